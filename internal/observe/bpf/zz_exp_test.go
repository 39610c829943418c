package bpf

import (
	"runtime"
	"syscall"
	"testing"
	"time"
	"errors"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

func loopCPU() float64 {
	const n = 1000000
	best := 1e18
	for range 3 {
		var ts unix.Timespec
		unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
		start := ts.Nano()
		for range n {
			syscall.Getppid()
		}
		unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
		best = min(best, float64(ts.Nano()-start)/n)
	}
	return best
}

func TestExpOverhead(t *testing.T) {
	runtime.LockOSThread()
	base := loopCPU()
	spec, _ := loadObserve()
	var objs observeObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil { t.Fatal(err) }
	defer objs.Close()
	var ls []link.Link
	for _, p := range []*ebpf.Program{objs.SysEnter, objs.SysExit} {
		l, _ := link.AttachTracing(link.TracingOptions{Program: p, AttachType: ebpf.AttachTraceRawTp})
		ls = append(ls, l)
	}
	two := loopCPU()
	for _, p := range []*ebpf.Program{objs.SchedFork, objs.SchedExec, objs.SchedExit} {
		l, _ := link.AttachTracing(link.TracingOptions{Program: p, AttachType: ebpf.AttachTraceRawTp})
		ls = append(ls, l)
	}
	five := loopCPU()
	rd, _ := ringbuf.NewReader(objs.Events)
	withrd := loopCPU()
	go func() {
		var rec ringbuf.Record
		for {
			rd.SetDeadline(time.Now().Add(10 * time.Millisecond))
			if err := rd.ReadInto(&rec); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				return
			}
		}
	}()
	withloop := loopCPU()
	t.Logf("reader loop %.1f", withloop)
	rd.Close()
	for _, l := range ls { l.Close() }
	t.Logf("base %.1f, sys progs %.1f, +sched %.1f, +reader %.1f, base again %.1f", base, two, five, withrd, loopCPU())
}
