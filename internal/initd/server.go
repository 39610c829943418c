package initd

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/initproto"
)

// Options configures a Server.
type Options struct {
	// Config is init's configuration.
	Config initproto.InitConfig
	// Root is the directory file operations are confined to and from which
	// /etc/passwd and /etc/group are read (default "/", the jail's root).
	// Commands always run in init's own filesystem view.
	Root string
	// PeerCheck rejects control connections from processes inside init's
	// pid namespace (SO_PEERCRED shows their pid; a peer outside the
	// namespace shows pid 0). Init enables it; tests may turn it off.
	PeerCheck bool
	// ReapAll makes the reaper wait for any child (PID 1 duty), not only
	// the shims the server started. Only for a process that owns all its
	// children.
	ReapAll bool
	// ShimPath is the executable re-run as the per-command shim (default
	// "/proc/self/exe"); it is started with ShimArgs and must route them
	// to Main.
	ShimPath string
	// ShimArgs is the shim's argv (default {"agentjail", "init", "--shim"}).
	ShimArgs []string
	// Log receives diagnostics (default: a logger on stderr).
	Log *log.Logger
	// RecordDir is where terminal sessions are recorded (asciicast v2,
	// see initproto.RecordingsName); empty records nothing. It is created
	// (0700) when missing.
	RecordDir string
}

// Server serves init's control protocol: it starts and tracks commands
// through shims, reaps children, and performs file operations inside its
// root.
type Server struct {
	cfg       initproto.InitConfig
	root      *fsRoot
	execRoot  *fsRoot
	peerCheck bool
	log       *log.Logger
	reaper    *reaper
	shims     *shimPool
	threads   jailThreads
	devnull   int
	recordDir string

	mu           sync.Mutex
	procs        map[int]*process
	sessions     map[string]*ptySession
	bg           map[int]*bgProc   // detached commands by pid
	ended        map[int]endedProc // how recent detached commands and sessions ended
	listeners    map[net.Listener]struct{}
	conns        map[net.Conn]struct{}
	connClosed   chan struct{}      // closed (and replaced) whenever a connection ends
	idle         map[*conn]struct{} // keep-alive connections awaiting a request
	dials        map[*conn]struct{} // connections relaying a port of the jail (MsgDial)
	quiescing    int                // checkpoint preparations under way: no connection stays open
	closing      bool
	prewarm      sync.Once
	shutdown     sync.Once
	shutdownDone chan struct{}
	execs        sync.WaitGroup // running exec operations
	handlers     sync.WaitGroup // all connection handlers
}

// NewServer validates opts, opens the roots and starts the reaper. The
// caller must call Shutdown to release them.
func NewServer(opts Options) (*Server, error) {
	if opts.Root == "" {
		opts.Root = "/"
	}
	if opts.ShimPath == "" {
		opts.ShimPath = "/proc/self/exe"
	}
	if len(opts.ShimArgs) == 0 {
		opts.ShimArgs = []string{"agentjail", "init", "--shim"}
	}
	if ll := opts.Config.CommandLandlock; ll != nil {
		b, err := json.Marshal(ll)
		if err != nil {
			return nil, err
		}
		opts.ShimArgs = append(slices.Clone(opts.ShimArgs), "--landlock", string(b))
	}
	if adj := opts.Config.CommandOOMScoreAdj; adj != 0 {
		opts.ShimArgs = append(slices.Clone(opts.ShimArgs), "--oom-score-adj", strconv.Itoa(adj))
	}
	if opts.Log == nil {
		opts.Log = log.New(os.Stderr, "agentjail init: ", log.LstdFlags|log.Lmicroseconds)
	}
	cfg := opts.Config
	if cfg.DefaultUser == "" {
		return nil, errors.New("init config: default_user is empty")
	}
	if cfg.Workspace == "" {
		cfg.Workspace = "/"
	}
	if _, err := cleanPath("init config workspace", cfg.Workspace); err != nil {
		return nil, err
	}
	root, err := openRoot(opts.Root, cfg.BlockedPaths)
	if err != nil {
		return nil, err
	}
	execRoot, err := openRoot("/", nil)
	if err != nil {
		root.close()
		return nil, err
	}
	devnull, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		root.close()
		execRoot.close()
		return nil, fmt.Errorf("open /dev/null: %w", err)
	}
	s := &Server{
		cfg:          cfg,
		root:         root,
		execRoot:     execRoot,
		peerCheck:    opts.PeerCheck,
		log:          opts.Log,
		reaper:       newReaper(opts.ReapAll),
		threads:      newJailThreads(),
		devnull:      devnull,
		recordDir:    opts.RecordDir,
		procs:        make(map[int]*process),
		sessions:     make(map[string]*ptySession),
		bg:           make(map[int]*bgProc),
		ended:        make(map[int]endedProc),
		listeners:    make(map[net.Listener]struct{}),
		conns:        make(map[net.Conn]struct{}),
		connClosed:   make(chan struct{}),
		idle:         make(map[*conn]struct{}),
		dials:        make(map[*conn]struct{}),
		shutdownDone: make(chan struct{}),
	}
	s.shims = &shimPool{
		reaper:    s.reaper,
		path:      opts.ShimPath,
		argv:      opts.ShimArgs,
		stderr:    os.Stderr.Fd(),
		devnull:   devnull,
		lingering: make(map[*shimProc]struct{}),
		maxIdle:   opts.Config.IdleShims,
	}
	return s, nil
}

// Serve accepts control connections on l until l is closed or Shutdown is
// called; it then returns nil. Accept errors are logged and retried with a
// back-off; a failing connection never stops the server.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return errors.New("serve: server is shut down")
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	s.prewarm.Do(func() {
		// Start the idle shims now, not in NewServer: a shim inherits
		// init's stderr as it is when the shim starts, and Main redirects
		// stderr to the log between the two.
		s.shims.fill()
	})
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
	}()
	backoff := time.Duration(0)
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Printf("accept: %v (retrying in %v)", err, backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			c.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.handlers.Add(1)
		s.mu.Unlock()
		go s.handle(c)
	}
}

// Forward sends sig to every running command (not to shims or init).
func (s *Server) Forward(sig unix.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for pid := range s.procs {
		_ = unix.Kill(pid, sig)
	}
}

// Shutdown stops accepting connections, waits until every running command
// has exited or ctx is done, then kills the remaining commands with all
// their descendants (and the leftovers of finished ones that shims stay
// with), waits briefly for their exit to be reported, and releases the
// server's resources. An init that reaps every orphan (PID 1) also waits,
// while ctx lasts, for its other children: the leftovers it took over,
// which end with it. It returns ctx's error when commands had to be
// killed. Later calls wait for the first to finish and return nil.
func (s *Server) Shutdown(ctx context.Context) error {
	first := false
	s.shutdown.Do(func() { first = true })
	if !first {
		<-s.shutdownDone
		return nil
	}
	defer close(s.shutdownDone)
	s.mu.Lock()
	s.closing = true
	for l := range s.listeners {
		l.Close()
	}
	s.mu.Unlock()

	waited := make(chan struct{})
	go func() { s.execs.Wait(); close(waited) }()
	var err error
	select {
	case <-waited:
	case <-ctx.Done():
		err = ctx.Err()
		s.mu.Lock()
		for _, p := range s.procs {
			p.kill()
		}
		s.mu.Unlock()
		select {
		case <-waited:
		case <-time.After(5 * time.Second):
			s.log.Printf("shutdown: commands still running after SIGKILL")
		}
	}
	s.shims.close(5 * time.Second)
	if s.reaper.all && err == nil {
		// Init reaps every orphan: the leftovers of finished commands are
		// its children. Give them the rest of the grace period; whatever
		// is left ends with init.
		awaitChildren(ctx)
	}
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.handlers.Wait()
	s.reaper.close()
	s.root.close()
	s.execRoot.close()
	unix.Close(s.devnull)
	return err
}

// awaitChildren waits until this process has no child left or ctx is
// done.
func awaitChildren(ctx context.Context) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for len(descendants(os.Getpid())) > 0 {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// conn is one control connection.
type conn struct {
	c   net.Conn
	r   *bufio.Reader
	wmu sync.Mutex
	buf []byte
	// keep is set on a keep-alive connection (initproto.MsgKeepAlive).
	keep bool
	// broken is set when an operation left the connection unfit for the
	// next request (a stream cut midway); the handler then closes it.
	broken bool
}

// send writes one frame; safe for concurrent use.
func (c *conn) send(t initproto.MsgType, payload []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return initproto.WriteFrame(c.c, t, payload)
}

// sendFrame writes a frame already encoded (header and payload); safe
// for concurrent use.
func (c *conn) sendFrame(frame []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.c.Write(frame)
	return err
}

// sendJSON writes one JSON frame; safe for concurrent use.
func (c *conn) sendJSON(t initproto.MsgType, v any) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return initproto.WriteJSON(c.c, t, v)
}

// sendErr writes an error frame.
func (c *conn) sendErr(err error) error {
	return c.sendJSON(initproto.MsgError, protoError(err))
}

// read reads the next frame; the payload is valid until the next read.
func (c *conn) read() (initproto.MsgType, []byte, error) {
	t, p, err := initproto.ReadFrame(c.r, c.buf)
	if err == nil && cap(p) > cap(c.buf) && cap(p) <= initproto.ChunkSize*2 {
		c.buf = p[:0]
	}
	return t, p, err
}

// connReadBuffer is the size of a control connection's read buffer.
const connReadBuffer = 4 << 10

// requestTimeout bounds how long a connection may take to send its
// request frame.
const requestTimeout = 30 * time.Second

// handle serves one connection: one operation, or on a keep-alive
// connection one after another.
func (s *Server) handle(nc net.Conn) {
	defer s.handlers.Done()
	defer func() {
		nc.Close()
		s.mu.Lock()
		delete(s.conns, nc)
		close(s.connClosed)
		s.connClosed = make(chan struct{})
		s.mu.Unlock()
	}()
	// Most connections carry one small request: the reader starts small
	// (frames larger than it are read into buf directly), and buf grows
	// to the largest frame the connection carries.
	c := &conn{c: nc, r: bufio.NewReaderSize(nc, connReadBuffer)}
	defer s.dropIdle(c)
	defer func() {
		if v := recover(); v != nil {
			s.log.Printf("connection handler panic: %v\n%s", v, debug.Stack())
			_ = c.sendErr(newError(initproto.KindInternal, "", "init failed to handle the request: %v", v))
		}
	}()
	if s.peerCheck {
		if err := checkPeer(nc); err != nil {
			s.log.Printf("rejected control connection: %v", err)
			_ = c.sendErr(err)
			return
		}
	}
	for {
		t, payload, ok := s.nextRequest(c)
		if !ok {
			return
		}
		switch {
		case t == initproto.MsgKeepAlive && !c.keep:
			c.keep = true
			if err := c.sendJSON(initproto.MsgOK, nil); err != nil {
				return
			}
			continue
		case t == initproto.MsgRelease && c.keep:
			continue // the end of an exec that could not start
		case c.keep && !keepAliveOp(t):
			_ = c.sendErr(newError(initproto.KindInvalid, "", "a %s request needs a connection of its own, not a keep-alive one", t))
			return
		}
		if err := s.dispatch(c, t, payload); err != nil {
			_ = c.sendErr(err)
		}
		if !c.keep || c.broken {
			return
		}
	}
}

// keepAliveOp reports whether a request of type t may be sent on a
// keep-alive connection (an exec is checked further by exec).
func keepAliveOp(t initproto.MsgType) bool {
	switch t {
	case initproto.MsgPing, initproto.MsgSignal, initproto.MsgKill, initproto.MsgList, initproto.MsgSessions,
		initproto.MsgInput, initproto.MsgSetSize, initproto.MsgStat, initproto.MsgReadDir, initproto.MsgMkdir,
		initproto.MsgSymlink, initproto.MsgRemove, initproto.MsgRename, initproto.MsgAccess, initproto.MsgShims, initproto.MsgExec:
		return true
	}
	return false
}

// nextRequest reads the connection's next request frame. A keep-alive
// connection waits for it as an idle connection, which a checkpoint's
// preparation closes (see quiesce): a request read from a connection
// closed meanwhile is dropped unanswered, so that a client may send it
// again elsewhere. ok is false when the connection is to be closed.
func (s *Server) nextRequest(c *conn) (t initproto.MsgType, payload []byte, ok bool) {
	timeout := requestTimeout
	if c.keep {
		s.mu.Lock()
		if s.quiescing > 0 || s.closing {
			s.mu.Unlock()
			return 0, nil, false
		}
		s.idle[c] = struct{}{}
		s.mu.Unlock()
		timeout = initproto.IdleTimeout
	}
	c.c.SetReadDeadline(time.Now().Add(timeout))
	t, payload, err := c.read()
	if c.keep && !s.takeIdle(c) {
		return 0, nil, false
	}
	if err != nil {
		if !errors.Is(err, io.EOF) && !c.keep {
			s.log.Printf("read request: %v", err)
		}
		return 0, nil, false
	}
	c.c.SetReadDeadline(time.Time{})
	return t, payload, true
}

// takeIdle takes c out of the idle connections, reporting whether it was
// still there (not closed by a checkpoint's preparation).
func (s *Server) takeIdle(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.idle[c]
	delete(s.idle, c)
	return ok
}

// dropIdle forgets c as an idle connection.
func (s *Server) dropIdle(c *conn) {
	s.mu.Lock()
	delete(s.idle, c)
	s.mu.Unlock()
}

// quiesce closes the keep-alive connections awaiting a request and the
// connections relaying a port (a checkpoint cannot save them; their
// clients connect again), and makes the others close after their
// operation, until the returned function is called.
func (s *Server) quiesce() (done func()) {
	s.mu.Lock()
	s.quiescing++
	for c := range s.idle {
		delete(s.idle, c)
		c.c.Close()
	}
	for c := range s.dials {
		c.c.Close()
	}
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		s.quiescing--
		s.mu.Unlock()
	}
}

// quiesceTimeout bounds how long init waits for the daemon's other control
// connections to close before a checkpoint.
const quiesceTimeout = 2 * time.Second

// awaitOnlyConn waits until nc is init's only control connection, or
// timeout; it returns how many others are still open.
func (s *Server) awaitOnlyConn(self net.Conn, timeout time.Duration) int {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		n := len(s.conns)
		if _, ok := s.conns[self]; ok {
			n--
		}
		closed := s.connClosed
		s.mu.Unlock()
		if n == 0 {
			return 0
		}
		select {
		case <-closed:
		case <-deadline.C:
			return n
		}
	}
}

// recoverPanic, deferred first in a goroutine, logs a panic instead of
// letting it end init (and with it the jail).
func recoverPanic(l *log.Logger, what string) {
	if v := recover(); v != nil {
		l.Printf("%s panic: %v\n%s", what, v, debug.Stack())
	}
}

// checkPeer accepts only peers outside the jail. As PID 1 of the jail's
// pid namespace, those are the peers whose pid reads as 0 through
// SO_PEERCRED. An init without a pid namespace of its own (the process
// level) runs as the jail's unprivileged user and accepts only root, the
// daemon.
func checkPeer(nc net.Conn) error {
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		return newError(initproto.KindForbidden, "", "control connections must be unix sockets")
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("read peer credentials: %w", cerr)
	}
	if os.Getpid() != 1 {
		if cred.Uid != 0 {
			return newError(initproto.KindForbidden, "", "control connections are accepted only from root outside the jail (peer uid %d)", cred.Uid)
		}
		return nil
	}
	if cred.Pid != 0 {
		return newError(initproto.KindForbidden, "", "control connections are accepted only from outside the jail (peer pid %d)", cred.Pid)
	}
	return nil
}

// dispatch runs one operation. A returned error is sent to the client as
// the operation's answer; operations that stream send their own errors.
func (s *Server) dispatch(c *conn, t initproto.MsgType, payload []byte) error {
	switch t {
	case initproto.MsgPing:
		return c.sendJSON(initproto.MsgOK, nil)
	case initproto.MsgExec:
		var req initproto.ExecRequest
		if err := initproto.Decode(t, payload, &req); err != nil {
			return newError(initproto.KindInvalid, "", "%v", err)
		}
		return s.exec(c, &req)
	case initproto.MsgSignal:
		var req initproto.SignalRequest
		if err := initproto.Decode(t, payload, &req); err != nil {
			return newError(initproto.KindInvalid, "", "%v", err)
		}
		if err := s.signal(req); err != nil {
			return err
		}
		return c.sendJSON(initproto.MsgOK, nil)
	case initproto.MsgKill:
		var req initproto.KillRequest
		if err := initproto.Decode(t, payload, &req); err != nil {
			return newError(initproto.KindInvalid, "", "%v", err)
		}
		p := s.process(req.Pid)
		if p == nil {
			return newError(initproto.KindNotFound, "", "no running command has pid %d", req.Pid)
		}
		p.kill()
		return c.sendJSON(initproto.MsgOK, nil)
	case initproto.MsgList:
		return c.sendJSON(initproto.MsgOK, fitList(s.list()))
	case initproto.MsgAttach:
		var req initproto.AttachRequest
		if err := initproto.Decode(t, payload, &req); err != nil {
			return newError(initproto.KindInvalid, "", "%v", err)
		}
		return s.attach(c, req)
	case initproto.MsgInput:
		var req initproto.InputRequest
		if err := initproto.Decode(t, payload, &req); err != nil {
			return newError(initproto.KindInvalid, "", "%v", err)
		}
		if err := s.input(req); err != nil {
			return err
		}
		return c.sendJSON(initproto.MsgOK, nil)
	case initproto.MsgSetSize:
		var req initproto.SizeRequest
		if err := initproto.Decode(t, payload, &req); err != nil {
			return newError(initproto.KindInvalid, "", "%v", err)
		}
		if err := s.setSize(req); err != nil {
			return err
		}
		return c.sendJSON(initproto.MsgOK, nil)
	case initproto.MsgWatch:
		var req initproto.WatchRequest
		if err := initproto.Decode(t, payload, &req); err != nil {
			return newError(initproto.KindInvalid, "", "%v", err)
		}
		return s.watch(c, req)
	case initproto.MsgSessions:
		return c.sendJSON(initproto.MsgOK, s.listSessions())
	case initproto.MsgShims:
		var req initproto.ShimsRequest
		if err := initproto.Decode(t, payload, &req); err != nil {
			return newError(initproto.KindInvalid, "", "%v", err)
		}
		if req.Checkpoint && c.keep {
			c.broken = true
			return newError(initproto.KindInvalid, "", "readying for a checkpoint needs a connection of its own, not a keep-alive one")
		}
		if req.Idle {
			s.shims.fill()
		} else {
			s.shims.drain(shimDrainTimeout)
			if req.Checkpoint {
				done := s.quiesce()
				defer done()
				ans := initproto.ShimsAnswer{OpenConnections: s.awaitOnlyConn(c.c, quiesceTimeout)}
				s.mu.Lock()
				ans.Terminals = len(s.sessions)
				s.mu.Unlock()
				return c.sendJSON(initproto.MsgOK, ans)
			}
		}
		return c.sendJSON(initproto.MsgOK, nil)
	case initproto.MsgDial:
		var req initproto.DialRequest
		if err := initproto.Decode(t, payload, &req); err != nil {
			return newError(initproto.KindInvalid, "", "%v", err)
		}
		return s.dialPort(c, req)
	case initproto.MsgStat, initproto.MsgReadDir, initproto.MsgListDir, initproto.MsgReadFile, initproto.MsgWriteFile,
		initproto.MsgMkdir, initproto.MsgSymlink, initproto.MsgRemove, initproto.MsgRename, initproto.MsgAccess:
		return s.threads.recorded(func(th *opThread) error { return s.fileOp(c, th, t, payload) })
	}
	return newError(initproto.KindInvalid, "", "unknown request type %s", t)
}

// process returns the running command with in-jail pid, or nil.
func (s *Server) process(pid int) *process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.procs[pid]
}

// signal delivers a signal to a running command.
func (s *Server) signal(req initproto.SignalRequest) error {
	sig, err := parseSignal(req.Signal)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.procs[req.Pid] == nil {
		return newError(initproto.KindNotFound, "", "no running command has pid %d", req.Pid)
	}
	if err := unix.Kill(req.Pid, sig); err != nil {
		return fmt.Errorf("signal pid %d: %w", req.Pid, err)
	}
	return nil
}

// fitList cuts the command lines (and working directories) of list so
// that its answer fits one frame. A command's arguments may be as long as
// the kernel takes (2 MiB), and as many commands may run as the jail's
// pids limit allows (4096). When the list may not fit (its strings
// counted as JSON escapes them at worst, six bytes a byte), each command
// gets an equal share. The list's own Argv slices are left as they are.
func fitList(list []initproto.ProcessInfo) []initproto.ProcessInfo {
	const (
		room = initproto.MaxPayload - 4<<10
		// fixed is what a command's entry takes besides its strings, with
		// the marks of what was cut.
		fixed = 300
	)
	worst := 0
	for _, p := range list {
		worst += fixed + 6*(len(p.Cwd)+len(p.User))
		for _, a := range p.Argv {
			worst += 6 * (len(a) + 3)
		}
	}
	if worst <= room {
		return list
	}
	share := (room/len(list) - fixed) / 6
	for i := range list {
		p := &list[i]
		p.User = cutString(p.User, 32)
		p.Cwd = cutString(p.Cwd, max(share/4, 32))
		p.Argv = cutArgv(p.Argv, share-len(p.Cwd)-len(p.User))
	}
	return list
}

// cutArgv returns argv in about share bytes (an argument counting 3 more,
// for its quotes and comma): its first arguments whole while they fit, the
// next one cut to what is left, and "…N more" for the arguments left out.
func cutArgv(argv []string, share int) []string {
	var out []string
	left := share
	for i, a := range argv {
		if left <= 3 {
			return append(out, fmt.Sprintf("…%d more", len(argv)-i))
		}
		a = cutString(a, left-3)
		out = append(out, a)
		left -= len(a) + 3
	}
	return out
}

// cutString returns s, or when it is longer than n bytes its start (cut at
// a character) and "…".
func cutString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// list describes the running commands, ordered by pid.
func (s *Server) list() []initproto.ProcessInfo {
	s.mu.Lock()
	out := make([]initproto.ProcessInfo, 0, len(s.procs))
	for _, p := range s.procs {
		out = append(out, p.info)
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Pid < out[j].Pid })
	return out
}
