package initd

import (
	"bytes"
	"fmt"
	"os"
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
