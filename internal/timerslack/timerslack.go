// Package timerslack gives agentjail's own processes a coarse timer slack
// and the processes they start for a jail's user the ordinary one.
//
// The kernel may end a thread's timed sleep up to its timer slack late, so
// that wake-ups due close together happen as one. The Go runtime's monitor
// thread sleeps 20 µs at a time for as long as any goroutine of the process
// runs or sits in a system call: with the ordinary slack (50 µs) it woke
// about sixteen times in each exec in each of the daemon, init and the
// shim. Every wake-up is a context switch, which in a virtual machine costs
// several microseconds of CPU beside the work it interrupts. With Coarse it
// wakes once or twice, and an exec through the API takes about a tenth less.
//
// A thread's slack passes to the threads and processes it creates and
// stays across execve, and the runtime makes its monitor thread before any
// code of the program runs. So the daemon re-executes itself once with
// Coarse (Reexec); the runtime it starts (runc) and through it each jail's
// init and shims inherit it. What runs a jail's user code gets Ordinary
// back at its start (StartOrdinary): each command a shim starts, and gVisor's
// sandbox, whose timers are the jail's.
package timerslack

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// Coarse is the timer slack of agentjail's own processes.
	Coarse = 500 * time.Microsecond
	// Ordinary is the kernel's default timer slack, which every process
	// started for a jail's user gets.
	Ordinary = 50 * time.Microsecond
)

// get returns the calling thread's timer slack.
func get() (time.Duration, error) {
	ns, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	if err != nil {
		return 0, fmt.Errorf("get timer slack: %w", err)
	}
	return time.Duration(ns), nil
}

// set sets the calling thread's timer slack.
func set(d time.Duration) error {
	if err := unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(d.Nanoseconds()), 0, 0, 0); err != nil {
		return fmt.Errorf("set timer slack: %w", err)
	}
	return nil
}

// ErrNotSet is returned by Reexec when the kernel keeps the thread's
// slack as it is (a real-time thread has none).
var ErrNotSet = errors.New("the kernel keeps this thread's timer slack")

// Reexec makes every thread of the calling program run with Coarse: when
// the calling thread does not have it, it re-executes the program (same
// pid, arguments, environment and open descriptors without close-on-exec)
// from a thread set to Coarse, and does not return. It returns nil when
// the slack is Coarse already, and an error when it cannot be set or the
// program cannot be executed; the program then runs on as it was.
//
// Call it first thing in a long-lived process, before it holds anything
// that close-on-exec would drop.
func Reexec() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cur, err := get()
	if err != nil || cur == Coarse {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("re-execute with timer slack %v: %w", Coarse, err)
	}
	if err := set(Coarse); err != nil {
		return err
	}
	if got, err := get(); err != nil || got != Coarse {
		_ = set(cur)
		return fmt.Errorf("re-execute with timer slack %v: %w", Coarse, ErrNotSet)
	}
	err = syscall.Exec(exe, os.Args, os.Environ())
	_ = set(cur)
	return fmt.Errorf("re-execute %s with timer slack %v: %w", exe, Coarse, err)
}

// StartOrdinary runs start, which starts a process, on a thread whose slack is
// Ordinary for the time of the call, so that the process it forks (and
// everything that process starts) has the ordinary slack. Where the kernel
// will not change the slack (gVisor keeps none), start runs as it is. The
// calling goroutine keeps its thread to itself until start returns.
func StartOrdinary(start func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cur, err := get()
	if err != nil || cur == Ordinary || set(Ordinary) != nil {
		return start()
	}
	defer func() { _ = set(cur) }()
	return start()
}
