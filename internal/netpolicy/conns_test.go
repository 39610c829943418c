package netpolicy

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/config"
)

// pyHold opens one connection to the daemon on each port of argv[2]
// (comma-separated; one more than the bound) and reports how they end: the
// one the daemon accepted last is reset at once, whichever it is. Once one
// kept is closed, a new one is kept again (tried until the daemon has let
// go of the closed one).
const pyHold = `
import socket, sys
daemon, ports = sys.argv[1], [int(p) for p in sys.argv[2].split(",")]
def state(s):
    s.settimeout(1.0)
    try:
        return "closed" if s.recv(1) == b"" else "data"
    except socket.timeout:
        return "open"
    except ConnectionResetError:
        return "reset"
conns = [socket.create_connection((daemon, p), timeout=5) for p in ports]
states = [state(s) for s in conns]
print(" ".join(sorted(states)))
conns[states.index("open")].close()
for i in range(100):
    again = socket.create_connection((daemon, ports[0]), timeout=5)
    if state(again) == "open":
        print("after a close: open"); break
    again.close()
else:
    print("after a close: refused")
`

// TestConnectionBound: a jail holds at most its policy's limits.connections
// connections to the daemon's proxies and DNS at once; one more is reset
// and recorded as refused; a closed one is uncounted (whichever way it
// ended: a tunnel, a proxied request, a connection the proxy could not
// serve), so the jail gets it back, and nothing stays counted once the
// jail's connections end.
func TestConnectionBound(t *testing.T) {
	e := setup(t)
	p := basePolicy()
	p.Connections = 4
	if _, err := compile(p); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{-1, config.MaxConnections + 1} {
		if _, err := compile(Policy{Connections: n}); err == nil {
			t.Fatalf("limits.connections %d accepted", n)
		}
	}
	j := attach(t, e.m, "conns", ModeIsolated, p)
	e.m.mu.Lock()
	js := e.m.jails[j.id]
	e.m.mu.Unlock()
	ports := e.m.ports
	daemon := e.m.daemon.String()

	out, _ := j.exec(t, nil, python, "-c", pyHold, daemon, fmt.Sprintf("%d,%d,%d,%d,%d", ports.SOCKS, ports.Proxy, ports.DNS, ports.SOCKS, ports.Proxy))
	out = strings.TrimSpace(out)
	want := "open open open open reset\nafter a close: open"
	if out != want {
		t.Fatalf("connections past the bound:\n%s\nwant:\n%s", out, want)
	}
	e.rec.wait(t, j.id, "the refusal recorded", func(ev ConnEvent) bool {
		return ev.Verdict == VerdictLimit && ev.Rule == connRule && strings.Contains(ev.Error, "4 connections")
	})

	// Served connections are uncounted when they end: a proxied request,
	// a CONNECT tunnel, a transparent connection the proxy cannot place.
	px := j.att.Env
	if s, c := j.curl(t, map[string]string{"http_proxy": px["http_proxy"]}, "http://allowed.test/"); s != "200" {
		t.Fatalf("http proxy: %s (exit %d)", s, c)
	}
	if s, c := j.curl(t, map[string]string{"https_proxy": px["https_proxy"]}, "--cacert", e.ca.pemFile, "https://allowed.test/"); s != "200" {
		t.Fatalf("CONNECT: %s (exit %d)", s, c)
	}
	j.connect(t, daemon, ports.HTTP, true)
	deadline := time.Now().Add(10 * time.Second)
	for js.conns.Load() != 0 || e.m.conns.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("connections still counted after they all ended: jail %d, daemon %d", js.conns.Load(), e.m.conns.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
