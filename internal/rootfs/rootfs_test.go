package rootfs

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/testenv"
)

func TestEnsureHostLayout(t *testing.T) {
	testenv.RequireRoot(t)
	dataDir := t.TempDir()
	tree, err := EnsureHost(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	if tree != filepath.Join(dataDir, "rootfs", "host") {
		t.Fatalf("tree at %s", tree)
	}
	for _, c := range []struct {
		path     string
		mode     fs.FileMode
		uid, gid uint32
	}{
		{"root", fs.ModeDir | 0o700, 0, 0},
		{"home/agent", fs.ModeDir | 0o750, 1000, 1000},
		{"workspace", fs.ModeDir | 0o755, 1000, 1000},
		{"tmp", fs.ModeDir | fs.ModeSticky | 0o777, 0, 0},
		{"var/tmp", fs.ModeDir | fs.ModeSticky | 0o777, 0, 0},
		{".agentjail/run", fs.ModeDir | 0o700, 0, 0},
		{"usr", fs.ModeDir | 0o755, 0, 0},
	} {
		fi, err := os.Lstat(filepath.Join(tree, c.path))
		if err != nil {
			t.Errorf("%s: %v", c.path, err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode() != c.mode || st.Uid != c.uid || st.Gid != c.gid {
			t.Errorf("%s: mode %v owner %d:%d, want %v %d:%d", c.path, fi.Mode(), st.Uid, st.Gid, c.mode, c.uid, c.gid)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(tree, "usr")); len(ents) != 0 {
		t.Errorf("usr/ is not empty: %v", ents)
	}
	if l, err := os.Readlink(filepath.Join(tree, "bin")); err != nil || l != "usr/bin" {
		t.Errorf("bin link: %q %v", l, err)
	}
	if b, err := os.ReadFile(filepath.Join(tree, "etc", "passwd")); err != nil || !strings.Contains(string(b), "agent:x:1000:1000:agent:/home/agent:/bin/bash") {
		t.Errorf("passwd: %q %v", b, err)
	}

	// Second call: nothing rebuilt.
	before, _ := os.Stat(tree)
	again, err := EnsureHost(dataDir)
	if err != nil || again != tree {
		t.Fatalf("second EnsureHost: %s %v", again, err)
	}
	after, _ := os.Stat(tree)
	if !os.SameFile(before, after) {
		t.Fatal("tree rebuilt although the recipe did not change")
	}
	// A changed recipe rebuilds and swaps the tree; the old one is retired.
	if err := os.WriteFile(filepath.Join(dataDir, "rootfs", "host.recipe"), []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureHost(dataDir); err != nil {
		t.Fatal(err)
	}
	rebuilt, _ := os.Stat(tree)
	if os.SameFile(before, rebuilt) {
		t.Fatal("tree not rebuilt after a recipe change")
	}
	if ents, _ := os.ReadDir(filepath.Join(dataDir, "rootfs", ".retired")); len(ents) != 1 {
		t.Fatalf("retired trees: %v", ents)
	}
	if ents, _ := filepath.Glob(filepath.Join(dataDir, "rootfs", ".host-*")); len(ents) != 0 {
		t.Fatalf("build dirs left: %v", ents)
	}
}

func TestHostTreeHasNoSecrets(t *testing.T) {
	testenv.RequireRoot(t)
	dataDir := t.TempDir()
	tree, err := EnsureHost(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"etc/gshadow", "etc/ssh", "etc/ssl/private", "etc/sudoers", "etc/machine-id", "root/.ssh", "etc/apt", "etc/pam.d"} {
		if _, err := os.Lstat(filepath.Join(tree, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s exists in the tree (%v)", p, err)
		}
	}
	for _, p := range []string{"root", "home/agent", "workspace", "tmp"} {
		if ents, _ := os.ReadDir(filepath.Join(tree, p)); len(ents) != 0 {
			t.Errorf("%s is not empty: %v", p, ents)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(tree, "home")); len(ents) != 1 {
		t.Errorf("home holds more than agent: %v", ents)
	}
	b, err := os.ReadFile(filepath.Join(tree, "etc", "shadow"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if f := strings.Split(line, ":"); len(f) < 2 || f[1] != "*" {
			t.Errorf("shadow entry with a password: %q", line)
		}
	}
	err = filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
			t.Errorf("%s is setuid/setgid", p)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			if target, _ := os.Readlink(p); strings.Contains(target, dataDir) {
				t.Errorf("%s links into the data dir: %s", p, target)
			}
		}
		if fi.Mode().IsRegular() && fi.Size() < 1<<20 {
			if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), "PRIVATE KEY") {
				t.Errorf("%s holds a private key", p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestHostTreeRunsTools overlays the host's /usr on the tree (as a jail
// would see it) and runs sh, git and python3 chrooted in it.
func TestHostTreeRunsTools(t *testing.T) {
	testenv.RequireRoot(t)
	dataDir := t.TempDir()
	tree, err := EnsureHost(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	// /usr as the host provider mounts it; /dev as the runtime provides it.
	for _, d := range []string{"/usr", "/dev"} {
		target := filepath.Join(tree, d)
		if err := unix.Mount(d, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
				t.Errorf("unmount %s: %v", target, err)
			}
		})
	}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"sh", []string{"/bin/sh", "-c", "echo ok"}, "ok"},
		{"git", []string{"/usr/bin/git", "--version"}, "git version"},
		{"python3", []string{"/usr/bin/python3", "-c", "import ssl, json, sqlite3; print('py', ssl.OPENSSL_VERSION[:7])"}, "py OpenSSL"},
		{"users", []string{"/bin/sh", "-c", "id -un 1000; getent hosts localhost"}, "agent"},
	} {
		if _, err := os.Stat(filepath.Join("/usr", strings.TrimPrefix(c.args[0], "/usr"))); err != nil {
			if testenv.CI() {
				t.Fatalf("%s: %v", c.name, err)
			}
			t.Logf("skipping %s: not on this host", c.name)
			continue
		}
		cmd := exec.Command(c.args[0], c.args[1:]...)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/root", "LANG=C.UTF-8"}
		cmd.Dir = "/"
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: tree}
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%s in the tree: %v: %s", c.name, err, out)
		}
	}
}

func TestCheckDir(t *testing.T) {
	dataDir := t.TempDir()
	ok := t.TempDir()
	file := filepath.Join(ok, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	inData := filepath.Join(dataDir, "jails")
	if err := os.Mkdir(inData, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(ok, "link")
	if err := os.Symlink(inData, link); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		dir  string
		want error
	}{
		{ok, nil},
		{"relative/dir", errdefs.ErrInvalid},
		{filepath.Join(ok, "missing"), errdefs.ErrUnprocessable},
		{file, errdefs.ErrUnprocessable},
		{"/", errdefs.ErrForbidden},
		{inData, errdefs.ErrForbidden},
		{link, errdefs.ErrForbidden},
		{filepath.Dir(dataDir), errdefs.ErrForbidden},
	} {
		err := CheckDir(c.dir, dataDir)
		if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("CheckDir(%s): %v, want %v", c.dir, err, c.want)
		}
	}
}

func TestHostMounts(t *testing.T) {
	m := HostMounts()
	if len(m) != 1 || m[0] != (Mount{Source: "/usr", Target: "/usr", ReadOnly: true}) {
		t.Fatalf("HostMounts: %+v", m)
	}
}

func BenchmarkEnsureHostCached(b *testing.B) {
	dataDir := b.TempDir()
	if _, err := EnsureHost(dataDir); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := EnsureHost(dataDir); err != nil {
			b.Fatal(err)
		}
	}
}
