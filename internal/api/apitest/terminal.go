package apitest

import (
	"bytes"
	"context"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
)

// OpenTerminal starts a fake session in a running jail: it echoes what is
// typed, reports a resize as "[resize RxC]", ends with code 0 when Ctrl-D
// is typed and with 128+N on signal N. Attaching (req.Session) is
// ErrNotFound: fake sessions end with their only client.
func (s *Service) OpenTerminal(_ context.Context, ref string, req model.TerminalRequest) (model.Terminal, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fj, err := s.running(ref)
	if err != nil {
		return nil, err
	}
	if req.Session != "" {
		return nil, errdefs.NotFoundf("jail %s has no running terminal session %q", fj.j.Name, req.Session)
	}
	s.next++
	rows, cols := req.Rows, req.Cols
	if rows == 0 {
		rows, cols = 24, 80
	}
	return &fakeTerm{
		out: make(chan []byte, 64),
		info: model.TerminalSession{
			ID: "s" + strconv.Itoa(s.next), JailID: fj.j.ID, Pid: 100 + s.next, Cmd: req.Cmd, User: req.User,
			Term: "xterm-256color", Rows: rows, Cols: cols, StartedAt: time.Now().UTC(), Attached: 1,
		},
	}, nil
}

type fakeTerm struct {
	info model.TerminalSession
	out  chan []byte

	mu      sync.Mutex
	pending []byte
	exit    *model.TerminalExit
	closed  bool
}

func (t *fakeTerm) Session() model.TerminalSession { return t.info }

func (t *fakeTerm) Read(p []byte) (int, error) {
	if len(t.pending) == 0 {
		b, ok := <-t.out
		if !ok {
			return 0, io.EOF
		}
		t.pending = b
	}
	n := copy(p, t.pending)
	t.pending = t.pending[n:]
	return n, nil
}

// emit queues output, or ends the session with exit when it is not nil.
func (t *fakeTerm) emit(b []byte, exit *model.TerminalExit) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.exit != nil || t.closed {
		return
	}
	if len(b) > 0 {
		t.out <- b
	}
	if exit != nil {
		t.exit = exit
		close(t.out)
	}
}

func (t *fakeTerm) Write(p []byte) (int, error) {
	if i := bytes.IndexByte(p, 4); i >= 0 {
		t.emit(append([]byte(nil), p[:i]...), &model.TerminalExit{})
		return len(p), nil
	}
	t.emit(append([]byte(nil), p...), nil)
	return len(p), nil
}

func (t *fakeTerm) Resize(rows, cols int) error {
	if rows < 1 || cols < 1 {
		return errdefs.Invalidf("resize: rows %d and cols %d must be positive", rows, cols)
	}
	t.emit([]byte("[resize "+strconv.Itoa(rows)+"x"+strconv.Itoa(cols)+"]"), nil)
	return nil
}

func (t *fakeTerm) Signal(sig string) error {
	n := map[string]int{"SIGINT": 2, "SIGTERM": 15, "SIGKILL": 9}[strings.ToUpper(sig)]
	if n == 0 {
		return errdefs.Invalidf("signal: %q is not a signal name", sig)
	}
	t.emit(nil, &model.TerminalExit{Code: 128 + n, Signal: strings.ToUpper(sig)})
	return nil
}

func (t *fakeTerm) Exit() (model.TerminalExit, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.exit == nil {
		return model.TerminalExit{}, false
	}
	return *t.exit, true
}

func (t *fakeTerm) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.closed && t.exit == nil {
		close(t.out)
	}
	t.closed = true
	return nil
}

// Terminals lists no sessions: fake sessions are not kept.
func (s *Service) Terminals(_ context.Context, ref string) ([]model.TerminalSession, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.running(ref); err != nil {
		return nil, err
	}
	return []model.TerminalSession{}, nil
}

// AddRecording stores a recording served by Recordings and OpenRecording;
// a recording with Status "tampered" fails its integrity check.
func (s *Service) AddRecording(rec model.Recording, content string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.recordings == nil {
		s.recordings = map[string]fakeRecording{}
	}
	s.recordings[rec.ID] = fakeRecording{rec, content}
}

type fakeRecording struct {
	rec     model.Recording
	content string
}

// Recordings lists the recordings added for the jail.
func (s *Service) Recordings(_ context.Context, ref string) ([]model.Recording, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fj, err := s.lookup(ref)
	if err != nil {
		return nil, err
	}
	out := []model.Recording{}
	for _, r := range s.recordings {
		if r.rec.JailID == fj.j.ID {
			out = append(out, r.rec)
		}
	}
	return out, nil
}

// OpenRecording returns a recording added with AddRecording.
func (s *Service) OpenRecording(_ context.Context, rid string) (*model.Recording, io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.recordings[rid]
	if !ok {
		return nil, nil, errdefs.NotFoundf("no recording %q", rid)
	}
	if r.rec.Status == "tampered" {
		return nil, nil, errdefs.Conflictf("recording %s failed its integrity check", rid)
	}
	rec := r.rec
	return &rec, io.NopCloser(strings.NewReader(r.content)), nil
}
