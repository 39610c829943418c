package integration

import (
	"fmt"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// soakCycles is how many create/exec/destroy cycles TestSoak runs:
// $AGENTJAIL_SOAK_CYCLES (make soak sets 10000), else 500.
func soakCycles(t *testing.T) int {
	v := os.Getenv("AGENTJAIL_SOAK_CYCLES")
	if v == "" {
		return 500
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 100 {
		t.Fatalf("AGENTJAIL_SOAK_CYCLES=%q: want a number of cycles, at least 100", v)
	}
	return n
}

// procSample is the daemon's resident memory and open descriptors after
// a number of cycles.
type procSample struct {
	cycles int
	rss    int64 // bytes
	fds    int
}

func sampleProc(tb testing.TB, pid, cycles int) procSample {
	tb.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		tb.Fatal(err)
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	s := procSample{cycles: cycles, fds: len(ents)}
	for _, l := range strings.Split(string(st), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			s.rss = kb << 10
		}
	}
	return s
}

// medianOf returns the median of xs (which it sorts).
func medianOf(xs []int64) int64 {
	sort.Slice(xs, func(a, b int) bool { return xs[a] < xs[b] })
	return xs[len(xs)/2]
}

// Flatness of TestSoak. The daemon's RSS and descriptor count are sampled
// 40 times, each while no cycle is in flight. The first tenth of the
// cycles (at least 50) is warm-up. Flat means: the median of the last
// quarter of the samples after warm-up is at most soakRSSGrowth bytes
// (soakFDGrowth descriptors) above the median of the first quarter. A
// leak of one descriptor per cycle, or of 32 KiB per cycle over 500
// cycles (4 KiB over 10 000), fails; the Go heap growing and being
// collected around a constant live set does not.
const (
	soakRSSGrowth = 8 << 20
	soakFDGrowth  = 2
)

// TestSoak runs create → exec → destroy cycles (two at a time) against a
// daemon of its own, and checks that the host holds nothing more of it
// afterwards (the leak inventory) and that the daemon's resident memory
// and open descriptors stay flat (see the bounds above). make test runs
// 500 cycles, make soak 10 000.
func TestSoak(t *testing.T) {
	n := soakCycles(t)
	d := newDaemon(t)
	base := baseline(t, d)
	const workers = 2
	warm := max(n/10, 50)
	every := max(n/40, 1)

	var mu sync.Mutex
	var samples []procSample
	var durations []time.Duration
	// Cycles hold quiet for reading; a sample takes it for writing, so it
	// sees the daemon with no cycle in flight.
	var quiet sync.RWMutex
	var done, next atomic.Int64
	var failed atomic.Bool
	errs := make(chan error, workers)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for !failed.Load() {
				i := int(next.Add(1))
				if i > n {
					return
				}
				quiet.RLock()
				t0 := time.Now()
				err := soakCycle(d, fmt.Sprintf("soak-%d-%d", w, i))
				took := time.Since(t0)
				quiet.RUnlock()
				if err != nil {
					failed.Store(true)
					errs <- fmt.Errorf("cycle %d: %w", i, err)
					return
				}
				c := int(done.Add(1))
				mu.Lock()
				durations = append(durations, took)
				mu.Unlock()
				if c%every == 0 || c == n {
					quiet.Lock()
					s := sampleProc(t, d.pid, int(done.Load()))
					quiet.Unlock()
					mu.Lock()
					samples = append(samples, s)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	sort.Slice(durations, func(a, b int) bool { return durations[a] < durations[b] })
	t.Logf("%d cycles in %v (%.1f/s); cycle median %v, p99 %v", n, elapsed.Round(time.Second),
		float64(n)/elapsed.Seconds(), durations[len(durations)/2], durations[len(durations)*99/100])

	var after []procSample
	var lines []string
	for _, s := range samples {
		lines = append(lines, fmt.Sprintf("%6d cycles: rss %6.1f MiB, %4d fds", s.cycles, float64(s.rss)/(1<<20), s.fds))
		if s.cycles > warm {
			after = append(after, s)
		}
	}
	t.Logf("daemon samples:\n%s", strings.Join(lines, "\n"))
	if len(after) < 5 {
		t.Fatalf("only %d samples after the warm-up of %d cycles", len(after), warm)
	}
	q := max(len(after)/4, 1)
	window := func(ss []procSample) (rss, fds int64) {
		var r, f []int64
		for _, s := range ss {
			r, f = append(r, s.rss), append(f, int64(s.fds))
		}
		return medianOf(r), medianOf(f)
	}
	rss0, fds0 := window(after[:q])
	rss1, fds1 := window(after[len(after)-q:])
	t.Logf("after warm-up (%d cycles), medians of the first and last %d samples: rss %.1f → %.1f MiB (%+.1f, bound %d), fds %d → %d (%+d, bound %d)",
		warm, q, float64(rss0)/(1<<20), float64(rss1)/(1<<20), float64(rss1-rss0)/(1<<20), soakRSSGrowth>>20, fds0, fds1, fds1-fds0, soakFDGrowth)
	if rss1-rss0 > soakRSSGrowth {
		t.Errorf("the daemon's RSS is not flat")
	}
	if fds1-fds0 > soakFDGrowth {
		t.Errorf("the daemon's descriptors are not flat")
	}
	if extra := waitNoLeak(d, base, 30*time.Second, warmDisk); len(extra) > 0 {
		t.Errorf("%d cycles left behind:\n  %s", n, strings.Join(extra, "\n  "))
	}
}

// soakCycle creates a jail, runs a command in it and destroys it.
func soakCycle(d *daemon, name string) error {
	r, err := d.api.send("POST", "/jails", map[string]any{"name": name})
	if err != nil {
		return err
	}
	if r.status != http.StatusCreated {
		return fmt.Errorf("create: %s", r)
	}
	r, err = d.api.send("POST", "/jails/"+name+"/exec", execReq{Cmd: []string{"sh", "-c", "echo $HOSTNAME"}, TimeoutMs: 30_000})
	if err != nil {
		return err
	}
	if r.status != http.StatusOK || !strings.Contains(string(r.body), name) {
		return fmt.Errorf("exec: %s", r)
	}
	r, err = d.api.send("DELETE", "/jails/"+name, nil)
	if err != nil {
		return err
	}
	if r.status != http.StatusNoContent {
		return fmt.Errorf("destroy: %s", r)
	}
	return nil
}
