package integration

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"
)

// scalingLevels are the numbers of running jails the scaling table
// measures at.
var scalingLevels = []int{1, 10, 50, 100}

// scaleOnce caches the scaling measures: one round is the measure.
var scaleOnce = struct {
	sync.Once
	create, exec, snapshot, branch map[int]time.Duration
	rss, idleCPU                   map[int]float64
	err                            error
}{}

// BenchmarkScaling measures how the cost of the operations grows with the
// work a daemon holds: with 1, 10, 50 and 100 idle jails running, the
// median of a cold create (no ready jails: started until `true` ran in
// it, then destroyed), an exec round trip of `true`, a full snapshot of a
// small jail, a branch of one from it (until it answers an exec), the
// daemon's RSS, and the CPU the daemon uses while nothing happens (the
// quieter of two 3 s windows after the measures, in percent of one core).
// docs/scaling.md holds a run's table.
func BenchmarkScaling(b *testing.B) {
	requireEnv(b)
	scaleOnce.Do(func() {
		o := &scaleOnce
		o.err = fmt.Errorf("the first run failed")
		o.create, o.exec, o.snapshot, o.branch = map[int]time.Duration{}, map[int]time.Duration{}, map[int]time.Duration{}, map[int]time.Duration{}
		o.rss, o.idleCPU = map[int]float64{}, map[int]float64{}
		d := newDaemon(b)
		probe := d.createJail(b, nil)
		running := 1
		for _, n := range scalingLevels {
			if n > running {
				idleJails(b, d, n-running)
				running = n
			}
			var create, execs, snaps, branches []time.Duration
			for range 5 {
				create = append(create, d.timeCreateExec(b, map[string]any{"name": uniqueName(b)}, []string{"true"}))
			}
			for range 50 {
				start := time.Now()
				if res := d.exec(b, probe.ID, execReq{Cmd: []string{"true"}}); res.ExitCode != 0 {
					b.Fatalf("exec true: %s", &res)
				}
				execs = append(execs, time.Since(start))
			}
			for range 3 {
				start := time.Now()
				var s snapshotInfo
				d.api.want(b, http.StatusCreated, "POST", "/jails/"+probe.ID+"/snapshot", map[string]any{}, &s)
				snaps = append(snaps, time.Since(start))
				start = time.Now()
				var out struct {
					Jails []jailInfo `json:"jails"`
				}
				d.api.want(b, http.StatusCreated, "POST", "/snapshots/"+s.ID+"/branch", map[string]any{"count": 1, "name_prefix": uniqueName(b)}, &out)
				if len(out.Jails) != 1 {
					b.Fatalf("branch of one made %d jails", len(out.Jails))
				}
				if res := d.exec(b, out.Jails[0].ID, execReq{Cmd: []string{"true"}}); res.ExitCode != 0 {
					b.Fatalf("exec true in the branch: %s", &res)
				}
				branches = append(branches, time.Since(start))
				d.destroy(b, out.Jails[0].ID)
				d.api.want(b, http.StatusNoContent, "DELETE", "/snapshots/"+s.ID, nil, nil)
			}
			rss, err := statusKiB(d.pid, "VmRSS")
			if err != nil {
				b.Fatal(err)
			}
			o.create[n], o.exec[n], o.snapshot[n], o.branch[n] = median(create), median(execs), median(snaps), median(branches)
			o.rss[n] = float64(rss) / 1024
			o.idleCPU[n] = idleCPUPercent(b, d.pid)
		}
		o.err = nil
	})
	if scaleOnce.err != nil {
		b.Fatal(scaleOnce.err)
	}
	o := &scaleOnce
	for _, n := range scalingLevels {
		b.ReportMetric(ms(o.create[n]), fmt.Sprintf("create-ms@%d", n))
		b.ReportMetric(ms(o.exec[n]), fmt.Sprintf("exec-ms@%d", n))
		b.ReportMetric(ms(o.snapshot[n]), fmt.Sprintf("snapshot-ms@%d", n))
		b.ReportMetric(ms(o.branch[n]), fmt.Sprintf("branch-ms@%d", n))
		b.ReportMetric(o.rss[n], fmt.Sprintf("daemon-rss-MiB@%d", n))
		b.ReportMetric(o.idleCPU[n], fmt.Sprintf("daemon-idle-cpu-%%@%d", n))
	}
}

// idleCPUPercent is the CPU process pid uses while no request comes, in
// percent of one core: the quieter of two 3 s windows (the first may still
// hold the end of earlier work).
func idleCPUPercent(tb testing.TB, pid int) float64 {
	const window = 3 * time.Second
	least := time.Duration(-1)
	for range 2 {
		before := procCPU(tb, pid)
		time.Sleep(window)
		if used := procCPU(tb, pid) - before; least < 0 || used < least {
			least = used
		}
	}
	return 100 * least.Seconds() / window.Seconds()
}
