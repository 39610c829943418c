package netpolicy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The nfnetlink_log protocol (linux/netfilter/nfnetlink_log.h), which
// x/sys/unix does not define.
const (
	nfnlSubsysULOG    = 4
	nfulnlMsgPacket   = 0
	nfulnlMsgConfig   = 1
	nfulaCfgCmd       = 1
	nfulaCfgMode      = 2
	nfulaCfgQThresh   = 5
	nfulnlCfgCmdBind  = 1
	nfulnlCopyPacket  = 2
	nfulaPayload      = 9
	nfulaPrefix       = 10
	nflogCopyRange    = 64
	nflogRecvDeadline = 200 * time.Millisecond
)

// nflogReader turns the kernel's log of the manager's rules into
// connection records.
type nflogReader struct {
	fd   int
	stop chan struct{}
	done sync.WaitGroup
	once sync.Once
}

func (r *nflogReader) Close() error {
	r.once.Do(func() {
		close(r.stop)
		r.done.Wait()
		unix.Close(r.fd)
	})
	return nil
}

func nlAttr(typ uint16, data []byte) []byte {
	b := binary.NativeEndian.AppendUint16(nil, uint16(4+len(data)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// startNflog binds the manager's nflog group.
func (m *Manager) startNflog() (*nflogReader, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("nflog socket: %w", err)
	}
	fail := func(err error) (*nflogReader, error) {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fail(fmt.Errorf("nflog bind: %w", err))
	}
	tv := unix.NsecToTimeval(nflogRecvDeadline.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fail(fmt.Errorf("nflog socket timeout: %w", err))
	}
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 1<<20)
	// The group derives from the prefix; another daemon (another prefix)
	// may hold it already (EPERM): take the next free one of the range.
	base := m.group
	var bound bool
	for try := uint16(0); try < 256 && !bound; try++ {
		m.group = base&0xff00 | (base+try)&0xff
		err := nflogConfig(fd, 1, m.group, nlAttr(nfulaCfgCmd, []byte{nfulnlCfgCmdBind}))
		if errors.Is(err, unix.EPERM) {
			continue
		}
		if err != nil {
			return fail(fmt.Errorf("nflog group %d: %w", m.group, err))
		}
		bound = true
	}
	if !bound {
		return fail(fmt.Errorf("nflog: every group of 0x%04x..0x%04x is taken", base&0xff00, base|0xff))
	}
	mode := binary.BigEndian.AppendUint32(nil, nflogCopyRange)
	mode = append(mode, nfulnlCopyPacket, 0)
	for i, attr := range [][]byte{nlAttr(nfulaCfgMode, mode), nlAttr(nfulaCfgQThresh, binary.BigEndian.AppendUint32(nil, 1))} {
		if err := nflogConfig(fd, uint32(i+2), m.group, attr); err != nil {
			return fail(fmt.Errorf("nflog group %d: %w", m.group, err))
		}
	}
	r := &nflogReader{fd: fd, stop: make(chan struct{})}
	r.done.Add(1)
	go func() {
		defer r.done.Done()
		m.readNflog(r)
	}()
	return r, nil
}

// nflogConfig sends one config message and waits for its ack.
func nflogConfig(fd int, seq uint32, group uint16, attr []byte) error {
	body := []byte{unix.AF_UNSPEC, 0, 0, 0}
	binary.BigEndian.PutUint16(body[2:], group)
	body = append(body, attr...)
	msg := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+len(body))
	binary.NativeEndian.PutUint32(msg[0:], uint32(unix.NLMSG_HDRLEN+len(body)))
	binary.NativeEndian.PutUint16(msg[4:], nfnlSubsysULOG<<8|nfulnlMsgConfig)
	binary.NativeEndian.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	binary.NativeEndian.PutUint32(msg[8:], seq)
	msg = append(msg, body...)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return err
		}
		for _, mm := range msgs {
			if mm.Header.Type == unix.NLMSG_ERROR && mm.Header.Seq == seq {
				if len(mm.Data) >= 4 {
					if code := int32(binary.NativeEndian.Uint32(mm.Data)); code != 0 {
						return unix.Errno(-code)
					}
				}
				return nil
			}
		}
	}
}

func (m *Manager) readNflog(r *nflogReader) {
	buf := make([]byte, 1<<16)
	for {
		select {
		case <-r.stop:
			return
		default:
		}
		n, _, err := unix.Recvfrom(r.fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) || errors.Is(err, unix.ENOBUFS) {
				continue
			}
			m.log.Warn("nflog receive", "err", err)
			return
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			continue
		}
		for _, mm := range msgs {
			if mm.Header.Type != nfnlSubsysULOG<<8|nfulnlMsgPacket || len(mm.Data) < 4 {
				continue
			}
			m.nflogPacket(mm.Data[4:])
		}
	}
}

// nflogPacket records one logged packet. The prefix is
// "<jail id> <a|b> <rule>" (see rb.note).
func (m *Manager) nflogPacket(attrs []byte) {
	var prefix string
	var payload []byte
	for len(attrs) >= 4 {
		l := int(binary.NativeEndian.Uint16(attrs))
		typ := binary.NativeEndian.Uint16(attrs[2:]) & 0x3fff
		if l < 4 || l > len(attrs) {
			return
		}
		data := attrs[4:l]
		switch typ {
		case nfulaPrefix:
			prefix = strings.TrimRight(string(data), "\x00")
		case nfulaPayload:
			payload = data
		}
		attrs = attrs[(l+3)&^3:]
	}
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
