package oci

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/procstat"
	"github.com/agentjail/agentjail/internal/storage"
)

// A daemon killed while it drove the runtime leaves the runtime running:
// `runc create`, `runc restore` (with CRIU and its action script below it)
// or `runc checkpoint` carry on without it. Such strays are found by their
// command line (the runtime's state directory and the container id) and
// by their parent not being this process.
//
// Reading a process's command line takes its memory map lock, which a
// jail's processes can hold for long stretches (a fork bomb holds it on
// every fork: 38 s to read them all was measured beside one), so only
// processes that can be the runtime's are read: those in this process's
// pid namespace and owned by its user. A jail's processes are in a pid
// namespace of their own, or run as a user of the jail's own.

// Strays returns the pids of runtime processes acting on container id (for
// verb, when not "") that this process did not start.
func (r *Runtime) Strays(id, verb string) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	pidns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return nil
	}
	uid := uint32(os.Geteuid())
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self || !mayBeOurs(e.Name(), pidns, uid) {
			continue
		}
		raw, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(raw) == 0 {
			continue
		}
		args := strings.Split(string(bytes.TrimRight(raw, "\x00")), "\x00")
		if args[len(args)-1] != id || !r.ownsArgs(args) || (verb != "" && !slices.Contains(args, verb)) {
			continue
		}
		if st, err := procstat.Read(pid); err == nil && st.PPID == self {
			continue
		}
		out = append(out, pid)
	}
	return out
}

// mayBeOurs reports whether process pid is in pid namespace pidns and
// owned by uid: the checks that do not take its memory map lock.
func mayBeOurs(pid, pidns string, uid uint32) bool {
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/"+pid, &st); err != nil || st.Uid != uid {
		return false
	}
	ns, err := os.Readlink("/proc/" + pid + "/ns/pid")
	return err == nil && ns == pidns
}

// ownsArgs reports whether a command line is this Runtime's: it names the
// runtime's state directory with --root.
func (r *Runtime) ownsArgs(args []string) bool {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--root" && args[i+1] == r.rc.Root {
			return true
		}
	}
	return false
}

// WaitStrays waits until no stray runtime process acts on id (for verb,
// when not "") or ctx ends; it returns the pids still running then.
func (r *Runtime) WaitStrays(ctx context.Context, id, verb string) []int {
	for {
		left := r.Strays(id, verb)
		if len(left) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return left
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// KillStrays SIGKILLs the stray runtime processes acting on id, waits
// (up to 10 s) until they have exited (their files closed, their mounts
// let go), and unmounts what they left mounted in id's state directory
// (the root a killed restore had bound for CRIU).
func (r *Runtime) KillStrays(ctx context.Context, id string) error {
	// Each stray is held by a pidfd from before the kill, so that the wait
	// is for that process (not its pid, which another could take) and
	// lasts until it has exited, not only until its command line is gone.
	held := map[int]int{} // pid → pidfd
	defer func() {
		for _, fd := range held {
			unix.Close(fd)
		}
	}()
	for _, pid := range r.Strays(id, "") {
		fd, err := unix.PidfdOpen(pid, 0)
		if errors.Is(err, unix.ESRCH) {
			continue
		}
		if err != nil {
			return fmt.Errorf("stray runtime process %d of %s: %w", pid, id, err)
		}
		held[pid] = fd
	}
	if err := r.killHeld(ctx, id, held); err != nil {
		return err
	}
	return storage.UnmountAll(filepath.Join(r.rc.Root, id))
}

// killHeld SIGKILLs the processes held (pid → pidfd) that are still strays
// of id now that they are held (a pid that changed hands meanwhile is not
// one), and waits until they have exited.
func (r *Runtime) killHeld(ctx context.Context, id string, held map[int]int) error {
	if len(held) == 0 {
		return nil
	}
	var killed []unix.PollFd
	for _, pid := range r.Strays(id, "") {
		fd, ok := held[pid]
		if !ok {
			continue
		}
		if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("stray runtime process %d of %s: %w", pid, id, err)
		}
		killed = append(killed, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
	}
	if err := waitExited(ctx, killed, 10*time.Second); err != nil {
		return fmt.Errorf("stray runtime processes of %s: %w", id, err)
	}
	return nil
}

// waitExited waits until every process held by fds (pidfds, POLLIN) has
// exited, at most timeout or until ctx ends.
func waitExited(ctx context.Context, fds []unix.PollFd, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for len(fds) > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return fmt.Errorf("%d did not exit %v after SIGKILL", len(fds), timeout)
		}
		// Short polls, so that ctx is seen.
		_, err := unix.Poll(fds, int(min(wait, 100*time.Millisecond)/time.Millisecond)+1)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return err
		}
		fds = slices.DeleteFunc(fds, func(p unix.PollFd) bool { return p.Revents != 0 })
	}
	return nil
}
