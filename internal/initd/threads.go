package initd

import (
	"os"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/initproto"
)

// Init and the shims are Go processes in the jail's pids cgroup, which
// the jail's commands can fill (a fork bomb, or just many commands at
// once). The Go runtime aborts a process when it needs an OS thread it
// cannot create ("fatal error: newosproc"): an init that needed one more
// thread while the jail was full would end the jail, a shim the command
// it waits for. Both therefore make the threads they need when they
// start: the runtime keeps an idle thread for good and takes one from its
// idle list before it creates one. The work that holds a thread for long
// in init is bounded (files API operations take one of threadSlots, shim
// starts are one at a time in reaper.start); short system calls hold one
// only while the kernel runs them, which the spare threads cover.
const (
	// initThreads is how many threads init makes at start: as many as it
	// holds after serving execs, terminals and files API calls at once
	// (threadSlots of them), with room to spare.
	initThreads = 12
	// threadSlots bounds init's concurrent thread-holding operations.
	threadSlots = 4
	// shimThreads is the shim's: as many as it holds after serving
	// commands, with room to spare.
	shimThreads = 7
)

// reserveThreads makes the Go runtime hold at least n OS threads, all
// but the caller's idle, by locking goroutines to threads of their own
// until the process has n and letting them go. It makes n at most.
func reserveThreads(n int) {
	release := make(chan struct{})
	defer close(release)
	for range n {
		if threadCount() >= n {
			return
		}
		locked := make(chan struct{})
		go func() {
			runtime.LockOSThread()
			close(locked)
			<-release
			runtime.UnlockOSThread()
		}()
		<-locked
	}
}

// threadCount is how many threads the process has, or 0 when /proc cannot
// tell.
func threadCount() int {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0
	}
	return len(tasks)
}

// jailThreads hands out init's slots for thread-holding work.
type jailThreads chan struct{}

func newJailThreads() jailThreads { return make(jailThreads, threadSlots) }

// opThread is a files API operation's hold on a slot and on the thread it
// runs on, which the jail's observation records: init's other calls
// (serving execs, keeping connections) are plumbing and left out of the
// syscall stream, while the file operations it makes for the API are the
// jail's activity. No other goroutine runs on the thread meanwhile.
type opThread struct{ slots jailThreads }

// recorded runs f, a files API operation, in a slot on a recorded thread.
func (j jailThreads) recorded(f func(th *opThread) error) error {
	th := &opThread{slots: j}
	th.take()
	defer th.give()
	return f(th)
}

func (th *opThread) take() {
	th.slots <- struct{}{}
	runtime.LockOSThread()
	// An error (EINVAL) is the expected answer: the option is a mark for
	// the tracer, not one the kernel acts on.
	_ = unix.Prctl(initproto.RecordOption, 1, 0, 0, 0)
}

func (th *opThread) give() {
	_ = unix.Prctl(initproto.RecordOption, 0, 0, 0, 0)
	runtime.UnlockOSThread()
	<-th.slots
}

// off runs f, a wait on the operation's connection (a client that reads
// or sends a file slowly), without the slot and off the recorded thread.
func (th *opThread) off(f func() error) error {
	th.give()
	defer th.take()
	return f()
}
