package netpolicy

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/nftables"
)

// TestDirectBytes: a bridge jail's direct connections spend its
// bytes_per_hour budget too. A direct download larger than the budget is
// delivered whole (a transfer in flight is not cut); once the kernel's
// count has been charged, new direct connections are refused and the
// proxy answers 429, both recorded with the byte limit; a new limit gives
// a fresh budget.
func TestDirectBytes(t *testing.T) {
	e := setup(t)
	p := Policy{
		Allow:        []Rule{{Destination: "allowed.test"}, {Destination: inetA.String(), Ports: []int{7, 8080}, Protocol: ProtoTCP}},
		BytesPerHour: 1 << 20,
	}
	j := attach(t, e.m, "direct-bytes", ModeBridge, p)
	if s, c := j.curl(t, nil, "http://allowed.test/"); s != "200" {
		t.Fatalf("proxied request within the budget: status %s exit %d", s, c)
	}
	out, code := j.exec(t, nil, "curl", "-sS", "--max-time", "20", "-o", "/dev/null", "-w", "%{http_code} %{size_download}",
		"http://"+inetA.String()+":8080/big")
	if want := fmt.Sprintf("200 %d", bigSize); strings.TrimSpace(out) != want {
		t.Fatalf("direct download of %d bytes on a 1 MiB budget: %q exit %d, want %q", bigSize, out, code, want)
	}
	// The count is charged within a poll; then new direct connections
	// are refused.
	var got string
	if err := pollUntil(5*bytesPoll, func() bool {
		got = j.connect(t, inetA.String(), 7)
		return got == "refused"
	}); err != nil {
		t.Fatalf("direct connection after the direct download spent the budget: %s, want refused", got)
	}
	e.rec.wait(t, j.id, "kernel refusal over the byte budget", func(ev ConnEvent) bool {
		return ev.Via == ViaKernel && ev.Verdict == VerdictBlock && ev.Rule == "limit:bytes_per_hour" && ev.Dst == inetA.String()+":7"
	})
	if s, c := j.curl(t, nil, "http://allowed.test/"); s != "429" {
		t.Errorf("proxied request after the direct download spent the budget: status %s exit %d, want 429", s, c)
	}
	// A jail without a byte budget is not counted at all: its counter
	// goes with the limit, and its direct traffic passes.
	if !hasCounter(t, e.m, j.id) {
		t.Error("no counter of direct bytes for a bridge jail with a byte budget")
	}
	p.BytesPerHour = 0
	if err := e.m.Update(t.Context(), j.id, p); err != nil {
		t.Fatal(err)
	}
	if hasCounter(t, e.m, j.id) {
		t.Error("a counter of direct bytes for a jail without a byte budget")
	}
	if got := j.connect(t, inetA.String(), 7); got != "connected ping" {
		t.Errorf("direct connection without a byte limit: %s", got)
	}
}

// hasCounter reports whether the manager's table holds the counter of
// direct bytes of jail id.
func hasCounter(t *testing.T, m *Manager, id string) bool {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := c.GetObjects(&nftables.Table{Name: m.table, Family: nftables.TableFamilyINet})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if co, ok := o.(*nftables.CounterObj); ok && co.Name == counterPrefix+id {
			return true
		}
	}
	return false
}
