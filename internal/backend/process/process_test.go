package process

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
)

func newConfig(mod func(c *config.Config)) *config.Config {
	c := &config.Config{}
	c.ApplyDefaults()
	if mod != nil {
		mod(c)
	}
	return c
}

// TestConfigure: the workspace becomes the jail's host directory, and
// what needs a mount namespace or another user is refused naming the
// field and the level.
func TestConfigure(t *testing.T) {
	b := &Backend{caps: backend.Capabilities{Level: config.LevelProcess}}
	dir := t.TempDir()
	inst := func(c *config.Config) backend.Instance {
		return backend.Instance{ID: "0123456789ab", Dir: dir, Config: c}
	}
	c := newConfig(nil)
	if err := b.Configure(inst(c)); err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(dir, "disk", "workspace")
	if c.Isolation.Filesystem.WorkspaceRoot != ws {
		t.Errorf("workspace_root %q, want %q", c.Isolation.Filesystem.WorkspaceRoot, ws)
	}
	if err := b.Configure(inst(c)); err != nil {
		t.Errorf("configuring again (a restart's config): %v", err)
	}
	src := t.TempDir()
	for field, mod := range map[string]func(c *config.Config){
		"isolation.filesystem.workspace_root": func(c *config.Config) { c.Isolation.Filesystem.WorkspaceRoot = "/srv/work" },
		"isolation.filesystem.read_only_mounts[0]": func(c *config.Config) {
			c.Isolation.Filesystem.ReadOnlyMounts = []config.Mount{{Source: src, Target: "/data"}}
		},
		"isolation.filesystem.read_write_mounts[0].source": func(c *config.Config) {
			c.Isolation.Filesystem.ReadWriteMounts = []config.Mount{{Source: "/no/such", Target: "/no/such"}}
		},
		"isolation.filesystem.blocked_paths":    func(c *config.Config) { c.Isolation.Filesystem.BlockedPaths = []string{"/etc/ssh"} },
		"isolation.network.tls_inspection":      func(c *config.Config) { c.Isolation.Network.TLSInspection = true },
		"isolation.process.user":                func(c *config.Config) { c.Isolation.Process.User = "root" },
		"isolation.process: the process level ": func(c *config.Config) { c.Isolation.Process.Capabilities = []string{"CAP_NET_RAW"} },
	} {
		err := b.Configure(inst(newConfig(mod)))
		// A missing source is the host's fault, not the level's.
		level := strings.HasSuffix(field, ".source") || strings.Contains(err.Error(), "process level")
		if !errors.Is(err, errdefs.ErrUnprocessable) || !strings.Contains(err.Error(), field) || !level {
			t.Errorf("%s: %v, want a 422 naming the field and the level", field, err)
		}
	}
	ok := newConfig(func(c *config.Config) {
		c.Isolation.Filesystem.ReadOnlyMounts = []config.Mount{{Source: src, Target: src}}
	})
	if err := b.Configure(inst(ok)); err != nil {
		t.Errorf("a mount at its own path: %v", err)
	}
	spec := b.confineSpec(inst(ok), 1100007, []string{"agentjail", "init"})
	if !slices.Contains(spec.Landlock.ReadOnly, src) || !slices.Contains(spec.Landlock.ReadWrite, ws) ||
		slices.Contains(spec.Landlock.ReadWrite, "/tmp") || spec.UID != 1100007 || !spec.Seccomp {
		t.Errorf("confine spec: %+v %+v", spec, spec.Landlock)
	}
}

func TestNoneConfigure(t *testing.T) {
	b := &Backend{unsafe: true, caps: backend.Capabilities{Level: config.LevelNone}}
	c := newConfig(nil)
	if err := b.Configure(backend.Instance{ID: "0123456789ab", Dir: "/jails/x", Config: c}); err != nil {
		t.Fatal(err)
	}
	if c.Isolation.Process.User != strconv.Itoa(os.Getuid()) || c.Isolation.Filesystem.WorkspaceRoot != "/jails/x/files/workspace" {
		t.Errorf("none config: user %q, workspace %q", c.Isolation.Process.User, c.Isolation.Filesystem.WorkspaceRoot)
	}
	if _, err := NoneFactory(false).New(backend.Host{}); err == nil || !strings.Contains(err.Error(), "--unsafe-none-level") {
		t.Errorf("the none level without the flag: %v", err)
	}
}

// TestUIDs: each jail gets the lowest free uid of the range, kept across
// calls, never another jail's.
func TestUIDs(t *testing.T) {
	data := t.TempDir()
	b := &Backend{host: backend.Host{DataDir: data}}
	inst := func(id string) backend.Instance {
		dir := filepath.Join(data, "jails", id)
		if err := os.MkdirAll(dir, 0o711); err != nil {
			t.Fatal(err)
		}
		return backend.Instance{ID: id, Dir: dir}
	}
	a, err := b.allocUID(inst("aaaaaaaaaaaa"))
	if err != nil || a != UIDBase {
		t.Fatalf("first uid %d %v", a, err)
	}
	c, err := b.allocUID(inst("cccccccccccc"))
	if err != nil || c != UIDBase+1 {
		t.Fatalf("second uid %d %v", c, err)
	}
	if again, _ := b.allocUID(inst("aaaaaaaaaaaa")); again != a {
		t.Errorf("the same jail got %d, then %d", a, again)
	}
	if err := os.RemoveAll(filepath.Join(data, "jails", "aaaaaaaaaaaa")); err != nil {
		t.Fatal(err)
	}
	if d, _ := b.allocUID(inst("dddddddddddd")); d != UIDBase {
		t.Errorf("a freed uid is not reused: %d", d)
	}
}
