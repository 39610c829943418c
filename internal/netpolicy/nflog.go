package netpolicy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"

	"github.com/florianl/go-nflog/v2"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// nflogCopyRange is how many bytes of each logged packet the kernel
// copies: the IPv4 header and the ports.
const nflogCopyRange = 64

// nflogReader turns the kernel's log of the manager's rules
// (nfnetlink_log, read with github.com/florianl/go-nflog) into connection
// records.
type nflogReader struct {
	nf     *nflog.Nflog
	cancel context.CancelFunc
	// mu is held for reading while a packet is recorded; Close takes it to
	// mark the reader closed, so that no record is made after Close.
	mu     sync.RWMutex
	closed bool
	once   sync.Once
}

// Close stops reading and releases the socket; no record is made after it
// returns.
func (r *nflogReader) Close() error {
	r.once.Do(func() {
		r.mu.Lock()
		r.closed = true
		r.mu.Unlock()
		r.cancel()
		r.nf.Close()
	})
	return nil
}

// startNflog binds the manager's nflog group. The group derives from the
// prefix; another daemon (another prefix) may hold it already: the kernel
// refuses the bind with EPERM, and the next free group of the range is
// taken.
func (m *Manager) startNflog() (*nflogReader, error) {
	base := m.group
	for try := uint16(0); try < 256; try++ {
		m.group = base&0xff00 | (base+try)&0xff
		r, err := m.bindNflog(m.group)
		if err == nil {
			return r, nil
		}
		if !groupTaken(err) {
			return nil, fmt.Errorf("nflog group %d: %w", m.group, err)
		}
	}
	return nil, fmt.Errorf("nflog: every group of 0x%04x..0x%04x is taken", base&0xff00, base|0xff)
}

// groupTaken reports whether err is the kernel's refusal to bind a group
// another socket holds. go-nflog formats the netlink error into its own
// (%v, not %w), so the errno is known by its text.
func groupTaken(err error) bool {
	return errors.Is(err, unix.EPERM) || strings.HasSuffix(err.Error(), unix.EPERM.Error())
}

// bindNflog opens a netlink socket bound to group and starts recording the
// packets logged to it.
func (m *Manager) bindNflog(group uint16) (*nflogReader, error) {
	nf, err := nflog.Open(&nflog.Config{
		Group:    group,
		Copymode: nflog.CopyPacket,
		Bufsize:  nflogCopyRange, // the copy range, in go-nflog's words
		QThresh:  1,              // deliver every packet at once
	})
	if err != nil {
		return nil, fmt.Errorf("nflog socket: %w", err)
	}
	if err := nf.Con.SetReadBuffer(1 << 20); err != nil {
		m.log.Warn("nflog receive buffer", "err", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &nflogReader{nf: nf, cancel: cancel}
	err = nf.RegisterWithErrorFunc(ctx, func(a nflog.Attribute) int {
		r.mu.RLock()
		defer r.mu.RUnlock()
		if r.closed {
			return 1
		}
		var prefix string
		var payload []byte
		if a.Prefix != nil {
			prefix = *a.Prefix
		}
		if a.Payload != nil {
			payload = *a.Payload
		}
		m.nflogPacket(prefix, payload)
		return 0
	}, func(err error) int {
		if ctx.Err() != nil {
			return 1
		}
		// A full socket buffer drops packets (ENOBUFS): go on reading.
		var op *netlink.OpError
		if errors.As(err, &op) && (op.Timeout() || errors.Is(op.Err, unix.ENOBUFS)) {
			return 0
		}
		m.log.Warn("nflog receive", "err", err)
		return 1
	})
	if err != nil {
		cancel()
		nf.Close()
		return nil, err
	}
	return r, nil
}

// nflogPacket records one logged packet from its log prefix,
// "<jail id> <a|b> <rule>" (see rb.note), and its first bytes.
func (m *Manager) nflogPacket(prefix string, payload []byte) {
	prefix = strings.TrimRight(prefix, "\x00")
	id, rest, ok := strings.Cut(prefix, " ")
	if !ok {
		return
	}
	verdict, rule, ok := strings.Cut(rest, " ")
	if !ok {
		return
	}
	ev := ConnEvent{Via: ViaKernel, Verdict: VerdictBlock, Rule: rule}
	if verdict == "a" {
		ev.Verdict = VerdictAllow
	}
	switch {
	case strings.HasPrefix(rule, "inter_jail"):
		ev.Dir = "inter_jail"
	case strings.HasPrefix(rule, "ingress"):
		ev.Dir = "ingress"
	}
	var dst netip.Addr
	if len(payload) >= 20 && payload[0]>>4 == 4 {
		ihl := int(payload[0]&0xf) * 4
		src := netip.AddrFrom4([4]byte(payload[12:16]))
		dst = netip.AddrFrom4([4]byte(payload[16:20]))
		ev.Src, ev.Dst = src.String(), dst.String()
		switch payload[9] {
		case unix.IPPROTO_TCP:
			ev.Proto = "tcp"
		case unix.IPPROTO_UDP:
			ev.Proto = "udp"
		case unix.IPPROTO_ICMP:
			ev.Proto = "icmp"
		default:
			ev.Proto = fmt.Sprint(payload[9])
		}
		if (ev.Proto == "tcp" || ev.Proto == "udp") && len(payload) >= ihl+4 {
			sp := binary.BigEndian.Uint16(payload[ihl:])
			dp := binary.BigEndian.Uint16(payload[ihl+2:])
			ev.Src = netip.AddrPortFrom(src, sp).String()
			ev.Dst = netip.AddrPortFrom(dst, dp).String()
			ev.Port = int(dp)
		}
	}
	if rule == ruleDNS {
		// A learned address: name the host and the rule that allows it.
		if host, rule, ok := m.learnedRule(id, Target{IP: dst, Port: ev.Port, Proto: ev.Proto}, m.extraProtected()); ok {
			ev.Host, ev.Rule = host, rule
		}
	}
	if ev.Verdict == VerdictAllow && ev.Dir == "" {
		m.chargeDirect(id)
	}
	m.record(id, ev)
}
