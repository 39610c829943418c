package bpf

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/agentjail/agentjail/internal/observe"
	"github.com/agentjail/agentjail/internal/testenv"
)

// requireRoot skips (or fails under CI=true) when the test cannot load
// programs or create cgroups.
func requireRoot(t testing.TB) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "root"
	} else if _, err := os.Stat("/sys/fs/cgroup/unified/cgroup.procs"); err != nil {
		why = "cgroup v2 at /sys/fs/cgroup/unified"
	} else if err := Probe(); err != nil {
		why = err.Error()
	}
	testenv.Need(t, why)
}

// testCgroup is a cgroup v2 directory the test created.
type testCgroup struct {
	path string
	id   uint64
	fd   *os.File
}

func newCgroup(t testing.TB) *testCgroup {
	t.Helper()
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join("/sys/fs/cgroup/unified", "agentjail-test-"+hex.EncodeToString(rnd[:]))
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	cg := &testCgroup{path: p}
	t.Cleanup(func() {
		if cg.fd != nil {
			cg.fd.Close()
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("remove cgroup %s: %v", p, err)
		}
	})
	id, err := CgroupID(p)
	if err != nil {
		t.Fatal(err)
	}
	cg.id = id
	cg.fd, err = os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	return cg
}

// command returns cmd set to be born in the cgroup (clone3 with
// CLONE_INTO_CGROUP), so the cgroup's first instruction is the child's.
func (cg *testCgroup) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.fd.Fd())}
	return cmd
}

// collector is a Sink keeping copies of every event.
type collector struct {
	mu     sync.Mutex
	events []observe.Event
	idles  int
}

func (c *collector) Handle(ev *observe.Event) {
	c.mu.Lock()
	c.events = append(c.events, *ev)
	c.mu.Unlock()
}

func (c *collector) Idle() {
	c.mu.Lock()
	c.idles++
	c.mu.Unlock()
}

func (c *collector) snapshot() []observe.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]observe.Event(nil), c.events...)
}

var (
	sharedOnce   sync.Once
	sharedTracer *Tracer
	sharedErr    error
)

// tracer returns the Tracer shared by the package's tests (closed by
// TestMain).
func tracer(t testing.TB) *Tracer {
	t.Helper()
	requireRoot(t)
	sharedOnce.Do(func() { sharedTracer, sharedErr = Open() })
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return sharedTracer
}

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedTracer != nil {
		if err := sharedTracer.Close(); err != nil {
			os.Stderr.WriteString("close tracer: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

// traceRun runs argv in a fresh watched cgroup and returns the events and
// the workload's host pid. The workload must succeed.
func traceRun(t *testing.T, tr *Tracer, opts Options, argv ...string) ([]observe.Event, int) {
	t.Helper()
	cg := newCgroup(t)
	col := &collector{}
	opts.Sink = col
	if err := tr.Watch(cg.id, "test", opts); err != nil {
		t.Fatal(err)
	}
	cmd := cg.command(argv[0], argv[1:]...)
	out, err := cmd.CombinedOutput()
	if uerr := tr.Unwatch(cg.id); uerr != nil {
		t.Fatal(uerr)
	}
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("run %v: %v\n%s", argv, err, out)
		}
	}
	return col.snapshot(), cmd.Process.Pid
}
