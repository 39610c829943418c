package bpf

import (
	"strconv"
	"strings"
	"testing"

	"github.com/agentjail/agentjail/internal/observe"
)

// coalesceScript feeds synthetic syscall events through a coalescer and
// records what reaches the sink as "name×count" strings.
type coalesceScript struct {
	c   coalescer
	out []observe.Event
	ts  int64
}

func (s *coalesceScript) Handle(ev *observe.Event) { s.out = append(s.out, *ev) }
func (s *coalesceScript) Idle()                    {}

func (s *coalesceScript) sys(tid int32, name string, ret int64, path string, args ...uint64) {
	nr, ok := observe.SyscallNumber(name)
	if !ok {
		panic(name)
	}
	s.ts += 10
	ev := observe.Event{Type: observe.TypeSyscall, TS: s.ts, HostPID: tid, HostTID: tid, PID: tid, TID: tid,
		Comm: "dd", NR: int32(nr), Ret: ret, DurNS: 3, Path: path, FD: -1, FDs: [2]int32{-1, -1}}
	copy(ev.Args[:], args)
	s.c.handle(&ev, s)
}

func (s *coalesceScript) take() string {
	var parts []string
	for _, ev := range s.out {
		p := ev.Name() + "×" + itoa(ev.Calls())
		if ev.HostTID != 1 {
			p = "t" + itoa(int64(ev.HostTID)) + ":" + p
		}
		parts = append(parts, p)
	}
	s.out = nil
	return strings.Join(parts, " ")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestCoalescerCopyLoop: a copy loop's alternating reads and writes become
// one counted event each, with the first call's start, the last call's and
// the summed duration; every call is in a count.
func TestCoalescerCopyLoop(t *testing.T) {
	s := &coalesceScript{}
	for range 1000 {
		s.sys(1, "read", 1, "", 0, 4096, 1)
		s.sys(1, "write", 1, "", 1, 4096, 1)
	}
	if got := s.take(); got != "" {
		t.Fatalf("delivered while the run goes on: %s", got)
	}
	s.c.flush(s)
	if len(s.out) != 2 {
		t.Fatalf("after flush: %s", s.take())
	}
	r, w := s.out[0], s.out[1]
	if r.Name() != "read" || r.Count != 1000 || r.TS != 10 || r.LastTS != 19990 || r.DurNS != 3000 {
		t.Errorf("read run: count %d ts %d last %d dur %d", r.Count, r.TS, r.LastTS, r.DurNS)
	}
	if w.Name() != "write" || w.Count != 1000 || w.TS != 20 || w.LastTS != 20000 {
		t.Errorf("write run: count %d ts %d last %d", w.Count, w.TS, w.LastTS)
	}
	b := string(r.AppendJSON(nil))
	if !strings.Contains(b, `"count":1000`) || !strings.Contains(b, `"last_ts_ns":19990`) {
		t.Errorf("JSON of a run: %s", b)
	}
	s.out = nil
	s.c.flush(s)
	if got := s.take(); got != "" {
		t.Errorf("second flush delivered %s", got)
	}
}

// TestCoalescerKernelRuns: the counted records of runs the kernel held
// join the coalescer's runs: a single call, then the kernel's count of its
// repetitions, make one event standing for all of them, with the first
// start, the kernel run's last start and every call's duration.
func TestCoalescerKernelRuns(t *testing.T) {
	s := &coalesceScript{}
	s.sys(1, "read", 1, "", 0, 4096, 1) // ts 10, recorded at once
	nr, _ := observe.SyscallNumber("read")
	run := observe.Event{Type: observe.TypeSyscall, TS: 20, LastTS: 5000, Count: 499, DurNS: 1497, HostPID: 1, HostTID: 1,
		PID: 1, TID: 1, Comm: "dd", NR: int32(nr), Ret: 1, FD: -1, FDs: [2]int32{-1, -1}}
	run.Args[1], run.Args[2] = 4096, 1
	s.c.handle(&run, s)
	s.sys(1, "read", 1, "", 0, 4096, 1) // ts 20
	s.c.flush(s)
	if len(s.out) != 1 {
		t.Fatalf("after flush: %s", s.take())
	}
	if r := s.out[0]; r.Count != 501 || r.TS != 10 || r.LastTS != 20 || r.DurNS != 1503 {
		t.Errorf("read run: count %d ts %d last %d dur %d, want 501, 10, 20, 1503", r.Count, r.TS, r.LastTS, r.DurNS)
	}
	s.out = nil
	s.c.handle(&run, s) // a kernel run first: its count and its last start
	s.c.flush(s)
	if r := s.out[0]; len(s.out) != 1 || r.Count != 499 || r.TS != 20 || r.LastTS != 5000 {
		t.Errorf("kernel run alone: %d events, count %d ts %d last %d", len(s.out), r.Count, r.TS, r.LastTS)
	}
}

// TestCoalescerOrder: held runs are delivered before any event that is not
// held, before a third distinct call of the task, and a call that differs
// in its return value or arguments starts a run of its own.
func TestCoalescerOrder(t *testing.T) {
	s := &coalesceScript{}
	s.sys(1, "read", 5, "", 3, 100, 5)
	s.sys(1, "read", 5, "", 3, 100, 5)
	s.sys(1, "read", 0, "", 3, 100, 5) // end of file: another call
	s.sys(1, "getpid", 1, "")          // a third one: the two runs go first
	if got := s.take(); got != "read×2 read×1" {
		t.Fatalf("third distinct call: %q", got)
	}
	s.sys(1, "getpid", 1, "")
	s.sys(2, "write", 4, "", 1, 200, 4) // another task holds its own run
	s.sys(2, "write", 4, "", 1, 200, 4)
	s.sys(1, "close", 0, "", 3) // changes the descriptor table: never held, everything before it goes first
	if got := s.take(); got != "getpid×2 t2:write×2 close×1" {
		t.Fatalf("before a close: %q", got)
	}
	s.sys(1, "openat", 3, "/etc/passwd", 0xffffff9c, 0, 0) // a path: never held
	s.sys(1, "openat", 3, "/etc/passwd", 0xffffff9c, 0, 0)
	if got := s.take(); got != "openat×1 openat×1" {
		t.Fatalf("calls with paths: %q", got)
	}
	s.sys(1, "clock_gettime", 0, "", 1, 7000)
	s.sys(1, "clock_gettime", 0, "", 1, 7008) // another buffer: another call
	s.c.flush(s)
	if got := s.take(); got != "clock_gettime×1 clock_gettime×1" {
		t.Fatalf("different arguments: %q", got)
	}
}

// TestCoalescerBounded: no more than maxRunTasks tasks hold runs at once.
func TestCoalescerBounded(t *testing.T) {
	s := &coalesceScript{}
	for tid := range int32(maxRunTasks + 10) {
		s.sys(tid+1, "getppid", 1, "")
		if len(s.c.pending) > maxRunTasks {
			t.Fatalf("%d tasks hold runs", len(s.c.pending))
		}
	}
	s.c.flush(s)
	if len(s.out) != maxRunTasks+10 {
		t.Fatalf("%d events delivered for %d calls", len(s.out), maxRunTasks+10)
	}
}
