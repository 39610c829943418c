package initd

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/asciicast"
	"github.com/agentjail/agentjail/internal/atomicfile"
	"github.com/agentjail/agentjail/internal/initproto"
)

// Terminal sessions: a command on a pseudo-terminal allocated by init in
// the jail's own devpts, outliving the connections attached to it.
const (
	// scrollbackSize is how much recent output a session keeps for
	// connections that attach later.
	scrollbackSize = 256 << 10
	// ptyChunk is the size of terminal output reads.
	ptyChunk = 32 << 10
	// attachQueue bounds the output chunks waiting for one attachment,
	// attachQueueBytes their bytes. The session never waits for an
	// attachment: one whose queue is full skips the output until its
	// queue is half empty again, and is told how much it missed. A client
	// reading at the speed of a unix socket never comes near the bound;
	// a slow viewer does, and never slows the command or its recording.
	attachQueue      = 1024
	attachQueueBytes = 8 << 20
	// frameCoalesce bounds the output sent to a client in one frame: the
	// writer joins the chunks queued for it, so a fast producer costs one
	// write per frame instead of one per terminal read.
	frameCoalesce = 256 << 10
	// While output comes in bulk (reads of bulkChunk bytes or more), the
	// writer waits up to bulkDelay for more before sending a frame, so a
	// flood goes out in large frames; a keystroke's echo (a few bytes) is
	// sent at once.
	bulkChunk = 2048
	bulkDelay = 250 * time.Microsecond
	// recordQueue bounds the output chunks waiting for the recorder.
	recordQueue = 256
	// recordFlush is how often a recording is flushed to its file, so
	// that a crash loses at most this much of it.
	recordFlush = time.Second
	// Default window size.
	defaultRows, defaultCols = 24, 80
)

// ptySession is one terminal session.
type ptySession struct {
	srv         *Server
	id          string
	master      *os.File // non-blocking, pollable
	sh          *shimProc
	proc        *process
	pid         int
	start       time.Time
	recordInput bool

	inMu sync.Mutex // serialises input writes

	recMu   sync.Mutex
	rec     *asciicast.Writer // nil when not (or no longer) recording
	recFile *os.File
	recPath string // the .part file
	// recQ feeds the recorder goroutine the session's output, so that
	// encoding and writing the recording run beside the reads of the
	// terminal instead of between them. Nil when not recording.
	recQ    chan recChunk
	recDone chan struct{}

	mu        sync.Mutex
	info      initproto.SessionInfo
	scroll    ring
	attachers map[*attacher]struct{}
	ended     bool
	exit      initproto.ExitStatus // valid once ended

	fanout []*attacher // the pump's scratch list
}

// recChunk is output on its way to the recording.
type recChunk struct {
	at time.Time
	d  []byte
}

// attacher is one connection attached to a session.
type attacher struct {
	c        *conn
	readOnly bool
	// q carries output to the connection's writer; the session closes it
	// when it ends (after the last output). queued counts its bytes.
	q        chan []byte
	queued   atomic.Int64
	gone     chan struct{} // closed when the client detached
	goneOnce sync.Once

	// Owned by the session's pump.
	lagging bool
	dropped int64
}

func (a *attacher) detach() { a.goneOnce.Do(func() { close(a.gone) }) }

// startSession runs a PTY exec: it starts the command on a new terminal
// and serves the connection as the session's first attachment.
func (s *Server) startSession(c *conn, req *initproto.ExecRequest) error {
	opts := *req.PTY
	if opts.Rows == 0 {
		opts.Rows = defaultRows
	}
	if opts.Cols == 0 {
		opts.Cols = defaultCols
	}
	if opts.Term == "" {
		opts.Term = initproto.DefaultTerm
	}
	r := *req
	r.Stdin = false // the terminal is the command's stdin
	var shell string
	if len(r.Argv) == 0 {
		user, group := r.User, ""
		if user == "" {
			user, group = s.cfg.DefaultUser, s.cfg.DefaultGroup
		}
		id, err := s.lookupUser(user, group)
		if err != nil {
			return err
		}
		shell = id.Shell
		if shell == "" {
			shell = "/bin/sh"
		}
		r.Argv = []string{shell, "-l"}
	}
	r.Env = append([]string{"TERM=" + opts.Term}, r.Env...)
	spec, id, fail, err := s.prepareExec(&r)
	if err != nil {
		return err
	}
	if shell == "" {
		shell = id.Shell
	}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return newError(initproto.KindInternal, "", "init is shutting down")
	}
	s.execs.Add(1) // done when the session ends
	s.mu.Unlock()
	if fail != nil {
		defer s.execs.Done()
		fail.Message = strings.ReplaceAll(fail.Message, "\n", "\r\n")
		return sendStartFailure(c, fail, initproto.MsgStdout, false)
	}
	ss, fail, err := s.newSession(&r, &opts, spec, id, shell)
	if err != nil || fail != nil {
		defer s.execs.Done()
		if err != nil {
			return err
		}
		fail.Message = strings.ReplaceAll(fail.Message, "\n", "\r\n")
		return sendStartFailure(c, fail, initproto.MsgStdout, false)
	}
	return ss.serve(c, false, true)
}

// newSession allocates the terminal, opens the recording and starts the
// command; on success the session runs and is registered. A start
// failure (execve refused) is returned as such, with nothing left.
func (s *Server) newSession(req *initproto.ExecRequest, opts *initproto.PTYOptions, spec *shimSpec, id *identity, shell string) (_ *ptySession, _ *startFailure, err error) {
	sid, err := newSessionID()
	if err != nil {
		return nil, nil, err
	}
	master, slave, err := openPTY()
	if err != nil {
		return nil, nil, err
	}
	defer unix.Close(slave)
	defer func() {
		if err != nil {
			master.Close()
		}
	}()
	if err := unix.IoctlSetWinsize(slave, unix.TIOCSWINSZ, &unix.Winsize{Row: opts.Rows, Col: opts.Cols}); err != nil {
		return nil, nil, fmt.Errorf("set terminal size: %w", err)
	}
	// The terminal belongs to its user, as a login terminal does.
	if err := unix.Fchown(slave, id.UID, -1); err != nil {
		return nil, nil, fmt.Errorf("chown terminal: %w", err)
	}
	if err := unix.Fchmod(slave, 0o620); err != nil {
		return nil, nil, fmt.Errorf("chmod terminal: %w", err)
	}
	start := time.Now()
	ss := &ptySession{
		srv: s, id: sid, master: master, start: start, recordInput: opts.RecordInput,
		attachers: make(map[*attacher]struct{}),
		info: initproto.SessionInfo{
			ID: sid, Argv: req.Argv, Cwd: spec.Dir, User: id.Name, Term: opts.Term,
			Rows: opts.Rows, Cols: opts.Cols, StartedAt: start,
		},
	}
	if err := ss.openRecording(req.Argv, opts, shell); err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			ss.discardRecording()
		}
	}()

	sh, err := s.shims.get()
	if errors.Is(err, unix.EAGAIN) {
		s.log.Printf("terminal %q: %v", req.Argv[0], err)
		ss.discardRecording()
		master.Close()
		return nil, execFailure(req.Argv[0], unix.EAGAIN), nil
	}
	if err != nil {
		return nil, nil, err
	}
	spec.Tty = true
	pid, errno, err := s.runOnShim(sh, spec, []int{slave, slave, slave})
	if err != nil {
		return nil, nil, err
	}
	if errno != 0 {
		s.shims.put(sh)
		ss.discardRecording()
		master.Close()
		return nil, execFailure(req.Argv[0], errno), nil
	}
	ss.sh, ss.pid, ss.info.Pid = sh, pid, pid
	ss.proc = &process{shim: sh, info: initproto.ProcessInfo{
		Pid: pid, Argv: req.Argv, Cwd: spec.Dir, User: id.Name, StartedAt: start, TimeoutMs: req.TimeoutMs,
	}}
	s.mu.Lock()
	s.procs[pid] = ss.proc
	s.sessions[sid] = ss
	s.mu.Unlock()
	pumpDone := make(chan struct{})
	go ss.pump(pumpDone)
	go ss.run(pumpDone, req.TimeoutMs)
	return ss, nil, nil
}

// newSessionID returns a random session id.
func newSessionID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("session id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// openPTY opens a new pseudo-terminal pair from init's /dev/ptmx (the
// jail's devpts instance). The master is non-blocking and pollable; the
// slave is a plain descriptor the caller closes.
func openPTY() (*os.File, int, error) {
	m, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, -1, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	if err := unix.IoctlSetPointerInt(m, unix.TIOCSPTLCK, 0); err != nil {
		unix.Close(m)
		return nil, -1, fmt.Errorf("unlock terminal: %w", err)
	}
	// TIOCGPTPEER opens the slave through the master, never by a path
	// that could have been swapped.
	sfd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(m), unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
	if errno != 0 {
		unix.Close(m)
		return nil, -1, fmt.Errorf("open terminal: %w", errno)
	}
	return os.NewFile(uintptr(m), "ptmx"), int(sfd), nil
}

// openRecording starts the session's recording when the server records.
func (ss *ptySession) openRecording(argv []string, opts *initproto.PTYOptions, shell string) error {
	dir := ss.srv.recordDir
	if dir == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("recordings directory: %w", err)
	}
	path := filepath.Join(dir, ss.id+".cast.part")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create recording: %w", err)
	}
	env := map[string]string{"TERM": opts.Term}
	if shell != "" {
		env["SHELL"] = shell
	}
	w, err := asciicast.NewWriter(f, asciicast.Header{
		Width: int(opts.Cols), Height: int(opts.Rows), Command: shellJoin(argv), Env: env,
		JailID: ss.srv.cfg.JailID, SessionID: ss.id,
	}, ss.start)
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("create recording: %w", err)
	}
	ss.rec, ss.recFile, ss.recPath = w, f, path
	ss.recQ, ss.recDone = make(chan recChunk, recordQueue), make(chan struct{})
	ss.info.Recording = true
	go ss.recordLoop()
	return nil
}

// recordLoop writes the output handed to it to the recording until recQ
// is closed.
func (ss *ptySession) recordLoop() {
	defer close(ss.recDone)
	defer recoverPanic(ss.srv.log, "terminal recorder")
	for c := range ss.recQ {
		ss.record(func(w *asciicast.Writer) error { return w.Event(c.at, asciicast.Output, c.d) })
	}
}

// stopRecorder lets the recorder write what it was handed and stop.
func (ss *ptySession) stopRecorder() {
	if ss.recQ != nil {
		close(ss.recQ)
		<-ss.recDone
		ss.recQ = nil
	}
}

// discardRecording removes the recording of a session that never ran.
func (ss *ptySession) discardRecording() {
	ss.stopRecorder()
	ss.recMu.Lock()
	defer ss.recMu.Unlock()
	if ss.recFile != nil {
		ss.recFile.Close()
		os.Remove(ss.recPath)
		ss.rec, ss.recFile = nil, nil
	}
}

// record appends an event to the recording; a failing recording is
// logged and stopped.
func (ss *ptySession) record(fn func(w *asciicast.Writer) error) {
	ss.recMu.Lock()
	defer ss.recMu.Unlock()
	if ss.rec == nil {
		return
	}
	if err := fn(ss.rec); err != nil {
		ss.srv.log.Printf("session %s: recording stopped: %v", ss.id, err)
		ss.rec = nil
	}
}

// flushLoop flushes the recording every recordFlush until stop closes.
func (ss *ptySession) flushLoop(stop <-chan struct{}) {
	defer recoverPanic(ss.srv.log, "recording flusher")
	t := time.NewTicker(recordFlush)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			ss.record(func(w *asciicast.Writer) error { return w.Flush() })
		}
	}
}

// finishRecording completes the recording and renames it to .cast.
func (ss *ptySession) finishRecording() {
	ss.recMu.Lock()
	defer ss.recMu.Unlock()
	if ss.recFile == nil {
		return
	}
	if ss.rec != nil {
		if err := ss.rec.Close(time.Now()); err != nil {
			ss.srv.log.Printf("session %s: completing the recording: %v", ss.id, err)
		}
	}
	if err := ss.recFile.Close(); err != nil {
		ss.srv.log.Printf("session %s: closing the recording: %v", ss.id, err)
	}
	if err := atomicfile.Rename(ss.recPath, strings.TrimSuffix(ss.recPath, ".part")); err != nil {
		ss.srv.log.Printf("session %s: completing the recording: %v", ss.id, err)
	}
	ss.rec, ss.recFile = nil, nil
}

// pump reads the terminal's output until it closes, or, once the run has
// set the read deadline, until what is buffered is read.
func (ss *ptySession) pump(done chan<- struct{}) {
	defer recoverPanic(ss.srv.log, "terminal pump")
	defer close(done)
	buf := make([]byte, ptyChunk)
	for {
		n, err := ss.master.Read(buf)
		if n > 0 {
			ss.output(buf[:n])
		}
		if err == nil {
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			drain(ss.master, buf, ss.output)
		}
		return // EIO: every holder of the terminal closed it
	}
}

// output hands a chunk of output to the recorder, keeps it in the
// scrollback and offers it to every attachment.
func (ss *ptySession) output(p []byte) {
	d := append([]byte(nil), p...)
	if ss.recQ != nil {
		ss.recQ <- recChunk{at: time.Now(), d: d}
	}
	ss.mu.Lock()
	ss.scroll.write(d)
	list := ss.fanout[:0]
	for a := range ss.attachers {
		list = append(list, a)
	}
	ss.mu.Unlock()
	for _, a := range list {
		a.offer(d)
	}
	clear(list)
	ss.fanout = list[:0]
}

// offer queues output for an attachment without ever waiting for it. An
// attachment whose queue is full skips output until its queue is half
// empty again; then it gets a notice of how much it skipped, and the
// output from there on.
func (a *attacher) offer(d []byte) {
	if a.lagging {
		if len(a.q) > cap(a.q)/2 || a.queued.Load() > attachQueueBytes/2 {
			a.dropped += int64(len(d))
			return
		}
		a.push(a.notice())
	}
	if len(a.q) >= attachQueue || a.queued.Load()+int64(len(d)) > attachQueueBytes {
		a.lagging = true
		a.dropped += int64(len(d))
		return
	}
	a.push(d)
}

// notice tells the attachment what it skipped and ends its lagging.
func (a *attacher) notice() []byte {
	n := fmt.Appendf(nil, "\r\n[agentjail: this viewer skipped %d bytes of output it did not keep up with]\r\n", a.dropped)
	a.lagging, a.dropped = false, 0
	return n
}

// push queues d; the caller checked that the queue has room (only the
// pump adds to it, and keeps one place free for the last notice).
func (a *attacher) push(d []byte) {
	a.queued.Add(int64(len(d)))
	a.q <- d
}

// run waits for the command's exit and ends the session: the remaining
// output is delivered, the recording completed, every attachment gets
// the exit status.
func (ss *ptySession) run(pumpDone <-chan struct{}, timeoutMs int64) {
	defer recoverPanic(ss.srv.log, "terminal session")
	s := ss.srv
	stopFlush := make(chan struct{})
	go ss.flushLoop(stopFlush)
	var timer *time.Timer
	if timeoutMs > 0 {
		timer = time.AfterFunc(time.Duration(timeoutMs)*time.Millisecond, func() { ss.proc.killFor(true) })
	}
	res, shimOK := s.waitShim(ss.sh, ss.pid)
	timedOut := ss.proc.finish()
	if timer != nil {
		timer.Stop()
	}
	status := exitStatus(res, ss.pid, ss.start, timedOut)
	s.rememberEnded(ss.pid, status)
	// What the command wrote is in the terminal now; background processes
	// that still hold it lose it (hang-up) when the master closes.
	ss.master.SetReadDeadline(time.Now())
	<-pumpDone
	ss.master.Close() // a blocked input write fails with it
	close(stopFlush)
	ss.stopRecorder()
	ss.finishRecording()

	s.mu.Lock()
	delete(s.procs, ss.pid)
	delete(s.sessions, ss.id)
	s.mu.Unlock()
	ss.mu.Lock()
	ss.ended, ss.exit = true, status
	for a := range ss.attachers {
		// The pump is done: a viewer still skipping learns what it
		// missed before the exit.
		if a.lagging {
			a.push(a.notice())
		}
		close(a.q)
	}
	ss.mu.Unlock()
	s.releaseShim(ss.sh, res, shimOK)
	s.execs.Done()
}

// attach serves a MsgAttach request.
func (s *Server) attach(c *conn, req initproto.AttachRequest) error {
	if req.Pid != 0 {
		return s.attachPid(c, req)
	}
	s.mu.Lock()
	ss := s.sessions[req.Session]
	s.mu.Unlock()
	if ss == nil {
		return newError(initproto.KindNotFound, "", "no running terminal session has id %q", req.Session)
	}
	return ss.serve(c, req.ReadOnly, !req.NoScrollback)
}

// serve attaches c to the session: it answers Started, replays the
// scrollback (when asked), streams the output and applies the client's
// input until the client detaches or the session ends.
func (ss *ptySession) serve(c *conn, readOnly, scrollback bool) error {
	a := &attacher{c: c, readOnly: readOnly, q: make(chan []byte, attachQueue+1), gone: make(chan struct{})}
	ss.mu.Lock()
	if ss.ended {
		ss.mu.Unlock()
		return newError(initproto.KindNotFound, "", "terminal session %q has ended", ss.id)
	}
	// The scrollback and the registration are taken together, so every
	// chunk of output reaches the attachment exactly once.
	var backlog []byte
	if scrollback {
		backlog = ss.scroll.bytes()
	}
	for len(backlog) > 0 {
		n := min(len(backlog), ptyChunk)
		a.push(backlog[:n])
		backlog = backlog[n:]
	}
	ss.attachers[a] = struct{}{}
	info := ss.info
	info.Attached = len(ss.attachers)
	ss.mu.Unlock()
	defer func() {
		a.detach()
		ss.mu.Lock()
		delete(ss.attachers, a)
		ss.mu.Unlock()
	}()
	if err := c.sendJSON(initproto.MsgStarted, initproto.Started{Pid: info.Pid, Session: &info}); err != nil {
		return nil
	}
	writerDone := make(chan struct{})
	go ss.writeLoop(a, writerDone)
	ss.readLoop(a)
	a.detach()
	<-writerDone
	return nil
}

// writeLoop sends an attachment's queued output, the chunks waiting at
// the time joined into frames of up to frameCoalesce bytes; when the
// session ends it sends the exit status and closes the connection.
func (ss *ptySession) writeLoop(a *attacher, done chan<- struct{}) {
	defer recoverPanic(ss.srv.log, "terminal writer")
	defer close(done)
	frame := make([]byte, 0, initproto.HeaderSize+frameCoalesce+ptyChunk)
	bulk := time.NewTimer(bulkDelay)
	bulk.Stop()
	for {
		select {
		case d, ok := <-a.q:
			ended := !ok
			if ok {
				frame = append(frame[:0], byte(initproto.MsgStdout), 0, 0, 0, 0)
				frame = append(frame, d...)
				last := len(d)
				waiting := false
			join:
				for len(frame) < initproto.HeaderSize+frameCoalesce {
					select {
					case more, ok := <-a.q:
						if !ok {
							ended = true
							break join
						}
						frame = append(frame, more...)
						last = len(more)
						continue
					default:
					}
					if last < bulkChunk {
						break // not a flood: send what there is
					}
					if !waiting {
						bulk.Reset(bulkDelay)
						waiting = true
					}
					select {
					case more, ok := <-a.q:
						if !ok {
							ended = true
							break join
						}
						frame = append(frame, more...)
						last = len(more)
					case <-bulk.C:
						waiting = false
						break join
					case <-a.gone:
						break join
					}
				}
				if waiting {
					bulk.Stop() // no stale tick is delivered after Stop (Go ≥ 1.23)
				}
				n := len(frame) - initproto.HeaderSize
				binary.BigEndian.PutUint32(frame[1:initproto.HeaderSize], uint32(n))
				a.queued.Add(-int64(n))
				if err := a.c.sendFrame(frame); err != nil {
					a.detach()
					a.c.c.Close()
					return
				}
			}
			if ended {
				ss.mu.Lock()
				status := ss.exit
				ss.mu.Unlock()
				_ = a.c.sendJSON(initproto.MsgExit, status)
				a.c.c.Close()
				return
			}
		case <-a.gone:
			return
		}
	}
}

// readLoop applies an attachment's frames until its connection fails or
// closes.
func (ss *ptySession) readLoop(a *attacher) {
	for {
		t, payload, err := a.c.read()
		if err != nil {
			return
		}
		switch t {
		case initproto.MsgStdin:
			if a.readOnly {
				continue
			}
			if err := ss.input(a, payload); errors.Is(err, errPeerGone) {
				return
			}
		case initproto.MsgResize:
			var req initproto.ResizeRequest
			if err := initproto.Decode(t, payload, &req); err != nil || a.readOnly {
				continue
			}
			if err := ss.resize(req.Rows, req.Cols); err != nil {
				ss.srv.log.Printf("session %s: resize: %v", ss.id, err)
			}
		case initproto.MsgPTYSignal:
			var req initproto.SignalRequest
			if err := initproto.Decode(t, payload, &req); err != nil || a.readOnly {
				continue
			}
			if err := ss.signal(req.Signal); err != nil {
				ss.srv.log.Printf("session %s: signal: %v", ss.id, err)
			}
		case initproto.MsgStdinClose:
			// A terminal has no end of input; the client detaches instead.
		default:
			ss.srv.log.Printf("session %s: ignoring %s frame", ss.id, t)
		}
	}
}

// control runs fn on the master's descriptor.
func (ss *ptySession) control(fn func(fd int) error) error {
	rc, err := ss.master.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// secretInput reports whether the terminal is at a password prompt: it
// does not echo but reads whole lines (a full-screen program that does
// its own echo turns canonical mode off too, and is recorded).
func (ss *ptySession) secretInput() bool {
	secret := true // when the state cannot be read, record nothing
	_ = ss.control(func(fd int) error {
		t, err := unix.IoctlGetTermios(fd, unix.TCGETS)
		if err == nil {
			secret = t.Lflag&unix.ECHO == 0 && t.Lflag&unix.ICANON != 0
		}
		return err
	})
	return secret
}

// input writes typed bytes to the terminal (and, when enabled and not at
// a password prompt, to the recording). While the terminal does not take
// them, it checks every stdinCheck that the client is still connected.
func (ss *ptySession) input(a *attacher, p []byte) error {
	ss.inMu.Lock()
	defer ss.inMu.Unlock()
	if ss.recordInput && !ss.secretInput() {
		d := append([]byte(nil), p...)
		ss.record(func(w *asciicast.Writer) error { return w.Event(time.Now(), asciicast.Input, d) })
	}
	for len(p) > 0 {
		ss.master.SetWriteDeadline(time.Now().Add(stdinCheck))
		n, err := ss.master.Write(p)
		p = p[n:]
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if peerClosed(a.c) {
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

// resize sets the window size (the kernel signals SIGWINCH to the
// foreground process group) and records it.
func (ss *ptySession) resize(rows, cols uint16) error {
	if rows == 0 || cols == 0 {
		return fmt.Errorf("window size %dx%d: rows and cols must be positive", rows, cols)
	}
	if err := ss.control(func(fd int) error {
		return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	}); err != nil {
		return err
	}
	ss.mu.Lock()
	ss.info.Rows, ss.info.Cols = rows, cols
	ss.mu.Unlock()
	ss.record(func(w *asciicast.Writer) error { return w.ResizeEvent(time.Now(), int(cols), int(rows)) })
	return nil
}

// signal sends a signal to the terminal's foreground process group. The
// keyboard signals go through the terminal (which also flushes its input,
// as typing them would); others are sent to the group directly.
func (ss *ptySession) signal(name string) error {
	sig, err := parseSignal(name)
	if err != nil {
		return err
	}
	return ss.control(func(fd int) error {
		switch sig {
		case unix.SIGINT, unix.SIGQUIT, unix.SIGTSTP:
			return unix.IoctlSetInt(fd, unix.TIOCSIG, int(sig))
		}
		pgrp, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP)
		if err != nil {
			return fmt.Errorf("foreground process group: %w", err)
		}
		if pgrp <= 1 {
			return fmt.Errorf("foreground process group %d: refusing to signal it", pgrp)
		}
		return unix.Kill(-pgrp, sig)
	})
}

// listSessions describes the running sessions, oldest first.
func (s *Server) listSessions() []initproto.SessionInfo {
	s.mu.Lock()
	list := make([]*ptySession, 0, len(s.sessions))
	for _, ss := range s.sessions {
		list = append(list, ss)
	}
	s.mu.Unlock()
	out := make([]initproto.SessionInfo, 0, len(list))
	for _, ss := range list {
		ss.mu.Lock()
		info := ss.info
		info.Attached = len(ss.attachers)
		ss.mu.Unlock()
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].StartedAt.Equal(out[j].StartedAt) {
			return out[i].ID < out[j].ID
		}
		return out[i].StartedAt.Before(out[j].StartedAt)
	})
	return out
}

// shellJoin quotes argv for display as one command line.
func shellJoin(argv []string) string {
	parts := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && strings.IndexFunc(a, func(r rune) bool {
			return !(r == '-' || r == '_' || r == '.' || r == '/' || r == '=' || r == ':' || r == ',' || r == '+' ||
				(r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9'))
		}) < 0 {
			parts[i] = a
			continue
		}
		parts[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(parts, " ")
}

// ring keeps the last scrollbackSize bytes written to it.
type ring struct {
	buf      []byte
	start, n int
}

func (r *ring) write(p []byte) {
	if r.buf == nil {
		r.buf = make([]byte, scrollbackSize)
	}
	size := len(r.buf)
	if len(p) >= size {
		copy(r.buf, p[len(p)-size:])
		r.start, r.n = 0, size
		return
	}
	end := (r.start + r.n) % size
	c := copy(r.buf[end:], p)
	copy(r.buf, p[c:])
	r.n += len(p)
	if r.n > size {
		r.start = (r.start + r.n - size) % size
		r.n = size
	}
}

// bytes returns a copy of the kept bytes, oldest first, without a torn
// UTF-8 sequence at the start.
func (r *ring) bytes() []byte {
	out := make([]byte, r.n)
	if r.n > 0 {
		c := copy(out, r.buf[r.start:min(r.start+r.n, len(r.buf))])
		copy(out[c:], r.buf)
	}
	for i := 0; i < 3 && len(out) > 0 && out[0]&0xC0 == 0x80; i++ {
		out = out[1:]
	}
	return out
}
