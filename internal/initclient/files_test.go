package initclient_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/initproto"
)

// readAll reads a jail file through the client.
func readAll(c *initclient.Client, p string) (string, error) {
	_, rc, err := c.ReadFile(context.Background(), p)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	return string(b), err
}

func writeStr(c *initclient.Client, p, data string, opts initproto.WriteOptions) (initproto.FileInfo, error) {
	return c.WriteFile(context.Background(), p, strings.NewReader(data), opts)
}

func owner(t *testing.T, p string) (int, int, os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return int(st.Uid), int(st.Gid), fi.Mode().Perm()
}

func TestFileOps(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.c

	// Write, with parents, default owner and mode.
	info, err := writeStr(c, "/work/a/b.txt", "hello", initproto.WriteOptions{MkdirParents: true})
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != initproto.TypeFile || info.Size != 5 || info.Mode != 0o644 || info.UID != 1000 || info.GID != 1000 || info.Path != "/work/a/b.txt" || info.Name != "b.txt" {
		t.Fatalf("write info: %+v", info)
	}
	if u, g, m := owner(t, filepath.Join(e.root, "work/a")); u != 1000 || g != 1000 || m != 0o755 {
		t.Fatalf("created parent: %d:%d %v", u, g, m)
	}
	if got := mustRead(t, filepath.Join(e.root, "work/a/b.txt")); got != "hello" {
		t.Fatalf("content %q", got)
	}
	// Replacing keeps mode and owner unless asked.
	if err := os.Chmod(filepath.Join(e.root, "work/a/b.txt"), 0o600); err != nil {
		t.Fatal(err)
	}
	if info, err = writeStr(c, "/work/a/b.txt", "again", initproto.WriteOptions{}); err != nil || info.Mode != 0o600 || info.UID != 1000 {
		t.Fatalf("replace: %+v %v", info, err)
	}
	if info, err = writeStr(c, "/work/x.sh", "#!/bin/sh\n", initproto.WriteOptions{Mode: 0o750, User: "tester"}); err != nil || info.Mode != 0o750 || info.UID != 4321 || info.GID != 4321 {
		t.Fatalf("mode/user: %+v %v", info, err)
	}
	// A large file round trip.
	big := make([]byte, 3<<20+17)
	rand.Read(big)
	if _, err := c.WriteFile(ctx, "/work/big", bytes.NewReader(big), initproto.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	info, rc, err := c.ReadFile(ctx, "/work/big")
	if err != nil || info.Size != int64(len(big)) {
		t.Fatalf("read big: %+v %v", info, err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("big content differs (%d bytes, %v)", len(got), err)
	}
	// No temporary file is left behind.
	ents, _ := os.ReadDir(filepath.Join(e.root, "work"))
	for _, de := range ents {
		if strings.HasPrefix(de.Name(), ".agentjail") {
			t.Fatalf("temporary file left: %s", de.Name())
		}
	}

	// Stat with lstat semantics, and ReadDir.
	if err := os.Symlink("a/b.txt", filepath.Join(e.root, "work/link")); err != nil {
		t.Fatal(err)
	}
	info, err = c.Stat(ctx, "/work/link")
	if err != nil || info.Type != initproto.TypeSymlink || info.LinkTarget != "a/b.txt" {
		t.Fatalf("stat link: %+v %v", info, err)
	}
	if s, err := readAll(c, "/work/link"); err != nil || s != "again" {
		t.Fatalf("read through link: %q %v", s, err)
	}
	list, err := c.ReadDir(ctx, "/work")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, fi := range list {
		names = append(names, fi.Name+":"+fi.Type)
	}
	if strings.Join(names, ",") != "a:dir,big:file,link:symlink,x.sh:file" {
		t.Fatalf("readdir: %v", names)
	}
	if info, err := c.Stat(ctx, "/"); err != nil || info.Type != initproto.TypeDir {
		t.Fatalf("stat /: %+v %v", info, err)
	}

	// Mkdir.
	if info, err = c.Mkdir(ctx, "/work/d", initproto.WriteOptions{Mode: 0o700}); err != nil || info.Type != initproto.TypeDir || info.Mode != 0o700 || info.UID != 1000 {
		t.Fatalf("mkdir: %+v %v", info, err)
	}
	if _, err = c.Mkdir(ctx, "/work/d", initproto.WriteOptions{}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("mkdir existing: %v", err)
	}
	if _, err = c.Mkdir(ctx, "/work/d", initproto.WriteOptions{MkdirParents: true}); err != nil {
		t.Fatalf("mkdir -p existing: %v", err)
	}
	if _, err = c.Mkdir(ctx, "/work/p/q/r", initproto.WriteOptions{MkdirParents: true, User: "root"}); err != nil {
		t.Fatal(err)
	}
	if u, _, _ := owner(t, filepath.Join(e.root, "work/p/q")); u != 0 {
		t.Fatalf("mkdir -p owner %d", u)
	}
	if _, err = c.Mkdir(ctx, "/nope/x", initproto.WriteOptions{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("mkdir without parent: %v", err)
	}

	// Rename and remove.
	if err := c.Rename(ctx, "/work/x.sh", "/work/d/y.sh"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stat(ctx, "/work/x.sh"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("renamed source: %v", err)
	}
	if err := c.Remove(ctx, "/work/link", false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(e.root, "work/a/b.txt")); err != nil {
		t.Fatalf("removing a symlink removed its target: %v", err)
	}
	if err := c.Remove(ctx, "/work/p", false); !errors.Is(err, errdefs.ErrUnprocessable) {
		t.Fatalf("remove non-empty: %v", err)
	}
	if err := c.Remove(ctx, "/work/p", true); err != nil {
		t.Fatal(err)
	}
	if err := c.Remove(ctx, "/work/p", true); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("remove missing: %v", err)
	}
	if err := c.Remove(ctx, "/", true); !errors.Is(err, errdefs.ErrUnprocessable) {
		t.Fatalf("remove /: %v", err)
	}

	// Error kinds.
	for _, tc := range []struct {
		name string
		err  error
		kind error
	}{
		{"stat missing", func() error { _, err := c.Stat(ctx, "/missing"); return err }(), errdefs.ErrNotFound},
		{"read dir", func() error { _, err := readAll(c, "/work"); return err }(), errdefs.ErrUnprocessable},
		{"readdir file", func() error { _, err := c.ReadDir(ctx, "/work/big"); return err }(), errdefs.ErrUnprocessable},
		{"write dir", func() error { _, err := writeStr(c, "/work/d", "x", initproto.WriteOptions{}); return err }(), errdefs.ErrUnprocessable},
		{"write no parent", func() error { _, err := writeStr(c, "/none/f", "x", initproto.WriteOptions{}); return err }(), errdefs.ErrNotFound},
		{"relative path", func() error { _, err := c.Stat(ctx, "work"); return err }(), errdefs.ErrInvalid},
		{"NUL path", func() error { _, err := c.Stat(ctx, "/wo\x00rk"); return err }(), errdefs.ErrInvalid},
		{"unknown owner", func() error { _, err := writeStr(c, "/work/u", "x", initproto.WriteOptions{User: "ghost"}); return err }(), errdefs.ErrInvalid},
	} {
		if !errors.Is(tc.err, tc.kind) {
			t.Errorf("%s: got %v, want kind %v", tc.name, tc.err, tc.kind)
		}
	}

	// A failing reader writes nothing.
	_, err = c.WriteFile(ctx, "/work/partial", io.MultiReader(strings.NewReader("abc"), errReader{}), initproto.WriteOptions{})
	if err == nil {
		t.Fatal("write with a failing reader succeeded")
	}
	waitFor(t, 5*time.Second, "the partial temp file to be removed", func() bool {
		ents, _ := os.ReadDir(filepath.Join(e.root, "work"))
		for _, de := range ents {
			if de.Name() == "partial" || strings.HasPrefix(de.Name(), ".agentjail") {
				return false
			}
		}
		return true
	})
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("source failed") }

func TestAccess(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	mustMkdir(t, filepath.Join(e.root, "priv"), 0o700)
	mustWrite(t, filepath.Join(e.root, "priv/f"), "x", 0o644)
	mustWrite(t, filepath.Join(e.root, "shared"), "x", 0o644)
	mustWrite(t, filepath.Join(e.root, "groupw"), "x", 0o664)
	if err := os.Chown(filepath.Join(e.root, "groupw"), 0, 5555); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(e.root, "groupw"), 0o664); err != nil {
		t.Fatal(err)
	}
	mustMkdir(t, filepath.Join(e.root, "home/tester"), 0o755)
	if err := os.Chown(filepath.Join(e.root, "home/tester"), 4321, 4321); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path   string
		write  bool
		user   string
		ok     bool
		reason string
	}{
		{"/shared", false, "tester", true, ""},
		{"/shared", true, "tester", false, "no write permission on /shared"},
		{"/shared", true, "root", true, ""},
		{"/priv/f", false, "tester", false, "cannot search /priv"},
		{"/priv/f", false, "root", true, ""},
		{"/groupw", true, "tester", true, ""}, // via supplementary group extra
		{"/groupw", true, "agent", false, "no write permission"},
		{"/home/tester/new", true, "tester", true, ""},
		{"/home/tester/new", true, "agent", false, "no write permission on /home/tester"},
		{"/home/tester/new", false, "tester", false, "does not exist"},
		{"/missing/new", true, "tester", false, "/missing does not exist"},
	} {
		ok, reason, err := e.c.Access(ctx, tc.path, tc.write, tc.user)
		if err != nil || ok != tc.ok || !strings.Contains(reason, tc.reason) {
			t.Errorf("access(%s, write=%v, %s) = %v %q %v; want %v %q", tc.path, tc.write, tc.user, ok, reason, err, tc.ok, tc.reason)
		}
	}
	if _, _, err := e.c.Access(ctx, "/shared", false, "ghost"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("unknown user: %v", err)
	}
}

func TestBlockedPaths(t *testing.T) {
	e := newEnv(t, "/secret", "/data/private")
	ctx := context.Background()
	mustMkdir(t, filepath.Join(e.root, "secret"), 0o755)
	mustWrite(t, filepath.Join(e.root, "secret/file"), "hidden", 0o644)
	mustMkdir(t, filepath.Join(e.root, "data/private"), 0o755)
	mustWrite(t, filepath.Join(e.root, "data/private/x"), "hidden", 0o644)
	mustWrite(t, filepath.Join(e.root, "data/ok"), "fine", 0o644)
	if err := os.Symlink("/secret/file", filepath.Join(e.root, "sneaky")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("data/private", filepath.Join(e.root, "sneakydir")); err != nil {
		t.Fatal(err)
	}
	c := e.c
	blocked := func(name string, err error, p string) {
		t.Helper()
		if !errors.Is(err, errdefs.ErrForbidden) {
			t.Errorf("%s: got %v, want forbidden", name, err)
			return
		}
		if want := `path "` + p + `" is blocked by the jail's policy`; err.Error() != want {
			t.Errorf("%s: message %q, want %q", name, err.Error(), want)
		}
	}
	_, err := readAll(c, "/secret/file")
	blocked("read", err, "/secret/file")
	_, err = readAll(c, "/sneaky")
	blocked("read through symlink", err, "/sneaky")
	_, err = readAll(c, "/data/../secret/./file")
	blocked("read dotted", err, "/secret/file")
	_, err = c.ReadDir(ctx, "/sneakydir")
	blocked("readdir through symlink", err, "/sneakydir")
	_, err = c.Stat(ctx, "/secret")
	blocked("stat", err, "/secret")
	_, err = writeStr(c, "/secret/new", "x", initproto.WriteOptions{})
	blocked("write", err, "/secret/new")
	_, err = writeStr(c, "/sneakydir/new", "x", initproto.WriteOptions{})
	blocked("write through symlinked dir", err, "/sneakydir/new")
	_, err = c.Mkdir(ctx, "/secret/d", initproto.WriteOptions{MkdirParents: true})
	blocked("mkdir", err, "/secret/d")
	_, err = c.Symlink(ctx, "/secret/link", "file", "")
	blocked("symlink", err, "/secret/link")
	_, err = c.Symlink(ctx, "/sneakydir/link", "x", "")
	blocked("symlink through symlinked dir", err, "/sneakydir/link")
	blocked("remove parent", c.Remove(ctx, "/data", true), "/data")
	blocked("rename", c.Rename(ctx, "/data/private", "/elsewhere"), "/data/private")
	blocked("rename into", c.Rename(ctx, "/data/ok", "/secret/ok"), "/secret/ok")
	ok, reason, err := c.Access(ctx, "/sneaky", false, "root")
	if err != nil || ok || !strings.Contains(reason, "blocked") {
		t.Errorf("access: %v %q %v", ok, reason, err)
	}
	// Neighbours stay usable; listing a parent shows the blocked entry.
	if s, err := readAll(c, "/data/ok"); err != nil || s != "fine" {
		t.Errorf("read neighbour: %q %v", s, err)
	}
	if l, err := c.ReadDir(ctx, "/data"); err != nil || len(l) != 2 {
		t.Errorf("readdir parent: %v %v", l, err)
	}
	if got := mustRead(t, filepath.Join(e.root, "secret/file")); got != "hidden" {
		t.Errorf("blocked file changed: %q", got)
	}
	if _, err := os.Stat(filepath.Join(e.root, "data/private/x")); err != nil {
		t.Errorf("blocked file removed: %v", err)
	}
}

// TestTraversalAttacks checks that no path form reaches outside the root:
// e.outside holds a secret next to the root, and /etc/passwd inside the
// root is the test's own.
func TestTraversalAttacks(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.c
	outSecret := filepath.Join(e.outside, "secret")
	for name, target := range map[string]string{
		"abs-out":     outSecret,           // absolute symlink to a host path
		"rel-out":     "../outside/secret", // relative escape
		"deep-out":    "../../../../../../../../../" + strings.TrimPrefix(outSecret, "/"),
		"etc-passwd":  "/etc/passwd",                // absolute: means the jail's /etc/passwd
		"dir-out":     "../outside",                 // a directory outside
		"dir-abs-out": e.outside,                    // the same, absolute
		"proc-root":   "/proc/self/root/etc/passwd", // a magic link path
	} {
		if err := os.Symlink(target, filepath.Join(e.root, name)); err != nil {
			t.Fatal(err)
		}
	}
	hostPasswd := mustRead(t, "/etc/passwd")
	for _, p := range []string{
		"/abs-out", "/rel-out", "/deep-out", "/dir-out/secret", "/dir-abs-out/secret",
		"/../outside/secret", "/../../../../etc/shadow", "/etc/../../outside/secret",
		"/proc-root",
	} {
		s, err := readAll(c, p)
		if strings.Contains(s, secret) || (s != "" && s == hostPasswd) {
			t.Errorf("read %s escaped the root: %q", p, s)
		}
		if err == nil {
			t.Errorf("read %s: unexpectedly succeeded with %q", p, s)
		}
		if _, err := c.Stat(ctx, p); err == nil && strings.HasPrefix(p, "/dir") {
			t.Errorf("stat %s reached outside", p)
		}
	}
	if s, err := readAll(c, "/etc-passwd"); err != nil || s != testPasswd {
		t.Errorf("absolute symlink: got %q %v, want the jail's passwd", s, err)
	}
	if s, err := readAll(c, "/../../etc/passwd"); err != nil || s != testPasswd {
		t.Errorf("dot-dot: got %q %v, want the jail's passwd", s, err)
	}
	// Writes never follow a final symlink nor leave through a directory one.
	for _, p := range []string{"/abs-out", "/rel-out", "/etc-passwd"} {
		if _, err := writeStr(c, p, "pwned", initproto.WriteOptions{}); !errors.Is(err, errdefs.ErrUnprocessable) {
			t.Errorf("write %s: %v", p, err)
		}
	}
	for _, p := range []string{"/dir-out/pwned", "/dir-abs-out/pwned", "/../outside/pwned"} {
		writeStr(c, p, "pwned", initproto.WriteOptions{MkdirParents: true})
		c.Mkdir(ctx, p+"-dir", initproto.WriteOptions{MkdirParents: true})
		c.Rename(ctx, "/etc/group", p)
		c.Remove(ctx, strings.TrimSuffix(p, "pwned")+"secret", true)
	}
	if got := mustRead(t, outSecret); got != secret {
		t.Fatalf("outside secret changed: %q", got)
	}
	ents, _ := os.ReadDir(e.outside)
	if len(ents) != 1 {
		t.Fatalf("outside directory changed: %v", ents)
	}
	if got := mustRead(t, filepath.Join(e.root, "etc/passwd")); got != testPasswd {
		t.Fatalf("jail passwd changed: %q", got)
	}

	// A hard link to an outside file (possible here because the test root
	// shares a filesystem with the host) is replaced, not written through.
	hl := filepath.Join(e.outside, "hardlinked")
	mustWrite(t, hl, "original", 0o644)
	if err := os.Link(hl, filepath.Join(e.root, "hl")); err != nil {
		t.Fatal(err)
	}
	if _, err := writeStr(c, "/hl", "new content", initproto.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := mustRead(t, hl); got != "original" {
		t.Fatalf("write through a hard link modified the outside file: %q", got)
	}
	if got := mustRead(t, filepath.Join(e.root, "hl")); got != "new content" {
		t.Fatalf("hard-linked path: %q", got)
	}
}

// TestProcMagicLinks mounts a proc instance inside the root: its magic
// links (/proc/self/root, /proc/self/cwd, fd links) must not resolve.
func TestProcMagicLinks(t *testing.T) {
	e := newEnv(t)
	procDir := filepath.Join(e.root, "proc")
	mustMkdir(t, procDir, 0o555)
	if err := unix.Mount("proc", procDir, "proc", 0, ""); err != nil {
		t.Fatalf("mount proc: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(procDir, unix.MNT_DETACH) })
	for _, p := range []string{"/proc/self/root/etc/passwd", "/proc/self/cwd/etc/passwd", "/proc/1/root/etc/passwd", "/proc/self/exe"} {
		s, err := readAll(e.c, p)
		if err == nil {
			t.Errorf("read %s through a magic link: %d bytes", p, len(s))
		}
		if _, err := writeStr(e.c, p, "x", initproto.WriteOptions{}); err == nil {
			t.Errorf("write %s through a magic link succeeded", p)
		}
	}
}

// TestSymlinkSwapRace swaps a path between an inside file and symlinks to
// the outside (file and directory) while reads and writes run.
func TestSymlinkSwapRace(t *testing.T) {
	e := newEnv(t)
	outSecret := filepath.Join(e.outside, "secret")
	race := filepath.Join(e.root, "race")
	raceDir := filepath.Join(e.root, "racedir")
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		targets := []string{outSecret, "../outside/secret"}
		dirTargets := []string{e.outside, "../outside"}
		for i := 0; !stop.Load(); i++ {
			os.Remove(race)
			os.Symlink(targets[i%2], race)
			os.Remove(race)
			os.WriteFile(race, []byte("inside"), 0o644)
			os.RemoveAll(raceDir)
			os.Symlink(dirTargets[i%2], raceDir)
			os.Remove(raceDir)
			os.Mkdir(raceDir, 0o755)
			os.WriteFile(filepath.Join(raceDir, "secret"), []byte("inside"), 0o644)
		}
	}()
	deadline := time.Now().Add(3 * time.Second)
	n := 0
	for ; n < 400 && time.Now().Before(deadline); n++ {
		if s, _ := readAll(e.c, "/race"); strings.Contains(s, secret) {
			t.Errorf("read /race returned the outside secret")
		}
		if s, _ := readAll(e.c, "/racedir/secret"); strings.Contains(s, secret) {
			t.Errorf("read /racedir/secret returned the outside secret")
		}
		writeStr(e.c, "/race", "pwned", initproto.WriteOptions{})
		writeStr(e.c, "/racedir/secret", "pwned", initproto.WriteOptions{})
		writeStr(e.c, "/racedir/new", "pwned", initproto.WriteOptions{})
	}
	stop.Store(true)
	wg.Wait()
	if n < 50 {
		t.Fatalf("only %d rounds ran", n)
	}
	if got := mustRead(t, outSecret); got != secret {
		t.Fatalf("outside secret changed: %q", got)
	}
	ents, _ := os.ReadDir(e.outside)
	if len(ents) != 1 {
		t.Fatalf("outside directory changed: %v", ents)
	}
}

// TestDiskFullAndReadOnly checks ENOSPC and EROFS mapping on real mounts
// inside the root.
func TestDiskFullAndReadOnly(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	small := filepath.Join(e.root, "small")
	mustMkdir(t, small, 0o755)
	if err := unix.Mount("tmpfs", small, "tmpfs", 0, "size=256k"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(small, unix.MNT_DETACH) })
	_, err := e.c.WriteFile(ctx, "/small/big", bytes.NewReader(make([]byte, 4<<20)), initproto.WriteOptions{})
	if !errors.Is(err, errdefs.ErrTooLarge) || !strings.Contains(err.Error(), "no space left in the jail's disk") {
		t.Fatalf("disk full: %v", err)
	}
	ents, _ := os.ReadDir(small)
	if len(ents) != 0 {
		t.Fatalf("a failed write left %v", ents)
	}

	ro := filepath.Join(e.root, "ro")
	mustMkdir(t, ro, 0o755)
	mustWrite(t, filepath.Join(ro, "f"), "data", 0o666)
	if err := unix.Mount(ro, ro, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(ro, unix.MNT_DETACH) })
	if err := unix.Mount("", ro, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remount read-only: %v", err)
	}
	if _, err := writeStr(e.c, "/ro/f", "x", initproto.WriteOptions{}); !errors.Is(err, errdefs.ErrForbidden) {
		t.Fatalf("write on a read-only mount: %v", err)
	}
	ok, reason, err := e.c.Access(ctx, "/ro/f", true, "root")
	if err != nil || ok || !strings.Contains(reason, "read-only") {
		t.Fatalf("access on a read-only mount: %v %q %v", ok, reason, err)
	}
	if s, err := readAll(e.c, "/ro/f"); err != nil || s != "data" {
		t.Fatalf("read on a read-only mount: %q %v", s, err)
	}
}

// TestSymlinkCreate: a link is made as given, owned by the jail's user (or
// the one asked for); following it stays inside the root; an existing
// path, a missing parent and a malformed target are refused.
func TestSymlinkCreate(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.c
	mustMkdir(t, filepath.Join(e.root, "work"), 0o755)
	mustWrite(t, filepath.Join(e.root, "work/data.txt"), "inside", 0o644)
	info, err := c.Symlink(ctx, "/work/rel", "data.txt", "")
	if err != nil || info.Type != initproto.TypeSymlink || info.LinkTarget != "data.txt" || info.UID != 1000 || info.GID != 1000 || info.Path != "/work/rel" {
		t.Fatalf("symlink: %+v %v", info, err)
	}
	if got, err := os.Readlink(filepath.Join(e.root, "work/rel")); err != nil || got != "data.txt" {
		t.Fatalf("on disk: %q %v", got, err)
	}
	if u, g, _ := owner(t, filepath.Join(e.root, "work/rel")); u != 1000 || g != 1000 {
		t.Fatalf("on disk owner %d:%d", u, g)
	}
	if s, err := readAll(c, "/work/rel"); err != nil || s != "inside" {
		t.Fatalf("read through the new link: %q %v", s, err)
	}
	if info, err := c.Symlink(ctx, "/work/as-tester", "/work/data.txt", "tester"); err != nil || info.UID != 4321 {
		t.Fatalf("symlink as tester: %+v %v", info, err)
	}
	// A target outside the root is kept as given, and reading through it
	// stays inside the root: the host's file next to the root is not read.
	escape := strings.Repeat("../", 8) + filepath.Join(strings.TrimPrefix(e.outside, "/"), "secret")
	if _, err := c.Symlink(ctx, "/work/escape", escape, ""); err != nil {
		t.Fatal(err)
	}
	if s, err := readAll(c, "/work/escape"); err == nil || s == secret {
		t.Fatalf("read through a link out of the root: %q %v", s, err)
	}
	for _, tc := range []struct {
		name, path, target string
		want               error
	}{
		{"existing path", "/work/data.txt", "x", errdefs.ErrConflict},
		{"existing link", "/work/rel", "x", errdefs.ErrConflict},
		{"missing parent", "/nowhere/link", "x", errdefs.ErrNotFound},
		{"empty target", "/work/empty", "", errdefs.ErrInvalid},
		{"NUL in target", "/work/nul", "a\x00b", errdefs.ErrInvalid},
		{"target too long", "/work/long", strings.Repeat("a", initproto.MaxLinkTarget+1), errdefs.ErrInvalid},
		{"relative path", "work/x", "x", errdefs.ErrInvalid},
	} {
		if _, err := c.Symlink(ctx, tc.path, tc.target, ""); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if got := mustRead(t, filepath.Join(e.root, "work/data.txt")); got != "inside" {
		t.Errorf("the refused link changed the file: %q", got)
	}
}

// TestListDirBounded: a directory too large for one frame is listed whole
// (ReadDir's single answer cannot carry it), sorted; past the limit the
// listing says it is truncated and holds the limit's worth, sorted; an
// init that predates the request is asked the old way.
func TestListDirBounded(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	dir := filepath.Join(e.root, "work/many")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const n = 30000 // about 6 MiB of entries, past initproto.MaxPayload
	for i := range n {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("entry-with-a-long-name-%06d", n-i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.c.ReadDir(ctx, "/work/many"); err == nil {
		t.Fatal("ReadDir of a directory past one frame succeeded; the test does not test ListDir's frames")
	}
	sorted := func(l []initproto.FileInfo) bool {
		return slices.IsSortedFunc(l, func(a, b initproto.FileInfo) int { return strings.Compare(a.Name, b.Name) })
	}
	list, truncated, err := e.c.ListDir(ctx, "/work/many", 100000)
	if err != nil || truncated || len(list) != n || !sorted(list) || list[0].Name != "entry-with-a-long-name-000001" || list[0].Path != "/work/many/entry-with-a-long-name-000001" {
		t.Fatalf("whole listing: %d entries, truncated %v, sorted %v, %v", len(list), truncated, sorted(list), err)
	}
	list, truncated, err = e.c.ListDir(ctx, "/work/many", 1000)
	if err != nil || !truncated || len(list) != 1000 || !sorted(list) {
		t.Fatalf("bounded listing: %d entries, truncated %v, sorted %v, %v", len(list), truncated, sorted(list), err)
	}
	for _, limit := range []int{0, initproto.MaxListDir + 1} {
		if _, _, err := e.c.ListDir(ctx, "/work/many", limit); !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("limit %d: %v", limit, err)
		}
	}
	if _, _, err := e.c.ListDir(ctx, "/work/many/entry-with-a-long-name-000001", 10); !errors.Is(err, errdefs.ErrUnprocessable) {
		t.Fatalf("listing a file: %v", err)
	}

	sock := filepath.Join(e.dir, "old.sock")
	asked := olderInit(t, sock, e.sock, initproto.MsgListDir)
	old := initclient.New(initclient.UnixSocket(sock))
	if err := os.MkdirAll(filepath.Join(e.root, "work/few"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.root, "work/few/a"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	list, truncated, err = old.ListDir(ctx, "/work/few", 10)
	if err != nil || truncated || len(list) != 1 || list[0].Name != "a" || asked.Load() != 1 {
		t.Fatalf("through an older init: %+v, truncated %v, %v (asked %d times)", list, truncated, err, asked.Load())
	}
}
