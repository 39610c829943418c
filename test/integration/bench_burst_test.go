package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// percentile is the nearest-rank p-th percentile of samples (p in 0..100).
func percentile(samples []time.Duration, p float64) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// newBusyboxBundle is the bursts' reference: a bundle whose whole root is
// a static busybox, running /bin/true, with runc's default namespaces and
// a cgroup of its own, and no network set up.
func newBusyboxBundle(b *testing.B) *refBundle {
	b.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		b.Fatalf("the reference needs a static busybox (busybox-static, installed by make setup): %v", err)
	}
	dir := b.TempDir()
	rb := &refBundle{dir: dir, state: filepath.Join(dir, "state")}
	root := filepath.Join(dir, "rootfs")
	for _, d := range []string{"bin", "proc", "dev", "sys"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), data, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.Symlink("busybox", filepath.Join(root, "bin", "true")); err != nil {
		b.Fatal(err)
	}
	if out, err := exec.Command("runc", "spec", "--bundle", dir).CombinedOutput(); err != nil {
		b.Fatalf("runc spec: %v\n%s", err, out)
	}
	var spec map[string]any
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		b.Fatal(err)
	}
	if err := json.Unmarshal(raw, &spec); err != nil {
		b.Fatal(err)
	}
	proc := spec["process"].(map[string]any)
	proc["terminal"] = false
	proc["args"] = []string{"/bin/true"}
	spec["root"] = map[string]any{"path": "rootfs", "readonly": true}
	spec["linux"].(map[string]any)["cgroupsPath"] = "/agentjail-bench/" + filepath.Base(dir)
	out, err := json.Marshal(spec)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), out, 0o644); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		parents, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", "agentjail-bench"))
		for _, p := range parents {
			os.Remove(p)
		}
	})
	return rb
}

// burstOnce caches the bursts' measures: one round is the measure.
var burstOnce = struct {
	sync.Once
	ref, first, again, conc, cold []time.Duration
	grown                         int
	err                           error
}{}

// BenchmarkCreateBurst times what an agent framework starting a batch
// sees: creates through the API, each until `true` has run in the new
// jail, against `runc run` of a minimal bundle (newBusyboxBundle) timed
// in the same run. The daemon runs on serve's defaults (two ready jails,
// the pool growing after bursts):
//
//	first-*      50 creates one after another on a daemon that saw none
//	burst-*      the same again once the pool has grown to the first burst
//	conc20-*     20 creates at once, then
//	cold-*       creates that no ready jail fits (each its own environment)
//
// p50 and p99 (nearest rank) of each, and their ratios to the
// reference's median. Targets: burst p50 ≤ 0.5×, p99 ≤ 1.5×; conc20 p50 ≤
// 2×; cold ≤ 2×.
func BenchmarkCreateBurst(b *testing.B) {
	requireEnv(b)
	burstOnce.Do(func() {
		burstOnce.err = fmt.Errorf("the first run failed")
		d := newDaemon(b, "--warm-jails", "2")
		rb := newBusyboxBundle(b)
		d.waitWarm(b)
		createExec := func(spec map[string]any) (time.Duration, string) {
			start := time.Now()
			var j jailInfo
			d.api.want(b, http.StatusCreated, "POST", "/jails", spec, &j)
			res := d.exec(b, j.ID, execReq{Cmd: []string{"true"}})
			took := time.Since(start)
			if res.ExitCode != 0 {
				b.Fatalf("exec true: %s", &res)
			}
			return took, j.ID
		}
		destroyAll := func(ids []string) {
			var wg sync.WaitGroup
			for _, id := range ids {
				wg.Add(1)
				go func() {
					defer wg.Done()
					d.destroy(b, id)
				}()
			}
			wg.Wait()
		}
		refRuns := func(n int) {
			for i := range n {
				start := time.Now()
				rb.run(b, fmt.Sprintf("bb-%d-%d-%d", os.Getpid(), len(burstOnce.ref), i))
				burstOnce.ref = append(burstOnce.ref, time.Since(start))
			}
		}
		sequential := func(n int) []time.Duration {
			var ds []time.Duration
			var ids []string
			for range n {
				took, id := createExec(map[string]any{"name": uniqueName(b)})
				ds = append(ds, took)
				ids = append(ids, id)
			}
			destroyAll(ids)
			return ds
		}
		refRuns(10)
		burstOnce.first = sequential(50)
		refRuns(10)
		d.waitWarm(b)
		burstOnce.grown = d.health(b).Warm.Ready
		burstOnce.again = sequential(50)
		refRuns(10)
		d.waitWarm(b)

		conc := make([]time.Duration, 20)
		ids := make([]string, 20)
		var wg sync.WaitGroup
		for i := range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				conc[i], ids[i] = createExec(map[string]any{"name": uniqueName(b)})
			}()
		}
		wg.Wait()
		burstOnce.conc = conc
		destroyAll(ids)
		d.waitWarm(b)
		refRuns(10)

		// Cold: a configuration of its own each time, so no pool fits.
		for i := range 10 {
			took, id := createExec(map[string]any{"name": uniqueName(b), "env": map[string]string{"BENCH_COLD": fmt.Sprint(i)}})
			burstOnce.cold = append(burstOnce.cold, took)
			d.destroy(b, id)
		}
		burstOnce.err = nil
	})
	if burstOnce.err != nil {
		b.Fatal(burstOnce.err)
	}
	ref := median(burstOnce.ref)
	x := func(d time.Duration) float64 { return float64(d) / float64(ref) }
	o := &burstOnce
	b.ReportMetric(ms(ref), "ref-ms")
	b.ReportMetric(ms(percentile(o.first, 50)), "first-p50-ms")
	b.ReportMetric(x(percentile(o.first, 50)), "first-p50-x-ref")
	b.ReportMetric(x(percentile(o.first, 99)), "first-p99-x-ref")
	b.ReportMetric(float64(o.grown), "grown-ready")
	b.ReportMetric(ms(percentile(o.again, 50)), "burst-p50-ms")
	b.ReportMetric(x(percentile(o.again, 50)), "burst-p50-x-ref")
	b.ReportMetric(ms(percentile(o.again, 99)), "burst-p99-ms")
	b.ReportMetric(x(percentile(o.again, 99)), "burst-p99-x-ref")
	b.ReportMetric(ms(percentile(o.conc, 50)), "conc20-p50-ms")
	b.ReportMetric(x(percentile(o.conc, 50)), "conc20-p50-x-ref")
	b.ReportMetric(ms(median(o.cold)), "cold-ms")
	b.ReportMetric(x(median(o.cold)), "cold-x-ref")
}

// BenchmarkCreateCold times creates that no ready jail fits (each with an
// environment of its own), through the API until `true` has run in the
// new jail, on a daemon with serve's default pool of two ready jails,
// each create right after a `runc run` of the minimal bundle
// (newBusyboxBundle) that is its reference. It reports the medians and
// their ratio (target ≤ 2×). BenchmarkCreateCold50 measures the same
// beside fifty ready jails.
func BenchmarkCreateCold(b *testing.B) {
	coldCreates(b, 2)
}

// BenchmarkCreateCold50 is BenchmarkCreateCold with fifty ready jails on
// the daemon (as after a burst): each has its network attached, so this
// shows what a new jail's network attachment costs beside them.
func BenchmarkCreateCold50(b *testing.B) {
	coldCreates(b, 50)
}

// coldCreates times cold creates against `runc run` on a daemon keeping
// ready ready jails (see BenchmarkCreateCold), and reports the load
// average of the machine before and after.
func coldCreates(b *testing.B, ready int) {
	requireEnv(b)
	d := newDaemon(b, "--warm-jails", fmt.Sprint(ready))
	rb := newBusyboxBundle(b)
	d.waitWarm(b)
	load := func() float64 {
		var l float64
		if raw, err := os.ReadFile("/proc/loadavg"); err == nil {
			fmt.Sscan(string(raw), &l)
		}
		return l
	}
	loadBefore := load()
	var ref, cold []time.Duration
	b.ResetTimer()
	for i := range max(b.N, 15) {
		start := time.Now()
		rb.run(b, fmt.Sprintf("bbc-%d-%d", os.Getpid(), i))
		ref = append(ref, time.Since(start))
		cold = append(cold, d.timeCreateExec(b, map[string]any{"name": uniqueName(b), "env": map[string]string{"BENCH_COLD": fmt.Sprint(i)}}, []string{"true"}))
	}
	b.StopTimer()
	if h := d.health(b); h.Warm == nil || h.Warm.Taken != 0 || h.Warm.Ready < ready {
		b.Fatalf("a ready jail served a create meant to be cold, or the pool is not full: %+v", h.Warm)
	}
	b.ReportMetric(ms(median(ref)), "ref-ms")
	b.ReportMetric(ms(median(cold)), "cold-ms")
	b.ReportMetric(float64(median(cold))/float64(median(ref)), "cold-x-ref")
	b.ReportMetric(loadBefore, "load-before")
	b.ReportMetric(load(), "load-after")
}
