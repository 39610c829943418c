package jail

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/recording"
)

// Terminal sizes accepted from clients.
const maxTermSize = 4096

// recordingsMu serialises the finalization of recordings.
var recordingsMu sync.Mutex

// rawRecordings is the host path of the directory where a jail's init
// writes its recordings (its control directory is DIR/run).
func rawRecordings(e *entry) string { return filepath.Join(e.dir, "run", initproto.RecordingsName) }

// storedRecordings is where a jail's finalized recordings live.
func storedRecordings(e *entry) string { return filepath.Join(e.dir, "recordings") }

// recordingID is the globally unique id of a session's recording.
func recordingID(jailID, session string) string { return jailID + "-" + session }

func checkTermSize(field string, v int) error {
	if v < 0 || v > maxTermSize {
		return errdefs.Invalidf("%s: %d must be between 1 and %d", field, v, maxTermSize)
	}
	return nil
}

// OpenTerminal starts a terminal session in a running jail, or attaches
// to one (req.Session), and returns the client's attachment. The session
// is recorded; input too when the jail's recording.input is set.
func (m *Manager) OpenTerminal(ctx context.Context, ref string, req model.TerminalRequest) (model.Terminal, error) {
	if err := checkTermSize("rows", req.Rows); err != nil {
		return nil, err
	}
	if err := checkTermSize("cols", req.Cols); err != nil {
		return nil, err
	}
	e, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	inst, c, err := m.running(ctx, ref)
	if err != nil {
		return nil, err
	}
	var t *initclient.Terminal
	if req.Session != "" {
		t, err = c.AttachTerminal(ctx, initproto.AttachRequest{Session: req.Session, ReadOnly: req.ReadOnly})
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, errdefs.NotFoundf("jail %s has no running terminal session %q", inst.Name, req.Session)
		}
	} else {
		if err := validateExec(&model.ExecRequest{Cmd: append([]string{"shell"}, req.Cmd...), Env: req.Env, Cwd: req.Cwd}); err != nil {
			return nil, err
		}
		if strings.ContainsAny(req.Term, "\x00\n") {
			return nil, errdefs.Invalidf("term: %q is not a terminal type", req.Term)
		}
		env := envList(req.Env)
		user, uerr := m.userFor(inst, req.User)
		if uerr != nil {
			return nil, uerr
		}
		t, err = c.StartTerminal(ctx, initproto.ExecRequest{
			Argv: req.Cmd, Env: env, Cwd: req.Cwd, User: user,
			PTY: &initproto.PTYOptions{
				Rows: uint16(req.Rows), Cols: uint16(req.Cols), Term: req.Term,
				RecordInput: inst.Config.Recording.Input,
			},
		})
	}
	if err != nil {
		return nil, err
	}
	return &terminal{m: m, e: e, t: t, readOnly: req.ReadOnly, info: sessionInfo(inst.ID, t.Session())}, nil
}

// sessionInfo converts init's description of a session.
func sessionInfo(jailID string, s initproto.SessionInfo) model.TerminalSession {
	out := model.TerminalSession{
		ID: s.ID, JailID: jailID, Pid: s.Pid, Cmd: s.Argv, User: s.User, Cwd: s.Cwd, Term: s.Term,
		Rows: int(s.Rows), Cols: int(s.Cols), StartedAt: s.StartedAt, Attached: s.Attached,
	}
	if s.Recording {
		out.RecordingID = recordingID(jailID, s.ID)
	}
	return out
}

// terminal adapts init's attachment to model.Terminal.
type terminal struct {
	m        *Manager
	e        *entry
	t        *initclient.Terminal
	readOnly bool
	info     model.TerminalSession
	pending  []byte
}

func (t *terminal) Session() model.TerminalSession { return t.info }

func (t *terminal) Read(p []byte) (int, error) {
	for len(t.pending) == 0 {
		b, err := t.t.Next()
		if errors.Is(err, io.EOF) {
			// The session ended: its recording can be finalized now.
			go t.m.finalizeRecordings(t.e, true)
			return 0, io.EOF
		}
		if err != nil {
			return 0, err
		}
		t.pending = b
	}
	n := copy(p, t.pending)
	t.pending = t.pending[n:]
	return n, nil
}

func (t *terminal) Write(p []byte) (int, error) {
	if t.readOnly {
		return len(p), nil
	}
	if err := t.t.Input(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (t *terminal) Resize(rows, cols int) error {
	if rows < 1 || cols < 1 || rows > maxTermSize || cols > maxTermSize {
		return errdefs.Invalidf("resize: rows %d and cols %d must be between 1 and %d", rows, cols, maxTermSize)
	}
	if t.readOnly {
		return errdefs.Forbiddenf("resize: this attachment is read-only")
	}
	return t.t.Resize(uint16(rows), uint16(cols))
}

func (t *terminal) Signal(sig string) error {
	if !validSignal(sig) {
		return errdefs.Invalidf("signal: %q is not a signal name or number", sig)
	}
	if t.readOnly {
		return errdefs.Forbiddenf("signal: this attachment is read-only")
	}
	return t.t.Signal(sig)
}

// validSignal accepts "SIGINT", "INT" or a number from 1 to 64.
func validSignal(s string) bool {
	if n, err := strconv.Atoi(s); err == nil {
		return n >= 1 && n <= 64
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	return unix.SignalNum(name) != 0
}

func (t *terminal) Exit() (model.TerminalExit, bool) {
	st, ok := t.t.Exit()
	return model.TerminalExit{Code: st.Code, Signal: st.Signal}, ok
}

func (t *terminal) Close() error { return t.t.Close() }

// Terminals lists a running jail's terminal sessions.
func (m *Manager) Terminals(ctx context.Context, ref string) ([]model.TerminalSession, error) {
	inst, c, err := m.running(ctx, ref)
	if err != nil {
		return nil, err
	}
	list, err := c.Sessions(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]model.TerminalSession, len(list))
	for i, s := range list {
		out[i] = sessionInfo(inst.ID, s)
	}
	return out, nil
}

// maxStoredRecordings bounds the recordings one jail keeps on the data dir
// (compressed). Its init writes them in the jail's control dir, where the
// jail's root can write too: without a bound a jail could move the room of
// its control dir onto the data dir again and again.
var maxStoredRecordings int64 = 4 << 30

// finalizeRecordings moves a jail's finished recordings into its
// recordings directory (compressed, checksummed). With running false, the
// jail's init is gone and recordings it left unfinished are finalized as
// they are (at most their last second is missing). Past
// maxStoredRecordings none is moved.
func (m *Manager) finalizeRecordings(e *entry, running bool) {
	recordingsMu.Lock()
	defer recordingsMu.Unlock()
	raw := rawRecordings(e)
	ents, err := os.ReadDir(raw)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			m.log.Warn("reading recordings", "dir", raw, "err", err)
		}
		return
	}
	jailID := e.snapshot().ID
	var stored int64
	if list, err := recording.List(storedRecordings(e)); err == nil {
		for _, r := range list {
			stored += r.CompressedSize
		}
	}
	for _, d := range ents {
		sid, done := strings.CutSuffix(d.Name(), ".cast")
		if !done {
			var part bool
			if sid, part = strings.CutSuffix(d.Name(), ".cast.part"); !part || running {
				continue
			}
		}
		rid := recordingID(jailID, sid)
		if stored >= maxStoredRecordings {
			m.log.Warn("a recording is not stored: the jail's recordings take their bound", "recording", rid, "stored", stored, "bound", maxStoredRecordings)
			continue
		}
		rec, err := recording.Finalize(filepath.Join(raw, d.Name()), storedRecordings(e), rid, jailID, sid)
		if err != nil {
			m.log.Error("finalizing a recording", "recording", rid, "err", err)
			continue
		}
		stored += rec.CompressedSize
	}
}

// Recordings lists a jail's recordings (those of running sessions too),
// oldest first; finished ones are finalized first.
func (m *Manager) Recordings(ctx context.Context, ref string) ([]model.Recording, error) {
	e, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	j := e.snapshot()
	m.finalizeRecordings(e, j.Status == model.StateRunning)
	list, err := recording.List(storedRecordings(e))
	if err != nil {
		return nil, err
	}
	raw := rawRecordings(e)
	ents, _ := os.ReadDir(raw)
	for _, d := range ents {
		sid, ok := strings.CutSuffix(d.Name(), ".cast.part")
		if !ok {
			continue
		}
		rec, err := recording.Describe(filepath.Join(raw, d.Name()), recordingID(j.ID, sid), j.ID, sid)
		if err != nil {
			m.log.Warn("describing an active recording", "err", err)
			continue
		}
		list = append(list, *rec)
	}
	recording.Sort(list)
	if list == nil {
		list = []model.Recording{}
	}
	return list, nil
}

// OpenRecording returns a recording (by its global id) and a reader of
// its asciicast v2 content; the caller closes it. A finished recording is
// verified against its sha256 first (ErrConflict when it was modified);
// an active one is read as written so far.
func (m *Manager) OpenRecording(ctx context.Context, rid string) (*model.Recording, io.ReadCloser, error) {
	jailID, sid, ok := strings.Cut(rid, "-")
	if !ok || jailID == "" || sid == "" || strings.ContainsAny(rid, "/.\x00") || path.Base(rid) != rid {
		return nil, nil, errdefs.NotFoundf("no recording %q (ids look like {jail id}-{session id})", rid)
	}
	e, err := m.lookup(ctx, jailID)
	if err != nil {
		return nil, nil, errdefs.NotFoundf("no recording %q: its jail %s does not exist", rid, jailID)
	}
	m.finalizeRecordings(e, e.snapshot().Status == model.StateRunning)
	rec, rc, err := recording.Open(storedRecordings(e), rid)
	if !errors.Is(err, errdefs.ErrNotFound) {
		return rec, rc, err
	}
	part := filepath.Join(rawRecordings(e), sid+".cast.part")
	rec, derr := recording.Describe(part, rid, jailID, sid)
	if derr != nil {
		return nil, nil, err
	}
	f, ferr := os.Open(part)
	if ferr != nil {
		return nil, nil, err
	}
	return rec, f, nil
}
