package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/testenv"
)

// testCgroupParent is the cgroup under which the tests' containers live.
const testCgroupParent = "/agentjail-oci-test"

// testUIDBase is the host id range of the tests' jails with a user
// namespace.
const testUIDBase = 300000

// cgroupRoot is the host's cgroup mount; controllers are its children.
const cgroupRoot = "/sys/fs/cgroup"

var (
	probeMu   sync.Mutex
	probeDir  string
	probeBins = map[string]string{} // GOARCH -> built probe
	idCounter atomic.Int64
)

func TestMain(m *testing.M) {
	code := m.Run()
	if probeDir != "" {
		os.RemoveAll(probeDir)
	}
	// The per-container cgroups are removed by runc; the shared parent is
	// the tests' own.
	ents, _ := os.ReadDir(cgroupRoot)
	for _, e := range ents {
		_ = os.Remove(filepath.Join(cgroupRoot, e.Name(), testCgroupParent))
	}
	os.Exit(code)
}

// needRoot skips (or fails when CI=true) a test that needs root and runc.
func needRoot(tb testing.TB) {
	tb.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "root"
	} else if _, err := exec.LookPath("runc"); err != nil {
		why = "runc on PATH"
	}
	testenv.Need(tb, why)
}

// probeBinary builds testdata/probe (static) for goarch once and returns
// its path.
func probeBinary(tb testing.TB, goarch string) string {
	tb.Helper()
	probeMu.Lock()
	defer probeMu.Unlock()
	if bin := probeBins[goarch]; bin != "" {
		return bin
	}
	if probeDir == "" {
		dir, err := os.MkdirTemp("", "agentjail-oci-probe-")
		if err != nil {
			tb.Fatal(err)
		}
		probeDir = dir
		if err := os.Chmod(dir, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	bin := filepath.Join(probeDir, goarch, "agentjail")
	cmd := exec.Command("go", "build", "-o", bin, "./testdata/probe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOARCH="+goarch)
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("build probe for %s: %v: %s", goarch, err, out)
	}
	if err := os.Chmod(filepath.Dir(bin), 0o755); err != nil {
		tb.Fatal(err)
	}
	probeBins[goarch] = bin
	return bin
}

// jailEnv is one container's bundle, rootfs, control dir, netns and
// runtime, all removed by the test's cleanup.
type jailEnv struct {
	id, dir, bundle, rootfs, control, netns string
	cgroupsPath                             string
	rt                                      *Runtime
	opts                                    SpecOptions
}

// newJailEnv builds a jail whose init is the probe in mode. mutate may
// change the config before defaults are applied and it is validated; the
// spec is written to the bundle.
func newJailEnv(tb testing.TB, mode string, mutate func(*config.Config)) *jailEnv {
	tb.Helper()
	needRoot(tb)
	bin := probeBinary(tb, runtime.GOARCH)
	dir := tb.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	e := &jailEnv{
		id:      fmt.Sprintf("ajt-%d-%d", os.Getpid(), idCounter.Add(1)),
		dir:     dir,
		bundle:  filepath.Join(dir, "bundle"),
		rootfs:  filepath.Join(dir, "rootfs"),
		control: filepath.Join(dir, "run"),
	}
	e.cgroupsPath = testCgroupParent + "/" + e.id
	e.rt = NewRuntime("runc", filepath.Join(dir, "runc"))
	buildRootfs(tb, e.rootfs)
	for _, d := range []string{e.bundle, e.control, filepath.Join(dir, "data-ro"), filepath.Join(dir, "data-rw")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	writeFile(tb, filepath.Join(dir, "data-ro", "hello"), "hello from the host")
	writeFile(tb, filepath.Join(e.control, "mode"), mode)
	e.netns = makeNetns(tb, e.id)

	c := &config.Config{}
	c.Isolation.Filesystem.BlockedPaths = []string{"/etc/secret", "/secretdir"}
	c.Isolation.Filesystem.ReadOnlyMounts = []config.Mount{{Source: filepath.Join(dir, "data-ro"), Target: "/data-ro"}}
	c.Isolation.Filesystem.ReadWriteMounts = []config.Mount{{Source: filepath.Join(dir, "data-rw"), Target: "/data-rw"}}
	c.Isolation.Resources.MemoryBytes = 256 * config.MiB
	c.Isolation.Resources.PidsLimit = 64
	c.Isolation.Resources.CPUQuota = 50000
	c.Isolation.Resources.AsLimit = uint64(4 * config.GiB)
	c.Isolation.Resources.CoreLimit = 0
	if mutate != nil {
		mutate(c)
	}
	c.ApplyDefaults()
	host := config.Host{CPUs: runtime.NumCPU(), Levels: []string{config.LevelContainer}, NetworkModes: []string{config.NetIsolated}}
	if err := c.Validate(host); err != nil {
		tb.Fatal(err)
	}
	e.opts = SpecOptions{
		ID:             e.id,
		Config:         c,
		Rootfs:         e.rootfs,
		NetnsPath:      e.netns,
		CgroupsPath:    e.cgroupsPath,
		InitBinary:     bin,
		ControlDir:     e.control,
		Mounts:         []Mount{{Source: "/usr", Target: "/usr", ReadOnly: true}},
		Hostname:       "jail-" + e.id,
		UIDMapBase:     testUIDBase,
		SwapAccounting: swapAccounting(),
	}
	e.writeSpec(tb)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := e.rt.Delete(ctx, e.id, true); err != nil {
			tb.Errorf("cleanup: delete %s: %v", e.id, err)
		}
	})
	return e
}

func (e *jailEnv) writeSpec(tb testing.TB) {
	tb.Helper()
	s, err := Spec(e.opts)
	if err != nil {
		tb.Fatal(err)
	}
	if err := WriteBundle(e.bundle, s); err != nil {
		tb.Fatal(err)
	}
}

// start runs Create and Start and returns the container's host pid.
func (e *jailEnv) start(tb testing.TB) int {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pid, err := e.rt.Create(ctx, e.id, e.bundle)
	if err != nil {
		tb.Fatal(err)
	}
	if err := e.rt.Start(ctx, e.id); err != nil {
		tb.Fatal(err)
	}
	return pid
}

// results reads what the probe wrote before it reported ready.
func (e *jailEnv) results(tb testing.TB) map[string]string {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join(e.control, "result.json"))
	if err != nil {
		tb.Fatal(err)
	}
	r := map[string]string{}
	if err := json.Unmarshal(data, &r); err != nil {
		tb.Fatal(err)
	}
	return r
}

// waitStatus polls the container's state until it is want or the deadline
// passes.
func (e *jailEnv) waitStatus(tb testing.TB, want string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		status, _, err := e.rt.State(ctx, e.id)
		if err == nil && status == want {
			return
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("container %s: status %q (err %v), want %q", e.id, status, err, want)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// assertGone checks that nothing of the container is left: no runtime
// state and no cgroup directory in any hierarchy.
func (e *jailEnv) assertGone(tb testing.TB) {
	tb.Helper()
	ctx := context.Background()
	if _, _, err := e.rt.State(ctx, e.id); !errors.Is(err, errdefs.ErrNotFound) {
		tb.Errorf("state of %s after failure: %v, want not found", e.id, err)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "runc", e.id)); !errors.Is(err, os.ErrNotExist) {
		tb.Errorf("runc state dir of %s is left: %v", e.id, err)
	}
	ids, err := e.rt.List(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	for _, id := range ids {
		if id == e.id {
			tb.Errorf("runc list still shows %s", e.id)
		}
	}
	if left := cgroupDirs(e.cgroupsPath); len(left) > 0 {
		tb.Errorf("cgroup dirs left: %v", left)
	}
	e.rt.mu.Lock()
	defer e.rt.mu.Unlock()
	if e.rt.stdio[e.id] != nil {
		tb.Errorf("runtime still holds stdio of %s", e.id)
	}
}

// cgroupDirs lists the directories named cgroupsPath in every hierarchy.
func cgroupDirs(cgroupsPath string) []string {
	var out []string
	ents, _ := os.ReadDir(cgroupRoot)
	for _, ent := range ents {
		p := filepath.Join(cgroupRoot, ent.Name(), cgroupsPath)
		if _, err := os.Stat(p); err == nil {
			out = append(out, p)
		}
	}
	return out
}

func swapAccounting() bool {
	_, err := os.Stat(filepath.Join(cgroupRoot, "memory", "memory.memsw.limit_in_bytes"))
	return err == nil
}

// buildRootfs makes a minimal root: /usr is a mount point for the host's
// /usr, the merged-/usr symlinks, a tiny /etc, and a file and a directory
// that the tests block.
func buildRootfs(tb testing.TB, root string) {
	tb.Helper()
	for _, d := range []string{"usr", "etc", "proc", "sys", "dev", "secretdir"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(root, "tmp"), 0o1777); err != nil {
		tb.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o1777); err != nil {
		tb.Fatal(err)
	}
	for _, l := range []string{"bin", "sbin", "lib", "lib64"} {
		if err := os.Symlink("usr/"+l, filepath.Join(root, l)); err != nil {
			tb.Fatal(err)
		}
	}
	writeFile(tb, filepath.Join(root, "etc", "passwd"), "root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000::/workspace:/bin/sh\n")
	writeFile(tb, filepath.Join(root, "etc", "group"), "root:x:0:\ntty:x:5:\nagent:x:1000:\n")
	writeFile(tb, filepath.Join(root, "etc", "secret"), "top secret")
	writeFile(tb, filepath.Join(root, "secretdir", "key"), "also secret")
}

func writeFile(tb testing.TB, path, data string) {
	tb.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		tb.Fatal(err)
	}
}

// makeNetns creates a named network namespace and returns its path; the
// test's cleanup deletes it. The namespace is made on a thread that is
// thrown away afterwards, so no goroutine runs in it.
func makeNetns(tb testing.TB, id string) string {
	tb.Helper()
	name := "ajt-" + id
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		h, err := netns.NewNamed(name)
		if err == nil {
			h.Close()
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		tb.Fatalf("netns %s: %v", name, err)
	}
	tb.Cleanup(func() {
		if err := netns.DeleteNamed(name); err != nil {
			tb.Errorf("delete netns %s: %v", name, err)
		}
	})
	return "/var/run/netns/" + name
}

// capMask is the capability bit mask of names, as /proc/<pid>/status
// prints it.
func capMask(names []string) string {
	var m uint64
	for _, n := range names {
		for i, c := range config.AllCapabilities {
			if c == n {
				m |= 1 << uint(i)
			}
		}
	}
	return fmt.Sprintf("%016x", m)
}

func readTrim(tb testing.TB, path string) string {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
