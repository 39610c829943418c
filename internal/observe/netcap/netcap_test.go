package netcap

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/agentjail/agentjail/internal/observe"
)

func buildDNS(t *testing.T, h dnsmessage.Header, q dnsmessage.Question, answers func(b *dnsmessage.Builder)) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, h)
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		t.Fatal(err)
	}
	if err := b.Question(q); err != nil {
		t.Fatal(err)
	}
	if answers != nil {
		if err := b.StartAnswers(); err != nil {
			t.Fatal(err)
		}
		answers(&b)
	}
	m, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestDecodeDNS(t *testing.T) {
	name := dnsmessage.MustNewName("WWW.Example.test.")
	q := dnsmessage.Question{Name: name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}
	rh := func(typ dnsmessage.Type) dnsmessage.ResourceHeader {
		return dnsmessage.ResourceHeader{Name: name, Type: typ, Class: dnsmessage.ClassINET, TTL: 30}
	}
	query := buildDNS(t, dnsmessage.Header{ID: 7, RecursionDesired: true}, q, nil)
	resp := buildDNS(t, dnsmessage.Header{ID: 7, Response: true}, q, func(b *dnsmessage.Builder) {
		b.CNAMEResource(rh(dnsmessage.TypeCNAME), dnsmessage.CNAMEResource{CNAME: dnsmessage.MustNewName("edge.example.test.")})
		b.AResource(rh(dnsmessage.TypeA), dnsmessage.AResource{A: [4]byte{192, 0, 2, 7}})
		b.AAAAResource(rh(dnsmessage.TypeAAAA), dnsmessage.AAAAResource{AAAA: netip.MustParseAddr("2001:db8::7").As16()})
		b.MXResource(rh(dnsmessage.TypeMX), dnsmessage.MXResource{Pref: 10, MX: dnsmessage.MustNewName("mx.example.test.")})
		b.TXTResource(rh(dnsmessage.TypeTXT), dnsmessage.TXTResource{TXT: []string{"v=spf1 ", "-all"}})
	})
	nx := buildDNS(t, dnsmessage.Header{ID: 8, Response: true, RCode: dnsmessage.RCodeNameError}, q, nil)

	ms, err := DecodeDNS(query, false)
	if err != nil || len(ms) != 1 {
		t.Fatalf("query: %v %v", ms, err)
	}
	if m := ms[0]; m.Response || m.ID != 7 || m.Name != "www.example.test" || m.Type != "A" || m.Partial {
		t.Errorf("query decoded as %+v", m)
	}

	wantAnswers := []string{"edge.example.test", "192.0.2.7", "2001:db8::7", "10 mx.example.test", "v=spf1 -all"}
	ms, err = DecodeDNS(resp, false)
	if err != nil || len(ms) != 1 {
		t.Fatalf("response: %v %v", ms, err)
	}
	if m := ms[0]; !m.Response || m.RCode != "NOERROR" || !slices.Equal(m.Answers, wantAnswers) || m.Partial {
		t.Errorf("response decoded as %+v", m)
	}

	// Two messages in one TCP segment, the second cut short by the copy.
	var seg []byte
	for _, m := range [][]byte{nx, resp} {
		seg = binary.BigEndian.AppendUint16(seg, uint16(len(m)))
		seg = append(seg, m...)
	}
	cut := len(seg) - 20
	ms, err = DecodeDNS(seg[:cut], true)
	if err != nil || len(ms) != 2 {
		t.Fatalf("tcp: %v %v", ms, err)
	}
	if ms[0].RCode != "NXDOMAIN" || ms[0].Partial || len(ms[0].Answers) != 0 {
		t.Errorf("tcp first message %+v", ms[0])
	}
	if !ms[1].Partial || ms[1].Name != "www.example.test" || len(ms[1].Answers) == 0 || len(ms[1].Answers) >= len(wantAnswers) {
		t.Errorf("tcp second message (cut) %+v", ms[1])
	}

	for _, bad := range [][]byte{nil, {1, 2, 3}, []byte(strings.Repeat("x", 40))} {
		if ms, err := DecodeDNS(bad, false); err == nil {
			t.Errorf("DecodeDNS(%q) = %+v, want an error", bad, ms)
		}
		if ms, err := DecodeDNS(bad, true); err == nil {
			t.Errorf("DecodeDNS(%q, tcp) = %+v, want an error", bad, ms)
		}
	}
}

func TestDNSEvent(t *testing.T) {
	key := FlowKey{Proto: 17, Local: netip.MustParseAddrPort("10.0.0.2:40000"), Remote: netip.MustParseAddrPort("10.0.0.1:53")}
	var ev observe.Event
	DNSEvent(&DNSMessage{Name: "a.test", Type: "AAAA"}, key, true, 5e9, &ev)
	if ev.Op != OpDNSQuery || ev.Dir != DirEgress || ev.Src != "10.0.0.2:40000" || ev.Dst != "10.0.0.1:53" || ev.Proto != "udp" {
		t.Errorf("query event %s", ev.AppendJSON(nil))
	}
	DNSEvent(&DNSMessage{Response: true, Name: "a.test", Type: "A", RCode: "SERVFAIL"}, key, false, 5e9, &ev)
	if ev.Op != OpDNSAnswer || ev.Dir != DirIngress || ev.Src != "10.0.0.1:53" || ev.Error != "SERVFAIL" {
		t.Errorf("answer event %s", ev.AppendJSON(nil))
	}
	js := string(ev.AppendJSON(nil))
	for _, want := range []string{`"op":"dns_answer"`, `"host":"a.test"`, `"qtype":"A"`, `"error":"SERVFAIL"`} {
		if !strings.Contains(js, want) {
			t.Errorf("JSON %s lacks %s", js, want)
		}
	}
}

func TestFlowTable(t *testing.T) {
	sec := int64(time.Second)
	ft := NewFlowTable(FlowConfig{IdleTimeout: 10 * time.Second, CloseLinger: time.Second, Interim: 5 * time.Second})
	s := FlowSample{
		Key:   FlowKey{Proto: 6, Local: netip.MustParseAddrPort("10.0.0.2:40000"), Remote: netip.MustParseAddrPort("10.0.0.1:443")},
		First: 100 * sec, Last: 101 * sec, BytesOut: 1000, BytesIn: 5000, PacketsOut: 10, PacketsIn: 8,
		PID: 3, HostPID: 3003, Comm: "curl",
	}
	if op := ft.Check(&s, 102*sec); op != "" {
		t.Fatalf("young flow: %q", op)
	}
	if op := ft.Check(&s, 105*sec); op != OpUpdate {
		t.Fatalf("flow past interim: %q, want update", op)
	}
	var ev observe.Event
	ft.Record(&s, OpUpdate, 105*sec, &ev)
	if ev.Bytes != 1000 || ev.BytesIn != 5000 || ev.Packets != 10 || ev.PacketsIn != 8 || ev.Dir != DirEgress ||
		ev.Src != "10.0.0.2:40000" || ev.Dst != "10.0.0.1:443" || ev.Proto != "tcp" || ev.HostPID != 3003 || ev.Comm != "curl" {
		t.Errorf("update record %s", ev.AppendJSON(nil))
	}
	// No new packets: nothing to report until idle.
	if op := ft.Check(&s, 111*sec-1); op != "" {
		t.Errorf("unchanged flow: %q", op)
	}
	s.Last, s.BytesOut, s.PacketsOut = 109*sec, 1500, 12
	if op := ft.Check(&s, 109*sec); op != "" {
		t.Errorf("changed flow within interim: %q", op)
	}
	if op := ft.Check(&s, 110*sec); op != OpUpdate {
		t.Errorf("changed flow after interim: %q", op)
	}
	s.Closed = true
	if op := ft.Check(&s, 109*sec+sec/2); op != "" {
		t.Errorf("closed flow within linger: %q", op)
	}
	if op := ft.Check(&s, 110*sec); op != OpClose {
		t.Errorf("closed flow after linger: %q", op)
	}
	ft.Record(&s, OpClose, 110*sec, &ev)
	if ev.Bytes != 500 || ev.BytesIn != 0 || ev.Packets != 2 || ev.PacketsIn != 0 || ev.Op != OpClose ||
		ev.FirstTS != 100*sec || ev.LastTS != 109*sec {
		t.Errorf("close record (deltas) %s", ev.AppendJSON(nil))
	}
	js := string(ev.AppendJSON(nil))
	for _, want := range []string{`"op":"close"`, `"bytes":500`, `"packets":2`, `"dir":"egress"`} {
		if !strings.Contains(js, want) {
			t.Errorf("JSON %s lacks %s", js, want)
		}
	}
	// Forgotten after its final record: a new flow on the same 5-tuple
	// starts from zero.
	if len(ft.flows) != 0 {
		t.Errorf("%d flows remembered after the final record", len(ft.flows))
	}

	in := FlowSample{Key: FlowKey{Proto: 17, Local: netip.MustParseAddrPort("[fd00::2]:53"), Remote: netip.MustParseAddrPort("[fd00::1]:5353")},
		First: 100 * sec, Last: 100 * sec, BytesIn: 60, PacketsIn: 1, Inbound: true}
	if op := ft.Check(&in, 110*sec); op != OpIdle {
		t.Errorf("idle flow: %q", op)
	}
	ft.Record(&in, OpIdle, 110*sec, &ev)
	if ev.Dir != DirIngress || ev.Src != "[fd00::1]:5353" || ev.Dst != "[fd00::2]:53" || ev.Proto != "udp" || ev.BytesIn != 60 {
		t.Errorf("inbound idle record %s", ev.AppendJSON(nil))
	}
}
