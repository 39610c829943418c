package netpolicy

import (
	"context"
	"strings"
	"testing"
	"time"
)

// resolve looks name up from inside the jail (through the daemon's DNS)
// and returns the address, or "nxdomain".
func (j *testJail) resolve(t *testing.T, name string) string {
	t.Helper()
	return j.py(t, nil, `
import socket
try:
    print(socket.gethostbyname("`+name+`"))
except socket.gaierror:
    print("nxdomain")`)
}

// TestDirectByName: in bridge mode a domain rule also allows direct
// connections, on its ports, to the addresses the daemon's DNS gave the
// jail for the name, and only after that answer; other ports, other
// addresses and blocked ports stay refused, the record names the host and
// the rule, a policy update revokes at once, and the addresses are
// forgotten when they expire. In isolated mode the same rule allows no
// direct connection.
func TestDirectByName(t *testing.T) {
	e := setup(t)
	p := basePolicy()
	p.Allow = []Rule{{Destination: "allowed.test", Ports: []int{7}, Protocol: ProtoTCP}, {Destination: "*.wild.test"}}
	p.Block = []Rule{{Destination: "bad.wild.test"}}
	j := attach(t, e.m, "direct", ModeBridge, p)

	// Before any answer, the address is unknown to the kernel's sets.
	if got := j.connect(t, inetA.String(), 7); got != "refused" {
		t.Errorf("direct connection before the name was looked up: %s, want refused", got)
	}
	if got := j.resolve(t, "allowed.test"); got != inetA.String() {
		t.Fatalf("allowed.test resolves to %s", got)
	}
	if got := j.connect(t, inetA.String(), 7); got != "connected ping" {
		t.Errorf("direct connection to allowed.test:7 after the lookup: %s", got)
	}
	if got := j.connect(t, inetA.String(), 8080, true); got != "refused" {
		t.Errorf("allowed.test on a port its rule does not name: %s, want refused", got)
	}
	if got := j.connect(t, inetB.String(), 7); got != "refused" {
		t.Errorf("an address no answer gave: %s, want refused", got)
	}
	e.rec.wait(t, j.id, "direct connection by name", func(ev ConnEvent) bool {
		return ev.Via == ViaKernel && ev.Verdict == VerdictAllow && ev.Dst == inetA.String()+":7" &&
			ev.Host == "allowed.test" && ev.Rule == "allow:allowed.test"
	})

	// A wildcard rule without ports: every port of the name's address.
	// bad.wild.test is blocked: it does not resolve, so its address is
	// never learned.
	if got := j.resolve(t, "bad.wild.test"); got != "nxdomain" {
		t.Errorf("bad.wild.test resolves to %s", got)
	}
	if got := j.connect(t, inetC.String(), 7); got != "refused" {
		t.Errorf("the blocked name's address: %s, want refused", got)
	}
	if got := j.resolve(t, "x.wild.test"); got != inetA.String() {
		t.Fatalf("x.wild.test resolves to %s", got)
	}
	if got := j.connect(t, inetA.String(), 8080, true); got != "connected" {
		t.Errorf("x.wild.test on any port after the lookup: %s", got)
	}
	udp := j.py(t, nil, `
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
s.connect(("`+inetA.String()+`", 7))
s.send(b"udp")
try:
    print(s.recv(10).decode())
except OSError as e:
    print("error", e)`)
	if udp != "udp" {
		t.Errorf("udp to x.wild.test after the lookup: %s", udp)
	}

	// A block rule on a port beats the every-port allow there.
	p.Block = append(p.Block, Rule{Destination: "x.wild.test", Ports: []int{7}})
	if err := e.m.Update(context.Background(), j.id, p); err != nil {
		t.Fatal(err)
	}
	// The address is also allowed.test's, whose rule allows port 7: a
	// connection cannot tell the names apart, so it passes.
	if got := j.connect(t, inetA.String(), 7); got != "connected ping" {
		t.Errorf("port 7 of an address allowed.test (port 7 allowed) shares with x.wild.test (port 7 blocked): %s", got)
	}

	// Revoked at once: the rule goes, the learned address stays known but
	// no set holds it.
	p.Allow = []Rule{{Destination: "api.test", Ports: []int{8080}}}
	if err := e.m.Update(context.Background(), j.id, p); err != nil {
		t.Fatal(err)
	}
	if got := j.connect(t, inetA.String(), 7); got != "refused" {
		t.Errorf("allowed.test:7 after its rule was removed: %s, want refused", got)
	}
	// Granted again: api.test shares the address; its answer opens port
	// 8080 only.
	if got := j.resolve(t, "api.test"); got != inetA.String() {
		t.Fatalf("api.test resolves to %s", got)
	}
	if got := j.connect(t, inetA.String(), 8080, true); got != "connected" {
		t.Errorf("api.test:8080 after the lookup: %s", got)
	}
	if got := j.connect(t, inetA.String(), 7); got != "refused" {
		t.Errorf("port 7 of api.test's address: %s, want refused", got)
	}

	// Expiry: past the learned lifetime the pruner rebuilds the table
	// without the address.
	later := time.Now().Add(learnedTTL + time.Minute)
	e.m.mu.Lock()
	e.m.now = func() time.Time { return later }
	e.m.mu.Unlock()
	e.m.pruneLearned()
	if got := j.connect(t, inetA.String(), 8080, true); got != "refused" {
		t.Errorf("api.test:8080 after the learned address expired: %s, want refused", got)
	}

	// Isolated mode: the same rules allow no direct connection.
	iso := attach(t, e.m, "isolated-direct", ModeIsolated, p)
	if got := iso.resolve(t, "api.test"); got != inetA.String() {
		t.Fatalf("api.test resolves to %s in isolated mode", got)
	}
	if got := iso.connect(t, inetA.String(), 8080, true); !strings.HasPrefix(got, "refused") {
		t.Errorf("direct connection in isolated mode: %s, want refused", got)
	}
}

// TestUpdateMode: an attached jail moves between isolated and bridge mode
// while it runs: direct connections its policy allows pass in bridge mode
// only, a name it resolves after the move is reachable directly, and a
// mode without an interface of its own is refused, changing nothing.
func TestUpdateMode(t *testing.T) {
	e := setup(t)
	p := basePolicy()
	p.Allow = []Rule{{Destination: inetA.String(), Ports: []int{7}}, {Destination: "other.test", Ports: []int{7}}}
	j := attach(t, e.m, "moves", ModeIsolated, p)
	if got := j.connect(t, inetA.String(), 7); got != "refused" {
		t.Fatalf("isolated: a direct connection: %s, want refused", got)
	}
	ctx := context.Background()
	if err := e.m.UpdateMode(ctx, j.id, ModeBridge, p); err != nil {
		t.Fatal(err)
	}
	if got := j.connect(t, inetA.String(), 7); got != "connected ping" {
		t.Errorf("moved to bridge: a direct connection the policy allows: %s", got)
	}
	if got := j.resolve(t, "other.test"); got != inetB.String() {
		t.Fatalf("other.test resolves to %s", got)
	}
	if got := j.connect(t, inetB.String(), 7); got != "connected ping" {
		t.Errorf("moved to bridge: a name resolved since: %s", got)
	}
	for _, bad := range []string{ModeNone, ModeHost, "wide"} {
		if err := e.m.UpdateMode(ctx, j.id, bad, p); err == nil {
			t.Errorf("mode %q: no error", bad)
		}
	}
	if got := j.connect(t, inetA.String(), 7); got != "connected ping" {
		t.Errorf("after refused moves, still bridge: %s", got)
	}
	if err := e.m.UpdateMode(ctx, j.id, ModeIsolated, p); err != nil {
		t.Fatal(err)
	}
	if got := j.connect(t, inetA.String(), 7); got != "refused" {
		t.Errorf("moved back to isolated: a direct connection: %s, want refused", got)
	}
}
