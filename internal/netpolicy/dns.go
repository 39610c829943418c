package netpolicy

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// RoutedAddr is the daemon's DNS answer for a name the jail's policy
// routes (Policy.Routes): an address of the benchmarking range (RFC 2544),
// which no host has; the jail's connections to it are redirected to the
// proxy like any other, and the proxy sends them where the route says.
var RoutedAddr = netip.MustParseAddr("198.18.0.1")

// hasRoute reports whether the jail's policy routes name.
func (js *jailState) hasRoute(name string) bool {
	_, ok := js.pol().routeFor(name)
	return ok
}

// dnsTTL is the TTL of the daemon's answers: short, so policy changes
// reach cached names soon.
const dnsTTL = 30

// dnsJob is one admitted UDP query.
type dnsJob struct {
	js   *jailState
	from net.Addr
	src  string
	q    []byte
}

// serveDNSPackets answers DNS over UDP with dnsWorkers workers fed by a
// queue of dnsQueue queries. The kernel drops a jail's queries past its
// rate (see dnsLimit); a query past dnsPerJail in flight, or finding
// the queue full, is dropped here and counted (see dnsDropped); the
// reader never waits.
func (m *Manager) serveDNSPackets(pc net.PacketConn) {
	jobs := make(chan dnsJob, dnsQueue)
	var workers sync.WaitGroup
	for range dnsWorkers {
		workers.Go(func() {
			for j := range jobs {
				resp := m.answerDNS(j.js, j.src, j.q, 512)
				j.js.dns.done(resp != nil)
				if resp != nil {
					pc.WriteTo(resp, j.from)
				}
			}
		})
	}
	defer func() {
		close(jobs)
		workers.Wait()
	}()
	buf := make([]byte, 65535)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		ap, err := netip.ParseAddrPort(from.String())
		if err != nil {
			continue
		}
		js := m.jailByAddr(ap.Addr())
		if js == nil || n > maxDNSQuery {
			continue
		}
		if rule := js.dns.admit(false); rule != "" {
			m.dnsDropped(js, rule, 1)
			continue
		}
		select {
		case jobs <- dnsJob{js: js, from: from, src: ap.String(), q: append([]byte(nil), buf[:n]...)}:
		default:
			js.dns.done(false)
			m.dnsDropped(js, dnsDropBusy, 1)
		}
	}
}

// serveDNSStream answers DNS over TCP (two-byte length prefixes).
func (m *Manager) serveDNSStream(c net.Conn) {
	cc := m.clientOf(c, ViaDNS)
	if cc == nil {
		return
	}
	defer cc.Close()
	for {
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		var l [2]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return
		}
		q := make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(c, q); err != nil {
			return
		}
		js := cc.info.js
		if rule := js.dns.admit(true); rule != "" {
			m.dnsDropped(js, rule, 1)
			return
		}
		resp := m.answerDNS(js, cc.info.src, q, 65535)
		js.dns.done(resp != nil)
		if resp == nil {
			return
		}
		out := binary.BigEndian.AppendUint16(nil, uint16(len(resp)))
		if _, err := c.Write(append(out, resp...)); err != nil {
			return
		}
	}
}

// answerDNS answers one query: names outside the policy get NXDOMAIN,
// allowed names their IPv4 addresses (the jail has no IPv6), each
// address checked against the policy too. It returns nil for a packet
// that is not a query.
func (m *Manager) answerDNS(js *jailState, src string, q []byte, max int) []byte {
	var p dnsmessage.Parser
	hdr, err := p.Start(q)
	if err != nil || hdr.Response {
		return nil
	}
	question, err := p.Question()
	if err != nil {
		return nil
	}
	rh := dnsmessage.Header{ID: hdr.ID, Response: true, OpCode: hdr.OpCode, RecursionDesired: hdr.RecursionDesired,
		RecursionAvailable: true}
	name := strings.ToLower(strings.TrimSuffix(question.Name.String(), "."))
	ev := ConnEvent{Via: ViaDNS, Proto: "dns", Src: src, Host: name, QType: strings.TrimPrefix(question.Type.String(), "Type")}
	var answers []netip.Addr
	d := m.decide(js, Target{Host: name, Port: 0})
	switch {
	case hdr.OpCode != 0 || question.Class != dnsmessage.ClassINET:
		rh.RCode = dnsmessage.RCodeNotImplemented
		d = Decision{Rule: "unsupported"}
	case !d.Allow:
		rh.RCode = dnsmessage.RCodeNameError
	case question.Type == dnsmessage.TypeA && js.hasRoute(name):
		// The proxy picks the upstream of a routed name: any address
		// whose port 80 is redirected to it will do, and the name need
		// not resolve anywhere (a model host reached offline, in tests).
		answers = append(answers, RoutedAddr)
	case question.Type == dnsmessage.TypeA:
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ips, err := m.o.Resolver.LookupNetIP(ctx, "ip4", name)
		cancel()
		if err != nil {
			var de *net.DNSError
			if errors.As(err, &de) && de.IsNotFound {
				rh.RCode = dnsmessage.RCodeNameError
			} else {
				rh.RCode = dnsmessage.RCodeServerFailure
			}
			ev.Error = err.Error()
			break
		}
		for _, ip := range ips {
			ip = ip.Unmap()
			if !ip.Is4() {
				continue
			}
			if dd := m.decide(js, Target{Host: name, IP: ip}); !dd.Allow {
				d = dd
				continue
			}
			answers = append(answers, ip)
		}
		if len(answers) == 0 && len(ips) > 0 {
			rh.RCode = dnsmessage.RCodeNameError
			d.Allow = false
		}
		if d.Allow {
			m.learn(js, name, answers)
		}
	}
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), rh)
	b.EnableCompression()
	b.StartQuestions()
	b.Question(question)
	b.StartAnswers()
	for _, ip := range answers {
		b.AResource(dnsmessage.ResourceHeader{Name: question.Name, Class: dnsmessage.ClassINET, TTL: dnsTTL},
			dnsmessage.AResource{A: ip.As4()})
		ev.Answers = append(ev.Answers, ip.String())
	}
	resp, err := b.Finish()
	if err != nil {
		return nil
	}
	if len(resp) > max {
		rh.Truncated = true
		b := dnsmessage.NewBuilder(nil, rh)
		b.StartQuestions()
		b.Question(question)
		resp, _ = b.Finish()
	}
	ev.Verdict, ev.Rule = VerdictBlock, d.Rule
	if d.Allow {
		ev.Verdict = VerdictAllow
		if ev.Error != "" {
			ev.Verdict = VerdictError
		}
	}
	m.record(js.id, ev)
	return resp
}
