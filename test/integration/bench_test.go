package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The benchmarks report medians with b.ReportMetric; `make bench` prints
// them as a table (scripts/benchtable.sh). Metric units:
//
//	ms            agentjail's median, in milliseconds
//	ref-ms        the reference's median (raw runc), in milliseconds
//	x-ref         agentjail's median over the reference's
//	target-ms     the target for agentjail's median
//	*-MiB         memory, in MiB (target-MiB: its target)

// median returns the median of samples.
func median(samples []time.Duration) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// timeCreateExec creates a jail from body (POST /jails), runs argv in it,
// and returns the time from the create call to the exec's answer; the
// command must exit 0. The jail is destroyed with b's timer stopped.
func (d *daemon) timeCreateExec(b *testing.B, body map[string]any, argv []string) time.Duration {
	b.Helper()
	start := time.Now()
	var j jailInfo
	d.api.want(b, http.StatusCreated, "POST", "/jails", body, &j)
	res := d.exec(b, j.ID, execReq{Cmd: argv})
	took := time.Since(start)
	if res.ExitCode != 0 {
		b.Fatalf("exec %q: %s", argv, &res)
	}
	b.StopTimer()
	d.destroy(b, j.ID)
	b.StartTimer()
	return took
}

// reportVsRef reports agentjail's and the reference's medians and their ratio.
func reportVsRef(b *testing.B, ours, ref []time.Duration, target time.Duration) {
	mo, mr := median(ours), median(ref)
	b.ReportMetric(ms(mo), "ms")
	b.ReportMetric(ms(mr), "ref-ms")
	if mr > 0 {
		b.ReportMetric(float64(mo)/float64(mr), "x-ref")
	}
	b.ReportMetric(ms(target), "target-ms")
}

// refBundle is an OCI bundle equivalent to a jail for raw runc: a read-only
// root with the host's /usr, the same namespaces, its own cgroup.
type refBundle struct {
	dir   string // the bundle
	state string // runc --root
}

// newRefBundle makes a bundle whose process runs argv.
func newRefBundle(b *testing.B, argv []string) *refBundle {
	b.Helper()
	dir := b.TempDir()
	rb := &refBundle{dir: dir, state: filepath.Join(dir, "state")}
	root := filepath.Join(dir, "rootfs")
	for _, d := range []string{"usr", "proc", "dev", "sys", "tmp", "etc", "workspace"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	for _, l := range []string{"bin", "sbin", "lib", "lib64"} {
		if target, err := os.Readlink("/" + l); err == nil {
			if err := os.Symlink(target, filepath.Join(root, l)); err != nil {
				b.Fatal(err)
			}
		}
	}
	if out, err := exec.Command("runc", "spec", "--bundle", dir).CombinedOutput(); err != nil {
		b.Fatalf("runc spec: %v\n%s", err, out)
	}
	var spec map[string]any
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		b.Fatal(err)
	}
	if err := json.Unmarshal(data, &spec); err != nil {
		b.Fatal(err)
	}
	proc := spec["process"].(map[string]any)
	proc["terminal"] = false
	proc["args"] = argv
	proc["cwd"] = "/workspace"
	spec["root"] = map[string]any{"path": "rootfs", "readonly": true}
	spec["mounts"] = append(spec["mounts"].([]any), map[string]any{
		"destination": "/usr", "type": "bind", "source": "/usr", "options": []string{"rbind", "ro", "nosuid", "nodev"},
	})
	spec["linux"].(map[string]any)["cgroupsPath"] = "/agentjail-bench/" + filepath.Base(dir)
	out, err := json.Marshal(spec)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), out, 0o644); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		// runc removes each container's cgroup, not their common parent.
		parents, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", "agentjail-bench"))
		for _, p := range parents {
			os.Remove(p)
		}
	})
	return rb
}

// run runs the bundle to completion with `runc run` and returns its stdout.
func (rb *refBundle) run(b *testing.B, id string) string {
	b.Helper()
	cmd := exec.Command("runc", "--root", rb.state, "run", "--bundle", rb.dir, id)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		b.Fatalf("runc run: %v\n%s", err, stderr.String())
	}
	return stdout.String()
}

// BenchmarkCreateToFirstExec times POST /jails (started) until `echo hi`
// has run in the new jail, against `runc run` of an equivalent bundle. The
// daemon keeps two ready jails (serve's default): "ms" is a create served
// from that pool, measured with the pool full as on a daemon that is not
// creating jails back to back; "cold-ms" is a create that misses the pool
// (its configuration differs from the default: one environment variable)
// and starts a container.
func BenchmarkCreateToFirstExec(b *testing.B) {
	d := newDaemon(b, "--warm-jails", "2")
	rb := newRefBundle(b, []string{"echo", "hi"})
	var ours, cold, ref []time.Duration
	createExec := func(spec map[string]any) (time.Duration, string) {
		start := time.Now()
		var j jailInfo
		d.api.want(b, http.StatusCreated, "POST", "/jails", spec, &j)
		res := d.exec(b, j.ID, execReq{Cmd: []string{"echo", "hi"}})
		took := time.Since(start)
		if res.Stdout != "hi\n" {
			b.Fatalf("exec: %s", &res)
		}
		return took, j.ID
	}
	b.ResetTimer()
	for i := range b.N {
		// Each create starts with the pool full and not refilling, so
		// that no background start weighs on any of the three measures.
		b.StopTimer()
		d.waitWarm(b)
		b.StartTimer()
		took, coldID := createExec(map[string]any{"name": uniqueName(b), "env": map[string]string{"BENCH": "cold"}})
		cold = append(cold, took)
		start := time.Now()
		out := rb.run(b, fmt.Sprintf("ref-%d-%d", os.Getpid(), i))
		ref = append(ref, time.Since(start))
		if out != "hi\n" {
			b.Fatalf("runc run printed %q", out)
		}
		took, warmID := createExec(map[string]any{"name": uniqueName(b)})
		ours = append(ours, took)
		// Destroying is not part of the measure, but keeps the host at
		// the same load for every iteration.
		b.StopTimer()
		d.destroy(b, warmID)
		d.destroy(b, coldID)
		b.StartTimer()
	}
	b.StopTimer()
	reportVsRef(b, ours, ref, 50*time.Millisecond)
	b.ReportMetric(ms(median(cold)), "cold-ms")
	if h := d.health(b); h.Warm == nil || h.Warm.Taken < uint64(b.N) {
		b.Fatalf("the warm pool served %+v of %d creates", h.Warm, b.N)
	}
}

// runcContainer returns the runc container id of jail id in the daemon's
// runc state root.
func runcContainer(b *testing.B, d *daemon, id string) (state, container string) {
	b.Helper()
	state = filepath.Join(d.dir, "run", "runc")
	out, err := exec.Command("runc", "--root", state, "list", "-q").Output()
	if err != nil {
		b.Fatalf("runc list: %v", err)
	}
	for _, c := range strings.Fields(string(out)) {
		if strings.Contains(c, id) {
			return state, c
		}
	}
	b.Fatalf("no runc container for jail %s in %s: %q", id, state, out)
	return "", ""
}

// BenchmarkExecTrue times an exec round trip of `true` through the API,
// against `runc exec` in the same jail's container. The two run in
// separate blocks: a `runc exec` starts a tree of processes in the jail
// whose syscalls the daemon is still recording when the next command
// starts, and interleaving the two timed that work into the API's exec.
//
// Two more figures put the round trip in proportion: the same round trip
// in a jail whose tracing is off (traced-off-ms), and the floor of any
// exec here: a process inside the jail spawning `true` and waiting for it,
// with no daemon, init or shim on the way (floor-ms).
func BenchmarkExecTrue(b *testing.B) {
	d := shared(b)
	j := d.createJail(b, nil)
	untraced := d.createJail(b, map[string]any{"tracing": map[string]any{"mode": "off"}})
	state, ctr := runcContainer(b, d, j.ID)
	roundTrips := func(id string) []time.Duration {
		var ds []time.Duration
		for range b.N {
			start := time.Now()
			res := d.exec(b, id, execReq{Cmd: []string{"true"}})
			ds = append(ds, time.Since(start))
			if res.ExitCode != 0 {
				b.Fatalf("exec true: %s", &res)
			}
		}
		return ds
	}
	var ref []time.Duration
	b.ResetTimer()
	ours := roundTrips(j.ID)
	for range b.N {
		start := time.Now()
		if out, err := exec.Command("runc", "--root", state, "exec", ctr, "true").CombinedOutput(); err != nil {
			b.Fatalf("runc exec: %v\n%s", err, out)
		}
		ref = append(ref, time.Since(start))
	}
	off := roundTrips(untraced.ID)
	// The least any call through the API costs: an authenticated request
	// answered without reaching a jail.
	var rtt []time.Duration
	for range b.N {
		start := time.Now()
		d.api.want(b, http.StatusOK, "GET", "/whoami", nil, nil)
		rtt = append(rtt, time.Since(start))
	}
	b.StopTimer()
	floor := spawnFloor(b, d, untraced.ID, b.N)
	reportVsRef(b, ours, ref, 3*time.Millisecond)
	b.ReportMetric(ms(median(off)), "traced-off-ms")
	b.ReportMetric(ms(floor), "floor-ms")
	b.ReportMetric(float64(median(ours))/float64(floor), "x-floor")
	b.ReportMetric(ms(median(rtt)), "api-rtt-ms")
	b.ReportMetric(float64(median(ours))/float64(floor+median(rtt)), "x-floor+rtt")
}

// spawnFloorScript spawns `true` n times (argv[1]) from one process and
// prints the median spawn-to-reaped time in nanoseconds.
const spawnFloorScript = `
import os, sys, time
ds = []
for _ in range(int(sys.argv[1])):
    t = time.perf_counter_ns()
    os.waitpid(os.posix_spawn("/usr/bin/true", ["true"], os.environ), 0)
    ds.append(time.perf_counter_ns() - t)
ds.sort()
print(ds[len(ds) // 2])
`

// spawnFloor is the median time, inside jail id, for a process to spawn
// `true` and reap it: what an exec costs before any messaging.
func spawnFloor(b *testing.B, d *daemon, id string, n int) time.Duration {
	b.Helper()
	res := d.exec(b, id, execReq{Cmd: []string{"python3", "-c", spawnFloorScript, strconv.Itoa(n)}, TimeoutMs: 60_000})
	ns, err := strconv.ParseInt(strings.TrimSpace(res.Stdout), 10, 64)
	if res.ExitCode != 0 || err != nil {
		b.Fatalf("spawn floor: %s", &res)
	}
	return time.Duration(ns)
}

// privateKiB is the memory only pid uses: Private_Clean + Private_Dirty of
// /proc/<pid>/smaps_rollup.
func privateKiB(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, err
	}
	var total int64
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && (f[0] == "Private_Clean:" || f[0] == "Private_Dirty:") {
			n, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0, err
			}
			total += n
		}
	}
	return total, nil
}

// rollupKiB reads a "Name:  N kB" field of /proc/<pid>/smaps_rollup.
func rollupKiB(pid int, field string) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				return strconv.ParseInt(f[0], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/smaps_rollup", field, pid)
}

// statusKiB reads a "Name:  N kB" field of /proc/<pid>/status.
func statusKiB(pid int, field string) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				return strconv.ParseInt(f[0], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

const mib = 1 << 20

// idleJails creates n started jails concurrently on d and returns them
// with the time it took; they are destroyed when the benchmark ends.
func idleJails(b *testing.B, d *daemon, n int) ([]jailInfo, time.Duration) {
	b.Helper()
	jails := make([]jailInfo, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := d.api.send("POST", "/jails", map[string]any{"name": fmt.Sprintf("%s-%d", uniqueName(b), i)})
			switch {
			case err != nil:
				errs[i] = err
			case r.status != http.StatusCreated:
				errs[i] = fmt.Errorf("POST /jails: %s", r)
			default:
				errs[i] = json.Unmarshal(r.body, &jails[i])
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	b.Cleanup(func() {
		var wg sync.WaitGroup
		for _, j := range jails {
			if j.ID != "" {
				wg.Add(1)
				go func() {
					defer wg.Done()
					d.destroy(b, j.ID)
				}()
			}
		}
		wg.Wait()
	})
	failed := 0
	for i, err := range errs {
		if err != nil {
			failed++
			if failed <= 5 {
				b.Errorf("jail %d: %v", i, err)
			}
		}
	}
	if failed > 0 {
		b.Fatalf("%d of %d concurrent creates failed; the daemon's errors:\n%s", failed, n, d.errorLines(5))
	}
	return jails, took
}

// memOnce caches the idle-memory measure: it does not depend on b.N.
var memOnce = struct {
	sync.Once
	initRSS, initPrivate, cgroup, daemonPer float64
	err                                     error
}{}

// BenchmarkIdleJailMemory measures an idle jail's memory: init's RSS and private memory, the
// jail cgroup's usage, and the daemon's RSS growth per jail (10 jails).
func BenchmarkIdleJailMemory(b *testing.B) {
	requireEnv(b)
	memOnce.Do(func() {
		memOnce.err = fmt.Errorf("the first run failed")
		d := newDaemon(b)
		const n = 10
		// A first jail warms the daemon's caches (templates, pools).
		idleJails(b, d, 1)
		before, err := statusKiB(d.pid, "VmRSS")
		if err != nil {
			memOnce.err = err
			return
		}
		jails, _ := idleJails(b, d, n)
		var initKiB, initPrivKiB, cgBytes int64
		for _, j := range jails {
			k, err := statusKiB(j.Pid, "VmRSS")
			if err != nil {
				memOnce.err = err
				return
			}
			initKiB += k
			// Most of init's RSS is the binary's text, shared by every
			// jail's init through the page cache: its own memory is the
			// private part (and its proportional share, PSS).
			priv, err := privateKiB(j.Pid)
			if err != nil {
				memOnce.err = err
				return
			}
			initPrivKiB += priv
			raw, err := os.ReadFile(filepath.Join(cgroupRoot, "memory", jailCgroupOf(j.ID), "memory.usage_in_bytes"))
			if err != nil {
				memOnce.err = err
				return
			}
			v, _ := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
			cgBytes += v
		}
		after, err := statusKiB(d.pid, "VmRSS")
		if err != nil {
			memOnce.err = err
			return
		}
		memOnce.initRSS = float64(initKiB) / 1024 / n
		memOnce.initPrivate = float64(initPrivKiB) / 1024 / n
		memOnce.cgroup = float64(cgBytes) / mib / n
		memOnce.daemonPer = float64(after-before) / 1024 / n
		memOnce.err = nil
	})
	if memOnce.err != nil {
		b.Fatal(memOnce.err)
	}
	b.ReportMetric(memOnce.initRSS, "init-rss-MiB")
	b.ReportMetric(memOnce.initPrivate, "init-private-MiB")
	b.ReportMetric(memOnce.cgroup, "cgroup-MiB")
	b.ReportMetric(memOnce.daemonPer, "daemon-per-jail-MiB")
	b.ReportMetric(memOnce.initPrivate+memOnce.daemonPer, "total-MiB")
	b.ReportMetric(8, "target-MiB")
}

// concOnce caches the 100-jail measure: one round is the measure.
var concOnce = struct {
	sync.Once
	took      time.Duration
	daemonRSS float64
	err       error
}{}

// BenchmarkCreate100Concurrent creates 100 started jails at once: all must
// succeed; it reports the total time and the daemon's RSS afterwards.
func BenchmarkCreate100Concurrent(b *testing.B) {
	requireEnv(b)
	concOnce.Do(func() {
		concOnce.err = fmt.Errorf("the first run failed")
		d := newDaemon(b)
		jails, took := idleJails(b, d, 100)
		for _, j := range jails {
			if j.Status != "running" {
				b.Fatalf("jail %s: %s", j.ID, j.Status)
			}
		}
		rss, err := statusKiB(d.pid, "VmRSS")
		if err != nil {
			b.Fatal(err)
		}
		concOnce.took, concOnce.daemonRSS, concOnce.err = took, float64(rss)/1024, nil
	})
	if concOnce.err != nil {
		b.Fatal(concOnce.err)
	}
	b.ReportMetric(ms(concOnce.took), "total-ms")
	b.ReportMetric(ms(concOnce.took)/100, "ms/jail")
	b.ReportMetric(concOnce.daemonRSS, "daemon-rss-MiB")
}
