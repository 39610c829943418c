package initd

import (
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/confine"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/procstat"
	"github.com/agentjail/agentjail/internal/timerslack"
)

// The shim is a small root process between init and each command: init
// re-executes its own binary as `init --shim` with a SOCK_SEQPACKET control
// socket on fd 3. The shim marks itself a child subreaper, so every
// descendant of its command that is orphaned (a double fork, a setsid()
// daemon) is reparented to it rather than to init; killing "the command
// and all its descendants" is then killing every descendant of the shim
// until it has no child left.
//
// A shim serves commands one after another. After a command exits, the
// shim reports whether it has descendants left: a clean shim goes back to
// init's pool of idle shims (so the Go runtime start-up of the shim is not
// paid per command). A shim with leftovers exits when its spec says
// HandOff, and they are reparented to init: PID 1 of the jail, which reaps
// every orphan and whose end ends them all. Otherwise (init outside a pid
// namespace) it stays with them as their subreaper and exits when they
// have all exited, or kills them when init asks or closes the control
// socket.
//
// Control messages are one type byte followed by JSON.
const (
	shimMsgRun     = 'r' // init → shim: shimSpec, with stdin/stdout/stderr fds as SCM_RIGHTS
	shimMsgKill    = 'k' // init → shim: kill the command's tree (or the leftovers)
	shimMsgStarted = 's' // shim → init: shimStarted
	shimMsgExit    = 'x' // shim → init: shimExit
	shimMsgReady   = 'y' // shim → init, once: started, with its threads made (no body)
)

// shimCtrlFd is the shim's control socket.
const shimCtrlFd = 3

// shimSpec is a command for the shim to run.
type shimSpec struct {
	Path   string
	Argv   []string
	Env    []string
	Dir    string
	UID    int
	GID    int
	Groups []int
	// Tty makes the command's stdin (a terminal) its controlling
	// terminal.
	Tty bool
	// HandOff leaves the command's leftovers to init when it exits: the
	// shim then exits instead of staying their subreaper.
	HandOff bool
}

// shimStarted reports the started command's pid.
type shimStarted struct {
	Pid int
}

// shimExit reports how the command ended, or why it could not start.
type shimExit struct {
	// StartErrno is set when execve failed; nothing ran.
	StartErrno int
	Exited     bool
	Code       int
	Signal     int
	// Reusable is true when the command left no descendants behind.
	Reusable bool
}

// shimMsg is a control message read by the shim.
type shimMsg struct {
	typ  byte
	body []byte
	fds  []int
	err  error // the socket failed or reached EOF
}

// reapInterval is how often a shim collects orphans that exit while its
// command still runs, or notices that lingering leftovers are gone.
const reapInterval = time.Second

// runShim is the shim process's main loop; it returns the exit code. The
// shim is single-goroutine: it waits on one epoll instance (the control
// socket, and the command's pidfd while one runs) through Go's network
// poller, so no goroutine hand-off sits on the path of a command's start
// or exit, and an idle or waiting shim holds no scheduler P. A P held in a
// blocking syscall would keep the Go runtime's monitor thread polling
// every few tens of microseconds for as long as commands keep coming,
// competing with the commands for the CPU.
func runShim(ll *initproto.Landlock, oomScoreAdj int) int {
	// Nothing in the jail may trace the shim: it runs as root and holds
	// init's end of the command. A shim traced before it could refuse
	// exits; init starts another.
	if err := protectSelf(); err != nil {
		fmt.Fprintf(os.Stderr, "agentjail shim: %v\n", err)
		return 1
	}
	// Every thread the shim will need, now: a shim in a jail whose pids
	// limit is reached cannot make one (threads.go).
	reserveThreads(shimThreads)
	// Opened before the Landlock domain, which may leave /proc out.
	var oom *oomScore
	if oomScoreAdj != 0 {
		var err error
		if oom, err = openOOMScore(oomScoreAdj); err != nil {
			fmt.Fprintf(os.Stderr, "agentjail shim: %v; commands keep the shim's oom_score_adj\n", err)
		}
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "agentjail shim: set child subreaper: %v\n", err)
		return 1
	}
	// The commands' own confinement, narrower than init's, before any
	// command runs.
	if ll != nil {
		if err := confine.RestrictFS(ll); err != nil {
			fmt.Fprintf(os.Stderr, "agentjail shim: %v\n", err)
			return 1
		}
	}
	// Nothing but stdio may leak into commands: not the control socket
	// (a command could forge reports to init), nor anything the shim
	// inherited by mistake.
	if err := unix.CloseRange(shimCtrlFd, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		fmt.Fprintf(os.Stderr, "agentjail shim: mark descriptors close-on-exec: %v\n", err)
		return 1
	}
	// Catch (rather than ignore) termination signals: an ignored signal
	// would stay ignored in the commands the shim starts.
	signal.Notify(make(chan os.Signal, 1), unix.SIGTERM, unix.SIGINT, unix.SIGHUP)
	w, err := newWaiter()
	if err != nil {
		fmt.Fprintf(os.Stderr, "agentjail shim: %v\n", err)
		return 1
	}
	s := &shim{w: w, buf: make([]byte, maxShimMsg+1), oob: make([]byte, unix.CmsgSpace(3*4)), oom: oom}
	if _, err := unix.Write(shimCtrlFd, []byte{shimMsgReady}); err != nil {
		fmt.Fprintf(os.Stderr, "agentjail shim: report ready to init: %v\n", err)
		return 1
	}
	for {
		m := s.recv()
		switch {
		case m.err != nil:
			return 0
		case m.typ == shimMsgRun:
			if !s.run(m) {
				return 0
			}
		default:
			closeFds(m.fds) // a kill for a command that already ended
		}
	}
}

// waiter waits for the shim's descriptors to become readable: an epoll
// instance holding the control socket (and a command's pidfd), itself
// waited on through Go's network poller.
type waiter struct {
	ep   int
	rc   syscall.RawConn
	file *os.File // keeps ep open
	evs  []unix.EpollEvent
}

// newWaiter makes the epoll instance and registers the control socket.
func newWaiter() (*waiter, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll: %w", err)
	}
	if err := unix.SetNonblock(ep, true); err != nil {
		unix.Close(ep)
		return nil, fmt.Errorf("epoll: %w", err)
	}
	f := os.NewFile(uintptr(ep), "epoll")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("epoll: %w", err)
	}
	w := &waiter{ep: ep, rc: rc, file: f, evs: make([]unix.EpollEvent, 2)}
	if err := w.add(shimCtrlFd); err != nil {
		f.Close()
		return nil, err
	}
	return w, nil
}

// add registers fd for readability.
func (w *waiter) add(fd int) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
	if err := unix.EpollCtl(w.ep, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("epoll add: %w", err)
	}
	return nil
}

// remove unregisters fd.
func (w *waiter) remove(fd int) {
	unix.EpollCtl(w.ep, unix.EPOLL_CTL_DEL, fd, nil)
}

// wait blocks until a registered descriptor is readable or timeout passes
// (timeout < 0: no limit) and returns the readable descriptors.
func (w *waiter) wait(timeout time.Duration) []int {
	if timeout >= 0 {
		w.file.SetReadDeadline(time.Now().Add(timeout))
	} else {
		w.file.SetReadDeadline(time.Time{})
	}
	var ready []int
	w.rc.Read(func(uintptr) bool {
		n, err := unix.EpollWait(w.ep, w.evs, 0)
		for i := range max(n, 0) {
			ready = append(ready, int(w.evs[i].Fd))
		}
		return n > 0 || (err != nil && err != unix.EINTR)
	})
	return ready
}

type shim struct {
	w        *waiter
	buf, oob []byte
	// oom, when not nil, gives each command its oom_score_adj.
	oom *oomScore
}

// recv reads one control message (waiting for it); the body is valid until
// the next recv.
func (s *shim) recv() shimMsg {
	for {
		n, oobn, _, _, err := unix.Recvmsg(shimCtrlFd, s.buf, s.oob, unix.MSG_CMSG_CLOEXEC|unix.MSG_DONTWAIT)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			s.w.wait(-1)
			continue
		}
		if err == nil && n == 0 {
			err = fmt.Errorf("control socket closed")
		}
		if err != nil {
			return shimMsg{err: err}
		}
		m := shimMsg{typ: s.buf[0], body: s.buf[1:n]}
		if oobn > 0 {
			if cms, err := unix.ParseSocketControlMessage(s.oob[:oobn]); err == nil {
				for _, cm := range cms {
					if fds, err := unix.ParseUnixRights(&cm); err == nil {
						m.fds = append(m.fds, fds...)
					}
				}
			}
		}
		return m
	}
}

// send writes one control message to init.
func (s *shim) send(typ byte, v shimBody) {
	if _, err := unix.Write(shimCtrlFd, v.appendTo([]byte{typ})); err != nil {
		fmt.Fprintf(os.Stderr, "agentjail shim: report to init: %v\n", err)
	}
}

// run starts one command and waits for it; it returns true when the shim
// is clean and can serve another command, false when it must exit (it
// outlived leftovers, or lost init).
func (s *shim) run(m shimMsg) bool {
	var spec shimSpec
	if err := spec.decode(m.body); err != nil || len(m.fds) != 3 {
		closeFds(m.fds)
		fmt.Fprintf(os.Stderr, "agentjail shim: malformed run message (%d fds): %v\n", len(m.fds), err)
		return false
	}
	cred, err := credential(spec)
	if err != nil {
		closeFds(m.fds)
		s.send(shimMsgExit, &shimExit{StartErrno: int(syscall.EPERM), Reusable: true})
		return true
	}
	pidfd := -1
	// The command inherits the raised score at the fork, so nothing it
	// runs before the shim lowers its own again has the shim's.
	s.oom.raise()
	// And the ordinary timer slack, not the shim's coarse one.
	var pid int
	err = timerslack.StartOrdinary(func() (err error) {
		pid, err = syscall.ForkExec(spec.Path, spec.Argv, &syscall.ProcAttr{
			Dir:   spec.Dir,
			Env:   spec.Env,
			Files: []uintptr{uintptr(m.fds[0]), uintptr(m.fds[1]), uintptr(m.fds[2])},
			Sys: &syscall.SysProcAttr{
				Setsid:  true,
				Setctty: spec.Tty,
				Ctty:    0,
				// Fires when the forking thread ends; Go ends a thread only
				// when a goroutine exits locked to it, which none in the
				// shim does.
				Pdeathsig:  syscall.SIGKILL,
				Credential: cred,
				PidFD:      &pidfd,
			},
		})
		return err
	})
	s.oom.restore()
	closeFds(m.fds)
	if err != nil {
		errno, _ := err.(syscall.Errno)
		if errno == 0 {
			errno = syscall.EINVAL
		}
		s.send(shimMsgExit, &shimExit{StartErrno: int(errno), Reusable: true})
		return true
	}
	timeout := reapInterval
	if pidfd >= 0 {
		defer unix.Close(pidfd)
		if err := s.w.add(pidfd); err != nil {
			fmt.Fprintf(os.Stderr, "agentjail shim: %v\n", err)
			timeout = 10 * time.Millisecond
		}
		defer s.w.remove(pidfd)
	} else {
		timeout = 10 * time.Millisecond // no pidfd to wake on: poll for the exit
	}
	s.send(shimMsgStarted, &shimStarted{Pid: pid})

	var status *unix.WaitStatus
	for status == nil {
		ctrl := slices.Contains(s.w.wait(timeout), shimCtrlFd)
		// Collects the command once it exited, and orphans that exited
		// meanwhile.
		status, _ = reapChildren(pid)
		if status == nil && ctrl {
			c := s.recv()
			closeFds(c.fds)
			if c.err != nil || c.typ == shimMsgKill {
				status = killTree(pid)
				if status == nil {
					ws := unix.WaitStatus(unix.SIGKILL)
					status = &ws
				}
				// Nothing is left below the shim: it is clean again, and
				// reusable unless init went away.
				s.report(*status, c.err == nil)
				return c.err == nil
			}
		}
	}
	// The command has exited; anything still alive below the shim is a
	// leftover it started in the background.
	_, leftovers := reapChildren(-1)
	s.report(*status, !leftovers)
	if !leftovers {
		return true
	}
	if !spec.HandOff {
		s.linger()
	}
	return false
}

// report sends the exit message for a wait status.
func (s *shim) report(ws unix.WaitStatus, reusable bool) {
	e := shimExit{Reusable: reusable}
	if ws.Signaled() {
		e.Signal = int(ws.Signal())
	} else {
		e.Exited, e.Code = true, ws.ExitStatus()
	}
	s.send(shimMsgExit, &e)
}

// linger stays the subreaper of a finished command's leftovers until they
// have all exited, or kills them when init asks or goes away.
func (s *shim) linger() {
	for {
		if slices.Contains(s.w.wait(reapInterval), shimCtrlFd) {
			c := s.recv()
			closeFds(c.fds)
			if c.err != nil || c.typ == shimMsgKill {
				killTree(-1)
				return
			}
		}
		if _, left := reapChildren(-1); !left {
			return
		}
	}
}

// killTree SIGKILLs every descendant of the shim, repeatedly, until the
// shim has no child left (descendants whose parents die are reparented to
// the shim, so none escapes). It returns the wait status of cmdPid when it
// reaped it.
func killTree(cmdPid int) *unix.WaitStatus {
	var status *unix.WaitStatus
	self := os.Getpid()
	for {
		for _, pid := range descendants(self) {
			killPinned(pid, self)
		}
		st, left := reapChildren(cmdPid)
		if st != nil {
			status = st
		}
		if !left {
			return status
		}
		// Give the kills a moment to land before the next round.
		time.Sleep(time.Millisecond)
	}
}

// reapChildren collects every exited child without blocking. It returns
// the status of pid when it collected it, and whether children remain.
func reapChildren(pid int) (status *unix.WaitStatus, left bool) {
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil: // ECHILD: no child at all
			return status, false
		case got == 0:
			return status, true
		case got == pid:
			w := ws
			status = &w
		}
	}
}

// descendants lists every process below root, from /proc.
func descendants(root int) []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	children := make(map[int][]int)
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		if ppid := parentOf(pid); ppid > 0 {
			children[ppid] = append(children[ppid], pid)
		}
	}
	var out []int
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// parentOf reads a process's parent pid from /proc (0 when unknown).
func parentOf(pid int) int {
	st, err := procstat.Read(pid)
	if err != nil {
		return 0
	}
	return st.PPID
}

// killPinned SIGKILLs pid through a pidfd after checking, with the process
// pinned, that it is still below root, so a pid recycled since the /proc
// scan is never signalled.
func killPinned(pid, root int) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	for p, depth := pid, 0; depth < 4096; depth++ {
		pp := parentOf(p)
		if pp == root {
			unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
			return
		}
		if pp <= 1 {
			return
		}
		p = pp
	}
}

// closeFds closes received descriptors.
func closeFds(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// credential is what the command of spec runs as. A shim running as root
// switches to the command's user; an unprivileged one (the process level,
// whose jail has one user) runs commands of its own user as they are and
// refuses others.
func credential(spec shimSpec) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		if spec.UID != os.Geteuid() || spec.GID != os.Getegid() {
			return nil, syscall.EPERM
		}
		return nil, nil
	}
	groups := make([]uint32, len(spec.Groups))
	for i, g := range spec.Groups {
		groups[i] = uint32(g)
	}
	return &syscall.Credential{Uid: uint32(spec.UID), Gid: uint32(spec.GID), Groups: groups}, nil
}
