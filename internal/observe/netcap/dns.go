package netcap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/agentjail/agentjail/internal/observe"
)

// DNSMessage is the part of one DNS message the observation records.
type DNSMessage struct {
	Response bool
	ID       uint16
	// Name is the first question's name, lower-case, without the final
	// dot; Type its type ("A", "AAAA", "MX", ...).
	Name, Type string
	// RCode is the response code of a response ("NOERROR", "NXDOMAIN",
	// ...).
	RCode string
	// Answers holds the answer section of a response: addresses for A and
	// AAAA records, the target name for CNAME, NS and PTR, "pref name" for
	// MX, the text for TXT, and the type name for other records.
	Answers []string
	// Partial is set when the copy of the message ended before the
	// message did; what was decoded up to there is kept.
	Partial bool
}

// errNotDNS is returned for payloads that do not start a DNS message.
var errNotDNS = errors.New("not a DNS message")

// DecodeDNS decodes the DNS messages at the start of a port-53 payload:
// one message for UDP; for TCP, the length-prefixed messages that start in
// the segment. payload may be a truncated copy of the real payload (the
// kernel copies a bounded prefix); messages cut short are returned with
// Partial set as long as their question was complete. An error is
// returned only when not even one question could be decoded.
func DecodeDNS(payload []byte, tcp bool) ([]DNSMessage, error) {
	if !tcp {
		m, err := decodeOne(payload)
		if err != nil {
			return nil, err
		}
		return []DNSMessage{m}, nil
	}
	var out []DNSMessage
	for len(payload) >= 2 {
		n := int(binary.BigEndian.Uint16(payload))
		payload = payload[2:]
		msg := payload
		if n < len(msg) {
			msg = msg[:n]
		}
		m, err := decodeOne(msg)
		if err != nil {
			break
		}
		if n > len(payload) {
			m.Partial = true
			out = append(out, m)
			break
		}
		out = append(out, m)
		payload = payload[n:]
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("dns over tcp: %w", errNotDNS)
	}
	return out, nil
}

func decodeOne(b []byte) (DNSMessage, error) {
	var p dnsmessage.Parser
	h, err := p.Start(b)
	if err != nil {
		return DNSMessage{}, fmt.Errorf("dns header: %w", err)
	}
	q, err := p.Question()
	if err != nil {
		return DNSMessage{}, fmt.Errorf("dns question: %w", err)
	}
	m := DNSMessage{
		Response: h.Response, ID: h.ID,
		Name: strings.ToLower(strings.TrimSuffix(q.Name.String(), ".")),
		Type: typeName(q.Type),
	}
	if !h.Response {
		return m, nil
	}
	m.RCode = rcodeName(h.RCode)
	if err := p.SkipAllQuestions(); err != nil {
		m.Partial = true
		return m, nil
	}
	for {
		rh, err := p.AnswerHeader()
		if errors.Is(err, dnsmessage.ErrSectionDone) {
			break
		}
		if err != nil {
			m.Partial = true
			break
		}
		a, err := answerText(&p, rh.Type)
		if err != nil {
			m.Partial = true
			break
		}
		m.Answers = append(m.Answers, a)
	}
	return m, nil
}

// answerText reads the body of the current answer.
func answerText(p *dnsmessage.Parser, t dnsmessage.Type) (string, error) {
	switch t {
	case dnsmessage.TypeA:
		r, err := p.AResource()
		return netip.AddrFrom4(r.A).String(), err
	case dnsmessage.TypeAAAA:
		r, err := p.AAAAResource()
		return netip.AddrFrom16(r.AAAA).String(), err
	case dnsmessage.TypeCNAME:
		r, err := p.CNAMEResource()
		return trimDot(r.CNAME), err
	case dnsmessage.TypeNS:
		r, err := p.NSResource()
		return trimDot(r.NS), err
	case dnsmessage.TypePTR:
		r, err := p.PTRResource()
		return trimDot(r.PTR), err
	case dnsmessage.TypeMX:
		r, err := p.MXResource()
		return fmt.Sprintf("%d %s", r.Pref, trimDot(r.MX)), err
	case dnsmessage.TypeTXT:
		r, err := p.TXTResource()
		return strings.Join(r.TXT, ""), err
	}
	return typeName(t), p.SkipAnswer()
}

func trimDot(n dnsmessage.Name) string { return strings.TrimSuffix(n.String(), ".") }

func typeName(t dnsmessage.Type) string { return strings.TrimPrefix(t.String(), "Type") }

func rcodeName(c dnsmessage.RCode) string {
	switch c {
	case dnsmessage.RCodeSuccess:
		return "NOERROR"
	case dnsmessage.RCodeFormatError:
		return "FORMERR"
	case dnsmessage.RCodeServerFailure:
		return "SERVFAIL"
	case dnsmessage.RCodeNameError:
		return "NXDOMAIN"
	case dnsmessage.RCodeNotImplemented:
		return "NOTIMP"
	case dnsmessage.RCodeRefused:
		return "REFUSED"
	}
	return strings.TrimPrefix(c.String(), "RCode")
}

// DNSEvent fills ev with the net event of message m, which crossed the
// flow key (from the jail's side) at ts (Unix ns): a query (OpDNSQuery,
// Host and QType set) or an answer (OpDNSAnswer, with Answers, and Error
// holding the response code when it is not NOERROR). sent tells whether the
// jail sent the message; Src and Dst are the message's sender and receiver.
func DNSEvent(m *DNSMessage, key FlowKey, sent bool, ts int64, ev *observe.Event) {
	*ev = observe.Event{
		Type: observe.TypeNet, TS: ts, FirstTS: ts, LastTS: ts,
		Proto: ProtoName(key.Proto), Host: m.Name, QType: m.Type,
	}
	if sent {
		ev.Dir, ev.Src, ev.Dst = DirEgress, key.Local.String(), key.Remote.String()
	} else {
		ev.Dir, ev.Src, ev.Dst = DirIngress, key.Remote.String(), key.Local.String()
	}
	if !m.Response {
		ev.Op = OpDNSQuery
		return
	}
	ev.Op = OpDNSAnswer
	ev.Answers = m.Answers
	if m.RCode != "NOERROR" {
		ev.Error = m.RCode
	}
}
