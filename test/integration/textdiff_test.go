package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// vmHWM is a process's peak resident memory in bytes.
func vmHWM(tb testing.TB, pid int) int64 {
	tb.Helper()
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for _, l := range strings.Split(string(st), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "VmHWM:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				tb.Fatal(err)
			}
			return kb << 10
		}
	}
	tb.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// resetHWM makes a process's peak resident memory its current one.
func resetHWM(tb testing.TB, pid int) {
	tb.Helper()
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		tb.Fatal(err)
	}
}

// TestTextDiffBoundedMemory has a jail rewrite every line of a 5 000-line
// file and of a file just under the text-diff cap, then asks for their
// text diffs four times at once: the daemon's peak memory grows by tens
// of megabytes, not gigabytes, and a file over the cap is marked, not an
// error.
func TestTextDiffBoundedMemory(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, nil)
	d.mustSh(t, j.ID, "seq 1 5000 > /workspace/a; seq 1 140000 > /workspace/big")
	snap := d.takeSnapshot(t, j.ID, "fs")
	d.mustSh(t, j.ID, `sed -i 's/^/x/' /workspace/a; seq 1 140000 | sed 's/^/y/' > /workspace/big
		head -c 2000000 /dev/zero | tr '\0' 'a' > /workspace/huge`)

	resetHWM(t, d.pid)
	base := vmHWM(t, d.pid)
	const concurrent = 4
	var wg sync.WaitGroup
	diffs := make([]fsDiff, concurrent)
	errs := make([]error, concurrent)
	for i := range concurrent {
		wg.Go(func() {
			r, err := d.api.send("GET", "/snapshots/"+snap.ID+"/diff?text=true", nil)
			switch {
			case err != nil:
				errs[i] = err
			case r.status != http.StatusOK:
				errs[i] = fmt.Errorf("GET diff: %s", r)
			default:
				errs[i] = json.Unmarshal(r.body, &diffs[i])
			}
		})
	}
	wg.Wait()
	peak := vmHWM(t, d.pid)
	t.Logf("daemon peak RSS %d MiB before, %d MiB during %d concurrent text diffs (+%d MiB)",
		base>>20, peak>>20, concurrent, (peak-base)>>20)
	for i := range concurrent {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		got := map[string]string{}
		for _, c := range diffs[i].Changes {
			got[c.Path] = c.Diff
		}
		if a := got["/workspace/a"]; strings.Count(a, "\n-") != 5000 || strings.Count(a, "\n+x") != 5000 {
			t.Fatalf("diff of a: %d bytes, not every line replaced:\n%.300s", len(a), a)
		}
		if b := got["/workspace/big"]; !strings.HasPrefix(b, "--- a/workspace/big\n+++ b/workspace/big\n@@ -1,140000 +1,140000 @@\n") {
			t.Fatalf("diff of big: %.300s", b)
		}
		if h := got["/workspace/huge"]; h != "Files /dev/null and b/workspace/huge differ (binary or too large for a text diff)\n" {
			t.Fatalf("diff of huge: %.300q", h)
		}
	}
	if grow := peak - base; grow > 256<<20 {
		t.Fatalf("the daemon's peak memory grew by %d MiB", grow>>20)
	}
}
