package bpf

import "github.com/agentjail/agentjail/internal/observe"

// Syscall numbers the coalescer treats specially (x86_64).
const (
	nrRead, nrWrite       = 0, 1
	nrPread64, nrPwrite64 = 17, 18
	nrReadv, nrWritev     = 19, 20
	nrSendto, nrRecvfrom  = 44, 45
	nrSendmsg, nrRecvmsg  = 46, 47
	nrClone, nrFork       = 56, 57
	nrVfork, nrExecve     = 58, 59
	nrExit, nrExitGroup   = 60, 231
	nrExecveat, nrClone3  = 322, 435
	nrPreadv, nrPwritev   = 295, 296
	nrPreadv2, nrPwritev2 = 327, 328
)

// coalescible[nr] is true for the syscalls whose identical repetitions may
// be recorded as one counted event: every syscall but those that change
// what later events mean — the descriptor table, working directory and
// files the file tracker follows (the reads and writes it only counts
// stay coalescible), and the process calls (clone, exec, exit).
var coalescible = func() (c [observe.MaxSyscall]bool) {
	for nr := range c {
		c[nr] = true
	}
	for _, nr := range observe.FileSyscalls() {
		c[nr] = false
	}
	for _, nr := range []int{nrRead, nrWrite, nrPread64, nrPwrite64, nrReadv, nrWritev, nrPreadv, nrPwritev,
		nrPreadv2, nrPwritev2, nrSendto, nrRecvfrom, nrSendmsg, nrRecvmsg} {
		c[nr] = true
	}
	for _, nr := range []int{nrClone, nrClone3, nrFork, nrVfork, nrExecve, nrExecveat, nrExit, nrExitGroup} {
		c[nr] = false
	}
	return c
}()

// kernelCoalescible returns the kernel side's coalesce_mask: the
// coalescible calls that decode no strings, addresses or descriptors, whose
// repetitions the kernel may count in runs of its own (observe.bpf.c).
func kernelCoalescible() (mask [kernelMaxSyscalls / 64]uint64) {
	for nr, ok := range coalescible {
		if ok && argSpecs[nr] == 0 && nr < kernelMaxSyscalls {
			mask[nr>>6] |= 1 << (nr & 63)
		}
	}
	return mask
}

// Bounds of the coalescer: the distinct calls one task's run may alternate
// between, and the tasks that may hold a run at once (more flushes them).
const (
	runSlots    = 2
	maxRunTasks = 256
)

// coalescer records runs of identical syscalls as counted events: while a
// task repeats calls with the same number, arguments and return value
// (alternating between at most runSlots of them, as a copy loop alternates
// read and write), they are held as one event each whose Count says how
// many calls it stands for, TS is the first call's start, LastTS the last
// one's and DurNS their summed duration. Calls with decoded strings or
// descriptors (paths, addresses, pipe fds) are never coalesced: their
// content may differ behind equal pointers.
//
// Held runs are delivered before any other event of the jail (so every
// event that changes what a descriptor means comes after the calls made
// before it), when a task's run meets a call it cannot hold, and by flush,
// which the tracer calls every poll period and before a jail's lost events
// and Unwatch. A coalescer belongs to one watchState; the tracer's t.mu
// guards it.
type coalescer struct {
	tasks   map[int32]*runTask // by host tid, the tasks holding a run
	pending []*runTask         // the same tasks, in the order their runs began
	last    *runTask           // the task of the previous syscall, if it holds a run
	free    []*runTask
}

// runTask is one task's held runs.
type runTask struct {
	tid  int32
	n    int
	runs [runSlots]observe.Event
}

// handle delivers ev to sink, or holds it as part of a run.
func (c *coalescer) handle(ev *observe.Event, sink observe.Sink) {
	if c.hold(ev) {
		return
	}
	c.flush(sink)
	if !c.hold(ev) {
		sink.Handle(ev)
	}
}

// hold adds ev to its task's runs and reports whether it did.
func (c *coalescer) hold(ev *observe.Event) bool {
	if ev.Type != observe.TypeSyscall || ev.NR < 0 || int(ev.NR) >= len(coalescible) || !coalescible[ev.NR] ||
		ev.Path != "" || ev.Path2 != "" || ev.Addr != "" || ev.FDs != [2]int32{-1, -1} {
		return false
	}
	rt := c.last
	if rt == nil || rt.tid != ev.HostTID {
		rt = c.tasks[ev.HostTID]
	}
	if rt != nil {
		c.last = rt
		for i := range rt.n {
			r := &rt.runs[i]
			if r.NR == ev.NR && r.Args == ev.Args && r.Ret == ev.Ret && r.Flags == ev.Flags && r.Comm == ev.Comm {
				r.Count += ev.Calls()
				r.LastTS = lastStart(ev)
				r.DurNS += ev.DurNS
				return true
			}
		}
		if rt.n == runSlots {
			return false
		}
	} else {
		if len(c.pending) >= maxRunTasks {
			return false
		}
		if n := len(c.free); n > 0 {
			rt = c.free[n-1]
			c.free = c.free[:n-1]
		} else {
			rt = &runTask{}
		}
		rt.tid, rt.n = ev.HostTID, 0
		if c.tasks == nil {
			c.tasks = make(map[int32]*runTask)
		}
		c.tasks[ev.HostTID] = rt
		c.pending = append(c.pending, rt)
		c.last = rt
	}
	r := &rt.runs[rt.n]
	rt.n++
	*r = *ev
	r.Count = ev.Calls()
	r.LastTS = lastStart(ev)
	return true
}

// lastStart returns the start of the last call ev stands for: a run the
// kernel counted carries it, a single call starts at TS.
func lastStart(ev *observe.Event) int64 {
	if ev.Count > 1 {
		return ev.LastTS
	}
	return ev.TS
}

// flush delivers every held run to sink, task by task in the order their
// runs began, each task's runs in the order they began.
func (c *coalescer) flush(sink observe.Sink) {
	if len(c.pending) == 0 {
		return
	}
	for _, rt := range c.pending {
		for i := range rt.n {
			sink.Handle(&rt.runs[i])
			rt.runs[i] = observe.Event{} // drop references to strings
		}
		rt.n = 0
		delete(c.tasks, rt.tid)
		c.free = append(c.free, rt)
	}
	clear(c.pending)
	c.pending = c.pending[:0]
	c.last = nil
}
