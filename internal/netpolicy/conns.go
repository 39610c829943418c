package netpolicy

import (
	"cmp"
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/config"
)

// Every connection a jail opens to the daemon's proxies or DNS holds a
// descriptor, a goroutine and buffers in the daemon (two descriptors once
// it is carried upstream). A jail could open them by the hundred thousand
// and leave them idle, until the daemon had no descriptor left for its API
// or its files. So a jail holds at most its policy's Connections at once
// (config.DefaultConnections: clients open tens at once, a browser or a
// package manager, and a thousand is far past any of them), and all jails
// together at most the manager's maxConns; a connection past either is
// reset as soon as it is accepted, and recorded as refused with rule
// connRule.

// connRule is the rule of a connection refused over a bound.
const connRule = "limit:connections"

// connBudget is how many jail connections the daemon holds at once: a
// quarter of its descriptor limit (each may take two), at least 256.
func connBudget() int64 {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == unix.RLIM_INFINITY {
		return 1 << 16
	}
	return max(int64(rl.Cur/4), 256)
}

// holdConn counts a new connection of js; it reports false, counting
// nothing, when js or the daemon is at its bound, with why.
func (m *Manager) holdConn(js *jailState) (string, bool) {
	bound := int64(cmp.Or(js.pol().src.Connections, config.DefaultConnections))
	if n := js.conns.Add(1); n > bound {
		js.conns.Add(-1)
		return fmt.Sprintf("the jail has %d connections to the daemon open at once, the most its policy allows (limits.connections)", bound), false
	}
	if n := m.conns.Add(1); n > m.maxConns {
		m.conns.Add(-1)
		js.conns.Add(-1)
		return fmt.Sprintf("the jails have %d connections to the daemon open at once, the most it takes", m.maxConns), false
	}
	return "", true
}

// releaseConn uncounts a connection holdConn counted.
func (m *Manager) releaseConn(js *jailState) {
	js.conns.Add(-1)
	m.conns.Add(-1)
}

// refuseConn resets a connection of js that is over a bound, and records
// it (dst: where the jail sent it).
func (m *Manager) refuseConn(js *jailState, c net.Conn, via string, src, dst netip.AddrPort, why string) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
	ev := ConnEvent{Via: via, Proto: "tcp", Src: src.String(), Verdict: VerdictLimit, Rule: connRule, Error: why}
	if dst.IsValid() {
		ev.Dst = dst.String()
	}
	m.record(js.id, ev)
}
