package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/agentjail/agentjail/internal/atomicfile"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
)

// Sandbox states.
const (
	stateRunning = "running"
	statePaused  = "paused"
)

// Limits of the control plane.
const (
	defaultTimeout = 300 * time.Second
	maxTimeout     = 24 * time.Hour
	maxForks       = model.MaxBranches
	// opTimeout bounds a lifecycle operation (create, pause, resume, kill).
	opTimeout = 5 * time.Minute
)

// record is a sandbox as kept in DATA_DIR/e2b/sandboxes/{id}.json.
type record struct {
	ID         string            `json:"id"`
	TemplateID string            `json:"template_id"`
	Tenant     string            `json:"tenant"`
	KeyID      string            `json:"key_id"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	EnvVars    map[string]string `json:"env_vars,omitempty"`
	// Token is the sandbox plane's access token (envdAccessToken).
	Token string `json:"token"`
	// TrafficToken, for a sandbox whose ports are not public, is what a
	// request to them by host name carries (trafficAccessToken).
	TrafficToken string `json:"traffic_token,omitempty"`
	State        string `json:"state"`
	// JailID is the jail the sandbox runs in (the last one while paused).
	JailID string `json:"jail_id"`
	// Jails are every jail the sandbox ran in, oldest first.
	Jails []string `json:"jails"`
	// PauseSnapshot is the snapshot a paused sandbox resumes from.
	PauseSnapshot string    `json:"pause_snapshot,omitempty"`
	StartedAt     time.Time `json:"started_at"`
	EndAt         time.Time `json:"end_at"`
	AutoPause     bool      `json:"auto_pause,omitempty"`
	// PauseFilesOnly makes the pause at the timeout keep the files only
	// (autoPauseMemory: false).
	PauseFilesOnly bool `json:"pause_files_only,omitempty"`
	// PausedFilesOnly: the paused sandbox's snapshot holds its files only.
	PausedFilesOnly bool `json:"paused_files_only,omitempty"`
	// AutoResume resumes the paused sandbox when a request reaches its
	// sandbox plane or its ports, for Timeout.
	AutoResume bool `json:"auto_resume,omitempty"`
	// Timeout is the lifetime the sandbox was created with.
	Timeout  time.Duration `json:"timeout,omitempty"`
	CPUCount int           `json:"cpu_count"`
	MemoryMB int           `json:"memory_mb"`
	// Network holds the E2B network options the sandbox was given (nil:
	// none, the daemon's default policy).
	Network *netSettings `json:"network,omitempty"`
	// Volumes are the volumes mounted in the sandbox.
	Volumes []volumeMount `json:"volume_mounts,omitempty"`
	// ExecEnv is added to the environment of every command (the create's
	// envVars, when the jail was restored rather than started with them).
	ExecEnv map[string]string `json:"exec_env,omitempty"`
	// Procs describes the processes started through the sandbox plane, by
	// pid (for Process/List and tag selectors).
	Procs map[uint32]procMeta `json:"procs,omitempty"`
}

// resumeTimeout is the lifetime a sandbox resumed by a request gets: the
// one it was created with.
func (r record) resumeTimeout() time.Duration {
	if r.Timeout > 0 {
		return r.Timeout
	}
	return defaultTimeout
}

// procMeta is how a process was started.
type procMeta struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args,omitempty"`
	Envs map[string]string `json:"envs,omitempty"`
	Cwd  string            `json:"cwd,omitempty"`
	Tag  string            `json:"tag,omitempty"`
	PTY  bool              `json:"pty,omitempty"`
}

// sandbox is a live record. op serialises lifecycle operations; mu guards
// rec and the streams.
type sandbox struct {
	op     sync.Mutex
	saveMu sync.Mutex // serialises saves of the record
	mu     sync.Mutex
	rec    record
	timer  *time.Timer
	// streams are the sandbox plane's open streams (each holds a
	// connection to the jail's init); a pause or kill ends them first.
	streams map[*stream]struct{}
	// homes are users' home directories, by jail and user (see home).
	homes map[string]string
}

func newSandbox(r record) *sandbox {
	if r.Procs == nil {
		r.Procs = map[uint32]procMeta{}
	}
	return &sandbox{rec: r, streams: map[*stream]struct{}{}, homes: map[string]string{}}
}

func (sb *sandbox) snapshot() record {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	r := sb.rec
	return r
}

// lockRunning takes sb's operation lock and returns its record; when sb
// is not running it returns a conflict (what it cannot then do) instead,
// the lock released.
func (sb *sandbox) lockRunning(what string) (record, error) {
	sb.op.Lock()
	r := sb.snapshot()
	if r.State != stateRunning {
		sb.op.Unlock()
		return r, errdefs.Conflictf("sandbox %s is %s; only a running sandbox can %s", r.ID, r.State, what)
	}
	return r, nil
}

func (sb *sandbox) stopTimer() {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.timer != nil {
		sb.timer.Stop()
		sb.timer = nil
	}
}

// stream is one open sandbox-plane stream.
type stream struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// openStream registers a stream of sb whose context is ended by a pause
// or kill; the caller calls the returned function when it ends.
func (sb *sandbox) openStream(ctx context.Context) (context.Context, func(), error) {
	ctx, cancel := context.WithCancelCause(ctx)
	st := &stream{cancel: func() { cancel(errSandboxGone) }, done: make(chan struct{})}
	sb.mu.Lock()
	if sb.rec.State != stateRunning {
		sb.mu.Unlock()
		cancel(nil)
		return nil, nil, errSandboxGone
	}
	sb.streams[st] = struct{}{}
	sb.mu.Unlock()
	return ctx, func() {
		sb.mu.Lock()
		delete(sb.streams, st)
		sb.mu.Unlock()
		cancel(nil)
		close(st.done)
	}, nil
}

// endStreams ends every open stream and waits until they are gone (so
// that no connection to the jail's init is left).
func (sb *sandbox) endStreams() {
	sb.mu.Lock()
	list := make([]*stream, 0, len(sb.streams))
	for st := range sb.streams {
		list = append(list, st)
	}
	sb.mu.Unlock()
	for _, st := range list {
		st.cancel()
	}
	for _, st := range list {
		select {
		case <-st.done:
		case <-time.After(10 * time.Second):
		}
	}
}

// errSandboxGone ends the streams of a sandbox that is paused or killed.
var errSandboxGone = errors.New("the sandbox was paused or killed")

// newSandboxID returns 20 characters of [a-z0-9], as E2B's ids (no '-':
// the SDK builds host names from them).
func newSandboxID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	var b [20]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b[:])
}

func newToken() string {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}

// jailName is the name of a sandbox's n-th jail.
func jailName(id string, n int) string {
	if n <= 1 {
		return "e2b-" + id
	}
	return fmt.Sprintf("e2b-%s-%d", id, n)
}

// store keeps the records, one file per sandbox.
type store struct {
	dir string
}

func openStore(dataDir string) (*store, error) {
	dir := filepath.Join(dataDir, "e2b", "sandboxes")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("e2b: %w", err)
	}
	return &store{dir: dir}, nil
}

func (st *store) load() ([]record, error) {
	ents, err := os.ReadDir(st.dir)
	if err != nil {
		return nil, fmt.Errorf("e2b: %w", err)
	}
	var out []record
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(st.dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("e2b: %w", err)
		}
		var r record
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, fmt.Errorf("e2b: %s: %w", e.Name(), err)
		}
		out = append(out, r)
	}
	return out, nil
}

func (st *store) save(r record) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(st.dir, r.ID+".json"), data, 0o600); err != nil {
		return fmt.Errorf("e2b: %w", err)
	}
	return nil
}

func (st *store) remove(id string) {
	os.Remove(filepath.Join(st.dir, id+".json"))
	os.RemoveAll(filepath.Join(st.dir, id))
}

// reportPath is where the report of a sandbox's earlier jail is kept.
func (st *store) reportPath(id, jailID string) string {
	return filepath.Join(st.dir, id, "report-"+jailID+".json")
}

// persist saves sb's record (errors are logged: the sandbox keeps working).
// Saves of one sandbox are serialised, each writing the record as it is
// then, so the last one leaves the newest.
func (s *Service) persist(sb *sandbox) {
	sb.saveMu.Lock()
	defer sb.saveMu.Unlock()
	if sb.snapshot().State == "killed" {
		return
	}
	if err := s.store.save(sb.snapshot()); err != nil {
		s.log.Error("saving an e2b sandbox record", "err", err)
	}
}

// arm (re)starts sb's timeout timer from its EndAt.
func (s *Service) arm(sb *sandbox) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.timer != nil {
		sb.timer.Stop()
	}
	if sb.rec.State != stateRunning {
		sb.timer = nil
		return
	}
	id := sb.rec.ID
	sb.timer = time.AfterFunc(time.Until(sb.rec.EndAt), func() { s.expire(id) })
}

// expire ends a sandbox whose timeout passed: paused when it asked for
// auto-pause, else killed.
func (s *Service) expire(id string) {
	select {
	case <-s.closed:
		return
	default:
	}
	sb := s.sandboxByID(id)
	if sb == nil {
		return
	}
	r := sb.snapshot()
	if r.State != stateRunning || time.Now().Before(r.EndAt) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if r.AutoPause {
		if err := s.pause(ctx, sb, !r.PauseFilesOnly); err == nil || errors.Is(err, errdefs.ErrConflict) {
			s.log.Info("e2b sandbox timed out: paused", "sandbox", id)
			return
		} else {
			s.log.Error("pausing a timed-out e2b sandbox; killing it", "sandbox", id, "err", err)
		}
	}
	if err := s.kill(ctx, sb); err != nil {
		s.log.Error("killing a timed-out e2b sandbox", "sandbox", id, "err", err)
		return
	}
	s.log.Info("e2b sandbox timed out: killed", "sandbox", id)
}

// createSpec is what a create asks for.
type createSpec struct {
	template  string
	timeout   time.Duration
	metadata  map[string]string
	envVars   map[string]string
	autoPause bool
	// autoResume resumes a paused sandbox on traffic (with autoPause).
	autoResume bool
	// pauseFilesOnly: the pause at the timeout keeps the files only.
	pauseFilesOnly bool
	// volumes are the volumes to mount, mounts the jail's mounts of them.
	volumes []volumeMount
	mounts  []config.Mount
	// network and creds are the E2B network options (nil: none).
	network *netSettings
	creds   []config.Credential
}

// create makes a sandbox for c.
func (s *Service) create(ctx context.Context, c caller, spec createSpec) (*sandbox, error) {
	id := newSandboxID()
	var j *model.Jail
	var err error
	sid := s.ownSnapshot(ctx, c, spec.template)
	var tb *buildRecord
	if sid == "" {
		// A template built here: its snapshot (started) or its image.
		if tb, err = s.templates.resolve(c, spec.template); err != nil {
			return nil, err
		}
		if tb != nil {
			sid = tb.Snapshot
		}
	}
	// The sandbox's network is its create's. A jail started with it is
	// needed only for credentials (they set the jail's environment as it
	// starts); otherwise the jail is a ready one of the daemon's default
	// configuration, or a restored snapshot, and its network is replaced
	// at once (without options: the daemon's default, nothing allowed,
	// not the snapshotted sandbox's).
	// A snapshot keeps the mounts it was made with: a sandbox of a template
	// with a start command that mounts volumes is a jail of the template's
	// image in which the start command starts anew.
	var start *buildRecord
	if sid != "" && len(spec.mounts) > 0 {
		if tb == nil || tb.StartCmd == "" {
			return nil, errdefs.Invalidf("volumeMounts: a sandbox restored from a snapshot keeps the mounts it was made with; mount volumes in sandboxes of templates or images")
		}
		sid, start = "", tb
	}
	startWithNetwork := sid == "" && spec.network != nil && len(spec.creds) > 0
	if sid != "" {
		// A snapshot made by createSnapshot: its files and processes.
		j, err = s.jails.Restore(ctx, sid, jailName(id, 1))
	} else {
		cfg := templateConfig(spec.template)
		if tb != nil {
			cfg = tb.sandboxConfig()
		}
		cfg.Env = spec.envVars
		cfg.Isolation.Filesystem.ReadWriteMounts = append(cfg.Isolation.Filesystem.ReadWriteMounts, spec.mounts...)
		if startWithNetwork {
			cfg.Isolation.Network = spec.network.policy(config.NetBridge, spec.creds)
		}
		j, err = s.jails.Create(ctx, model.CreateRequest{Name: jailName(id, 1), Config: cfg})
		if err != nil && errors.Is(err, errdefs.ErrUnprocessable) && spec.template != "" && spec.template != defaultTemplate {
			return nil, errdefs.NotFoundf("template %q: %v", spec.template, err)
		}
	}
	if err != nil {
		return nil, err
	}
	if !startWithNetwork && (sid != "" || spec.network != nil) {
		n := config.Network{Mode: j.Config.Isolation.Network.Mode}
		if spec.network != nil {
			n = spec.network.policy(config.NetBridge, spec.creds)
		}
		updated, err := s.jails.UpdateNetwork(ctx, j.ID, n)
		if err != nil {
			s.dropJail(ctx, j.ID)
			return nil, err
		}
		j = updated
	}
	if start != nil {
		if err := s.startTemplate(ctx, j.ID, start.StartCmd, start.ReadyCmd); err != nil {
			s.dropJail(ctx, j.ID)
			return nil, fmt.Errorf("template %s: %w", spec.template, err)
		}
	}
	now := time.Now().UTC()
	r := record{
		ID: id, TemplateID: spec.template, Tenant: c.key.Tenant, KeyID: c.key.ID,
		Metadata: spec.metadata, EnvVars: spec.envVars, Token: newToken(), State: stateRunning,
		JailID: j.ID, Jails: []string{j.ID}, StartedAt: now, EndAt: now.Add(spec.timeout), AutoPause: spec.autoPause,
		AutoResume: spec.autoResume, Timeout: spec.timeout, PauseFilesOnly: spec.pauseFilesOnly,
		CPUCount: cpuCount(j), MemoryMB: int(j.Config.Isolation.Resources.MemoryBytes >> 20), Network: spec.network,
		Volumes: spec.volumes,
	}
	if sid != "" {
		// A restored jail keeps the environment it was started with.
		r.ExecEnv = spec.envVars
	}
	if spec.network.private() {
		r.TrafficToken = newToken()
	}
	if r.TemplateID == "" {
		r.TemplateID = defaultTemplate
	}
	sb := newSandbox(r)
	if err := s.store.save(r); err != nil {
		s.dropJail(ctx, j.ID)
		return nil, err
	}
	s.mu.Lock()
	s.sandboxes[id] = sb
	s.mu.Unlock()
	s.arm(sb)
	return sb, nil
}

// dropJail destroys the jail of a failed create.
func (s *Service) dropJail(ctx context.Context, j string) {
	if err := s.jails.Destroy(context.WithoutCancel(ctx), j); err != nil {
		s.log.Error("destroying the jail of a failed e2b create", "jail", j, "err", err)
	}
}

// ownSnapshot returns template when it is the id of a snapshot of one of
// the sandboxes c sees (made by createSnapshot), else "".
func (s *Service) ownSnapshot(ctx context.Context, c caller, template string) string {
	if template == "" || template == defaultTemplate {
		return ""
	}
	snaps, err := s.jails.ListSnapshots(ctx, "")
	if err != nil {
		return ""
	}
	for _, sn := range snaps {
		if sn.ID == template && s.ownsJail(c, sn.JailID) {
			return sn.ID
		}
	}
	return ""
}

// cpuCount is the CPUs a jail may use (its quota, else the host's).
func cpuCount(j *model.Jail) int {
	r := j.Config.Isolation.Resources
	if r.CPUQuota > 0 && r.CPUPeriod > 0 {
		return max(1, int((uint64(r.CPUQuota)+r.CPUPeriod-1)/r.CPUPeriod))
	}
	return runtime.NumCPU()
}

// kill destroys the sandbox: its jails, its pause snapshot, its record.
func (s *Service) kill(ctx context.Context, sb *sandbox) error {
	sb.op.Lock()
	defer sb.op.Unlock()
	r := sb.snapshot()
	sb.mu.Lock()
	sb.rec.State = "killed"
	sb.mu.Unlock()
	sb.stopTimer()
	sb.endStreams()
	if r.State == stateRunning {
		if err := s.jails.Destroy(ctx, r.JailID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			// The sandbox stays, as it was, for another try.
			sb.mu.Lock()
			sb.rec.State = r.State
			sb.mu.Unlock()
			s.arm(sb)
			return err
		}
	}
	var errs []error
	if r.PauseSnapshot != "" {
		if err := s.jails.DeleteSnapshot(ctx, r.PauseSnapshot); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	s.closeWatchers(r.ID)
	s.mu.Lock()
	delete(s.sandboxes, r.ID)
	s.mu.Unlock()
	sb.saveMu.Lock()
	s.store.remove(r.ID)
	sb.saveMu.Unlock()
	return errors.Join(errs...)
}

// pause snapshots the running sandbox (processes and files; its files
// only without keepMemory, and its resume then starts it afresh), keeps
// its jail's report, and destroys the jail: a paused sandbox holds no CPU
// or memory. ErrConflict when it is already paused.
func (s *Service) pause(ctx context.Context, sb *sandbox, keepMemory bool) error {
	sb.op.Lock()
	defer sb.op.Unlock()
	r := sb.snapshot()
	if r.State == statePaused {
		return errdefs.Conflictf("sandbox %s is already paused", r.ID)
	}
	if r.State != stateRunning {
		return errdefs.NotFoundf("sandbox %q not found", r.ID)
	}
	sb.mu.Lock()
	sb.rec.State = "pausing"
	sb.mu.Unlock()
	sb.endStreams()
	s.closeWatchers(r.ID)
	mode := model.SnapshotFull
	if !keepMemory {
		mode = model.SnapshotFS
	}
	snap, err := s.snapshot(ctx, r.JailID, model.SnapshotRequest{Name: fmt.Sprintf("e2b-%s-pause-%d", r.ID, len(r.Jails)), Mode: mode})
	if err != nil {
		sb.mu.Lock()
		sb.rec.State = stateRunning
		sb.mu.Unlock()
		return err
	}
	s.keepReport(ctx, r.ID, r.JailID)
	if err := s.jails.Destroy(ctx, r.JailID); err != nil {
		// The jail still holds its resources: the sandbox stays running.
		if derr := s.jails.DeleteSnapshot(context.WithoutCancel(ctx), snap.ID); derr != nil {
			s.log.Error("deleting the snapshot of a failed pause", "snapshot", snap.ID, "err", derr)
		}
		sb.mu.Lock()
		sb.rec.State = stateRunning
		sb.mu.Unlock()
		return err
	}
	sb.mu.Lock()
	sb.rec.State, sb.rec.PauseSnapshot = statePaused, snap.ID
	sb.rec.PausedFilesOnly = !keepMemory
	if !keepMemory {
		sb.rec.Procs = nil // they end with the jail
	}
	sb.mu.Unlock()
	sb.stopTimer()
	s.persist(sb)
	return nil
}

// snapshot takes a full snapshot of a sandbox's jail just after its
// streams ended. Their connections to the jail's init may still be
// closing on init's side, which a process checkpoint refuses ("unix
// socket ... not found"): such a failure is retried, briefly.
func (s *Service) snapshot(ctx context.Context, jail string, req model.SnapshotRequest) (*model.Snapshot, error) {
	delay := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		snap, err := s.jails.Snapshot(ctx, jail, req)
		if err == nil || attempt == 4 || !errors.Is(err, errdefs.ErrUnprocessable) || !strings.Contains(strings.ToLower(err.Error()), "unix socket") {
			return snap, err
		}
		s.log.Info("e2b: retrying a snapshot that met a closing connection", "jail", jail, "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
		delay *= 2
	}
}

// keepReport saves the observation report of a jail the sandbox leaves.
func (s *Service) keepReport(ctx context.Context, id, jailID string) {
	rep, err := s.jails.Report(ctx, jailID)
	if err != nil {
		s.log.Warn("keeping the report of an e2b sandbox's jail", "jail", jailID, "err", err)
		return
	}
	p := s.store.reportPath(id, jailID)
	data, _ := json.Marshal(rep)
	err = os.MkdirAll(filepath.Dir(p), 0o700)
	if err == nil {
		err = atomicfile.WriteFile(p, data, 0o600)
	}
	if err != nil {
		s.log.Warn("keeping the report of an e2b sandbox's jail", "jail", jailID, "err", err)
	}
}

// resume restores a paused sandbox from its pause snapshot into its next
// jail, with the same id, token, files and processes.
func (s *Service) resume(ctx context.Context, sb *sandbox, timeout time.Duration) error {
	sb.op.Lock()
	defer sb.op.Unlock()
	r := sb.snapshot()
	if r.State == stateRunning {
		s.extend(sb, timeout)
		return nil
	}
	if r.State != statePaused {
		return errdefs.NotFoundf("sandbox %q not found", r.ID)
	}
	j, err := s.jails.Restore(ctx, r.PauseSnapshot, jailName(r.ID, len(r.Jails)+1))
	if err != nil {
		return err
	}
	if err := s.jails.DeleteSnapshot(ctx, r.PauseSnapshot); err != nil {
		s.log.Warn("deleting a resumed e2b sandbox's pause snapshot", "snapshot", r.PauseSnapshot, "err", err)
	}
	now := time.Now().UTC()
	sb.mu.Lock()
	sb.rec.State, sb.rec.JailID, sb.rec.PauseSnapshot, sb.rec.PausedFilesOnly = stateRunning, j.ID, "", false
	sb.rec.Jails = append(sb.rec.Jails, j.ID)
	sb.rec.EndAt = now.Add(timeout)
	sb.mu.Unlock()
	s.persist(sb)
	s.arm(sb)
	return nil
}

// extend moves a running sandbox's end to now+timeout when that is later.
func (s *Service) extend(sb *sandbox, timeout time.Duration) {
	end := time.Now().UTC().Add(timeout)
	sb.mu.Lock()
	later := end.After(sb.rec.EndAt)
	if later {
		sb.rec.EndAt = end
	}
	sb.mu.Unlock()
	if later {
		s.persist(sb)
		s.arm(sb)
	}
}

// setTimeout sets a running sandbox's end to now+timeout.
func (s *Service) setTimeout(sb *sandbox, timeout time.Duration) error {
	sb.mu.Lock()
	if sb.rec.State != stateRunning {
		sb.mu.Unlock()
		return errdefs.NotFoundf("sandbox %q is not running", sb.rec.ID)
	}
	sb.rec.EndAt = time.Now().UTC().Add(timeout)
	sb.mu.Unlock()
	s.persist(sb)
	s.arm(sb)
	return nil
}

// fork branches the running sandbox count ways: a snapshot of it (files
// and processes) restored as count new sandboxes with their own ids and
// tokens. The source's open streams end (their connections cannot be
// recorded); its processes keep running.
func (s *Service) fork(ctx context.Context, c caller, sb *sandbox, count int, timeout time.Duration) ([]*sandbox, error) {
	if count < 1 || count > maxForks {
		return nil, errdefs.Invalidf("count: %d must be between 1 and %d", count, maxForks)
	}
	r, err := sb.lockRunning("be forked")
	if err != nil {
		return nil, err
	}
	sb.endStreams()
	snap, err := s.snapshot(ctx, r.JailID, model.SnapshotRequest{Name: "e2b-" + r.ID + "-fork-" + newToken()[:6], Mode: model.SnapshotFull})
	sb.op.Unlock()
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := s.jails.DeleteSnapshot(context.WithoutCancel(ctx), snap.ID); err != nil {
			s.log.Warn("deleting a fork's snapshot", "snapshot", snap.ID, "err", err)
		}
	}()
	ids := make([]string, count)
	for i := range ids {
		ids[i] = newSandboxID()
	}
	out := make([]*sandbox, 0, count)
	fail := func(err error) ([]*sandbox, error) {
		for _, f := range out {
			if kerr := s.kill(context.WithoutCancel(ctx), f); kerr != nil {
				s.log.Error("killing a fork after a failed fork", "sandbox", f.rec.ID, "err", kerr)
			}
		}
		return nil, err
	}
	for _, id := range ids {
		j, err := s.jails.Restore(ctx, snap.ID, jailName(id, 1))
		if err != nil {
			return fail(err)
		}
		now := time.Now().UTC()
		fr := r
		fr.ID, fr.Token, fr.State, fr.JailID, fr.Jails, fr.PauseSnapshot = id, newToken(), stateRunning, j.ID, []string{j.ID}, ""
		if fr.TrafficToken != "" {
			fr.TrafficToken = newToken()
		}
		fr.Tenant, fr.KeyID, fr.StartedAt, fr.EndAt = c.key.Tenant, c.key.ID, now, now.Add(timeout)
		fr.Procs = map[uint32]procMeta{}
		for pid, m := range r.Procs {
			fr.Procs[pid] = m
		}
		f := newSandbox(fr)
		if err := s.store.save(fr); err != nil {
			if derr := s.jails.Destroy(context.WithoutCancel(ctx), j.ID); derr != nil {
				s.log.Error("destroying a fork's jail after a failed fork", "jail", j.ID, "err", derr)
			}
			return fail(err)
		}
		s.mu.Lock()
		s.sandboxes[id] = f
		s.mu.Unlock()
		s.arm(f)
		out = append(out, f)
	}
	return out, nil
}

// readReport reads a kept report (ErrNotFound when none).
func (s *Service) readReport(id, jailID string) (json.RawMessage, error) {
	data, err := os.ReadFile(s.store.reportPath(id, jailID))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errdefs.NotFoundf("no report of jail %s is kept for sandbox %s", jailID, id)
	}
	return data, err
}
