package integration

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	ajclient "github.com/agentjail/agentjail/client"
)

// BenchmarkVMSnapshots measures the vm level's snapshots beside the
// container level's, on one daemon, each on a jail running a counter
// loop: a full snapshot (and how long the jail was frozen), a restore, and
// a branch ×10 (each median of three; the branches are destroyed between
// runs). BenchmarkLevels has the vm level's create → first exec, exec
// round trip, syscall cost and idle memory beside the other levels'.
func BenchmarkVMSnapshots(b *testing.B) {
	d := newDaemon(b)
	if !levelAvailable(b, ajclient.New("http://"+d.addr, d.token), "vm") {
		return
	}
	type figures struct{ snap, frozen, restore, branch10 time.Duration }
	got := map[string]*figures{}
	for _, level := range []string{"container", "vm"} {
		j := d.createJail(b, map[string]any{"isolation": map[string]any{"level": level}})
		if res := d.shAs(b, j.ID, "", counterScript); res.ExitCode != 0 {
			b.Fatalf("%s: counter: %s", level, &res)
		}
		d.waitCounting(b, j.ID, 0)
		var snap, frozen, restore, branch10 []time.Duration
		for i := range 3 {
			start := time.Now()
			var s snapshotInfo
			d.api.want(b, http.StatusCreated, "POST", "/jails/"+j.ID+"/snapshot", map[string]any{}, &s)
			snap = append(snap, time.Since(start))
			frozen = append(frozen, time.Duration(s.FrozenMs*float64(time.Millisecond)))
			start = time.Now()
			var r jailInfo
			d.api.want(b, http.StatusCreated, "POST", "/snapshots/"+s.ID+"/restore", map[string]any{}, &r)
			restore = append(restore, time.Since(start))
			d.destroy(b, r.ID)
			start = time.Now()
			var out struct {
				Jails []jailInfo `json:"jails"`
			}
			d.api.want(b, http.StatusCreated, "POST", "/snapshots/"+s.ID+"/branch",
				map[string]any{"count": 10, "name_prefix": fmt.Sprintf("%s-%s-b%d", uniqueName(b), level, i)}, &out)
			branch10 = append(branch10, time.Since(start))
			for _, bj := range out.Jails {
				d.destroy(b, bj.ID)
			}
			d.api.want(b, http.StatusNoContent, "DELETE", "/snapshots/"+s.ID, nil, nil)
		}
		d.destroy(b, j.ID)
		got[level] = &figures{median(snap), median(frozen), median(restore), median(branch10)}
	}
	c, v := got["container"], got["vm"]
	report := func(name string, vm, ref time.Duration) {
		b.Run(name, func(b *testing.B) {
			b.ReportMetric(ms(vm), "ms")
			b.ReportMetric(ms(ref), "ref-ms")
			b.ReportMetric(float64(vm)/float64(ref), "x-ref")
		})
	}
	report("snapshot/vm-vs-container", v.snap, c.snap)
	report("frozen/vm-vs-container", v.frozen, c.frozen)
	report("restore/vm-vs-container", v.restore, c.restore)
	report("branch10/vm-vs-container", v.branch10, c.branch10)
}
