package vm

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cavaliergopher/cpio"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/backend/vm/vmproto"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/testenv"
)

func TestMachineArgs(t *testing.T) {
	tap, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer tap.Close()
	s := machineSpec{
		dir: "/run/j", accel: "tcg", kernel: "/k/vmlinux", initrd: "/c/initramfs.cpio", tscKHz: 2600000,
		cpus: 2, memMiB: 704, lower: "/c/lower.erofs", usr: "/c/usr.erofs", upper: "/p/disk.img",
		tap: tap, mac: "02:00:00:00:00:01",
	}
	args := s.args()
	joined := strings.Join(args, " ")
	value := func(flag string) string {
		i := slices.Index(args, flag)
		if i < 0 || i+1 >= len(args) {
			t.Fatalf("no %s in %q", flag, joined)
		}
		return args[i+1]
	}
	cmdline := value("-append")
	// The guest kernel needs the TSC's frequency and must trust it (TCG
	// hangs or miscounts CPU time otherwise), and starts our binary with
	// vminit after "--".
	for _, want := range []string{"tsc_early_khz=2600000", "tsc=reliable", "reboot=t", "panic=-1", "rdinit=/agentjail"} {
		if !slices.Contains(strings.Fields(cmdline), want) {
			t.Errorf("kernel command line %q lacks %s", cmdline, want)
		}
	}
	if !strings.HasSuffix(cmdline, " -- vminit") {
		t.Errorf("kernel command line %q does not end with init's arguments", cmdline)
	}
	if !slices.Contains(strings.Split(value("-M"), ","), "mem-merge=off") {
		t.Errorf("machine %q: its RAM may be merged with other machines' (mem-merge is not off)", value("-M"))
	}
	if value("-accel") != "tcg,tb-size=128" || value("-smp") != "2" || value("-m") != "704M" {
		t.Errorf("machine: %q", joined)
	}
	for _, d := range []string{"lower", "usr", "upper"} {
		if !strings.Contains(joined, "virtio-blk-device,drive="+d+",serial="+d) {
			t.Errorf("no disk with serial %s: %q", d, joined)
		}
	}
	for _, ro := range []string{"/c/lower.erofs", "/c/usr.erofs"} {
		if !strings.Contains(joined, "file="+ro+",format=raw,if=none,cache=none,aio=threads,readonly=on") {
			t.Errorf("%s is not read-only: %q", ro, joined)
		}
	}
	if strings.Contains(joined, "file=/p/disk.img,format=raw,if=none,cache=none,aio=threads,readonly") {
		t.Errorf("the jail's disk is read-only: %q", joined)
	}
	if !strings.Contains(joined, "tap,id=net0,fd=3") || !strings.Contains(joined, "mac=02:00:00:00:00:01") {
		t.Errorf("the network is not the tap on descriptor 3: %q", joined)
	}
	if slices.Contains(args, "-incoming") || slices.Contains(args, "-S") {
		t.Errorf("a booting machine waits for a migration: %q", joined)
	}
	s.incoming, s.tap, s.usr = true, nil, ""
	args = s.args()
	joined = strings.Join(args, " ")
	if value("-incoming") != "defer" || !slices.Contains(args, "-S") {
		t.Errorf("a restored machine must wait for its state, paused: %q", joined)
	}
	if strings.Contains(joined, "netdev") || strings.Contains(joined, "serial=usr") {
		t.Errorf("no tap and no /usr asked for: %q", joined)
	}
}

func TestShellQuote(t *testing.T) {
	for _, s := range []string{"/plain/path", "/with space/x", "/it's/here", "/$(touch /tmp/x)/`id`", "'", ""} {
		out, err := exec.Command("sh", "-c", "printf %s "+shellQuote(s)).Output()
		if err != nil {
			t.Fatal(err)
		}
		if string(out) != s {
			t.Errorf("%q quoted as %s reads back as %q", s, shellQuote(s), out)
		}
	}
}

func TestInitramfs(t *testing.T) {
	dir := t.TempDir()
	kernel := filepath.Join(dir, "kernel")
	if err := os.MkdirAll(filepath.Join(kernel, "modules"), 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"VERSION":         "linux-image-test 1\n",
		"modules/order":   "b.ko\na.ko\n",
		"modules/a.ko":    "module a",
		"modules/b.ko":    "module b",
		"modules/stray.x": "not in the order",
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(kernel, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "agentjail")
	if err := os.WriteFile(bin, []byte("the daemon's binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(dir, "cache")
	if err := os.Mkdir(cache, 0o700); err != nil {
		t.Fatal(err)
	}
	im := &images{dir: cache, locks: map[string]*sync.Mutex{}, sums: map[string]string{}}
	path, err := im.initramfs(bin, kernel)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := map[string]string{}
	modes := map[string]os.FileMode{}
	r := cpio.NewReader(f)
	for {
		h, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r)
		got[h.Name], modes[h.Name] = string(b), h.FileInfo().Mode()
	}
	want := map[string]string{
		"agentjail": "the daemon's binary", "lib/modules/order": "b.ko\na.ko\n",
		"lib/modules/a.ko": "module a", "lib/modules/b.ko": "module b",
	}
	for name, data := range want {
		if got[name] != data {
			t.Errorf("%s holds %q, want %q", name, got[name], data)
		}
	}
	if _, ok := got["lib/modules/stray.x"]; ok {
		t.Errorf("a module the order does not name is in the initramfs")
	}
	if m := modes["agentjail"]; !m.IsRegular() || m.Perm()&0o100 == 0 {
		t.Errorf("/agentjail mode %v: not an executable file", m)
	}
	for _, d := range []string{"dev", "proc", "sys", "mnt", "tmp", "lib/modules"} {
		if !modes[d].IsDir() {
			t.Errorf("no directory %s (mode %v)", d, modes[d])
		}
	}
	// The same inputs give the same image; another binary another one. The
	// previous one stays while it was used lately (another daemon of the
	// host may start machines from it), and goes once it was not for a day.
	if again, err := im.initramfs(bin, kernel); err != nil || again != path {
		t.Errorf("initramfs again: %s %v, want %s", again, err, path)
	}
	if err := os.WriteFile(bin, []byte("the daemon's next binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	next, err := im.initramfs(bin, kernel)
	if err != nil || next == path {
		t.Fatalf("initramfs of a changed binary: %s %v", next, err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("the previous initramfs, used a moment ago, was removed: %v", err)
	}
	old := time.Now().Add(-2 * pruneAfter)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, []byte("a third binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := im.initramfs(bin, kernel); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("an initramfs unused for two days is still there: %v", err)
	}
	if _, err := os.Stat(next); err != nil {
		t.Errorf("the initramfs used a moment ago was removed: %v", err)
	}
}

func TestTreeKey(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "sub", "f")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("one"), 0o644); err != nil {
		t.Fatal(err)
	}
	k1, err := treeKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if k2, _ := treeKey(dir); k2 != k1 {
		t.Errorf("the key of an unchanged tree changed: %s %s", k1, k2)
	}
	if err := os.WriteFile(p, []byte("two!"), 0o644); err != nil {
		t.Fatal(err)
	}
	k3, _ := treeKey(dir)
	if k3 == k1 {
		t.Errorf("a changed file left the key as it was")
	}
	// Bytecode caches come and go without changing the key.
	pyc := filepath.Join(dir, "sub", "__pycache__", "f.cpython-311.pyc")
	if err := os.MkdirAll(filepath.Dir(pyc), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pyc, []byte("cache"), 0o644); err != nil {
		t.Fatal(err)
	}
	if k4, _ := treeKey(dir); k4 != k3 {
		t.Errorf("writing a __pycache__ file changed the key")
	}
	if err := os.WriteFile(pyc, []byte("cache, again"), 0o644); err != nil {
		t.Fatal(err)
	}
	if k5, _ := treeKey(dir); k5 != k3 {
		t.Errorf("rewriting a __pycache__ file changed the key")
	}
	if _, err := treeKey(filepath.Join(dir, "missing")); err == nil {
		t.Errorf("the key of a missing tree")
	}
}

func TestWake(t *testing.T) {
	daemon, guest := net.Pipe()
	defer daemon.Close()
	defer guest.Close()
	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		errc <- wake(ctx, daemon)
	}()
	// The guest skips what precedes the wake line (an earlier session's
	// bytes), then answers its hello on a line of its own, and the
	// session's first bytes follow at once.
	got := make([]byte, len(vmproto.WakeLine))
	if _, err := io.ReadFull(guest, got); err != nil || string(got) != vmproto.WakeLine {
		t.Fatalf("the daemon wrote %q %v, want the wake line", got, err)
	}
	go guest.Write([]byte("old output\n\n" + vmproto.HelloLine + "\nSESSION"))
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	b := make([]byte, len("SESSION"))
	if _, err := io.ReadFull(daemon, b); err != nil || string(b) != "SESSION" {
		t.Errorf("after the hello the daemon reads %q %v: the session's bytes were consumed", b, err)
	}

	// A guest that hangs up ends the wait.
	d2, g2 := net.Pipe()
	defer d2.Close()
	go func() {
		io.ReadFull(g2, make([]byte, len(vmproto.WakeLine)))
		g2.Close()
	}()
	if err := wake(context.Background(), d2); err == nil {
		t.Errorf("wake with a guest that hung up succeeded")
	}
}

// TestSessionSilentGuest: a machine whose guest never answers (paused,
// or its wake line lost) holds nobody beyond their own deadline — not a
// second caller waiting to open the same session, not a destroy.
func TestSessionSilentGuest(t *testing.T) {
	dir := t.TempDir()
	ln, err := net.Listen("unix", filepath.Join(dir, controlSock))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c // read nothing, answer nothing
		}
	}()
	s := newSession(dir)

	// The first opener waits for the guest with no deadline of its own
	// (as the event stream did); the second gives up at its deadline.
	first := make(chan error, 1)
	go func() {
		_, err := s.open(context.Background())
		first <- err
	}()
	// Once the first has connected, it holds the session's opening.
	defer (<-accepted).Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if _, err := s.open(ctx); err == nil {
		t.Fatal("a second open succeeded with a silent guest")
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("the second open waited %v, past its 200 ms deadline", d)
	}

	// A destroy (close) ends the first opener's wait at once.
	s.close()
	select {
	case err := <-first:
		if err == nil {
			t.Error("the first open succeeded after close")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("close did not end an open waiting for a silent guest")
	}
}

// TestErofsDiskFull: an image that does not fit on the cache's disk is
// an error of kind no-space (a 507 for the create that needed it), not
// an internal error, and leaves no partial image.
func TestErofsDiskFull(t *testing.T) {
	testenv.RequireRoot(t)
	mkfs := testenv.RequireTool(t, "mkfs.erofs")
	cache := t.TempDir()
	if err := unix.Mount("tmpfs", cache, "tmpfs", 0, "size=256k"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(cache, unix.MNT_DETACH)
	tree := t.TempDir()
	noise := make([]byte, 2<<20)
	if _, err := rand.Read(noise); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "big"), noise, 0o644); err != nil {
		t.Fatal(err)
	}
	im := &images{dir: cache, mkfs: mkfs, locks: map[string]*sync.Mutex{}, sums: map[string]string{}}
	_, err := im.erofs(context.Background(), "lower", tree)
	if !errors.Is(err, errdefs.ErrNoSpace) {
		t.Fatalf("building an image larger than its disk: %v, want an error of kind %v", err, errdefs.ErrNoSpace)
	}
	left, _ := os.ReadDir(cache)
	for _, e := range left {
		if strings.HasSuffix(e.Name(), ".erofs") || strings.HasSuffix(e.Name(), ".tmp") {
			t.Errorf("a partial image is left: %s", e.Name())
		}
	}
}
