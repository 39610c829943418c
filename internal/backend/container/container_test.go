package container

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/storage"
	"github.com/agentjail/agentjail/internal/testenv"
)

// lowerTree makes a lower tree with an /etc/passwd.
func lowerTree(t *testing.T, passwd string) string {
	t.Helper()
	lower := t.TempDir()
	if err := os.Mkdir(filepath.Join(lower, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lower, "etc", "passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	return lower
}

func TestUsersOfTheLowerTree(t *testing.T) {
	lower := lowerTree(t, "root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1001::/home/agent:/bin/bash\nbad:x:one:1::/:/bin/sh\n")
	for _, c := range []struct {
		user     string
		uid, gid int
		ok       bool
		home     string
	}{
		{"agent", 1000, 1001, true, "/home/agent"},
		{"root", 0, 0, true, "/root"},
		{"4242", 4242, 4242, true, ""},
		{"bad", 1000, 1000, false, ""}, // a malformed entry is passed over
		{"ghost", 1000, 1000, false, ""},
	} {
		uid, gid, ok := lookupUser(lower, c.user)
		if uid != c.uid || gid != c.gid || ok != c.ok {
			t.Errorf("lookupUser(%q) = %d %d %v, want %d %d %v", c.user, uid, gid, ok, c.uid, c.gid, c.ok)
		}
		if got := homeOf(lower, c.user); got != c.home {
			t.Errorf("homeOf(%q) = %q, want %q", c.user, got, c.home)
		}
	}
	if uid, _, ok := lookupUser(t.TempDir(), "agent"); ok || uid != 1000 {
		t.Errorf("a tree without /etc/passwd: %d %v", uid, ok)
	}
}

// TestCheckHostInputs: a missing mount source or an unknown user is a 422
// naming the field, before anything is made.
func TestCheckHostInputs(t *testing.T) {
	lower := lowerTree(t, "agent:x:1000:1000::/home/agent:/bin/sh\n")
	cfg := func(mod func(c *config.Config)) *config.Config {
		c := &config.Config{}
		c.ApplyDefaults()
		mod(c)
		return c
	}
	if err := checkHostInputs(cfg(func(*config.Config) {}), lower); err != nil {
		t.Errorf("the default config: %v", err)
	}
	for name, c := range map[string]struct {
		cfg  *config.Config
		want string
	}{
		"missing mount": {cfg(func(c *config.Config) {
			c.Isolation.Filesystem.ReadWriteMounts = []config.Mount{{Source: "/no/such/dir", Target: "/data"}}
		}), "isolation.filesystem.read_write_mounts[0].source"},
		"unknown user": {cfg(func(c *config.Config) { c.Isolation.Process.User = "ghost" }), `no user "ghost"`},
	} {
		err := checkHostInputs(c.cfg, lower)
		if !errors.Is(err, errdefs.ErrUnprocessable) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want a 422 containing %q", name, err, c.want)
		}
	}
	if err := checkHostInputs(cfg(func(c *config.Config) { c.Isolation.Process.User = "4242" }), lower); err != nil {
		t.Errorf("a numeric uid: %v", err)
	}
}

func TestConfigure(t *testing.T) {
	b := &Backend{}
	c := &config.Config{}
	c.ApplyDefaults()
	if err := b.Configure(backend.Instance{Config: c}); err != nil {
		t.Errorf("the default config: %v", err)
	}
	off := false
	c.Isolation.Filesystem.UseOverlay = &off
	if err := b.Configure(backend.Instance{Config: c}); !errors.Is(err, errdefs.ErrUnprocessable) || !strings.Contains(err.Error(), "use_overlay") {
		t.Errorf("use_overlay false: %v", err)
	}
}

// TestWriteControl: init's config holds the jail's identity, its
// environment in order (config, then network), its blocked paths and a
// pool of shims sized by the pids limit; with a user namespace the
// mapped root owns it.
func TestWriteControl(t *testing.T) {
	testenv.RequireRoot(t)
	for _, userNS := range []bool{false, true} {
		dir := t.TempDir()
		c := &config.Config{Env: map[string]string{"ZED": "z", "ALPHA": "a"}}
		c.ApplyDefaults()
		c.Isolation.Filesystem.BlockedPaths = []string{"/workspace/.secrets"}
		if userNS {
			on := true
			c.Isolation.Process.Namespaces = &config.Namespaces{User: &on}
			c.Isolation.Resources.PidsLimit = 64
		}
		inst := backend.Instance{ID: "0123456789ab", Dir: dir, Config: c}
		b := &Backend{}
		p := b.paths(inst)
		if err := b.writeControl(inst, p, map[string]string{"HTTP_PROXY": "http://10.88.0.1:3128"}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { storage.Unmount(p.control) })
		controlIsBounded(t, p.control, controlBytes(c.Isolation.Resources.MemoryBytes))
		data, err := os.ReadFile(filepath.Join(p.control, initproto.ConfigName))
		if err != nil {
			t.Fatal(err)
		}
		var ic initproto.InitConfig
		if err := json.Unmarshal(data, &ic); err != nil {
			t.Fatal(err)
		}
		wantEnv := []string{"PATH=" + DefaultPath, "LANG=C.UTF-8", "ALPHA=a", "ZED=z", "HTTP_PROXY=http://10.88.0.1:3128"}
		if ic.JailID != inst.ID || ic.DefaultUser != config.DefaultUser || ic.Workspace != config.DefaultWorkspace ||
			!slices.Equal(ic.Env, wantEnv) || !slices.Equal(ic.BlockedPaths, c.Isolation.Filesystem.BlockedPaths) {
			t.Errorf("init config: %+v", ic)
		}
		wantShims, wantOwner := 2, 0
		if userNS {
			wantShims, wantOwner = 0, UIDMapBase
		}
		if ic.IdleShims != wantShims {
			t.Errorf("user namespace %v: %d idle shims, want %d", userNS, ic.IdleShims, wantShims)
		}
		for _, f := range []string{p.control, filepath.Join(p.control, initproto.ConfigName)} {
			fi, err := os.Stat(f)
			if err != nil {
				t.Fatal(err)
			}
			if uid := int(fi.Sys().(*syscall.Stat_t).Uid); uid != wantOwner {
				t.Errorf("user namespace %v: %s owned by %d, want %d", userNS, f, uid, wantOwner)
			}
		}
		if got := b.IDShift(inst); got != wantOwner {
			t.Errorf("user namespace %v: IDShift %d, want %d", userNS, got, wantOwner)
		}
		// Written again before the next start, it keeps what init wrote.
		if err := os.WriteFile(filepath.Join(p.control, initproto.LogName), []byte("before\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := b.writeControl(inst, p, nil); err != nil {
			t.Fatal(err)
		}
		if data, err := os.ReadFile(filepath.Join(p.control, initproto.LogName)); err != nil || string(data) != "before\n" {
			t.Errorf("init's log after the control dir was written again: %q %v", data, err)
		}
		if err := storage.Unmount(p.control); err != nil {
			t.Fatal(err)
		}
		if mounted, err := storage.IsMounted(p.control); err != nil || mounted {
			t.Errorf("the control dir is still mounted after its unmount: %v", err)
		}
	}
}

// controlIsBounded fails the test unless dir is a tmpfs of size bytes that
// refuses a write past them (what the jail's root could otherwise write
// there would land on the data dir's disk, past the jail's own).
func controlIsBounded(t *testing.T, dir string, size int64) {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Type != unix.TMPFS_MAGIC || int64(st.Blocks)*st.Bsize != size {
		t.Fatalf("control dir: filesystem type %#x of %d bytes, want a tmpfs of %d", st.Type, int64(st.Blocks)*st.Bsize, size)
	}
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	n, err := f.Write(make([]byte, size+1<<20))
	if !errors.Is(err, unix.ENOSPC) || int64(n) > size {
		t.Fatalf("writing past the control dir's bound: %d bytes written, %v", n, err)
	}
}

// TestClearControl: what a run leaves in its control dir goes, but for
// init's log (its end) and, when the jail stops, the recordings its
// manager is still to store.
func TestClearControl(t *testing.T) {
	dir := t.TempDir()
	rec := filepath.Join(dir, initproto.RecordingsName)
	log := bytes.Repeat([]byte("0123456789abcdef"), 20<<10) // 320 KiB
	files := map[string][]byte{
		initproto.LogName: log, initproto.ConfigName: []byte("{}"), "junk": []byte("x"), "junkdir/x": []byte("x"),
		initproto.RecordingsName + "/s1.cast": []byte("a"), initproto.RecordingsName + "/s2.cast.part": []byte("b"),
		initproto.RecordingsName + "/filler": []byte("c"), initproto.RecordingsName + "/sub/s3.cast": []byte("d"),
	}
	for name, data := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	names := func(d string) []string {
		ents, _ := os.ReadDir(d)
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	if err := clearControl(dir, true); err != nil {
		t.Fatal(err)
	}
	if got := names(dir); !slices.Equal(got, []string{initproto.LogName, initproto.RecordingsName}) {
		t.Errorf("after a stop the control dir holds %v", got)
	}
	if got := names(rec); !slices.Equal(got, []string{"s1.cast", "s2.cast.part"}) {
		t.Errorf("after a stop the recordings dir holds %v", got)
	}
	kept, err := os.ReadFile(filepath.Join(dir, initproto.LogName))
	if err != nil || len(kept) != maxKeptLog || !bytes.HasSuffix(log, kept) {
		t.Errorf("init's log: %d bytes kept (%v), want its last %d", len(kept), err, maxKeptLog)
	}
	if err := clearControl(dir, false); err != nil {
		t.Fatal(err)
	}
	if got := names(dir); !slices.Equal(got, []string{initproto.LogName}) {
		t.Errorf("before a start the control dir holds %v", got)
	}
	if err := clearControl(filepath.Join(dir, "none"), true); err != nil {
		t.Errorf("a control dir that is not there: %v", err)
	}
}
