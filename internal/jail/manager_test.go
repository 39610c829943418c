package jail

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/testenv"
)

// The manager's tests run it for real (storage pool, jail network,
// tracers: root) over fake backends, whose jails are a sleeping process
// each: they show what the manager itself does with a backend.

// testData is a data dir and the backends its managers get.
type testData struct {
	opts Options
}

func newTestData(t *testing.T, fs ...backend.Factory) *testData {
	t.Helper()
	testenv.RequireRoot(t)
	td := &testData{opts: Options{
		DataDir:   t.TempDir(),
		Backends:  fs,
		PoolSize:  2 * config.GiB,
		WarmDisks: -1,
		NetPrefix: "ajm",
		Subnet:    "10.231.0.0/24",
	}}
	t.Cleanup(func() {
		if err := Teardown(context.Background(), td.opts); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	return td
}

// open starts a manager on the data dir, closed when the test ends.
func (td *testData) open(t *testing.T) *Manager {
	t.Helper()
	m, err := NewManager(context.Background(), td.opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func req(name, level string, start bool) model.CreateRequest {
	return model.CreateRequest{Name: name, Start: &start, Config: config.Config{
		Isolation: config.Isolation{Level: level, Network: config.Network{Mode: config.NetNone}},
	}}
}

// settled waits until no lifecycle transition of jail ref is under way
// (the manager reacts to a dying init on a goroutine of its own).
func settled(t *testing.T, m *Manager, ref string) *model.Jail {
	t.Helper()
	e, err := m.lookup(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	// Wait for the operation under way, if any, to end.
	e.op.Lock()
	//lint:ignore SA2001 the lock is taken only to wait for its holder
	e.op.Unlock()
	j, err := m.Get(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// alive reports whether process pid runs (a zombie does not).
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) S ...: the state follows the last ')'.
	rest := stat[bytes.LastIndexByte(stat, ')')+1:]
	return len(bytes.TrimSpace(rest)) > 0 && bytes.TrimSpace(rest)[0] != 'Z'
}

// jailDirs lists the directories under DATA_DIR/jails.
func jailDirs(t *testing.T, m *Manager) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(m.opts.DataDir, "jails"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func TestManagerStateMachine(t *testing.T) {
	fake := newFake(config.LevelVM)
	m := newTestData(t, fake.factory()).open(t)
	ctx := context.Background()

	j, err := m.Create(ctx, req("sm", config.LevelVM, false))
	if err != nil {
		t.Fatal(err)
	}
	if j.Status != model.StateCreated || j.Pid != 0 || !fake.called("prepare "+j.ID) || fake.called("start "+j.ID) {
		t.Fatalf("create without start: %+v, calls %v", j, fake.calls)
	}
	if _, err := m.Stop(ctx, "sm", 0); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("stop of a created jail: %v, want a conflict", err)
	}
	if j, err = m.Start(ctx, "sm"); err != nil || j.Status != model.StateRunning || !alive(j.Pid) {
		t.Fatalf("start: %+v %v", j, err)
	}
	pid := j.Pid
	if _, err := m.Start(ctx, "sm"); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "running") {
		t.Errorf("start of a running jail: %v, want a conflict that says it runs", err)
	}
	if j, err = m.Stop(ctx, "sm", time.Second); err != nil || j.Status != model.StateStopped || j.Pid != 0 || alive(pid) {
		t.Fatalf("stop: %+v %v (init %d alive: %v)", j, err, pid, alive(pid))
	}
	if _, err := m.Stop(ctx, "sm", 0); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("second stop: %v, want a conflict", err)
	}
	if j, err = m.Start(ctx, "sm"); err != nil || j.Status != model.StateRunning || j.Pid == pid {
		t.Fatalf("restart: %+v %v", j, err)
	}
	pid = j.Pid
	if err := m.Destroy(ctx, "sm"); err != nil {
		t.Fatal(err)
	}
	if alive(pid) || !fake.called("destroy "+j.ID) {
		t.Errorf("destroy left init %d alive (%v) or never asked the backend (calls %v)", pid, alive(pid), fake.calls)
	}
	if _, err := m.Get(ctx, "sm"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("get after destroy: %v", err)
	}
	if d := jailDirs(t, m); len(d) != 0 {
		t.Errorf("jail directories left after destroy: %v", d)
	}
	if err := m.Destroy(ctx, j.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second destroy: %v", err)
	}
}

// TestManagerInitDeath: a jail whose init dies is failed, with why, and
// its backend is told to clean up; it can be started again.
func TestManagerInitDeath(t *testing.T) {
	fake := newFake(config.LevelVM)
	m := newTestData(t, fake.factory()).open(t)
	ctx := context.Background()
	j, err := m.Create(ctx, req("dies", config.LevelVM, true))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(j.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-fake.stopped:
		if id != j.ID {
			t.Fatalf("backend stopped %s, want %s", id, j.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the manager did not notice that init died")
	}
	got := settled(t, m, "dies")
	if got.Status != model.StateError || !strings.Contains(got.Error, "init exited") || got.Pid != 0 {
		t.Fatalf("after init died: %+v", got)
	}
	if got, err = m.Start(ctx, "dies"); err != nil || got.Status != model.StateRunning {
		t.Fatalf("start after init died: %+v %v", got, err)
	}
}

// TestManagerFailedCreateReleasesAll: a create failing at any step
// leaves no record, no directory, no process and no backend resource, and
// its name free.
func TestManagerFailedCreateReleasesAll(t *testing.T) {
	fake := newFake(config.LevelVM)
	m := newTestData(t, fake.factory()).open(t)
	ctx := context.Background()
	for _, step := range []string{"configure", "prepare", "prepare-late", "start", "start-late"} {
		t.Run(step, func(t *testing.T) {
			boom := errdefs.Unprocessablef("injected failure at %s", step)
			fake.failAt(step, boom)
			_, err := m.Create(ctx, req("half", config.LevelVM, true))
			fake.failAt(step, nil)
			if !errors.Is(err, boom) {
				t.Fatalf("create: %v, want the injected failure", err)
			}
			if list, _ := m.List(ctx); len(list) != 0 {
				t.Errorf("jails listed after a failed create: %+v", list)
			}
			if d := jailDirs(t, m); len(d) != 0 {
				t.Errorf("jail directories left: %v", d)
			}
			if step != "configure" {
				// Everything past Configure made something: the backend
				// must have been asked to destroy it.
				var id string
				for _, c := range fake.calls {
					if strings.HasPrefix(c, step+" ") {
						id = strings.TrimPrefix(c, step+" ")
					}
				}
				if !fake.called("destroy " + id) {
					t.Errorf("the backend was not asked to destroy the half-made jail %s: %v", id, fake.calls)
				}
			}
			j, err := m.Create(ctx, req("half", config.LevelVM, true))
			if err != nil {
				t.Fatalf("the name of a failed create is not free: %v", err)
			}
			if err := m.Destroy(ctx, j.ID); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestManagerRecovery: a new manager on the data dir re-adopts the jails
// that still run, records those a crash left half-way or whose init died
// as stopped (asking the backend to clean up), releases a directory
// without a record, and leaves alone the jails of a level it lacks.
func TestManagerRecovery(t *testing.T) {
	vm, gv := newFake(config.LevelVM), newFake(config.LevelGVisor)
	td := newTestData(t, vm.factory(), gv.factory())
	ctx := context.Background()
	m1 := td.open(t)
	made := map[string]*model.Jail{}
	for _, r := range []model.CreateRequest{
		req("runs", config.LevelVM, true), req("created", config.LevelVM, false),
		req("halfway", config.LevelVM, true), req("died", config.LevelVM, true), req("other-level", config.LevelGVisor, true),
		req("unanswered", config.LevelVM, true),
	} {
		j, err := m1.Create(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		made[j.Name] = j
	}
	if err := m1.Close(); err != nil {
		t.Fatal(err)
	}
	// What a crash leaves: a record written while starting, an init that
	// died while no daemon watched, a directory whose record was lost.
	setRecordStatus(t, filepath.Join(td.opts.DataDir, "jails", made["halfway"].ID), model.StateStarting)
	// A create that had not answered when the daemon died.
	unanswered := filepath.Join(td.opts.DataDir, "jails", made["unanswered"].ID)
	if err := os.WriteFile(filepath.Join(unanswered, makingMarker), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(made["died"].Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	orphan := filepath.Join(td.opts.DataDir, "jails", "0123456789ab")
	if err := os.Mkdir(orphan, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(orphan, "fake-disk"), nil, 0o600); err != nil {
		t.Fatal(err)
	}

	// The next daemon has no gvisor level.
	td.opts.Backends = []backend.Factory{vm.factory(), {Level: config.LevelGVisor, New: func(backend.Host) (backend.Backend, error) {
		return nil, errors.New("runsc not built; run make gvisor")
	}}}
	m2 := td.open(t)
	want := map[string]model.State{"runs": model.StateRunning, "created": model.StateCreated,
		"halfway": model.StateStopped, "died": model.StateStopped, "other-level": model.StateError}
	for name, st := range want {
		j, err := m2.Get(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if j.Status != st {
			t.Errorf("%s: %s after recovery, want %s (%s)", name, j.Status, st, j.Error)
		}
	}
	if j, _ := m2.Get(ctx, "runs"); j.Pid != made["runs"].Pid || !alive(j.Pid) || !vm.called("reattach "+j.ID) {
		t.Errorf("the running jail was not re-adopted: pid %d (was %d), calls %v", j.Pid, made["runs"].Pid, vm.calls)
	}
	if half := made["halfway"]; alive(half.Pid) || !vm.called("stop "+half.ID) {
		t.Errorf("the jail found half-way still runs (%v) or was not stopped by its backend", alive(half.Pid))
	}
	other, _ := m2.Get(ctx, "other-level")
	if !strings.Contains(other.Error, "runsc not built") || !alive(made["other-level"].Pid) {
		t.Errorf("the jail of a missing level: %q, init alive %v (it must be left alone)", other.Error, alive(made["other-level"].Pid))
	}
	if _, err := os.Stat(orphan); !errors.Is(err, os.ErrNotExist) || !vm.called("destroy 0123456789ab") {
		t.Errorf("the directory without a record was not released: %v", err)
	}
	// The create that never answered is released, not adopted.
	if _, err := m2.Get(ctx, "unanswered"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a jail whose create never answered is still known: %v", err)
	}
	if _, err := os.Stat(unanswered); !errors.Is(err, os.ErrNotExist) || !vm.called("destroy "+made["unanswered"].ID) || alive(made["unanswered"].Pid) {
		t.Errorf("a jail whose create never answered was not released: dir %v, init alive %v", err, alive(made["unanswered"].Pid))
	}
	// Teardown needs the level back to destroy that jail.
	td.opts.Backends = []backend.Factory{vm.factory(), gv.factory()}
}

func setRecordStatus(t *testing.T, dir string, st model.State) {
	t.Helper()
	path := filepath.Join(dir, "jail.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var j model.Jail
	if err := json.Unmarshal(data, &j); err != nil {
		t.Fatal(err)
	}
	j.Status = st
	if data, err = json.Marshal(j); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestManagerLevels: what a level lacks is refused naming the level and
// the verb (501) or the field (422); a level the host lacks is a 422 with
// the reason; /health lists every level.
func TestManagerLevels(t *testing.T) {
	fake := newFake(config.LevelVM)
	m := newTestData(t, fake.factory(), backend.Factory{Level: config.LevelGVisor, New: func(backend.Host) (backend.Backend, error) {
		return nil, errdefs.Unavailablef("runsc not built; run make gvisor")
	}}).open(t)
	ctx := context.Background()
	if _, err := m.Create(ctx, req("g", config.LevelGVisor, true)); !errors.Is(err, errdefs.ErrUnprocessable) ||
		!strings.Contains(err.Error(), "gvisor") || !strings.Contains(err.Error(), "runsc not built; run make gvisor") {
		t.Errorf("create at a missing level: %v", err)
	}
	if _, err := m.Create(ctx, req("p", config.LevelProcess, true)); !errors.Is(err, errdefs.ErrUnprocessable) || !strings.Contains(err.Error(), "available: vm") {
		t.Errorf("create at an unknown level: %v", err)
	}
	r := req("d", config.LevelVM, true)
	r.Isolation.Filesystem.Rootfs = "dir:/srv/tree"
	if _, err := m.Create(ctx, r); !errors.Is(err, errdefs.ErrUnprocessable) || !strings.Contains(err.Error(), `the vm level cannot mount a "dir" root`) {
		t.Errorf("create with a rootfs the level lacks: %v", err)
	}
	r = req("b", config.LevelVM, true)
	r.Isolation.Network.Mode = config.NetBridge
	if _, err := m.Create(ctx, r); !errors.Is(err, errdefs.ErrUnprocessable) || !strings.Contains(err.Error(), "isolation.network.mode") {
		t.Errorf("create with a network mode the level lacks: %v", err)
	}
	j, err := m.Create(ctx, req("ok", config.LevelVM, true))
	if err != nil {
		t.Fatal(err)
	}
	for verb, err := range map[string]error{
		"snapshot": func() error { _, err := m.Snapshot(ctx, j.Name, model.SnapshotRequest{}); return err }(),
		"diff":     func() error { _, err := m.FsDiff(ctx, j.Name, false); return err }(),
	} {
		if !errors.Is(err, errdefs.ErrNotImplemented) || !strings.Contains(err.Error(), "the vm level cannot") {
			t.Errorf("%s on a level without it: %v", verb, err)
		}
	}
	h := m.Health(ctx)
	if len(h.Levels) != 2 || h.Levels[0].Name != "vm" || !h.Levels[0].Available || h.Levels[0].Capabilities.Runtime != "fake 1" ||
		h.Levels[1].Name != "gvisor" || h.Levels[1].Available || !strings.Contains(h.Levels[1].Reason, "make gvisor") {
		t.Errorf("health levels: %+v", h.Levels)
	}
	if c := h.Checks["levels"]; c.OK || !strings.Contains(c.Message, "make gvisor") {
		t.Errorf("health levels check: %+v", c)
	}
}

// TestInstallBinaryUnreadable installs the running binary as the jails'
// init: executable, not readable without a capability; a copy an older
// daemon installed readable is made unreadable in place.
func TestInstallBinaryUnreadable(t *testing.T) {
	dir := t.TempDir()
	mode := func(path string) os.FileMode {
		t.Helper()
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return st.Mode().Perm()
	}
	if err := os.Mkdir(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	bin, err := installBinary(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m := mode(bin); m != 0o111 {
		t.Fatalf("installed with mode %v, want 0111", m)
	}
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	again, err := installBinary(dir)
	if err != nil {
		t.Fatal(err)
	}
	if again != bin {
		t.Fatalf("installed again as %s, want %s", again, bin)
	}
	if m := mode(bin); m != 0o111 {
		t.Fatalf("a readable copy left with mode %v, want 0111", m)
	}
}

// TestDataDirInUse: a second manager on a data dir in use fails before it
// touches anything there (the first's ready disks stay), naming the
// holder; the first keeps working, and once it is closed the data dir
// opens again.
func TestDataDirInUse(t *testing.T) {
	fake := newFake(config.LevelVM)
	td := newTestData(t, fake.factory())
	td.opts.WarmDisks = 2
	ctx := context.Background()
	m1, err := NewManager(ctx, td.opts)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			m1.Close()
		}
	})
	warmDir := filepath.Join(td.opts.DataDir, "pool", "warm")
	var ready []string
	deadline := time.Now().Add(time.Minute)
	for len(ready) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the pool made %d ready disks in a minute, want 2", len(ready))
		}
		time.Sleep(10 * time.Millisecond)
		ents, err := os.ReadDir(warmDir)
		if err != nil {
			t.Fatal(err)
		}
		ready = ready[:0]
		for _, e := range ents {
			ready = append(ready, e.Name())
		}
	}

	_, err = NewManager(ctx, td.opts)
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), fmt.Sprintf("in use by another agentjail daemon (pid %d)", os.Getpid())) {
		t.Fatalf("a second manager on the data dir: %v, want a conflict naming pid %d", err, os.Getpid())
	}
	for _, name := range ready {
		if _, err := os.Stat(filepath.Join(warmDir, name)); err != nil {
			t.Errorf("the first manager's ready disk %s: %v", name, err)
		}
	}
	if _, err := m1.Create(ctx, req("after", config.LevelVM, true)); err != nil {
		t.Fatalf("the first manager after the second one's attempt: %v", err)
	}
	closed = true
	if err := m1.Close(); err != nil {
		t.Fatal(err)
	}
	m2, err := NewManager(ctx, td.opts)
	if err != nil {
		t.Fatalf("the data dir once its manager closed: %v", err)
	}
	if err := m2.Close(); err != nil {
		t.Fatal(err)
	}
}
