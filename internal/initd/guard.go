package initd

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/procstat"
)

// Bounds on init's waits for a shim: a shim that a jail's root stopped
// (SIGSTOP) must not wedge a command's start or kill.
const (
	// shimAnswerTimeout bounds the wait for a shim's answer to a run.
	shimAnswerTimeout = 5 * time.Second
	// shimKillGrace is how long a shim has, once asked to kill its
	// command, to report the exit before init kills the shim itself (its
	// command then dies with it, through its parent-death signal).
	shimKillGrace = 5 * time.Second
)

// protectSelf makes the calling process non-dumpable, so that nothing in
// the jail can ptrace it, read or write its memory (/proc/PID/mem,
// process_vm_writev) or open its /proc entries: all of these need
// CAP_SYS_PTRACE against a non-dumpable process, which no jail process
// holds, root included. execve resets the flag, so the commands a shim
// starts stay debuggable. It fails when a tracer attached before the
// flag was set (the window between execve and this call).
func protectSelf() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("make the process non-dumpable: %w", err)
	}
	pid, err := tracerPid()
	if err != nil {
		return err
	}
	if pid != 0 {
		return fmt.Errorf("traced by pid %d", pid)
	}
	return nil
}

// tracerPid returns the pid tracing the calling process (0: none).
func tracerPid() (int, error) {
	st, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, l := range bytes.Split(st, []byte("\n")) {
		if v, ok := bytes.CutPrefix(l, []byte("TracerPid:")); ok {
			return strconv.Atoi(string(bytes.TrimSpace(v)))
		}
	}
	return 0, fmt.Errorf("no TracerPid in /proc/self/status")
}

// stopped reports whether process pid is stopped (by a signal or a
// tracer).
func stopped(pid int) bool {
	st, err := procstat.Read(pid)
	return err == nil && st.Stopped()
}

// withoutReadOverride runs fork on an OS thread whose effective
// capabilities lack CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (capabilities
// are a thread's: the process's other threads keep them), so that a
// process it starts execs as one that cannot read files it has no read
// permission on. The thread has them again before anything else runs on
// it; if they cannot be restored, its goroutine exits locked to it, so
// that nothing ever runs there again.
func withoutReadOverride(fork func() (int, error)) (int, error) {
	type result struct {
		pid int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		var r result
		saved, err := dropReadOverride()
		if err != nil {
			runtime.UnlockOSThread() // capset changes nothing when it fails
			ch <- result{err: err}
			return
		}
		r.pid, r.err = fork()
		ch <- r
		if setCaps(saved) == nil {
			runtime.UnlockOSThread()
		}
	}()
	r := <-ch
	return r.pid, r.err
}

// capState is a thread's capability sets.
type capState [2]unix.CapUserData

// dropReadOverride clears CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the
// calling thread's effective capabilities (they stay permitted) and
// returns the sets it had.
func dropReadOverride() (capState, error) {
	var saved capState
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	if err := unix.Capget(&hdr, &saved[0]); err != nil {
		return saved, fmt.Errorf("capget: %w", err)
	}
	dropped := saved
	dropped[0].Effective &^= 1<<unix.CAP_DAC_OVERRIDE | 1<<unix.CAP_DAC_READ_SEARCH
	return saved, setCaps(dropped)
}

// setCaps sets the calling thread's capability sets.
func setCaps(c capState) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	if err := unix.Capset(&hdr, &c[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}
