package jail

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/procwait"
)

// fakeBackend is a backend whose jails are one host process each (a
// sleep, standing for init) and a marker file per resource in the jail's
// directory; its state lives in the jail directories and the processes,
// so it survives a manager the way a real backend's does. Steps can be
// told to fail.
type fakeBackend struct {
	level string
	mu    sync.Mutex
	// fail maps a step ("configure", "prepare", "prepare-late", "start",
	// "start-late", "stop") to the error it returns.
	fail map[string]error
	// calls records "step id" in order.
	calls []string
	// stopped receives the id of every Stop.
	stopped chan string
}

var _ backend.Backend = (*fakeBackend)(nil)

func newFake(level string) *fakeBackend {
	return &fakeBackend{level: level, fail: map[string]error{}, stopped: make(chan string, 64)}
}

func (f *fakeBackend) factory() backend.Factory {
	return backend.Factory{Level: f.level, New: func(backend.Host) (backend.Backend, error) { return f, nil }}
}

// step records a call and returns the failure set for it.
func (f *fakeBackend) step(name, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, name+" "+id)
	return f.fail[name]
}

func (f *fakeBackend) failAt(step string, err error) {
	f.mu.Lock()
	f.fail[step] = err
	f.mu.Unlock()
}

func (f *fakeBackend) called(call string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Contains(f.calls, call)
}

// The fake's resources: a disk marker made by Prepare, the pid file of
// the running "init".
func diskMarker(inst backend.Instance) string { return filepath.Join(inst.Dir, "fake-disk") }
func pidFile(inst backend.Instance) string    { return filepath.Join(inst.Dir, "fake-pid") }

func (f *fakeBackend) Capabilities() backend.Capabilities {
	return backend.Capabilities{Level: f.level, Runtime: "fake 1", NetworkModes: []string{config.NetNone, config.NetIsolated},
		RootfsKinds: []string{model.RootfsKindHost}, Guarantees: "none: a test double"}
}

func (f *fakeBackend) Configure(inst backend.Instance) error {
	return f.step("configure", inst.ID)
}

func (f *fakeBackend) Prepare(ctx context.Context, inst backend.Instance) error {
	if err := f.step("prepare", inst.ID); err != nil {
		return err
	}
	if err := os.WriteFile(diskMarker(inst), nil, 0o600); err != nil {
		return err
	}
	if err := f.step("prepare-late", inst.ID); err != nil {
		// As the contract says: a failing Prepare releases what it made.
		os.Remove(diskMarker(inst))
		return err
	}
	return nil
}

func (f *fakeBackend) Start(ctx context.Context, inst backend.Instance) (backend.Status, error) {
	if err := f.step("start", inst.ID); err != nil {
		return backend.Status{}, err
	}
	if _, err := os.Stat(diskMarker(inst)); err != nil {
		return backend.Status{}, fmt.Errorf("start before prepare: %w", err)
	}
	cmd := exec.Command("sleep", "1000")
	// Its own process group, so that the test's signals stay the test's.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return backend.Status{}, err
	}
	pid := cmd.Process.Pid
	go cmd.Wait() // reap it whenever it ends
	st := backend.Status{Running: true, Pid: pid}
	fail := func(err error) (backend.Status, error) {
		f.kill(pid)
		return backend.Status{}, err
	}
	if err := os.WriteFile(pidFile(inst), []byte(fmt.Sprint(pid)), 0o600); err != nil {
		return fail(err)
	}
	if inst.OnCreated != nil {
		if err := inst.OnCreated(st); err != nil {
			os.Remove(pidFile(inst))
			return fail(err)
		}
	}
	if err := f.step("start-late", inst.ID); err != nil {
		os.Remove(pidFile(inst))
		return fail(err)
	}
	return st, nil
}

// kill ends the fake init pid and waits for it.
func (f *fakeBackend) kill(pid int) {
	syscall.Kill(pid, syscall.SIGKILL)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	procwait.WaitPid(ctx, pid)
}

// running returns the pid of the jail's fake init when it runs.
func (f *fakeBackend) running(inst backend.Instance) int {
	data, err := os.ReadFile(pidFile(inst))
	if err != nil {
		return 0
	}
	var pid int
	fmt.Sscan(string(data), &pid)
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return 0
	}
	return pid
}

func (f *fakeBackend) Stop(ctx context.Context, inst backend.Instance, grace time.Duration) error {
	err := f.step("stop", inst.ID)
	if err == nil {
		if pid := f.running(inst); pid > 0 {
			f.kill(pid)
		}
		os.Remove(pidFile(inst))
	}
	f.stopped <- inst.ID
	return err
}

func (f *fakeBackend) Destroy(ctx context.Context, inst backend.Instance) error {
	f.step("destroy", inst.ID)
	if pid := f.running(inst); pid > 0 {
		f.kill(pid)
	}
	return errors.Join(rmIfExists(pidFile(inst)), rmIfExists(diskMarker(inst)))
}

func rmIfExists(p string) error {
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func (f *fakeBackend) Status(ctx context.Context, inst backend.Instance) (backend.Status, error) {
	if pid := f.running(inst); pid > 0 {
		return backend.Status{Running: true, Pid: pid}, nil
	}
	return backend.Status{}, nil
}

func (f *fakeBackend) Reattach(ctx context.Context, inst backend.Instance) error {
	return f.step("reattach", inst.ID)
}

func (f *fakeBackend) UpdateNetwork(ctx context.Context, inst backend.Instance) error {
	return f.step("network", inst.ID)
}

func (f *fakeBackend) Rename(ctx context.Context, inst backend.Instance, st backend.Status) error {
	return f.step("rename", inst.ID)
}

func (f *fakeBackend) Stats(ctx context.Context, inst backend.Instance) (backend.Stats, error) {
	return backend.Stats{Pids: 1}, nil
}

// InitDialer: the fake has no init to talk to.
func (f *fakeBackend) InitDialer(inst backend.Instance) initclient.Dialer {
	return func(ctx context.Context) (net.Conn, error) {
		return nil, errdefs.Unavailablef("the fake level has no init")
	}
}
