package initd

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/initproto"
)

// process is a running command.
type process struct {
	info initproto.ProcessInfo
	shim *shimProc

	mu       sync.Mutex
	finished bool // the shim reported the exit; it may serve another command
	killed   bool
	timedOut bool // the kill came from the timeout
}

// kill asks the shim to kill the command and all its descendants, unless
// the command already finished or a kill was already requested. Once
// finished, no kill reaches the shim, which may by then run another
// command.
func (p *process) kill() { p.killFor(false) }

// killFor is kill, recording whether the timeout asked for it.
func (p *process) killFor(timeout bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.finished || p.killed {
		return
	}
	p.killed, p.timedOut = true, timeout
	p.shim.kill()
	// A shim stopped by the jail's root cannot act on the kill: past a
	// grace, kill the shim itself.
	sh := p.shim
	time.AfterFunc(shimKillGrace, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if !p.finished && !sh.exited() {
			_ = unix.Kill(sh.pid, unix.SIGKILL)
		}
	})
}

// finish marks the command as finished and reports whether its timeout
// killed it.
func (p *process) finish() (timedOut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.finished = true
	return p.timedOut
}

// defaultPath is the PATH used for the executable lookup when the
// command's environment has none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// startFailure is an executable that cannot be run: the command "runs"
// and exits with Code after printing Message on its stderr.
type startFailure struct {
	Code    int
	Message string
}

// prepareExec validates an exec request and resolves its user, working
// directory, environment and executable.
func (s *Server) prepareExec(req *initproto.ExecRequest) (*shimSpec, *identity, *startFailure, error) {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return nil, nil, nil, newError(initproto.KindInvalid, "", "argv is empty")
	}
	for i, a := range req.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return nil, nil, nil, newError(initproto.KindInvalid, "", "argv[%d] contains a NUL byte", i)
		}
	}
	for _, kv := range req.Env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.IndexByte(kv, 0) >= 0 {
			return nil, nil, nil, newError(initproto.KindInvalid, "", "env entry %q is not KEY=VALUE", kv)
		}
	}
	if req.TimeoutMs < 0 {
		return nil, nil, nil, newError(initproto.KindInvalid, "", "timeout_ms %d is negative", req.TimeoutMs)
	}
	user, group := req.User, ""
	if user == "" {
		user, group = s.cfg.DefaultUser, s.cfg.DefaultGroup
	}
	id, err := s.lookupUser(user, group)
	if err != nil {
		return nil, nil, nil, err
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = s.cfg.Workspace
	}
	if cwd, err = cleanPath("cwd", cwd); err != nil {
		return nil, nil, nil, err
	}
	if err := s.execRoot.checkCwd(cwd, id); err != nil {
		return nil, nil, nil, err
	}
	env := mergeEnv([]string{"HOSTNAME=" + hostname()}, s.cfg.Env, []string{"HOME=" + id.Home, "USER=" + id.Name, "LOGNAME=" + id.Name}, req.Env)
	pathEnv := defaultPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathEnv = v
		}
	}
	exe, fail := s.lookPath(req.Argv[0], pathEnv, cwd, id)
	if fail != nil {
		return nil, id, fail, nil
	}
	spec := &shimSpec{Path: exe, Argv: req.Argv, Env: env, Dir: cwd, UID: id.UID, GID: id.GID, Groups: id.Groups,
		// An init that reaps every orphan takes over a command's
		// leftovers; no shim then stays in the jail for them.
		HandOff: s.reaper.all}
	return spec, id, nil, nil
}

// hostname is the jail's current host name (the daemon may set it after
// init started, when it hands out a ready jail under a new name).
func hostname() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Nodename[:])
}

// mergeEnv merges "K=V" lists; a later list overrides earlier values of
// the same key, which keep their position.
func mergeEnv(lists ...[]string) []string {
	var out []string
	index := make(map[string]int)
	for _, l := range lists {
		for _, kv := range l {
			k, _, _ := strings.Cut(kv, "=")
			if i, ok := index[k]; ok {
				out[i] = kv
				continue
			}
			index[k] = len(out)
			out = append(out, kv)
		}
	}
	return out
}

// lookPath finds the executable for argv0 the way a shell does: a name
// with a slash is used as is (relative to cwd), other names are searched
// in PATH for a regular file the user may execute.
func (s *Server) lookPath(argv0, pathEnv, cwd string, id *identity) (string, *startFailure) {
	if strings.Contains(argv0, "/") {
		p := argv0
		if !path.IsAbs(p) {
			p = path.Join(cwd, p)
		}
		st, err := s.execRoot.statFollow(p)
		switch {
		case err != nil:
			return "", &startFailure{127, fmt.Sprintf("agentjail: %s: %v\n", argv0, err)}
		case st.Mode&unix.S_IFMT == unix.S_IFDIR:
			return "", &startFailure{126, fmt.Sprintf("agentjail: %s: is a directory\n", argv0)}
		case !permits(st, id, wantExec):
			return "", &startFailure{126, fmt.Sprintf("agentjail: %s: permission denied\n", argv0)}
		}
		return p, nil
	}
	denied := false
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		if !path.IsAbs(dir) {
			dir = path.Join(cwd, dir)
		}
		p := path.Join(dir, argv0)
		st, err := s.execRoot.statFollow(p)
		if err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			continue
		}
		if !permits(st, id, wantExec) {
			denied = true
			continue
		}
		return p, nil
	}
	if denied {
		return "", &startFailure{126, fmt.Sprintf("agentjail: %s: permission denied\n", argv0)}
	}
	return "", &startFailure{127, fmt.Sprintf("agentjail: %s: command not found\n", argv0)}
}

// statFollow stats the jail path p, following symlinks inside the root.
func (r *fsRoot) statFollow(p string) (*unix.Stat_t, error) {
	fd, err := r.open(p, unix.O_PATH, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// exec runs one command for a connection: it answers Started (or an
// error), streams output, feeds stdin, and ends with Exit.
func (s *Server) exec(c *conn, req *initproto.ExecRequest) error {
	if c.keep && (req.PTY != nil || req.Detach || req.Stdin) {
		c.broken = true
		return newError(initproto.KindInvalid, "", "an exec with a terminal, a stdin stream or detach needs a connection of its own, not a keep-alive one")
	}
	if req.Brief && (req.PTY != nil || req.Detach || req.Stdin) {
		return newError(initproto.KindInvalid, "", "a brief exec has no terminal, stdin stream or detach")
	}
	if req.PTY != nil {
		return s.startSession(c, req)
	}
	spec, id, fail, err := s.prepareExec(req)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return newError(initproto.KindInternal, "", "init is shutting down")
	}
	s.execs.Add(1)
	s.mu.Unlock()
	defer s.execs.Done()
	if fail != nil {
		return sendStartFailure(c, fail, initproto.MsgStderr, req.Brief)
	}

	sh, err := s.shims.get()
	if errors.Is(err, unix.EAGAIN) {
		// Out of processes: the command could not start, as a shell's
		// fork would say.
		s.log.Printf("exec %q: %v", req.Argv[0], err)
		return sendStartFailure(c, execFailure(req.Argv[0], unix.EAGAIN), initproto.MsgStderr, req.Brief)
	}
	if err != nil {
		return err
	}
	ex := &execution{srv: s, c: c, sh: sh, req: req, start: time.Now()}
	if err := ex.startCommand(spec); err != nil {
		return err
	}
	if ex.failure != nil {
		s.shims.put(sh)
		return sendStartFailure(c, ex.failure, initproto.MsgStderr, req.Brief)
	}
	ex.proc = &process{shim: sh, info: initproto.ProcessInfo{
		Pid: ex.pid, Argv: req.Argv, Cwd: spec.Dir, User: id.Name, StartedAt: ex.start, TimeoutMs: req.TimeoutMs,
	}}
	s.mu.Lock()
	s.procs[ex.pid] = ex.proc
	s.mu.Unlock()
	if req.Detach {
		return s.runDetached(c, ex)
	}
	ex.run()
	return nil
}

// sendStartFailure answers an exec whose executable could not be run as a
// process that printed why (on stream, MsgStderr or MsgStdout) and exited
// with the shell's code (without MsgStarted for a brief exec).
func sendStartFailure(c *conn, f *startFailure, stream initproto.MsgType, brief bool) error {
	if !brief {
		if err := c.sendJSON(initproto.MsgStarted, initproto.Started{}); err != nil {
			return nil
		}
	}
	if err := c.send(stream, []byte(f.Message)); err != nil {
		return nil
	}
	_ = c.sendJSON(initproto.MsgExit, initproto.ExitStatus{Code: f.Code})
	return nil
}

// execution is one command being run for one connection.
type execution struct {
	srv   *Server
	c     *conn
	sh    *shimProc
	req   *initproto.ExecRequest
	start time.Time
	proc  *process

	pid            int
	failure        *startFailure
	stdin          *os.File // nil when the command reads /dev/null
	stdout, stderr *os.File

	ended    atomic.Bool // Exit is being sent; a client EOF no longer kills
	connDead atomic.Bool
}

// startCommand hands the command to the shim and waits for it to start.
// On return without error, either ex.pid is set (the command runs) or
// ex.failure (the executable could not be run); the shim is then idle.
func (ex *execution) startCommand(spec *shimSpec) (err error) {
	var childFds []int
	var parents []*os.File
	defer func() {
		closeFds(childFds)
		if err != nil {
			for _, f := range parents {
				f.Close()
			}
		}
	}()
	stdinChild := ex.srv.devnull
	if ex.req.Stdin {
		w, r, err := pipe(false)
		if err != nil {
			ex.srv.shims.put(ex.sh)
			return err
		}
		ex.stdin, stdinChild = w, r
		parents, childFds = append(parents, w), append(childFds, r)
	}
	outR, outW, err := pipe(true)
	if err != nil {
		ex.srv.shims.put(ex.sh)
		return err
	}
	ex.stdout = outR
	parents, childFds = append(parents, outR), append(childFds, outW)
	errR, errW, err := pipe(true)
	if err != nil {
		ex.srv.shims.put(ex.sh)
		return err
	}
	ex.stderr = errR
	parents, childFds = append(parents, errR), append(childFds, errW)

	pid, errno, err := ex.srv.runOnShim(ex.sh, spec, []int{stdinChild, outW, errW})
	if err != nil {
		return err
	}
	if errno != 0 {
		for _, f := range parents {
			f.Close()
		}
		parents = nil
		ex.failure = execFailure(ex.req.Argv[0], errno)
		return nil
	}
	ex.pid = pid
	return nil
}

// execFailure is the start failure of an executable that execve refused.
func execFailure(argv0 string, errno unix.Errno) *startFailure {
	code := 126
	if errno == unix.ENOENT {
		code = 127
	}
	return &startFailure{code, fmt.Sprintf("agentjail: %s: %v\n", argv0, errno)}
}

// runOnShim hands a command with its stdio fds to an idle shim and waits
// for it to start. It returns the command's pid, or the errno with which
// execve failed (the shim is then idle again). On error the shim has been
// disposed of (returned to the pool when nothing reached it, else cut
// off). The caller still owns and closes fds.
func (s *Server) runOnShim(sh *shimProc, spec *shimSpec, fds []int) (int, unix.Errno, error) {
	if err := sh.send(shimMsgRun, spec, fds); err != nil {
		var pe *initproto.Error
		if errors.As(err, &pe) {
			s.shims.put(sh) // nothing was sent
			return 0, 0, err
		}
		sh.ctrl.Close() // a shim that cannot be talked to exits on EOF
		return 0, 0, fmt.Errorf("start command: %w", err)
	}
	buf := make([]byte, 512)
	// A shim stopped by the jail's root never answers: bound the wait and
	// kill it.
	sh.ctrl.SetReadDeadline(time.Now().Add(shimAnswerTimeout))
	typ, body, err := sh.recv(buf)
	sh.ctrl.SetReadDeadline(time.Time{})
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			_ = unix.Kill(sh.pid, unix.SIGKILL)
			err = fmt.Errorf("no answer within %v (stopped?); killed", shimAnswerTimeout)
		}
		sh.ctrl.Close()
		return 0, 0, fmt.Errorf("start command: shim %d: %w", sh.pid, err)
	}
	switch typ {
	case shimMsgStarted:
		var st shimStarted
		if err := st.decode(body); err != nil {
			sh.kill()
			s.shims.linger(sh)
			return 0, 0, err
		}
		return st.Pid, 0, nil
	case shimMsgExit:
		var e shimExit
		if err := e.decode(body); err != nil {
			sh.ctrl.Close()
			return 0, 0, err
		}
		return 0, unix.Errno(e.StartErrno), nil
	}
	sh.ctrl.Close()
	return 0, 0, fmt.Errorf("start command: shim %d sent unexpected message %q", sh.pid, typ)
}

// run streams the command's I/O until it exits and sends Exit.
func (ex *execution) run() {
	s := ex.srv
	if !ex.req.Brief {
		if err := ex.c.sendJSON(initproto.MsgStarted, initproto.Started{Pid: ex.pid}); err != nil {
			ex.connDead.Store(true)
			ex.proc.kill()
		}
	}
	var pumps sync.WaitGroup
	pumps.Add(2)
	go ex.pump(ex.stdout, initproto.MsgStdout, &pumps)
	go ex.pump(ex.stderr, initproto.MsgStderr, &pumps)
	readerDone := make(chan bool, 1)
	go ex.readClient(readerDone)
	status, res, shimOK := ex.await(ex.waitExit, &pumps)
	if ex.stdin != nil {
		ex.stdin.Close()
	}
	s.mu.Lock()
	delete(s.procs, ex.pid)
	s.mu.Unlock()

	ex.ended.Store(true)
	// The shim is back in the pool (or let go) before the client learns
	// of the exit: a request that follows it (emptying the pool before a
	// snapshot) sees the pool as the command left it.
	s.releaseShim(ex.sh, res, shimOK)
	// The client of a brief exec on a keep-alive connection sends its next
	// request right after Exit: the reader stops before, so that it cannot
	// take that request for its own.
	stopped, released := false, false
	if ex.req.Brief && ex.c.keep {
		if ex.c.c.SetReadDeadline(time.Now()) == nil {
			stopped = true
			released = <-readerDone
			ex.c.c.SetReadDeadline(time.Time{})
		} else {
			ex.c.broken = true // the reader cannot be stopped: close after Exit
		}
	}
	if !ex.connDead.Load() {
		if err := ex.c.sendJSON(initproto.MsgExit, status); err != nil {
			ex.connDead.Store(true)
		}
	}
	// A keep-alive connection carries the next request once the client
	// released it (readClient returns at its MsgRelease, or for a brief
	// exec at the stop); any other is done.
	if !ex.c.keep || ex.c.broken || ex.connDead.Load() {
		ex.c.broken = true
		ex.c.c.Close()
	}
	if !stopped {
		released = <-readerDone
	}
	if !released {
		ex.c.broken = true
	}
}

// await waits for the command's exit with wait, killing the command when
// the request's timeout passes first, then drains and closes its output
// pipes. Everything the command wrote before it exited is in the pipes by
// then; the drain does not wait for background descendants that may
// still hold them open: they lose them (EPIPE) when init closes them.
func (ex *execution) await(wait func() (shimExit, bool), pumps *sync.WaitGroup) (status initproto.ExitStatus, res shimExit, shimOK bool) {
	var timer *time.Timer
	if ex.req.TimeoutMs > 0 {
		timer = time.AfterFunc(time.Duration(ex.req.TimeoutMs)*time.Millisecond, func() {
			ex.proc.killFor(true)
		})
	}
	res, shimOK = wait()
	timedOut := ex.proc.finish()
	if timer != nil {
		timer.Stop()
	}
	status = exitStatus(res, ex.pid, ex.start, timedOut)
	now := time.Now()
	ex.stdout.SetReadDeadline(now)
	ex.stderr.SetReadDeadline(now)
	pumps.Wait()
	ex.stdout.Close()
	ex.stderr.Close()
	return status, res, shimOK
}

// waitExit reads the shim's exit report (see waitShim).
func (ex *execution) waitExit() (res shimExit, shimOK bool) {
	return ex.srv.waitShim(ex.sh, ex.pid)
}

// waitShim reads the exit report of the command pid running under sh.
// shimOK is false when the shim died instead; the result then reflects
// the SIGKILL its death delivered to the command.
func (s *Server) waitShim(sh *shimProc, pid int) (res shimExit, shimOK bool) {
	buf := make([]byte, 512)
	for {
		typ, body, err := sh.recv(buf)
		if err != nil {
			<-sh.done
			s.log.Printf("shim %d of pid %d ended without a report (%v)", sh.pid, pid, sh.ws)
			return shimExit{Signal: int(unix.SIGKILL)}, false
		}
		if typ == shimMsgExit && res.decode(body) == nil {
			return res, true
		}
	}
}

// exitStatus is the wire status of a command's exit report.
func exitStatus(res shimExit, pid int, start time.Time, timedOut bool) initproto.ExitStatus {
	status := initproto.ExitStatus{Pid: pid, DurationNs: int64(time.Since(start)), TimedOut: timedOut}
	if res.Exited {
		status.Code = res.Code
	} else {
		status.Signal = unix.SignalName(unix.Signal(res.Signal))
		status.Code = 128 + res.Signal
	}
	return status
}

// releaseShim returns a shim whose command ended to the pool, leaves it
// with the command's leftovers, or cuts it off when it died.
func (s *Server) releaseShim(sh *shimProc, res shimExit, shimOK bool) {
	switch {
	case !shimOK:
		sh.ctrl.Close()
	case res.Reusable:
		s.shims.put(sh)
	default:
		s.shims.linger(sh)
	}
}

// pump streams one output pipe to the client as frames of type t. After
// the command's exit, the read deadline is set: pump then reads what is
// left in the pipe without blocking and returns.
func (ex *execution) pump(f *os.File, t initproto.MsgType, wg *sync.WaitGroup) {
	defer recoverPanic(ex.srv.log, "output pump")
	defer wg.Done()
	emit := func(b []byte) {
		if ex.connDead.Load() {
			return
		}
		if err := ex.c.send(t, b); err != nil {
			ex.connDead.Store(true)
			ex.proc.kill() // the client is gone
		}
	}
	readPipe(f, emit)
}

// chunks recycles the output pumps' read buffers: two per command, each
// ChunkSize, would otherwise be most of what init allocates per exec (and
// the garbage collections that follow, on the exec path).
var chunks = sync.Pool{New: func() any { return new([initproto.ChunkSize]byte) }}

// readPipe passes what the output pipe f delivers to emit until it ends,
// or, once its read deadline is set (the command exited), until what is
// buffered in it is read. emit must not keep the slice it is given.
func readPipe(f *os.File, emit func([]byte)) {
	chunk := chunks.Get().(*[initproto.ChunkSize]byte)
	defer chunks.Put(chunk)
	buf := chunk[:]
	for {
		n, err := f.Read(buf)
		if n > 0 {
			emit(buf[:n])
		}
		if err == nil {
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			drain(f, buf, emit)
		}
		return
	}
}

// drain reads what is buffered in a non-blocking pipe, without waiting.
func drain(f *os.File, buf []byte, emit func([]byte)) {
	f.SetReadDeadline(time.Time{})
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Read(func(fd uintptr) bool {
		for {
			n, err := unix.Read(int(fd), buf)
			if n <= 0 || err != nil {
				return true
			}
			emit(buf[:n])
		}
	})
}

// readClient reads the client's stream frames: stdin data and its end,
// and on a keep-alive connection the release that ends the exec. A
// client that goes away before Exit gets the command tree killed. It
// sends on done whether the client released the connection.
func (ex *execution) readClient(done chan<- bool) {
	released := false
	defer func() { done <- released }()
	defer recoverPanic(ex.srv.log, "exec client reader")
	if ex.req.Brief && ex.c.keep {
		released = ex.awaitHangUp()
		return
	}
	stdinOpen := ex.stdin != nil
	for {
		t, payload, err := ex.c.read()
		if err != nil {
			if !ex.ended.Load() {
				ex.proc.kill()
			}
			return
		}
		switch t {
		case initproto.MsgRelease:
			if ex.c.keep {
				released = true
				return
			}
			ex.srv.log.Printf("exec pid %d: ignoring %s frame", ex.pid, t)
		case initproto.MsgStdin:
			if !stdinOpen {
				continue
			}
			if err := ex.writeStdin(payload); err != nil {
				if errors.Is(err, errPeerGone) {
					ex.proc.kill()
					return
				}
				// The command closed its stdin or exited: drop the rest.
				stdinOpen = false
			}
		case initproto.MsgStdinClose:
			if stdinOpen {
				ex.stdin.Close()
				stdinOpen = false
			}
		default:
			ex.srv.log.Printf("exec pid %d: ignoring %s frame", ex.pid, t)
		}
	}
}

// awaitHangUp watches the connection of a brief exec on a keep-alive
// connection, whose client sends nothing before Exit: the client's
// hang-up (or half-close) kills the command, and so does a frame, which
// breaks the protocol. It reports whether the connection is still fit
// for the next request when run stopped the watch (its read deadline).
func (ex *execution) awaitHangUp() bool {
	_, err := ex.c.r.Peek(1)
	if errors.Is(err, os.ErrDeadlineExceeded) && ex.ended.Load() {
		return true
	}
	if err == nil {
		ex.srv.log.Printf("exec pid %d: the client of a brief exec sent a frame; killing the command", ex.pid)
	}
	if !ex.ended.Load() {
		ex.proc.kill()
	}
	return false
}

// errPeerGone reports a client that closed its connection while stdin
// was blocked.
var errPeerGone = errors.New("client closed the connection")

// stdinCheck is how often a blocked stdin write checks that the client is
// still connected.
const stdinCheck = time.Second

// writeStdin writes p to the command's stdin. While the command does not
// read, it checks every stdinCheck that the client is still connected.
func (ex *execution) writeStdin(p []byte) error {
	for len(p) > 0 {
		ex.stdin.SetWriteDeadline(time.Now().Add(stdinCheck))
		n, err := ex.stdin.Write(p)
		p = p[n:]
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if peerClosed(ex.c) {
				return errPeerGone
			}
			continue
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// HangUpReporter is a connection that tells of its peer's hang-up itself,
// where a poll of a descriptor cannot: a stream of a multiplexed session,
// as the vm level serves init's clients.
type HangUpReporter interface {
	// PeerClosed reports, without blocking, whether the peer is gone for
	// good, even with input of its still unread.
	PeerClosed() bool
}

// peerClosed reports whether the client closed its end of the
// connection, even with input of its still unread (the poll's hang-up of
// the reading side, which a client never causes otherwise: it ends its
// input with a frame).
func peerClosed(c *conn) bool {
	if h, ok := c.c.(HangUpReporter); ok {
		return h.PeerClosed()
	}
	sc, ok := c.c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	_ = rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		n, err := unix.Poll(fds, 0)
		closed = err == nil && n > 0 && fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
	})
	return closed
}

// pipe makes a pipe. With readParent the read end is init's (non-blocking,
// pollable) and the write end is the child's fd; otherwise the reverse.
func pipe(readParent bool) (parent *os.File, child int, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil, -1, fmt.Errorf("create pipe: %w", err)
	}
	pi, ci := 1, 0
	if readParent {
		pi, ci = 0, 1
	}
	// The child's end blocks. A new pipe end has no status flag but
	// O_NONBLOCK, so clearing them all is one call instead of a get and a
	// set.
	if _, err := unix.FcntlInt(uintptr(p[ci]), unix.F_SETFL, 0); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, -1, fmt.Errorf("create pipe: %w", err)
	}
	return os.NewFile(uintptr(p[pi]), "pipe"+strconv.Itoa(p[pi])), p[ci], nil
}
