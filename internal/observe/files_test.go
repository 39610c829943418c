package observe

import (
	"strings"
	"testing"
)

// script drives a FileTracker with synthetic events and records what it
// emits as "op path bytes" strings.
type script struct {
	ft  *FileTracker
	out []string
	ts  int64
	// hostless sends events without host ids, as a source whose threads
	// are not host threads does.
	hostless bool
}

func newScript() *script {
	s := &script{}
	s.ft = NewFileTracker(func(ev *Event) {
		line := ev.Op + " " + ev.Path
		if ev.Path2 != "" {
			line += " -> " + ev.Path2
		}
		if ev.Op == "read" || ev.Op == "write" {
			line += " " + itoa(ev.Bytes)
		}
		s.out = append(s.out, line)
	})
	return s
}

func itoa(n int64) string {
	b := appendIntField(nil, "", n)
	return string(b[4:])
}

func (s *script) sys(tid int32, name string, ret int64, path string, args ...uint64) {
	nr, _ := SyscallNumber(name)
	ev := Event{Type: TypeSyscall, HostPID: tid, HostTID: tid, PID: tid, TID: tid, NR: int32(nr), Ret: ret, Path: path}
	copy(ev.Args[:], args)
	if s.hostless {
		ev.HostPID, ev.HostTID = 0, 0
	}
	s.ts++
	ev.TS = s.ts
	s.ft.Handle(&ev)
}

func (s *script) proc(op string, caller, tid int32, mods func(*Event)) {
	ev := Event{Type: TypeProc, Op: op, CallerTID: caller, HostPID: tid, HostTID: tid, PID: tid, TID: tid}
	if s.hostless {
		ev.HostPID, ev.HostTID = 0, 0
	}
	if mods != nil {
		mods(&ev)
	}
	s.ft.Handle(&ev)
}

func (s *script) take() string {
	r := strings.Join(s.out, "; ")
	s.out = nil
	return r
}

const atFDCWDArg = uint64(0xffffff9c) // -100 as the kernel passes the int

func TestFileTrackerOpenReadWriteDup(t *testing.T) {
	s := newScript()
	s.proc("exec", 10, 10, func(e *Event) { e.Cwd = "/work" })
	s.sys(10, "openat", 3, "out.txt", atFDCWDArg, 0, oWronly|oCreat)
	s.sys(10, "write", 100, "", 3)
	s.sys(10, "dup2", 1, "", 3, 1)
	s.sys(10, "write", 50, "", 1)
	s.sys(10, "close", 0, "", 3)
	if got := s.take(); got != "open /work/out.txt" {
		t.Fatalf("after close of one dup: %q", got)
	}
	s.sys(10, "close", 0, "", 1)
	if got := s.take(); got != "write /work/out.txt 150; close /work/out.txt" {
		t.Fatalf("last close: %q", got)
	}
	s.sys(10, "mkdirat", 0, "d", atFDCWDArg, 0o755)
	s.sys(10, "renameat2", 0, "a", atFDCWDArg, 0, atFDCWDArg, 0)
	s.sys(10, "unlinkat", 0, "/tmp/x/../y", atFDCWDArg, 0, 0x200)
	s.sys(10, "open", -2, "/nope", 0)
	if got := s.take(); got != "mkdir /work/d; rename /work/a; rmdir /tmp/y" {
		t.Fatalf("path ops: %q", got)
	}
}

// TestFileTrackerHostless: events without host ids (a user-space kernel's)
// are tracked per jail thread: a child's table is its own.
func TestFileTrackerHostless(t *testing.T) {
	s := newScript()
	s.hostless = true
	s.proc("exec", 1, 1, func(e *Event) { e.Cwd = "/w" })
	s.sys(1, "openat", 3, "f", atFDCWDArg, 0, oWronly|oCreat)
	s.proc("fork", 1, 2, nil)
	s.sys(2, "write", 7, "", 3)
	s.sys(2, "close", 0, "", 3)
	if got := s.take(); got != "open /w/f" {
		t.Fatalf("the child's close while the parent holds the file: %q", got)
	}
	s.proc("exit", 0, 1, nil)
	if got := s.take(); got != "write /w/f 7; close /w/f" {
		t.Fatalf("the parent's exit: %q", got)
	}
	if n := s.ft.Tasks(); n != 1 {
		t.Errorf("%d tasks tracked, want the child only", n)
	}
}

func TestFileTrackerForkExecCloexec(t *testing.T) {
	s := newScript()
	s.proc("exec", 1, 1, func(e *Event) { e.Cwd = "/" })
	s.sys(1, "open", 3, "/keep", 0)
	s.sys(1, "open", 4, "/cloexec", 0, oCloexec)
	s.sys(1, "pipe2", 0, "", 0, 0)
	// The child gets a copy of the table.
	s.proc("fork", 1, 2, nil)
	s.sys(2, "read", 10, "", 3)
	s.sys(1, "close", 0, "", 3)
	if got := s.take(); got != "open /keep; open /cloexec" {
		t.Fatalf("parent close while the child holds it: %q", got)
	}
	// exec in the child closes the O_CLOEXEC descriptor (still open in the
	// parent, so nothing is reported yet).
	s.proc("exec", 2, 2, func(e *Event) { e.Cwd = "/" })
	s.sys(1, "close", 0, "", 4)
	if got := s.take(); got != "close /cloexec" {
		t.Fatalf("after exec + parent close: %q", got)
	}
	s.proc("exit", 0, 2, nil)
	if got := s.take(); got != "read /keep 10; close /keep" {
		t.Fatalf("child exit: %q", got)
	}
	// A thread shares the table: its close is the process's close.
	s.sys(1, "openat", 5, "/shared", atFDCWDArg, 0, 0)
	s.proc("fork", 1, 3, func(e *Event) { e.Thread, e.SharedFiles = true, true })
	s.sys(3, "close", 0, "", 5)
	if got := s.take(); got != "open /shared; close /shared" {
		t.Fatalf("thread close: %q", got)
	}
	s.sys(1, "open", 6, "/a", 0)
	s.sys(1, "open", 7, "/b", 0)
	s.sys(1, "close_range", 0, "", 6, ^uint64(0)>>32, 0)
	if got := s.take(); !strings.Contains(got, "close /a") || !strings.Contains(got, "close /b") {
		t.Fatalf("close_range: %q", got)
	}
	if s.ft.Tasks() != 2 {
		t.Errorf("tasks %d, want 2 (process and thread)", s.ft.Tasks())
	}
}

// TestFileTrackerCountedCalls: a syscall event standing for a run of
// identical calls moves its bytes once per call.
func TestFileTrackerCountedCalls(t *testing.T) {
	s := newScript()
	s.proc("exec", 10, 10, func(e *Event) { e.Cwd = "/work" })
	s.sys(10, "openat", 3, "out.txt", atFDCWDArg, 0, oWronly|oCreat)
	nr, _ := SyscallNumber("write")
	ev := Event{Type: TypeSyscall, HostPID: 10, HostTID: 10, PID: 10, TID: 10, NR: int32(nr), Ret: 512, Args: [6]uint64{3, 4096, 512}, Count: 1000}
	s.ft.Handle(&ev)
	s.sys(10, "close", 0, "", 3)
	if got := s.take(); got != "open /work/out.txt; write /work/out.txt 512000; close /work/out.txt" {
		t.Fatalf("counted writes: %q", got)
	}
}

// TestFileTrackerBoundsPaths: a process going down directories by relative
// steps without end (mkdir d, chdir d, ...) does not make the tracked
// working directory, or the paths of its events, grow past the tracker's
// bound: they keep their start and their end.
func TestFileTrackerBoundsPaths(t *testing.T) {
	s := newScript()
	s.proc("exec", 10, 10, func(e *Event) { e.Cwd = "/tmp" })
	for range 3000 {
		s.sys(10, "mkdir", 0, "d0123456789", 0o755)
		s.sys(10, "chdir", 0, "d0123456789")
	}
	s.sys(10, "mkdir", 0, "last", 0o755)
	for _, l := range s.out {
		if p := strings.TrimPrefix(l, "mkdir "); len(p) > maxTrackedPath {
			t.Fatalf("a path of %d bytes was recorded", len(p))
		}
	}
	last := s.out[len(s.out)-1]
	if !strings.HasPrefix(last, "mkdir /tmp/d0123456789/d0123456789/") || !strings.HasSuffix(last, "/d0123456789/d0123456789/last") || !strings.Contains(last, "/…/") {
		t.Fatalf("the deepest path does not keep its start and end: %q...%q", last[:60], last[len(last)-60:])
	}
}
