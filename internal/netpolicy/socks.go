package netpolicy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/agentjail/agentjail/internal/config"
)

// SOCKS5 (RFC 1928), CONNECT only, no authentication: the jail's address
// identifies it. BIND and UDP ASSOCIATE are refused with "command not
// supported"; UDP leaves a jail only where the kernel rules allow it.
const (
	socksVersion      = 5
	socksNoAuth       = 0
	socksNoAcceptable = 0xff
	socksConnect      = 1
	socksOK           = 0
	socksFailure      = 1
	socksNotAllowed   = 2
	socksHostUnreach  = 4
	socksCmdNotSupp   = 7
	socksAtypNotSupp  = 8
)

func (m *Manager) serveSOCKS(c net.Conn) {
	cc := m.clientOf(c, ViaSOCKS)
	if cc == nil {
		return
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	host, addr, port, err := socksHandshake(c)
	if err != nil {
		cc.Close()
		return
	}
	c.SetDeadline(time.Time{})
	m.tunnel(cc, host, addr, port, func(d Decision, verdict string, err error) error {
		code := byte(socksOK)
		switch verdict {
		case VerdictAllow:
		case VerdictBlock, VerdictLimit:
			code = socksNotAllowed
		default:
			code = socksHostUnreach
		}
		return socksReply(c, code)
	})
}

// socksHandshake negotiates no authentication and reads a CONNECT
// request; it answers errors itself.
func socksHandshake(c net.Conn) (host string, addr netip.Addr, port int, err error) {
	var hdr [2]byte
	if _, err = io.ReadFull(c, hdr[:]); err != nil {
		return
	}
	if hdr[0] != socksVersion {
		return "", addr, 0, errors.New("socks: not version 5")
	}
	methods := make([]byte, hdr[1])
	if _, err = io.ReadFull(c, methods); err != nil {
		return
	}
	ok := false
	for _, mth := range methods {
		ok = ok || mth == socksNoAuth
	}
	if !ok {
		c.Write([]byte{socksVersion, socksNoAcceptable})
		return "", addr, 0, errors.New("socks: client offers no acceptable method")
	}
	if _, err = c.Write([]byte{socksVersion, socksNoAuth}); err != nil {
		return
	}
	var req [4]byte
	if _, err = io.ReadFull(c, req[:]); err != nil {
		return
	}
	if req[0] != socksVersion {
		return "", addr, 0, errors.New("socks: bad request version")
	}
	if req[1] != socksConnect {
		socksReply(c, socksCmdNotSupp)
		return "", addr, 0, errors.New("socks: command not supported")
	}
	switch req[3] {
	case 1:
		var b [4]byte
		if _, err = io.ReadFull(c, b[:]); err != nil {
			return
		}
		addr = netip.AddrFrom4(b)
	case 4:
		var b [16]byte
		if _, err = io.ReadFull(c, b[:]); err != nil {
			return
		}
		addr = netip.AddrFrom16(b).Unmap()
	case 3:
		var l [1]byte
		if _, err = io.ReadFull(c, l[:]); err != nil {
			return
		}
		b := make([]byte, l[0])
		if _, err = io.ReadFull(c, b); err != nil {
			return
		}
		name := strings.ToLower(strings.TrimSuffix(string(b), "."))
		if a, perr := netip.ParseAddr(name); perr == nil {
			addr = a
			break
		}
		// Policy rules name hosts in this form; anything else (an empty
		// name, spaces, NUL bytes) names no host a rule could mean.
		if host, err = config.NormalizeHost(name); err != nil {
			socksReply(c, socksHostUnreach)
			return "", addr, 0, fmt.Errorf("socks: %w", err)
		}
	default:
		socksReply(c, socksAtypNotSupp)
		return "", addr, 0, errors.New("socks: address type not supported")
	}
	var p [2]byte
	if _, err = io.ReadFull(c, p[:]); err != nil {
		return
	}
	port = int(binary.BigEndian.Uint16(p[:]))
	if port == 0 {
		socksReply(c, socksFailure)
		return "", addr, 0, errors.New("socks: port 0")
	}
	return host, addr, port, nil
}

func socksReply(c net.Conn, code byte) error {
	_, err := c.Write([]byte{socksVersion, code, 0, 1, 0, 0, 0, 0, 0, 0})
	return err
}
