package initd

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/initproto"
)

// shimProc is init's handle on one shim process.
type shimProc struct {
	pid  int
	ctrl *os.File // init's end of the control socket (non-blocking, pollable)
	done chan struct{}
	ws   unix.WaitStatus // valid once done is closed
}

// exited reports whether the shim has been reaped.
func (p *shimProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// send writes one control message, passing fds along when given.
func (p *shimProc) send(typ byte, v shimBody, fds []int) error {
	msg := []byte{typ}
	if v != nil {
		msg = v.appendTo(msg)
	}
	if len(msg) > maxShimMsg {
		return newError(initproto.KindInvalid, "", "command too large: argv and environment take %d bytes, at most %d are allowed", len(msg), maxShimMsg)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	rc, err := p.ctrl.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), msg, oob, nil, 0)
		return serr != unix.EAGAIN
	})
	if err != nil {
		return fmt.Errorf("write to shim %d: %w", p.pid, err)
	}
	if serr != nil {
		return fmt.Errorf("write to shim %d: %w", p.pid, serr)
	}
	return nil
}

// recv reads one control message from the shim into buf; io errors
// (including the shim's exit) are returned as is.
func (p *shimProc) recv(buf []byte) (byte, []byte, error) {
	n, err := p.ctrl.Read(buf)
	if err != nil {
		return 0, nil, err
	}
	if n == 0 {
		return 0, nil, fmt.Errorf("shim %d sent an empty message", p.pid)
	}
	return buf[0], buf[1:n], nil
}

// kill asks the shim to kill its command's tree (or its leftovers).
func (p *shimProc) kill() {
	_ = p.send(shimMsgKill, nil, nil)
}

// shimPool starts shims and keeps a few idle ones ready.
type shimPool struct {
	reaper  *reaper
	path    string
	argv    []string
	stderr  uintptr
	devnull int

	// maxIdle bounds the idle pool (InitConfig.IdleShims).
	maxIdle int
	// execNeedsRead is set once the kernel refused to run the shim binary
	// without read permission (see forkShim).
	execNeedsRead atomic.Bool

	mu        sync.Mutex
	idle      []*shimProc
	refilled  chan struct{} // while a refill runs: closed when it ends
	paused    bool          // drained: no refill until the next get or fill
	closed    bool
	lingering map[*shimProc]struct{}
}

// maxShimMsg bounds a control message to a shim (a command's argv and
// environment).
const maxShimMsg = 1 << 20

// get returns an idle shim, starting one when none is ready, and refills
// the pool in the background.
func (sp *shimPool) get() (*shimProc, error) {
	sp.mu.Lock()
	if sp.closed {
		sp.mu.Unlock()
		return nil, errors.New("init is shutting down")
	}
	var sh *shimProc
	for len(sp.idle) > 0 && sh == nil {
		sh = sp.idle[len(sp.idle)-1]
		sp.idle = sp.idle[:len(sp.idle)-1]
		if sh.exited() {
			sh.ctrl.Close()
			sh = nil
		} else if stopped(sh.pid) {
			// Stopped by the jail's root: it would never answer.
			_ = unix.Kill(sh.pid, unix.SIGKILL)
			sh.ctrl.Close()
			sh = nil
		}
	}
	sp.paused = false
	if len(sp.idle) == 0 {
		sp.startRefillLocked()
	}
	sp.mu.Unlock()
	if sh != nil {
		return sh, nil
	}
	return sp.spawn()
}

// startRefillLocked starts filling the pool in the background unless it is
// full, being filled or closed. sp.mu is held.
func (sp *shimPool) startRefillLocked() {
	if sp.closed || sp.refilled != nil || len(sp.idle) >= sp.maxIdle {
		return
	}
	sp.refilled = make(chan struct{})
	go sp.refill(sp.refilled)
}

// shimDrainTimeout bounds the wait for drained idle shims to exit.
const shimDrainTimeout = 2 * time.Second

// drain lets the idle shims exit and waits up to timeout until they have,
// and until a refill under way has ended (its shims exit too). The pool
// fills again at the next get or fill.
func (sp *shimPool) drain(timeout time.Duration) {
	sp.mu.Lock()
	sp.paused = true
	idle := sp.idle
	sp.idle = nil
	refilled := sp.refilled
	sp.mu.Unlock()
	for _, sh := range idle {
		sh.ctrl.Close() // the idle shim exits on EOF
	}
	deadline := time.After(timeout)
	if refilled != nil {
		select {
		case <-refilled:
		case <-deadline:
			return
		}
	}
	for _, sh := range idle {
		select {
		case <-sh.done:
		case <-deadline:
			return
		}
	}
}

// fill starts filling the pool in the background.
func (sp *shimPool) fill() {
	sp.mu.Lock()
	sp.paused = false
	sp.startRefillLocked()
	sp.mu.Unlock()
}

// refill starts idle shims until the pool is full, then closes done. A
// full pool lets a command start without a shim start (a Go process:
// milliseconds of CPU) competing with it, unless more commands run at once
// than it holds. A shim started after a drain is let go, and refill waits
// for it to exit.
func (sp *shimPool) refill(done chan struct{}) {
	defer close(done)
	for {
		sh, err := sp.spawn()
		if err != nil {
			sp.mu.Lock()
			sp.refilled = nil
			sp.mu.Unlock()
			fmt.Fprintf(os.Stderr, "agentjail init: start idle shim: %v\n", err)
			return
		}
		if !sp.put(sh) {
			select {
			case <-sh.done:
			case <-time.After(shimDrainTimeout):
			}
		}
		sp.mu.Lock()
		stop := sp.closed || sp.paused || len(sp.idle) >= sp.maxIdle
		if stop {
			sp.refilled = nil
		}
		sp.mu.Unlock()
		if stop {
			return
		}
	}
}

// put returns a clean shim to the pool and reports true, or lets it exit
// (the pool is full, drained or closed) and reports false.
func (sp *shimPool) put(sh *shimProc) bool {
	sp.mu.Lock()
	if sp.closed || sp.paused || len(sp.idle) >= sp.maxIdle || sh.exited() {
		sp.mu.Unlock()
		sh.ctrl.Close() // the idle shim exits on EOF
		return false
	}
	sp.idle = append(sp.idle, sh)
	sp.mu.Unlock()
	return true
}

// linger records a shim that stays with a finished command's leftovers;
// it is dropped when the shim exits.
func (sp *shimPool) linger(sh *shimProc) {
	sp.mu.Lock()
	if sp.closed {
		sp.mu.Unlock()
		sh.kill()
		return
	}
	sp.lingering[sh] = struct{}{}
	sp.mu.Unlock()
	go func() {
		<-sh.done
		sp.mu.Lock()
		delete(sp.lingering, sh)
		sp.mu.Unlock()
		sh.ctrl.Close()
	}()
}

// spawn starts a shim process.
func (sp *shimPool) spawn() (*shimProc, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("shim control socket: %w", err)
	}
	// Room for a run message with a large argv and environment; root may
	// exceed the system's default buffer sizes.
	_ = unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 2*maxShimMsg)
	_ = unix.SetsockoptInt(fds[1], unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 2*maxShimMsg)
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, fmt.Errorf("shim control socket: %w", err)
	}
	sh := &shimProc{ctrl: os.NewFile(uintptr(fds[0]), "shim-ctrl"), done: make(chan struct{})}
	pid, err := sp.reaper.start(func() (int, error) {
		return sp.forkShim(&syscall.ProcAttr{
			Dir:   "/",
			Env:   []string{"GOMAXPROCS=1"},
			Files: []uintptr{uintptr(sp.devnull), sp.stderr, sp.stderr, uintptr(fds[1])},
		})
	}, func(ws unix.WaitStatus) {
		sh.ws = ws
		close(sh.done)
	})
	unix.Close(fds[1])
	if err != nil {
		sh.ctrl.Close()
		return nil, fmt.Errorf("start shim %s: %w", sp.path, err)
	}
	sh.pid = pid
	if err := sh.awaitReady(); err != nil {
		return nil, err
	}
	return sh, nil
}

// awaitReady waits for a new shim's ready message; on error the shim is
// gone. The Go runtime ends a process that cannot make a thread it needs
// with exit status 2: a shim that ends so before it is ready met the
// jail's pids limit (or its memory's), and the error says so and wraps
// EAGAIN, as a fork refused for that limit does.
func (p *shimProc) awaitReady() error {
	var buf [16]byte
	p.ctrl.SetReadDeadline(time.Now().Add(shimAnswerTimeout))
	typ, _, err := p.recv(buf[:])
	p.ctrl.SetReadDeadline(time.Time{})
	if err == nil && typ == shimMsgReady {
		return nil
	}
	if err == nil {
		err = fmt.Errorf("message %q before it was ready", typ)
	}
	p.ctrl.Close()
	if !errors.Is(err, io.EOF) && !errors.Is(err, unix.ECONNRESET) {
		// Stopped (the deadline), or talking out of turn: it is not a
		// shim to use.
		_ = unix.Kill(p.pid, unix.SIGKILL)
		return fmt.Errorf("start shim %d: %w; killed", p.pid, err)
	}
	select {
	case <-p.done:
	case <-time.After(shimDrainTimeout):
		_ = unix.Kill(p.pid, unix.SIGKILL)
		return fmt.Errorf("start shim %d: it closed its control socket but did not exit; killed", p.pid)
	}
	switch {
	case p.ws.Exited() && p.ws.ExitStatus() == 2:
		return fmt.Errorf("start shim %d: it could not make its threads (the jail is out of processes or memory): %w", p.pid, unix.EAGAIN)
	case p.ws.Signaled():
		return fmt.Errorf("start shim %d: signal %v before it was ready", p.pid, p.ws.Signal())
	}
	return fmt.Errorf("start shim %d: exit status %d before it was ready", p.pid, p.ws.ExitStatus())
}

// forkShim starts the shim binary. The daemon installs that binary
// without read permission, so a shim started without the capabilities
// that override it is made non-dumpable by the kernel at its execve, as a
// set-uid program is: no jail process can attach to it in the moments
// before protectSelf runs. Where the kernel will not run a binary its
// caller cannot read (gVisor's), shims start with those capabilities and
// protect themselves at their first instructions.
func (sp *shimPool) forkShim(attr *syscall.ProcAttr) (int, error) {
	if !sp.execNeedsRead.Load() {
		pid, err := withoutReadOverride(func() (int, error) {
			return syscall.ForkExec(sp.path, sp.argv, attr)
		})
		if !errors.Is(err, syscall.EACCES) {
			return pid, err
		}
		sp.execNeedsRead.Store(true)
	}
	return syscall.ForkExec(sp.path, sp.argv, attr)
}

// close stops handing out shims, lets idle shims exit and kills the
// leftovers of lingering ones; it waits up to timeout for them to exit.
func (sp *shimPool) close(timeout time.Duration) {
	sp.mu.Lock()
	sp.closed = true
	idle := sp.idle
	sp.idle = nil
	var all []*shimProc
	for sh := range sp.lingering {
		all = append(all, sh)
	}
	sp.mu.Unlock()
	for _, sh := range idle {
		sh.ctrl.Close()
	}
	for _, sh := range all {
		sh.kill()
	}
	deadline := time.After(timeout)
	for _, sh := range append(idle, all...) {
		select {
		case <-sh.done:
		case <-deadline:
			return
		}
	}
}
