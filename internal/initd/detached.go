package initd

import (
	"errors"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/agentjail/agentjail/internal/asciicast"
	"github.com/agentjail/agentjail/internal/initproto"
)

// Detached commands (ExecRequest.Detach): a command whose life does not
// depend on any connection. Its output goes to the connections attached at
// the moment; input arrives on an attachment or by MsgInput.

// lagGrace is how long a detached command's output waits for an
// attachment whose queue is full before that attachment starts losing
// output: long enough that a reading client on a loaded host never loses
// any, short enough that a client that stopped reading holds the others up
// only once, briefly.
const lagGrace = 5 * time.Second

// bgProc is a running detached command.
type bgProc struct {
	srv *Server
	ex  *execution

	inMu        sync.Mutex // serialises stdin writes
	stdinClosed bool

	pubMu sync.Mutex // serialises publishing (keeps the streams' order)

	mu    sync.Mutex
	subs  map[*bgSub]struct{}
	ended bool
	exit  initproto.ExitStatus
}

// bgFrame is one output frame queued for an attachment.
type bgFrame struct {
	t initproto.MsgType
	b []byte
}

// bgSub is one connection attached to a detached command.
type bgSub struct {
	c    *conn
	q    chan bgFrame // closed by the command's end, after the last output
	gone chan struct{}
	once sync.Once
	// lagging is set (under pubMu) while the attachment loses output.
	lagging bool
}

func (a *bgSub) detach() { a.once.Do(func() { close(a.gone) }) }

// endedProc is how a detached command or a terminal session ended.
type endedProc struct {
	exit initproto.ExitStatus
	at   time.Time
}

// runDetached runs the started command ex detached, serving c as its
// first attachment until c detaches or the command ends.
func (s *Server) runDetached(c *conn, ex *execution) error {
	b := &bgProc{srv: s, ex: ex, subs: map[*bgSub]struct{}{}}
	first := b.subscribe(c)
	s.execs.Add(1) // done when the command ends
	s.mu.Lock()
	s.bg[ex.pid] = b
	s.mu.Unlock()
	go b.run()
	b.serve(first)
	return nil
}

// subscribe registers a new attachment (nil when the command ended).
func (b *bgProc) subscribe(c *conn) *bgSub {
	a := &bgSub{c: c, q: make(chan bgFrame, attachQueue), gone: make(chan struct{})}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		return nil
	}
	b.subs[a] = struct{}{}
	return a
}

// run streams the command's output to the attachments until it exits,
// then ends every attachment with the exit status.
func (b *bgProc) run() {
	defer recoverPanic(b.srv.log, "detached command")
	s, ex := b.srv, b.ex
	var pumps sync.WaitGroup
	pumps.Add(2)
	go b.pump(ex.stdout, initproto.MsgStdout, &pumps)
	go b.pump(ex.stderr, initproto.MsgStderr, &pumps)
	status, res, shimOK := ex.await(func() (shimExit, bool) { return s.waitShim(ex.sh, ex.pid) }, &pumps)
	b.inMu.Lock()
	if ex.stdin != nil && !b.stdinClosed {
		ex.stdin.Close()
		b.stdinClosed = true
	}
	b.inMu.Unlock()
	s.mu.Lock()
	delete(s.procs, ex.pid)
	delete(s.bg, ex.pid)
	s.mu.Unlock()
	s.rememberEnded(ex.pid, status)
	s.releaseShim(ex.sh, res, shimOK) // before the attachments learn of the exit (see execution.run)
	b.mu.Lock()
	b.ended, b.exit = true, status
	for a := range b.subs {
		close(a.q)
	}
	b.mu.Unlock()
	s.execs.Done()
}

// pump publishes what one output pipe delivers (see readPipe).
func (b *bgProc) pump(f *os.File, t initproto.MsgType, wg *sync.WaitGroup) {
	defer recoverPanic(b.srv.log, "detached output pump")
	defer wg.Done()
	readPipe(f, func(p []byte) { b.publish(t, p) })
}

// publish offers a chunk to every attachment. An attachment whose queue
// stays full for lagGrace loses output until it has room again; it never
// holds the command up for longer.
func (b *bgProc) publish(t initproto.MsgType, p []byte) {
	d := bgFrame{t, append([]byte(nil), p...)}
	b.pubMu.Lock()
	defer b.pubMu.Unlock()
	b.mu.Lock()
	list := make([]*bgSub, 0, len(b.subs))
	for a := range b.subs {
		list = append(list, a)
	}
	b.mu.Unlock()
	for _, a := range list {
		if a.lagging && len(a.q) > cap(a.q)/2 {
			continue
		}
		a.lagging = false
		select {
		case a.q <- d:
			continue
		case <-a.gone:
			continue
		default:
		}
		t := time.NewTimer(lagGrace)
		select {
		case a.q <- d:
		case <-a.gone:
		case <-t.C:
			a.lagging = true
			b.srv.log.Printf("detached pid %d: an attachment does not keep up; dropping its output", b.ex.pid)
		}
		t.Stop()
	}
}

// serve answers Started on a's connection, then streams the queued output
// and applies the client's stdin frames until the client detaches or the
// command ends (then it sends Exit and closes the connection).
func (b *bgProc) serve(a *bgSub) {
	defer func() {
		a.detach()
		b.mu.Lock()
		delete(b.subs, a)
		b.mu.Unlock()
	}()
	if err := a.c.sendJSON(initproto.MsgStarted, initproto.Started{Pid: b.ex.pid}); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		defer recoverPanic(b.srv.log, "detached writer")
		defer close(done)
		for {
			select {
			case f, ok := <-a.q:
				if !ok {
					b.mu.Lock()
					status := b.exit
					b.mu.Unlock()
					_ = a.c.sendJSON(initproto.MsgExit, status)
					a.c.c.Close()
					return
				}
				if err := a.c.send(f.t, f.b); err != nil {
					a.detach()
					a.c.c.Close()
					return
				}
			case <-a.gone:
				return
			}
		}
	}()
	for {
		t, payload, err := a.c.read()
		if err != nil {
			break
		}
		switch t {
		case initproto.MsgStdin:
			if err := b.write(payload, time.Now().Add(initproto.MaxInputWait)); err != nil {
				b.srv.log.Printf("detached pid %d: stdin: %v", b.ex.pid, err)
			}
		case initproto.MsgStdinClose:
			b.closeStdin()
		default:
			b.srv.log.Printf("detached pid %d: ignoring %s frame", b.ex.pid, t)
		}
	}
	a.detach()
	<-done
}

// write writes p to the command's stdin, waiting until deadline at most
// for a command that does not read.
func (b *bgProc) write(p []byte, deadline time.Time) error {
	b.inMu.Lock()
	defer b.inMu.Unlock()
	if b.ex.stdin == nil {
		return newError(initproto.KindUnprocessable, "", "pid %d was started without stdin", b.ex.pid)
	}
	if b.stdinClosed {
		return newError(initproto.KindConflict, "", "the stdin of pid %d is closed", b.ex.pid)
	}
	b.ex.stdin.SetWriteDeadline(deadline)
	if _, err := b.ex.stdin.Write(p); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return newError(initproto.KindUnprocessable, "", "pid %d does not read its input", b.ex.pid)
		}
		if errors.Is(err, syscall.EPIPE) {
			return newError(initproto.KindConflict, "", "pid %d closed its input", b.ex.pid)
		}
		return newError(initproto.KindUnprocessable, "", "stdin of pid %d: %v", b.ex.pid, err)
	}
	return nil
}

// closeStdin ends the command's stdin (once).
func (b *bgProc) closeStdin() {
	b.inMu.Lock()
	defer b.inMu.Unlock()
	if b.ex.stdin != nil && !b.stdinClosed {
		b.ex.stdin.Close()
		b.stdinClosed = true
	}
}

// rememberEnded keeps how pid ended for EndedRetention, and forgets
// entries older than that.
func (s *Server) rememberEnded(pid int, status initproto.ExitStatus) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for p, e := range s.ended {
		if now.Sub(e.at) > initproto.EndedRetention {
			delete(s.ended, p)
		}
	}
	s.ended[pid] = endedProc{exit: status, at: now}
}

// attachPid serves a MsgAttach by pid: a detached command, a terminal
// session's command, or one of them that ended within EndedRetention.
func (s *Server) attachPid(c *conn, req initproto.AttachRequest) error {
	s.mu.Lock()
	b := s.bg[req.Pid]
	var ss *ptySession
	if b == nil {
		for _, x := range s.sessions {
			if x.pid == req.Pid {
				ss = x
			}
		}
	}
	ended, wasEnded := s.ended[req.Pid]
	s.mu.Unlock()
	switch {
	case b != nil:
		if a := b.subscribe(c); a != nil {
			b.serve(a)
			return nil
		}
		b.mu.Lock()
		ended, wasEnded = endedProc{exit: b.exit, at: time.Now()}, true
		b.mu.Unlock()
	case ss != nil:
		return ss.serve(c, req.ReadOnly, !req.NoScrollback)
	}
	if wasEnded && time.Since(ended.at) <= initproto.EndedRetention {
		if err := c.sendJSON(initproto.MsgStarted, initproto.Started{Pid: req.Pid}); err != nil {
			return nil
		}
		_ = c.sendJSON(initproto.MsgExit, ended.exit)
		return nil
	}
	return newError(initproto.KindNotFound, "", "no detached command or terminal session has pid %d", req.Pid)
}

// input serves MsgInput.
func (s *Server) input(req initproto.InputRequest) error {
	deadline := time.Now().Add(initproto.MaxInputWait)
	s.mu.Lock()
	b := s.bg[req.Pid]
	var ss *ptySession
	for _, x := range s.sessions {
		if x.pid == req.Pid {
			ss = x
		}
	}
	ended, wasEnded := s.ended[req.Pid]
	s.mu.Unlock()
	switch {
	case b != nil:
		if len(req.Data) > 0 {
			if err := b.write(req.Data, deadline); err != nil {
				return err
			}
		}
		if req.Close {
			b.closeStdin()
		}
		return nil
	case ss != nil:
		if req.Close {
			return newError(initproto.KindUnprocessable, "", "pid %d runs on a terminal, which has no end of input (send Ctrl-D)", req.Pid)
		}
		return ss.typeInput(req.Data, deadline)
	}
	if wasEnded && time.Since(ended.at) <= initproto.EndedRetention {
		// A command can end between its client's writes (it read all it
		// needed): its input is closed already, and data for it is late.
		if len(req.Data) == 0 {
			return nil
		}
		return newError(initproto.KindConflict, "", "pid %d has ended: its input is closed", req.Pid)
	}
	return newError(initproto.KindNotFound, "", "no detached command or terminal session has pid %d", req.Pid)
}

// typeInput writes bytes to the terminal, waiting until deadline at most.
func (ss *ptySession) typeInput(p []byte, deadline time.Time) error {
	ss.inMu.Lock()
	defer ss.inMu.Unlock()
	if ss.recordInput && !ss.secretInput() {
		d := append([]byte(nil), p...)
		ss.record(func(w *asciicast.Writer) error { return w.Event(time.Now(), asciicast.Input, d) })
	}
	ss.master.SetWriteDeadline(deadline)
	if _, err := ss.master.Write(p); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return newError(initproto.KindUnprocessable, "", "pid %d does not read its terminal", ss.pid)
		}
		return newError(initproto.KindUnprocessable, "", "terminal of pid %d: %v", ss.pid, err)
	}
	return nil
}

// setSize serves MsgSetSize.
func (s *Server) setSize(req initproto.SizeRequest) error {
	s.mu.Lock()
	var ss *ptySession
	for _, x := range s.sessions {
		if x.pid == req.Pid {
			ss = x
		}
	}
	s.mu.Unlock()
	if ss == nil {
		return newError(initproto.KindNotFound, "", "no terminal session has pid %d", req.Pid)
	}
	if err := ss.resize(req.Rows, req.Cols); err != nil {
		return newError(initproto.KindInvalid, "", "%v", err)
	}
	return nil
}
