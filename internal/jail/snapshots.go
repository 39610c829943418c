package jail

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/snapshot"
	"github.com/agentjail/agentjail/internal/tenant"
)

// snapshotState is the manager's part of snapshots: the store and the
// snapshots in use by a restore (which cannot be deleted meanwhile).
type snapshotState struct {
	store *snapshot.Store
	mu    sync.Mutex
	busy  map[string]int
	// pending counts the snapshots being taken, by tenant; admit
	// serialises the quota checks that add to it.
	pending map[string]int
	admit   sync.Mutex
}

// openSnapshots opens the snapshot store of the data dir (the storage
// pool must be open): snapshots survive daemon restarts and the
// destruction of their jails.
func (m *Manager) openSnapshots() error {
	st, err := snapshot.Open(m.opts.DataDir)
	if err != nil {
		return err
	}
	m.snaps = &snapshotState{store: st, busy: map[string]int{}, pending: map[string]int{}}
	return nil
}

// recoverCheckpoints undoes what a checkpoint interrupted by a daemon
// crash left on the running jails (a frozen disk or cgroup), once it has
// ended, then removes what incomplete snapshots left: a snapshot is
// either complete (its record written last) or gone.
func (m *Manager) recoverCheckpoints(ctx context.Context) {
	defer func() {
		if err := m.snaps.store.Sweep(); err != nil {
			m.log.Error("removing incomplete snapshots", "err", err)
		}
	}()
	m.mu.Lock()
	var running []*entry
	for _, e := range m.jails {
		if e.snapshot().Status == model.StateRunning {
			running = append(running, e)
		}
	}
	m.mu.Unlock()
	for _, e := range running {
		b, err := m.backendOf(e)
		if err != nil {
			continue
		}
		ck, ok := b.(backend.Checkpointer)
		if !ok {
			continue
		}
		if err := ck.Recover(ctx, m.instance(e)); err != nil {
			m.log.Error("recovering from an interrupted snapshot", "jail", e.snapshot().ID, "err", err)
		}
	}
}

// checkpointer returns the backend of level as a Checkpointer, or
// ErrNotImplemented naming the level and verb when it cannot snapshot.
func (m *Manager) checkpointer(level, verb string) (backend.Backend, backend.Checkpointer, error) {
	b, err := m.levels.Get(level)
	if err != nil {
		return nil, nil, err
	}
	ck, ok := b.(backend.Checkpointer)
	if !ok {
		return nil, nil, backend.Unsupported(level, verb, "")
	}
	return b, ck, nil
}

// use marks snapshot sid in use until the returned function is called;
// errdefs.ErrNotFound if it does not exist.
func (m *Manager) use(ctx context.Context, sid string) (*model.Snapshot, func(), error) {
	m.snaps.mu.Lock()
	defer m.snaps.mu.Unlock()
	snap, err := m.getSnapshot(ctx, sid)
	if err != nil {
		return nil, nil, err
	}
	m.snaps.busy[sid]++
	return snap, func() {
		m.snaps.mu.Lock()
		m.snaps.busy[sid]--
		if m.snaps.busy[sid] == 0 {
			delete(m.snaps.busy, sid)
		}
		m.snaps.mu.Unlock()
	}, nil
}

// Snapshot records the running jail ref: with mode "full" (the default)
// its processes and filesystem, consistently; with "fs" its filesystem
// only. The jail keeps running throughout and after, whatever happens.
// errdefs.ErrNotImplemented (with the reason) when process checkpoints are
// unavailable here; errdefs.ErrUnprocessable naming the process and
// resource when the jail's processes cannot be recorded.
func (m *Manager) Snapshot(ctx context.Context, ref string, req model.SnapshotRequest) (*model.Snapshot, error) {
	mode := req.Mode
	switch mode {
	case "":
		mode = model.SnapshotFull
	case model.SnapshotFull, model.SnapshotFS:
	default:
		return nil, errdefs.Invalidf("mode: %q must be %q or %q", mode, model.SnapshotFull, model.SnapshotFS)
	}
	if req.Name != "" {
		if err := config.ValidName(req.Name); err != nil {
			return nil, err
		}
	}
	e, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	b, ck, err := m.checkpointer(e.snapshot().Config.Isolation.Level, "snapshot jails")
	if err != nil {
		return nil, err
	}
	if caps := b.Capabilities(); mode == model.SnapshotFull && !caps.Checkpoint {
		return nil, errdefs.NotImplementedf("snapshots of processes are unavailable at the %s level: %s (mode fs still works)", caps.Level, caps.CheckpointReason)
	}
	unreserve, err := m.reserveSnapshot(e.snapshot().Tenant)
	if err != nil {
		return nil, err
	}
	defer unreserve()
	e.op.Lock()
	defer e.op.Unlock()
	j := e.snapshot()
	if j.Status != model.StateRunning {
		return nil, errdefs.Conflictf("jail %s is %s; only a running jail can be snapshotted", j.Name, j.Status)
	}
	inst := m.instance(e)
	sid := snapshot.NewID()
	name := req.Name
	if name == "" {
		name = j.Name + "-" + sid[1:7]
	}
	store := m.snaps.store
	if err := store.Create(sid); err != nil {
		return nil, err
	}
	ok := false
	defer m.removeUnless(&ok, sid, "a failed snapshot")
	snap := &model.Snapshot{
		ID: sid, Name: name, Tenant: tenant.Of(j.Tenant), JailID: j.ID, JailName: j.Name, Mode: mode,
		Parent: model.Lineage{Kind: model.LineageJail, ID: j.ID, Name: j.Name},
		Config: j.Config, EventPositions: eventPositions(e.dir),
	}
	if st, err := b.Stats(ctx, inst); err == nil {
		snap.Usage = &model.Stats{
			MemoryBytes: st.MemoryBytes, MemoryLimitBytes: st.MemoryLimitBytes,
			CPUTimeNs: st.CPUTimeNs, Pids: st.Pids, PidsLimit: st.PidsLimit, OOMKills: st.OOMKills,
			DiskUsedBytes: st.DiskUsedBytes, DiskLimitBytes: st.DiskLimitBytes,
		}
		snap.DiskUsedBytes = st.DiskUsedBytes
	}
	start := time.Now()
	if mode == model.SnapshotFull {
		// Init's idle shims are processes CRIU would dump and restore for
		// nothing: let them exit first. The pool fills again at the jail's
		// next command, as a restored jail's does, rather than right
		// after the snapshot, where starting the shims (Go processes)
		// would compete with the restore or branch that usually follows.
		if err := m.control(b, inst).SetIdleShims(ctx, false); err != nil {
			m.log.Warn("emptying init's idle shims before a snapshot", "jail", j.Name, "err", err)
		}
	}
	res, err := ck.Checkpoint(ctx, inst, backend.CheckpointOptions{
		Dir: store.Dir(sid), DiskImage: store.Image(sid), Processes: mode == model.SnapshotFull,
	})
	if err != nil {
		return nil, err
	}
	snap.CreatedAt = time.Now().UTC()
	snap.DurationMs = ms(time.Since(start))
	snap.FrozenMs = ms(res.Frozen)
	snap.ProcessBytes = res.ProcessBytes
	snap.DiskBytes = store.ImageBytes(sid)
	snap.PreviousSnapshot = m.previousSnapshot(&j)
	if err := store.Save(snap); err != nil {
		return nil, err
	}
	ok = true
	return snap, nil
}

// removeUnless removes snapshot sid, being made, unless *kept: the
// deferred cleanup of a failed snapshot or pull (what names it in the log).
func (m *Manager) removeUnless(kept *bool, sid, what string) {
	if !*kept {
		if err := m.snaps.store.Remove(sid); err != nil {
			m.log.Error("removing "+what, "snapshot", sid, "err", err)
		}
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// previousSnapshot is the jail's latest snapshot, else the snapshot the
// jail was made from.
func (m *Manager) previousSnapshot(j *model.Jail) string {
	list, err := m.snaps.store.List()
	if err == nil {
		for i := len(list) - 1; i >= 0; i-- {
			if list[i].JailID == j.ID {
				return list[i].ID
			}
		}
	}
	if j.Parent != nil && j.Parent.Kind == model.LineageSnapshot {
		return j.Parent.ID
	}
	return ""
}

// eventPositions returns the sizes of the jail's JSONL event files.
func eventPositions(dir string) map[string]int64 {
	out := map[string]int64{}
	for stream, file := range eventFiles {
		if fi, err := os.Stat(filepath.Join(dir, "events", file)); err == nil {
			out[stream] = fi.Size()
		}
	}
	return out
}

// ListSnapshots returns the snapshots of jail ref (every snapshot when ref
// is ""), oldest first. A jail that is gone still has its snapshots: ref
// may then be the id of the destroyed jail.
func (m *Manager) ListSnapshots(ctx context.Context, ref string) ([]*model.Snapshot, error) {
	all, err := m.snaps.store.List()
	if err != nil {
		return nil, err
	}
	list := all[:0:0]
	for _, s := range all {
		if tenant.Visible(ctx, s.Tenant) {
			list = append(list, s)
		}
	}
	if ref == "" {
		return list, nil
	}
	id := ref
	if e, err := m.lookup(ctx, ref); err == nil {
		id = e.snapshot().ID
	} else {
		found := false
		for _, s := range list {
			found = found || s.JailID == ref
		}
		if !found {
			return nil, err
		}
	}
	out := []*model.Snapshot{}
	for _, s := range list {
		if s.JailID == id {
			out = append(out, s)
		}
	}
	return out, nil
}

// GetSnapshot returns snapshot sid (errdefs.ErrNotFound if none).
func (m *Manager) GetSnapshot(ctx context.Context, sid string) (*model.Snapshot, error) {
	return m.getSnapshot(ctx, sid)
}

// getSnapshot finds snapshot sid as the caller of ctx may see it: a
// snapshot of another tenant is not found. Every operation on a snapshot
// goes through here.
func (m *Manager) getSnapshot(ctx context.Context, sid string) (*model.Snapshot, error) {
	snap, err := m.snaps.store.Get(sid)
	if err != nil {
		return nil, err
	}
	if !tenant.Visible(ctx, snap.Tenant) {
		return nil, errdefs.NotFoundf("no snapshot %q", sid)
	}
	return snap, nil
}

// DeleteSnapshot removes snapshot sid and everything it holds (process
// images, disk image). Jails made from it are not affected: each has its
// own copy. errdefs.ErrConflict while a restore from it runs.
func (m *Manager) DeleteSnapshot(ctx context.Context, sid string) error {
	m.snaps.mu.Lock()
	defer m.snaps.mu.Unlock()
	if _, err := m.getSnapshot(ctx, sid); err != nil {
		return err
	}
	if m.snaps.busy[sid] > 0 {
		return errdefs.Conflictf("snapshot %s is being restored; try again when that is done", sid)
	}
	return m.snaps.store.Remove(sid)
}

// Restore makes a new running jail, named name (default: derived from the
// snapshot's name), in the state of snapshot sid: its own copy of the
// filesystem, fresh namespaces (a new network namespace), and the
// snapshot's processes resumed (mode full) or a fresh init (mode fs).
func (m *Manager) Restore(ctx context.Context, sid, name string) (*model.Jail, error) {
	snap, done, err := m.use(ctx, sid)
	if err != nil {
		return nil, err
	}
	defer done()
	return m.restore(ctx, snap, name)
}

func (m *Manager) restore(ctx context.Context, snap *model.Snapshot, name string) (*model.Jail, error) {
	b, ck, err := m.checkpointer(snap.Config.Isolation.Level, "restore snapshots")
	if err != nil {
		return nil, err
	}
	if name != "" {
		if err := config.ValidName(name); err != nil {
			return nil, err
		}
	}
	var e *entry
	// A derived name is unique by construction: another id is drawn
	// while the name it gives is taken.
	for try := 0; ; try++ {
		id, jname := newID(), name
		if jname == "" {
			jname = derivedName(snap.Name, id)
		}
		e = &entry{dir: m.jailDir(id), rec: model.Jail{
			ID: id, Name: jname, Tenant: tenant.Of(snap.Tenant), Status: model.StateStarting, CreatedAt: time.Now().UTC(), Config: snap.Config,
			Parent: &model.Lineage{Kind: model.LineageSnapshot, ID: snap.ID, Name: snap.Name},
		}}
		err := m.register(e)
		if err == nil {
			break
		}
		if name != "" || try == 16 {
			return nil, err
		}
	}
	id := e.rec.ID
	e.op.Lock()
	defer e.op.Unlock()
	fail := func(err error) (*model.Jail, error) {
		m.observeStop(e)
		m.forget(e)
		if rerr := removeJailDir(e.dir); rerr != nil {
			m.log.Error("removing a failed restore's directory", "jail", id, "err", rerr)
		}
		return nil, err
	}
	if err := os.Mkdir(e.dir, 0o711); err != nil {
		return fail(fmt.Errorf("jail dir: %w", err))
	}
	if err := os.WriteFile(filepath.Join(e.dir, makingMarker), nil, 0o600); err != nil {
		return fail(fmt.Errorf("jail dir: %w", err))
	}
	e.mu.Lock()
	e.making = true
	e.mu.Unlock()
	if err := m.persist(e); err != nil {
		return fail(err)
	}
	inst := m.instance(e)
	inst.OnCreated = func(st backend.Status) error {
		if err := m.observeStart(e, b, st); err != nil {
			return err
		}
		// Only a process restore brings processes back; an fs-only
		// snapshot's jail boots a fresh init, recorded as any start.
		if snap.Mode == model.SnapshotFull {
			m.observeRestored(e, st.Pid)
		}
		return nil
	}
	store := m.snaps.store
	st, err := ck.Restore(ctx, inst, backend.RestoreSource{
		Dir: store.Dir(snap.ID), DiskImage: store.Image(snap.ID), Processes: snap.Mode == model.SnapshotFull,
	})
	if err != nil {
		return fail(err)
	}
	now := time.Now().UTC()
	m.setState(e, func(j *model.Jail) {
		j.Status = model.StateRunning
		j.Pid = st.Pid
		j.StartedAt = &now
	})
	m.watch(e, st.Pid)
	m.made(e)
	return e.view(), nil
}

// derivedName is the name of a jail made from a snapshot named base when
// the request names none: base (shortened to fit) and six hex digits of
// the jail's id.
func derivedName(base, id string) string {
	suffix := "-" + id[:6]
	if room := maxNameLen - len(suffix); len(base) > room {
		base = base[:room]
	}
	return base + suffix
}

// maxNameLen is the longest jail name config.ValidName accepts.
const maxNameLen = 63

// branchNames returns the names of the jails req asks for ("" each for
// names derived from the snapshot's and the jail's id), checked: valid,
// distinct, and not held by a jail of tenant t now.
func (m *Manager) branchNames(t string, req model.BranchRequest) ([]string, error) {
	count := req.Count
	switch {
	case len(req.Names) > 0 && req.NamePrefix != "":
		return nil, errdefs.Invalidf("names and name_prefix: give one or the other")
	case len(req.Names) > 0 && count == 0:
		count = len(req.Names)
	case len(req.Names) > 0 && count != len(req.Names):
		return nil, errdefs.Invalidf("count: %d, but names has %d", count, len(req.Names))
	case count == 0:
		count = 1
	}
	if count < 1 || count > model.MaxBranches {
		return nil, errdefs.Invalidf("count: %d must be between 1 and %d", count, model.MaxBranches)
	}
	names := make([]string, count)
	switch {
	case len(req.Names) > 0:
		copy(names, req.Names)
	case req.NamePrefix != "":
		for i := range names {
			names[i] = fmt.Sprintf("%s-%d", req.NamePrefix, i+1)
		}
	default:
		return names, nil
	}
	seen := map[string]bool{}
	for i, n := range names {
		if err := config.ValidName(n); err != nil {
			if len(req.Names) > 0 {
				return nil, fmt.Errorf("names[%d]: %w", i, err)
			}
			return nil, fmt.Errorf("name_prefix: %w", err)
		}
		if seen[n] {
			return nil, errdefs.Invalidf("names: %q is given twice", n)
		}
		seen[n] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, n := range names {
		if _, taken := m.names[nameKey{tenant.Of(t), n}]; taken {
			return nil, errdefs.Conflictf("a jail named %q already exists", n)
		}
	}
	return names, nil
}

// Branch makes independent running jails from snapshot sid: req.Count
// (1 to model.MaxBranches; 0 means 1, or len(req.Names)), named as req
// says (see model.BranchRequest). Every name is checked before any jail
// is made; then either all are made or, on the first failure, those made
// are destroyed and the error returned.
func (m *Manager) Branch(ctx context.Context, sid string, req model.BranchRequest) ([]*model.Jail, error) {
	snap, done, err := m.use(ctx, sid)
	if err != nil {
		return nil, err
	}
	defer done()
	names, err := m.branchNames(snap.Tenant, req)
	if err != nil {
		return nil, err
	}
	count := len(names)
	out := make([]*model.Jail, count)
	errs := make([]error, count)
	// Five restores per CPU: each spends much of its time waiting (for
	// runc and CRIU to start, for the kernel), and more in flight finish
	// sooner (10 branches on 2 CPUs: 1.6-1.8 s at 10, 1.9-2.1 s at 4).
	sem := make(chan struct{}, max(5*runtime.NumCPU(), 1))
	var wg sync.WaitGroup
	for i := range names {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i], errs[i] = m.restore(ctx, snap, names[i])
		}()
	}
	wg.Wait()
	if err := firstError(errs); err != nil {
		for _, j := range out {
			if j != nil {
				if derr := m.Destroy(context.WithoutCancel(ctx), j.ID); derr != nil {
					m.log.Error("destroying a branch after a failed branch", "jail", j.ID, "err", derr)
				}
			}
		}
		return nil, err
	}
	return out, nil
}

// firstError is the first of a branch's errors, saying how many of its
// jails failed (nil when none did).
func firstError(errs []error) error {
	var first error
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	if failed > 1 {
		return fmt.Errorf("%d of %d branches failed, the first: %w", failed, len(errs), first)
	}
	return first
}

// side is one end of a diff: a running jail's live layers or a snapshot's
// disk image mounted read-only.
type side struct {
	tree    snapshot.Tree
	release func() error
}

// openSide resolves ref as a snapshot id or a jail ref.
func (m *Manager) openSide(ctx context.Context, ref string) (*side, error) {
	if snapshot.ValidID(ref) {
		if snap, done, err := m.use(ctx, ref); err == nil {
			cfg := snap.Config
			b, err := m.levels.Get(cfg.Isolation.Level)
			if err != nil {
				done()
				return nil, err
			}
			lb, ok := b.(backend.Layered)
			if !ok {
				done()
				return nil, backend.Unsupported(cfg.Isolation.Level, "diff a snapshot's files", "")
			}
			lower, _, err := lb.Layers(backend.Instance{ID: snap.JailID, Dir: m.jailDir(snap.JailID), Config: &cfg})
			if err != nil {
				done()
				return nil, err
			}
			dir, unmount, err := snapshot.MountImage(m.snaps.store.Image(ref), filepath.Join(m.opts.DataDir, "run", "snapmnt"))
			if err != nil {
				done()
				return nil, err
			}
			return &side{tree: snapshot.Tree{Lower: lower, Upper: filepath.Join(dir, "upper")}, release: func() error {
				defer done()
				return unmount()
			}}, nil
		}
	}
	e, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, errdefs.NotFoundf("no jail or snapshot %q", ref)
	}
	if j := e.snapshot(); j.Status == model.StateCreated {
		return nil, errdefs.Conflictf("jail %s was never started; it has no filesystem to compare yet", j.Name)
	}
	lb, err := m.layered(e)
	if err != nil {
		return nil, err
	}
	lower, upper, err := lb.Layers(m.instance(e))
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(upper); err != nil {
		return nil, errdefs.Conflictf("jail %s: its disk is not mounted (%v)", e.snapshot().Name, err)
	}
	return &side{tree: snapshot.Tree{Lower: lower, Upper: upper}, release: func() error { return nil }}, nil
}

// Diff compares the filesystems of from and to, each a jail (id or name)
// or a snapshot id: what was added, modified and deleted going from one to
// the other, with sizes, modes and sha256; with text, a unified diff of
// text files too.
func (m *Manager) Diff(ctx context.Context, from, to string, text bool) (*model.FsDiff, error) {
	if from == "" || to == "" {
		return nil, errdefs.Invalidf("from and to: both a jail or a snapshot are required")
	}
	a, err := m.openSide(ctx, from)
	if err != nil {
		return nil, fmt.Errorf("from: %w", err)
	}
	defer m.release(a)
	b, err := m.openSide(ctx, to)
	if err != nil {
		return nil, fmt.Errorf("to: %w", err)
	}
	defer m.release(b)
	return snapshot.Diff(ctx, a.tree, b.tree, snapshot.SkipInternal, text)
}

func (m *Manager) release(s *side) {
	if err := s.release(); err != nil {
		m.log.Error("releasing a diff side", "err", err)
	}
}

// SnapshotDiff compares snapshot sid with its jail as it is now.
func (m *Manager) SnapshotDiff(ctx context.Context, sid string, text bool) (*model.FsDiff, error) {
	snap, err := m.getSnapshot(ctx, sid)
	if err != nil {
		return nil, err
	}
	if _, err := m.lookup(ctx, snap.JailID); err != nil {
		return nil, errdefs.Conflictf("snapshot %s: its jail %s no longer exists; compare it with GET /diff", sid, snap.JailName)
	}
	return m.Diff(ctx, sid, snap.JailID, text)
}
