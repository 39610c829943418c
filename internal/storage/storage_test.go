package storage

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/testenv"
)

const (
	testPoolSize = 16 << 30
	testDiskSize = 64 << 20
)

// requireLoop stops the test (testenv.Need) when it cannot manage loop
// devices and mounts.
func requireLoop(tb testing.TB) {
	tb.Helper()
	var missing string
	switch {
	case os.Geteuid() != 0:
		missing = "root"
	default:
		for _, name := range []string{"mkfs.xfs", "mkfs.btrfs"} {
			if _, err := tool(name, name); err != nil {
				missing = name
			}
		}
		if _, err := os.Stat("/dev/loop-control"); err != nil {
			missing = "/dev/loop-control"
		}
	}
	testenv.Need(tb, missing)
}

// openTestPool opens a pool in a fresh data dir and tears it down after the
// test, checking that no loop device is left.
func openTestPool(tb testing.TB, defaultSize int64, warm int) (*Pool, string) {
	tb.Helper()
	requireLoop(tb)
	dataDir := tb.TempDir()
	p, err := OpenPool(dataDir, testPoolSize, defaultSize, warm)
	if err != nil {
		tb.Fatalf("OpenPool: %v", err)
	}
	tb.Cleanup(func() {
		if err := p.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
		if err := Teardown(dataDir); err != nil {
			tb.Errorf("Teardown: %v", err)
		}
		waitNoLoops(tb, dataDir)
	})
	return p, dataDir
}

// waitNoLoops waits (bounded) until no loop device is bound to a file under
// dir; autoclear releases devices as their last user closes them.
func waitNoLoops(tb testing.TB, dir string) {
	tb.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		devs, err := LoopDevicesFor(dir)
		if err != nil {
			tb.Fatalf("LoopDevicesFor: %v", err)
		}
		if len(devs) == 0 {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("loop devices left for %s: %v", dir, devs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitWarm waits (bounded) until the warm cache holds every disk it can:
// the queued ones plus the one the refill loop holds, all mounted.
func waitWarm(tb testing.TB, p *Pool) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ents, err := os.ReadDir(filepath.Join(p.dir, "warm"))
		if err != nil {
			tb.Fatal(err)
		}
		ready := 0
		for _, e := range ents {
			if ok, _ := IsMounted(filepath.Join(p.dir, "warm", e.Name())); ok {
				ready++
			}
		}
		if ready == cap(p.warm)+1 && len(p.warm) == cap(p.warm) {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("warm cache not filled: %d mounted, %d of %d queued", ready, len(p.warm), cap(p.warm))
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestDiskLimitIsENOSPC(t *testing.T) {
	p, dataDir := openTestPool(t, testDiskSize, 0)
	mnt := filepath.Join(dataDir, "jails", "a", "rootfs")
	if err := p.CreateDisk("a", testDiskSize, mnt); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { UnmountDisk(mnt) })

	st, err := os.Stat(p.DiskPath("a"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != testDiskSize {
		t.Fatalf("image size %d, want %d", st.Size(), testDiskSize)
	}
	used, total, err := Usage(mnt)
	if err != nil {
		t.Fatal(err)
	}
	if total == 0 || total > testDiskSize || used > total {
		t.Fatalf("usage %d of %d for a %d-byte disk", used, total, testDiskSize)
	}
	for _, d := range []string{"upper", "work"} {
		if fi, err := os.Stat(filepath.Join(mnt, d)); err != nil || !fi.IsDir() {
			t.Fatalf("%s/ missing on the disk: %v", d, err)
		}
	}

	lower := t.TempDir()
	if err := os.WriteFile(filepath.Join(lower, "from-lower"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	merged := filepath.Join(mnt, "merged")
	if err := MountOverlay([]string{lower}, filepath.Join(mnt, "upper"), filepath.Join(mnt, "work"), merged); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Unmount(merged) })
	if _, err := os.Stat(filepath.Join(merged, "from-lower")); err != nil {
		t.Fatalf("lower file not visible in the overlay: %v", err)
	}

	f, err := os.Create(filepath.Join(merged, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var written int64
	for {
		n, err := f.Write(buf)
		written += int64(n)
		if err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatalf("write stopped with %v, want ENOSPC", err)
			}
			break
		}
		if written > 2*testDiskSize {
			t.Fatalf("wrote %d bytes to a %d-byte disk", written, testDiskSize)
		}
	}
	if written < testDiskSize/2 {
		t.Fatalf("only %d bytes fit on a %d-byte disk", written, testDiskSize)
	}
	if st, err := os.Stat(p.DiskPath("a")); err != nil || st.Size() != testDiskSize {
		t.Fatalf("image grew past its size: %v %v", st.Size(), err)
	}
	// The pool itself (and so the host) still has room.
	if used, total, err := Usage(filepath.Join(dataDir, "pool")); err != nil || total-used < testPoolSize/2 {
		t.Fatalf("pool usage %d of %d: %v", used, total, err)
	}
	f.Close()
	if err := os.Remove(filepath.Join(merged, "fill")); err != nil {
		t.Fatal(err)
	}
	if err := Unmount(merged); err != nil {
		t.Fatal(err)
	}
	// A copy of the overlay mount in a mount namespace made meanwhile (by
	// a process on the host) pins the deleted file until that namespace
	// goes: wait for the disk's space to come back.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var fs unix.Statfs_t
		if err := unix.Statfs(mnt, &fs); err != nil {
			t.Fatal(err)
		}
		if fs.Bfree > fs.Blocks*3/4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the deleted file's space did not come back: %d of %d blocks free", fs.Bfree, fs.Blocks)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Unmounting trims: the deleted file's blocks leave the image.
	if err := UnmountDisk(mnt); err != nil {
		t.Fatal(err)
	}
	var ist unix.Stat_t
	if err := unix.Stat(p.DiskPath("a"), &ist); err != nil {
		t.Fatal(err)
	}
	if alloc := ist.Blocks * 512; alloc > testDiskSize/4 {
		t.Fatalf("image still holds %d bytes after the file was deleted", alloc)
	}
}

func TestCreateDiskConflicts(t *testing.T) {
	p, dataDir := openTestPool(t, testDiskSize, 0)
	mnt := filepath.Join(dataDir, "jails", "a", "rootfs")
	if err := p.CreateDisk("a", testDiskSize, mnt); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { UnmountDisk(mnt) })
	if err := p.CreateDisk("a", testDiskSize, filepath.Join(dataDir, "other")); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("second CreateDisk of a: %v, want ErrConflict", err)
	}
	if err := p.CreateDisk("b", testDiskSize, mnt); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("CreateDisk onto a mount point: %v, want ErrConflict", err)
	}
	if _, err := os.Stat(p.DiskPath("b")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("failed CreateDisk left %s: %v", p.DiskPath("b"), err)
	}
	if err := p.CreateDisk("c", MinDiskSize-1, filepath.Join(dataDir, "c")); !errors.Is(err, errdefs.ErrUnprocessable) {
		t.Fatalf("tiny disk: %v, want ErrUnprocessable", err)
	}
	if err := p.CreateDisk("../x", testDiskSize, filepath.Join(dataDir, "x")); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("bad id: %v, want ErrInvalid", err)
	}
	if devs, _ := LoopDevicesFor(dataDir); len(devs) != 2 { // the pool and disk a
		t.Fatalf("loop devices after failed creates: %v", devs)
	}
}

func TestMountDiskAfterUnmount(t *testing.T) {
	p, dataDir := openTestPool(t, testDiskSize, 0)
	mnt := filepath.Join(dataDir, "jails", "a", "rootfs")
	if err := p.CreateDisk("a", testDiskSize, mnt); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "upper", "kept"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.RemoveDisk("a"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("RemoveDisk of a mounted disk: %v, want ErrConflict", err)
	}
	if err := UnmountDisk(mnt); err != nil {
		t.Fatal(err)
	}
	if err := UnmountDisk(mnt); err != nil {
		t.Fatalf("second UnmountDisk: %v", err)
	}
	waitNoLoops(t, filepath.Join(dataDir, "pool"))

	if err := p.MountDisk("a", mnt); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "upper", "kept")); err != nil || string(b) != "data" {
		t.Fatalf("file after remount: %q %v", b, err)
	}
	if err := p.MountDisk("a", mnt); err != nil {
		t.Fatalf("MountDisk where already mounted: %v", err)
	}
	if err := p.MountDisk("a", filepath.Join(dataDir, "elsewhere")); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("MountDisk of a disk in use: %v, want ErrConflict", err)
	}
	if err := p.CreateDisk("b", testDiskSize, filepath.Join(dataDir, "b")); err != nil {
		t.Fatal(err)
	}
	if err := p.MountDisk("b", mnt); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("MountDisk onto another disk: %v, want ErrConflict", err)
	}
	if err := p.MountDisk("missing", filepath.Join(dataDir, "m")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("MountDisk of a missing disk: %v, want ErrNotFound", err)
	}
	for _, m := range []string{mnt, filepath.Join(dataDir, "b")} {
		if err := UnmountDisk(m); err != nil {
			t.Fatal(err)
		}
	}
	waitNoLoops(t, filepath.Join(dataDir, "pool"))
	for _, id := range []string{"a", "b", "a"} {
		if err := p.RemoveDisk(id); err != nil {
			t.Fatalf("RemoveDisk(%s): %v", id, err)
		}
	}
	if _, err := os.Stat(p.DiskPath("a")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("disk image still there: %v", err)
	}
}

func TestWarmDisk(t *testing.T) {
	p, dataDir := openTestPool(t, testDiskSize, 2)
	waitWarm(t, p)
	warmBefore := p.seq.Load()
	mnt := filepath.Join(dataDir, "jails", "w", "rootfs")
	if err := p.CreateDisk("w", testDiskSize, mnt); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { UnmountDisk(mnt) })
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, mnt, 0, 0, &stx); err != nil {
		t.Fatal(err)
	}
	if got := backingOfDevice(stx.Dev_major, stx.Dev_minor); got != p.DiskPath("w") {
		t.Fatalf("disk mounted at %s is backed by %q, want %s", mnt, got, p.DiskPath("w"))
	}
	if fi, err := os.Stat(filepath.Join(mnt, "upper")); err != nil || !fi.IsDir() {
		t.Fatalf("upper/ missing on a warm disk: %v", err)
	}
	// The disk came from the cache: the refill loop made a replacement.
	waitWarm(t, p)
	if p.seq.Load() != warmBefore+1 {
		t.Fatalf("warm disks made: %d, want %d", p.seq.Load(), warmBefore+1)
	}
	// A disk of another size is made cold.
	if err := p.CreateDisk("cold", 2*testDiskSize, filepath.Join(dataDir, "cold")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { UnmountDisk(filepath.Join(dataDir, "cold")) })
	if used, total, err := Usage(filepath.Join(dataDir, "cold")); err != nil || total <= testDiskSize || used > total {
		t.Fatalf("cold disk usage %d of %d: %v", used, total, err)
	}

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(filepath.Join(dataDir, "pool", "warm"))
	if err != nil || len(entries) != 0 {
		t.Fatalf("warm dir after Close: %v %v", entries, err)
	}
	if err := UnmountDisk(mnt); err != nil {
		t.Fatal(err)
	}
	if err := UnmountDisk(filepath.Join(dataDir, "cold")); err != nil {
		t.Fatal(err)
	}
	waitNoLoops(t, filepath.Join(dataDir, "pool"))
}

func TestConcurrentCreateDisk(t *testing.T) {
	p, dataDir := openTestPool(t, testDiskSize, 2)
	const n = 100
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("j%03d", i)
			errs[i] = p.CreateDisk(id, testDiskSize, filepath.Join(dataDir, "jails", id, "rootfs"))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("CreateDisk j%03d: %v", i, err)
		}
	}
	devs, err := LoopDevicesFor(filepath.Join(dataDir, "pool", "disks"))
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != n {
		t.Errorf("%d loop devices for %d disks", len(devs), n)
	}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("j%03d", i)
			if err := UnmountDisk(filepath.Join(dataDir, "jails", id, "rootfs")); err != nil {
				t.Errorf("UnmountDisk %s: %v", id, err)
			}
		}()
	}
	wg.Wait()
	waitNoLoops(t, filepath.Join(dataDir, "pool", "disks"))
	for i := range n {
		if err := p.RemoveDisk(fmt.Sprintf("j%03d", i)); err != nil {
			t.Errorf("RemoveDisk: %v", err)
		}
	}
}

func TestTeardownAndReopen(t *testing.T) {
	requireLoop(t)
	dataDir := t.TempDir()
	p, err := OpenPool(dataDir, testPoolSize, testDiskSize, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		Teardown(dataDir)
		waitNoLoops(t, dataDir)
	})
	waitWarm(t, p)
	mnt := filepath.Join(dataDir, "jails", "a", "rootfs")
	if err := p.CreateDisk("a", testDiskSize, mnt); err != nil {
		t.Fatal(err)
	}
	// A restarted daemon re-opens the mounted pool; the first one's warm
	// disk is stale and released. The first daemon is gone by then: its
	// refill no longer runs (it could still be filling a warm disk).
	waitWarm(t, p)
	p.stopRefill()
	p2, err := OpenPool(dataDir, testPoolSize, testDiskSize, 0)
	if err != nil {
		t.Fatalf("re-open mounted pool: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(dataDir, "pool", "warm")); len(ents) != 0 {
		t.Fatalf("stale warm disks after re-open: %v", ents)
	}
	err = Teardown(dataDir)
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), mnt) {
		t.Fatalf("Teardown with a mounted disk: %v, want ErrConflict naming %s", err, mnt)
	}
	if err := UnmountDisk(mnt); err != nil {
		t.Fatal(err)
	}
	if err := Teardown(dataDir); err != nil {
		t.Fatalf("Teardown: %v", err)
	}
	if err := Teardown(dataDir); err != nil {
		t.Fatalf("second Teardown: %v", err)
	}
	if ok, _ := IsMounted(filepath.Join(dataDir, "pool")); ok {
		t.Fatal("pool still mounted after Teardown")
	}
	waitNoLoops(t, dataDir)
	p2.Close()

	// After a host reboot: the image is there, nothing is mounted.
	p3, err := OpenPool(dataDir, testPoolSize, testDiskSize, 0)
	if err != nil {
		t.Fatalf("re-open unmounted pool: %v", err)
	}
	if err := p3.MountDisk("a", mnt); err != nil {
		t.Fatal(err)
	}
	if err := UnmountDisk(mnt); err != nil {
		t.Fatal(err)
	}
	p3.Close()
	if err := Teardown(dataDir); err != nil {
		t.Fatal(err)
	}
}

// stopRefill stops the refill loop of a pool whose warm disks someone else
// (a re-opened pool, Teardown) released.
func (p *Pool) stopRefill() {
	p.closeOnce.Do(func() {
		close(p.stop)
		<-p.done
	})
}

func TestUnmountBusyAndIdempotent(t *testing.T) {
	requireLoop(t)
	dir := filepath.Join(t.TempDir(), "m")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if ok, err := IsMounted(dir); err != nil || ok {
		t.Fatalf("IsMounted of a plain dir: %v %v", ok, err)
	}
	if ok, err := IsMounted(filepath.Join(dir, "missing")); err != nil || ok {
		t.Fatalf("IsMounted of a missing path: %v %v", ok, err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Unmount(dir) })
	if ok, err := IsMounted(dir); err != nil || !ok {
		t.Fatalf("IsMounted of a tmpfs: %v %v", ok, err)
	}
	f, err := os.Create(filepath.Join(dir, "busy"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := Unmount(dir); err != nil {
		t.Fatalf("Unmount of a busy mount: %v", err)
	}
	if ok, _ := IsMounted(dir); ok {
		t.Fatal("still mounted after Unmount")
	}
	if err := Unmount(dir); err != nil {
		t.Fatalf("second Unmount: %v", err)
	}
	if err := Unmount(filepath.Join(dir, "missing")); err != nil {
		t.Fatalf("Unmount of a missing path: %v", err)
	}
	if err := MountOverlay([]string{"/a:b"}, "/u", "/w", filepath.Join(dir, "o")); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("overlay with ':' in a path: %v, want ErrInvalid", err)
	}
}

// TestUnmountAll leaves what a killed CRIU leaves — a tmpfs with mounts
// inside it, one of them busy — and a sibling whose name shares the prefix;
// UnmountAll clears the tree and only it.
func TestUnmountAll(t *testing.T) {
	requireLoop(t)
	base := t.TempDir()
	yard := filepath.Join(base, "work", ".yard")
	sibling := filepath.Join(base, "work2")
	for _, d := range []string{yard, sibling} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mount := func(dir string) {
		t.Helper()
		if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { Unmount(dir) })
	}
	mount(yard)
	mount(sibling)
	inner := []string{filepath.Join(yard, "cpu"), filepath.Join(yard, "memory")}
	for _, d := range inner {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		mount(d)
	}
	f, err := os.Create(filepath.Join(inner[0], "busy"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := UnmountAll(filepath.Join(base, "work")); err != nil {
		t.Fatalf("UnmountAll: %v", err)
	}
	for _, d := range append(inner, yard) {
		if ok, err := IsMounted(d); err != nil || ok {
			t.Errorf("%s still mounted after UnmountAll (%v)", d, err)
		}
	}
	if ok, err := IsMounted(sibling); err != nil || !ok {
		t.Errorf("UnmountAll of work unmounted its sibling work2 (%v)", err)
	}
	if err := UnmountAll(filepath.Join(base, "missing")); err != nil {
		t.Errorf("UnmountAll of a missing dir: %v", err)
	}
}

// benchCreate measures CreateDisk of a default-size (1 GiB) disk; with warm,
// each iteration first waits (untimed) for the cache to refill.
func benchCreate(b *testing.B, warm int) {
	p, dataDir := openTestPool(b, 1<<30, warm)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if warm > 0 {
			b.StopTimer()
			waitWarm(b, p)
			b.StartTimer()
		}
		id := fmt.Sprintf("b%d", i)
		mnt := filepath.Join(dataDir, "jails", id, "rootfs")
		if err := p.CreateDisk(id, 1<<30, mnt); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := UnmountDisk(mnt); err != nil {
			b.Fatal(err)
		}
		waitNoLoops(b, p.DiskPath(id))
		if err := p.RemoveDisk(id); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

func BenchmarkCreateDiskCold(b *testing.B) { benchCreate(b, 0) }
func BenchmarkCreateDiskWarm(b *testing.B) { benchCreate(b, 2) }

// TestMountOverlayManyLowers stacks more lowers than fit in one page of
// mount options (an image of many layers) and a read-only overlay of
// lowers alone.
func TestMountOverlayManyLowers(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	long := strings.Repeat("l", 100)
	var lowers []string
	for i := range 60 {
		l := filepath.Join(dir, fmt.Sprintf("%s%02d", long, i))
		if err := os.MkdirAll(l, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(l, fmt.Sprintf("f%02d", i)), []byte{byte(i)}, 0o644); err != nil {
			t.Fatal(err)
		}
		lowers = append([]string{l}, lowers...)
	}
	upper, work, merged := filepath.Join(dir, "u"), filepath.Join(dir, "w"), filepath.Join(dir, "m")
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := MountOverlay(lowers, upper, work, merged); err != nil {
		t.Fatal(err)
	}
	defer Unmount(merged)
	ents, err := os.ReadDir(merged)
	if err != nil || len(ents) != 60 {
		t.Fatalf("merged view of 60 lowers: %d entries, %v", len(ents), err)
	}
	view := filepath.Join(dir, "view")
	if err := MountOverlay(lowers[:2], "", "", view); err != nil {
		t.Fatal(err)
	}
	defer Unmount(view)
	if err := os.WriteFile(filepath.Join(view, "x"), nil, 0o644); err == nil {
		t.Fatal("a read-only overlay took a write")
	}
	if ents, _ := os.ReadDir(view); len(ents) != 2 {
		t.Fatalf("read-only view: %d entries", len(ents))
	}
}

// TestMountReadOnly mounts a disk image as snapshots are read: the files
// are there, nothing can be written, the loop device itself is read-only,
// the image is unchanged and the device goes with the unmount.
func TestMountReadOnly(t *testing.T) {
	p, dataDir := openTestPool(t, testDiskSize, 0)
	mnt := filepath.Join(dataDir, "jails", "a", "rootfs")
	if err := p.CreateDisk("a", testDiskSize, mnt); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "kept"), []byte("snapshot data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := UnmountDisk(mnt); err != nil {
		t.Fatal(err)
	}
	img := p.DiskPath("a")
	before := fileSum(t, img)
	dir := t.TempDir()
	if err := MountReadOnly(img, dir, "xfs", "norecovery,nouuid"); err != nil {
		t.Fatal(err)
	}
	unmounted := false
	defer func() {
		if !unmounted {
			Unmount(dir)
		}
	}()
	if got, err := os.ReadFile(filepath.Join(dir, "kept")); err != nil || string(got) != "snapshot data" {
		t.Fatalf("read %q, %v", got, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "new"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Fatalf("writing into the read-only mount: %v, want EROFS", err)
	}
	devs, err := LoopDevicesFor(img)
	if err != nil || len(devs) != 1 {
		t.Fatalf("loop devices of the image: %v %v", devs, err)
	}
	ro, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(devs[0]), "ro"))
	if err != nil || strings.TrimSpace(string(ro)) != "1" {
		t.Fatalf("%s read-only flag %q, %v", devs[0], ro, err)
	}
	if err := Unmount(dir); err != nil {
		t.Fatal(err)
	}
	unmounted = true
	waitNoLoops(t, img)
	if after := fileSum(t, img); after != before {
		t.Fatal("the image changed under a read-only mount")
	}
	if err := MountReadOnly(filepath.Join(dataDir, "missing.img"), dir, "xfs", ""); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a missing image: %v", err)
	}
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(data)
}
