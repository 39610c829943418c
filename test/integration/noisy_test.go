package integration

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// noisyNeighbours are the four noisy jails of TestNoisyNeighbour: each
// script starts its noise in the background (as the jail's user) and
// returns at once.
var noisyNeighbours = []struct {
	name, script string
	// on reports from the jail's stats that the noise is at full strength.
	on func(s *jailStats) bool
}{
	// Every process forks for ever, failures (the pids limit) included.
	{"fork bomb", `setsid -f python3 -c 'import os
while True:
    try:
        os.fork()
    except OSError:
        pass' >/dev/null 2>&1 </dev/null`,
		func(s *jailStats) bool { return s.Pids >= s.PidsLimit-8 }},
	{"memory hog", `setsid -f sh -c 'while :; do python3 -c "b = bytearray(2 << 30)"; done' >/dev/null 2>&1 </dev/null`,
		func(s *jailStats) bool { return s.OOMKills >= 2 }},
	{"disk filler", `setsid -f sh -c 'while :; do dd if=/dev/zero of=/workspace/fill bs=1M count=4096; sync; rm -f /workspace/fill; done' >/dev/null 2>&1 </dev/null`,
		func(s *jailStats) bool { return s.DiskUsedBytes >= 256<<20 }},
	{"fd exhaustion", `for i in $(seq 24); do setsid -f python3 -c 'import os, time
fds = []
while True:
    try:
        fds.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        break
time.sleep(3600)' >/dev/null 2>&1 </dev/null; done`,
		func(s *jailStats) bool { return s.Pids >= 24 }},
}

// noisyDestroyBound bounds the destroy of a noisy jail (typically well
// under a second; reading a fork bomb's command lines made it 38 s).
const noisyDestroyBound = 10 * time.Second

// execLatencies runs `true` n times in the jail and returns the round
// trips, sorted; after each, it spawns /bin/true on the host, outside any
// jail (the bare operation: one process started and waited for), and
// passes a byte through the relay chain, and returns those times too,
// sorted, so all three see the same moments.
func execLatencies(t *testing.T, d *daemon, id string, n int, chain *relayChain) (jail, bare, relayed []time.Duration) {
	t.Helper()
	jail, bare, relayed = make([]time.Duration, 0, n), make([]time.Duration, 0, n), make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		r := d.api.do(t, "POST", "/jails/"+id+"/exec", execReq{Cmd: []string{"true"}, TimeoutMs: 30_000})
		took := time.Since(start)
		if r.status != http.StatusOK || !strings.Contains(string(r.body), `"exit_code":0`) {
			t.Fatalf("exec true: %s", r)
		}
		jail = append(jail, took)
		start = time.Now()
		if err := exec.Command("/bin/true").Run(); err != nil {
			t.Fatalf("host /bin/true: %v", err)
		}
		bare = append(bare, time.Since(start))
		relayed = append(relayed, chain.roundTrip(t))
	}
	for _, v := range [][]time.Duration{jail, bare, relayed} {
		sort.Slice(v, func(a, b int) bool { return v[a] < v[b] })
	}
	return jail, bare, relayed
}

func sum(ds []time.Duration) (s time.Duration) {
	for _, d := range ds {
		s += d
	}
	return s
}

// procCPU is the CPU time (user + system) process pid has used.
func procCPU(t testing.TB, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// pid (comm) state ppid ... utime(14) stime(15), counted from the ')'
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

func p99(sorted []time.Duration) time.Duration { return sorted[len(sorted)*99/100] }

// p90 is the 90th percentile of sorted.
func p90(sorted []time.Duration) time.Duration { return sorted[len(sorted)*9/10] }

// The bound of TestNoisyNeighbour: a percentile of the jail's exec may grow
// noisyBound times beside the noisy jails, or noisyFloorSlack times what
// the same percentile of the bare operation grew in the same moments, when
// that floor is higher.
const (
	noisyBound      = 2.0
	noisyFloorSlack = 1.5
)

// TestNoisyNeighbour measures a jail's exec round trip (p90 and p99 of 1000
// runs of `true`) quiet, then while four other jails run a fork bomb, a
// memory hog (OOM-killed in a loop), a disk filler and descriptor
// exhaustion. Beside it, the same percentiles of the bare operation
// (/bin/true spawned on the host, interleaved), which the neighbours slow
// down too, and of /bin/true spawned through a chain of host processes
// with as many hand-offs as an exec. Each percentile of the exec must stay
// within twice the quiet one, or within 1.5× of the bare operation's
// growth where that is more (on the 2-core machines the bare spawn's p99
// alone grows 2–8×; docs/architecture.md). It runs in make soak
// (AGENTJAIL_NOISY=1). AGENTJAIL_NOISY_ONLY=K[,K...] runs only the
// neighbours listed (0-3).
func TestNoisyNeighbour(t *testing.T) {
	if os.Getenv("AGENTJAIL_NOISY") == "" {
		t.Skip("half a minute beside four noisy jails; make soak runs it (AGENTJAIL_NOISY=1)")
	}
	d := newDaemon(t)
	victim := d.createJail(t, nil)
	const n = 1000
	chain := startRelayChain(t)
	execLatencies(t, d, victim.ID, 20, chain) // warm the paths
	cpu0 := procCPU(t, d.pid)
	quiet, bareQuiet, relayQuiet := execLatencies(t, d, victim.ID, n, chain)
	quietTook, quietCPU := sum(quiet), procCPU(t, d.pid)-cpu0

	var noisyIDs []string
	for k, nb := range noisyNeighbours {
		if o := os.Getenv("AGENTJAIL_NOISY_ONLY"); o != "" && !slices.Contains(strings.Split(o, ","), strconv.Itoa(k)) {
			noisyIDs = append(noisyIDs, victim.ID)
			continue
		}
		j := d.createJail(t, nil)
		noisyIDs = append(noisyIDs, j.ID)
		if res := d.shAs(t, j.ID, "", nb.script); res.ExitCode != 0 {
			t.Fatalf("%s: %s", nb.name, &res)
		}
	}
	stats := func() []string {
		var out []string
		for i, id := range noisyIDs {
			if id == victim.ID {
				continue // a neighbour left out
			}
			s := d.getJail(t, id).Stats
			out = append(out, fmt.Sprintf("%s: pids %d/%d, oom kills %d, disk %d MiB", noisyNeighbours[i].name, s.Pids, s.PidsLimit, s.OOMKills, s.DiskUsedBytes>>20))
		}
		return out
	}
	// Measure once every neighbour is at full strength.
	if err := waitFor(time.Minute, func() error {
		for i, id := range noisyIDs {
			if s := d.getJail(t, id).Stats; id != victim.ID && (s == nil || !noisyNeighbours[i].on(s)) {
				return fmt.Errorf("%s not at full strength: %s", noisyNeighbours[i].name, strings.Join(stats(), "; "))
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	cpu0 = procCPU(t, d.pid)
	noisy, bareNoisy, relayNoisy := execLatencies(t, d, victim.ID, n, chain)
	noisyTook, noisyCPU := sum(noisy), procCPU(t, d.pid)-cpu0
	t.Logf("neighbours: %s", strings.Join(stats(), "; "))
	t.Logf("daemon CPU while measuring: quiet %v in %v (%.0f%%), noisy %v in %v (%.0f%%)",
		quietCPU, quietTook.Round(time.Millisecond), 100*quietCPU.Seconds()/quietTook.Seconds(),
		noisyCPU, noisyTook.Round(time.Millisecond), 100*noisyCPU.Seconds()/noisyTook.Seconds())
	for i, id := range noisyIDs {
		if id == victim.ID {
			continue
		}
		var rep struct {
			Events map[string]uint64 `json:"events"`
			Lost   map[string]uint64 `json:"lost"`
		}
		d.api.want(t, http.StatusOK, "GET", "/jails/"+id+"/report", nil, &rep)
		t.Logf("%s: events %v, lost %v", noisyNeighbours[i].name, rep.Events, rep.Lost)
	}
	ratio := func(a, b time.Duration) float64 { return float64(a) / float64(b) }
	t.Logf("exec true in the jail: quiet median %v p90 %v p99 %v; noisy median %v p90 %v p99 %v (p90 %.2f×, p99 %.2f×)",
		quiet[n/2], p90(quiet), p99(quiet), noisy[n/2], p90(noisy), p99(noisy), ratio(p90(noisy), p90(quiet)), ratio(p99(noisy), p99(quiet)))
	t.Logf("bare /bin/true on the host: quiet median %v p90 %v p99 %v; noisy median %v p90 %v p99 %v (p90 %.2f×, p99 %.2f×)",
		bareQuiet[n/2], p90(bareQuiet), p99(bareQuiet), bareNoisy[n/2], p90(bareNoisy), p99(bareNoisy), ratio(p90(bareNoisy), p90(bareQuiet)), ratio(p99(bareNoisy), p99(bareQuiet)))
	t.Logf("/bin/true through %d relays on the host: quiet median %v p90 %v p99 %v; noisy median %v p90 %v p99 %v (p90 %.2f×, p99 %.2f×)",
		relayDepth+1, relayQuiet[n/2], p90(relayQuiet), p99(relayQuiet), relayNoisy[n/2], p90(relayNoisy), p99(relayNoisy), ratio(p90(relayNoisy), p90(relayQuiet)), ratio(p99(relayNoisy), p99(relayQuiet)))
	for _, pc := range []struct {
		name string
		at   func([]time.Duration) time.Duration
	}{{"p90", p90}, {"p99", p99}} {
		grew, floor := ratio(pc.at(noisy), pc.at(quiet)), ratio(pc.at(bareNoisy), pc.at(bareQuiet))
		if bound := max(noisyBound, noisyFloorSlack*floor); grew > bound {
			t.Errorf("exec %s grew %.2f× with noisy neighbours (%v → %v), more than %.2f× (twice, or %.1f× the bare spawn's %.2f×)",
				pc.name, grew, pc.at(quiet), pc.at(noisy), bound, noisyFloorSlack, floor)
		}
	}
	// Each noisy jail is destroyed promptly, its noise still going.
	for i, id := range noisyIDs {
		if id == victim.ID {
			continue
		}
		start := time.Now()
		d.api.want(t, http.StatusNoContent, "DELETE", "/jails/"+id, nil, nil)
		took := time.Since(start)
		t.Logf("%s: destroyed in %v", noisyNeighbours[i].name, took.Round(time.Millisecond))
		if took > noisyDestroyBound {
			t.Errorf("destroying the %s jail took %v, more than %v", noisyNeighbours[i].name, took, noisyDestroyBound)
		}
	}
}
