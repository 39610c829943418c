package integration

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// The observation benchmarks compare a fully traced jail with one whose
// tracing is off (the reference), running the same workload; strace -f in
// the untraced jail is the other reference. A traced jail is made afresh
// for each run so its event files do not pile up.

// timedSh runs script in a jail and returns its wall time as the jail's
// init measured it.
func timedSh(b *testing.B, d *daemon, id, script string) time.Duration {
	b.Helper()
	res := d.shAs(b, id, "", script)
	if res.ExitCode != 0 {
		b.Fatalf("%s: %s", script, &res)
	}
	return time.Duration(res.DurationMs * float64(time.Millisecond))
}

// lostOf returns the events a jail's report counts as lost.
func lostOf(b *testing.B, d *daemon, id string) uint64 {
	var rep struct {
		Lost map[string]uint64 `json:"lost"`
	}
	d.api.want(b, http.StatusOK, "GET", "/jails/"+id+"/report", nil, &rep)
	var n uint64
	for _, v := range rep.Lost {
		n += v
	}
	return n
}

func benchTracedVsOff(b *testing.B, setup, workload string, target float64, withStrace bool) {
	d := shared(b)
	off := d.createJail(b, map[string]any{"tracing": map[string]any{"mode": "off"}})
	if setup != "" {
		timedSh(b, d, off.ID, setup)
	}
	var ours, ref, strace []time.Duration
	var lost uint64
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		traced := d.createJail(b, nil)
		if setup != "" {
			timedSh(b, d, traced.ID, setup)
		}
		b.StartTimer()
		ours = append(ours, timedSh(b, d, traced.ID, workload))
		ref = append(ref, timedSh(b, d, off.ID, workload))
		b.StopTimer()
		lost += lostOf(b, d, traced.ID)
		d.destroy(b, traced.ID)
		b.StartTimer()
	}
	if withStrace {
		strace = append(strace, timedSh(b, d, off.ID, "strace -f -o /dev/null sh -c '"+strings.ReplaceAll(workload, "'", `'\''`)+"'"))
	}
	b.StopTimer()
	mo, mr := median(ours), median(ref)
	b.ReportMetric(ms(mo), "ms")
	b.ReportMetric(ms(mr), "ref-ms")
	b.ReportMetric(float64(mo)/float64(mr), "x-ref")
	b.ReportMetric(target, "target-x")
	b.ReportMetric(float64(lost), "lost-events")
	if len(strace) > 0 {
		b.ReportMetric(float64(median(strace))/float64(mr), "strace-x")
	}
}

// BenchmarkTracedSyscallHeavy is seed 000's worst case: one syscall per
// byte. Target: ≤ 3× untraced, 0 events lost.
func BenchmarkTracedSyscallHeavy(b *testing.B) {
	benchTracedVsOff(b, "", "dd if=/dev/zero of=/dev/null bs=1 count=200000 2>/dev/null", 3, true)
}

// BenchmarkTracedAgentWorkload is a realistic agent step: clone a local
// repository and byte-compile it. Target: ≤ 1.3× untraced.
func BenchmarkTracedAgentWorkload(b *testing.B) {
	const setup = `set -e
rm -rf /tmp/src && mkdir -p /tmp/src && cp -r /usr/lib/python3.11/json /usr/lib/python3.11/email /usr/lib/python3.11/http /tmp/src/
cd /tmp/src && git init -q && git add -A && git -c user.email=a@b -c user.name=a commit -qm init`
	const workload = `rm -rf /tmp/clone && git clone -q /tmp/src /tmp/clone && python3 -m compileall -q /tmp/clone >/dev/null`
	benchTracedVsOff(b, setup, workload, 1.3, false)
}
