// Package storage owns the writable layer of every jail: a storage pool (a
// btrfs filesystem in DATA_DIR/storage.img, loop-mounted at DATA_DIR/pool)
// holding one XFS image per jail (pool/disks/{id}.img) of exactly the jail's
// disk size, so that a full disk fails with ENOSPC inside the jail and never
// touches the host's disk. Disks are reflink copies of pre-formatted
// templates (pool/templates/{size}.img), and a few disks of the default size
// are kept made and mounted (pool/warm/) so that creating a jail's disk is a
// rename and a mount move.
//
// It also provides the mount helpers the jail layers share: overlay mounts,
// idempotent unmounts, mount-point and usage queries.
package storage

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/atomicfile"
	"github.com/agentjail/agentjail/internal/errdefs"
)

// MinDiskSize is the smallest disk this package makes.
const MinDiskSize = 32 << 20

const (
	// xfsSupportedMin is the size below which mkfs.xfs refuses to format
	// unless given the override its own test suite uses.
	xfsSupportedMin = 300 << 20
	// diskMountFlags and diskMountData are the mount options of a jail
	// disk. Every disk is a copy of a template, so all share one XFS UUID:
	// nouuid lets them be mounted side by side. Online discard is left off
	// (it doubles the mount time); UnmountDisk trims instead.
	diskMountFlags = unix.MS_NOSUID | unix.MS_NODEV
	diskMountData  = "nouuid"
	// ioctlFITRIM is FITRIM, _IOWR('X', 121, struct fstrim_range).
	ioctlFITRIM = 0xc0185879
)

// Pool is an open storage pool. Its methods are safe for concurrent use.
type Pool struct {
	dir         string // DATA_DIR/pool
	defaultSize int64

	tmplMu  sync.Mutex // serialises template creation
	mountMu sync.Mutex // serialises MountDisk's check-then-mount

	warm      chan warmDisk // ready disks of defaultSize; nil when warm == 0
	kick      chan struct{} // wakes the refill loop after a failure
	stop      chan struct{}
	done      chan struct{} // closed when the refill loop has exited
	seq       atomic.Uint64
	closeOnce sync.Once
}

// warmDisk is a made and mounted disk of the default size waiting for a jail.
type warmDisk struct{ img, mnt string }

// OpenPool makes sure the storage pool of dataDir is mounted at
// dataDir/pool: it creates dataDir/storage.img (sparse, size bytes; size only
// applies when the image is created) and formats it btrfs if missing, and
// loop-mounts it with discard unless it is already mounted (re-used after a
// daemon restart). The pool mount is made private so that warm disks can be
// moved out of it. defaultDiskSize is the disk size of the warm cache and
// warm the number of such disks kept ready (0 disables the cache); they are
// made in the background. Stale warm disks of an earlier run are released.
func OpenPool(dataDir string, size int64, defaultDiskSize int64, warm int) (*Pool, error) {
	if !filepath.IsAbs(dataDir) {
		return nil, errdefs.Invalidf("storage pool: data dir %q is not absolute", dataDir)
	}
	if defaultDiskSize < MinDiskSize {
		return nil, errdefs.Invalidf("storage pool: default disk size %d is below the minimum %d bytes", defaultDiskSize, MinDiskSize)
	}
	if warm < 0 {
		return nil, errdefs.Invalidf("storage pool: warm disk count %d is negative", warm)
	}
	dataDir = filepath.Clean(dataDir)
	p := &Pool{dir: filepath.Join(dataDir, "pool"), defaultSize: defaultDiskSize}
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return nil, fmt.Errorf("storage pool: %w", err)
	}
	mounted, err := IsMounted(p.dir)
	if err != nil {
		return nil, fmt.Errorf("storage pool: %w", err)
	}
	if !mounted {
		if err := mountPool(filepath.Join(dataDir, "storage.img"), size, p.dir); err != nil {
			return nil, err
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(p.dir, &st); err != nil {
		return nil, fmt.Errorf("storage pool: %w", err)
	}
	if st.Type != unix.BTRFS_SUPER_MAGIC {
		return nil, errdefs.Conflictf("storage pool: %s is mounted but is not btrfs", p.dir)
	}
	if err := unix.Mount("", p.dir, "", unix.MS_PRIVATE, ""); err != nil {
		return nil, fmt.Errorf("storage pool: make %s private: %w", p.dir, err)
	}
	for _, d := range []string{"disks", "templates", "warm"} {
		if err := os.MkdirAll(filepath.Join(p.dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("storage pool: %w", err)
		}
	}
	if err := p.clearStale(); err != nil {
		return nil, err
	}
	if _, err := p.template(defaultDiskSize); err != nil {
		return nil, err
	}
	p.stop = make(chan struct{})
	p.done = make(chan struct{})
	if warm > 0 {
		p.warm = make(chan warmDisk, warm-1) // plus the one the refill loop holds
		p.kick = make(chan struct{}, 1)
		go p.refill()
	} else {
		close(p.done)
	}
	return p, nil
}

// mountPool creates (if missing) and loop-mounts the pool image img at dir.
func mountPool(img string, size int64, dir string) error {
	if _, err := os.Stat(img); errors.Is(err, fs.ErrNotExist) {
		if err := makePoolImage(img, size); err != nil {
			return err
		}
	} else if err != nil {
		return fmt.Errorf("storage pool image: %w", err)
	}
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("storage pool image: %w", err)
	}
	defer f.Close()
	dev, fd, err := attachLoop(f, false)
	if err != nil {
		return fmt.Errorf("storage pool: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Mount(dev, dir, "btrfs", unix.MS_NOSUID|unix.MS_NODEV, "discard"); err != nil {
		return fmt.Errorf("storage pool: mount %s (%s) at %s: %w", dev, img, dir, err)
	}
	return nil
}

// makePoolImage creates the sparse pool image img of size bytes and formats
// it btrfs. The image appears under its name only once formatted.
func makePoolImage(img string, size int64) error {
	mkfs, err := tool("mkfs.btrfs", "btrfs-progs")
	if err != nil {
		return err
	}
	tmp := img + ".tmp"
	if err := makeSparse(tmp, size); err != nil {
		return fmt.Errorf("storage pool image: %w", err)
	}
	out, err := exec.Command(mkfs, "-q", "-K", "-L", "agentjail", "-m", "single", "-d", "single", tmp).CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("storage pool image: mkfs.btrfs %s: %w: %s", tmp, err, strings.TrimSpace(string(out)))
	}
	if err := atomicfile.Rename(tmp, img); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("storage pool image: %w", err)
	}
	return nil
}

// makeSparse creates path (replacing a leftover) as a sparse file of size bytes.
func makeSparse(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

// tool finds an external program, also in the sbin directories a daemon's
// PATH may lack.
func tool(name, pkg string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/sbin"} {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errdefs.Unavailablef("%s not found (install %s)", name, pkg)
}

// clearStale releases warm disks and half-made templates left by an earlier run.
func (p *Pool) clearStale() error {
	warmDir := filepath.Join(p.dir, "warm")
	entries, err := os.ReadDir(warmDir)
	if err != nil {
		return fmt.Errorf("storage pool: %w", err)
	}
	for _, e := range entries {
		path := filepath.Join(warmDir, e.Name())
		if e.IsDir() {
			if err := Unmount(path); err != nil {
				return fmt.Errorf("storage pool: stale warm disk: %w", err)
			}
		}
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("storage pool: stale warm disk: %w", err)
		}
	}
	tmpls, err := os.ReadDir(filepath.Join(p.dir, "templates"))
	if err != nil {
		return fmt.Errorf("storage pool: %w", err)
	}
	for _, e := range tmpls {
		if strings.HasPrefix(e.Name(), ".") {
			if err := os.Remove(filepath.Join(p.dir, "templates", e.Name())); err != nil {
				return fmt.Errorf("storage pool: stale template: %w", err)
			}
		}
	}
	return nil
}

// template returns the path of the formatted XFS image of size bytes,
// making it first if missing.
func (p *Pool) template(size int64) (string, error) {
	path := filepath.Join(p.dir, "templates", strconv.FormatInt(size, 10)+".img")
	p.tmplMu.Lock()
	defer p.tmplMu.Unlock()
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	mkfs, err := tool("mkfs.xfs", "xfsprogs")
	if err != nil {
		return "", err
	}
	tmp := filepath.Join(p.dir, "templates", "."+strconv.FormatInt(size, 10)+".tmp")
	if err := makeSparse(tmp, size); err != nil {
		return "", fmt.Errorf("disk template of %d bytes: %w", size, err)
	}
	cmd := exec.Command(mkfs, "-q", "-K", tmp)
	if size < xfsSupportedMin {
		cmd.Env = append(os.Environ(), "TEST_DIR=1", "TEST_DEV=1", "QA_CHECK_FS=1")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("disk template of %d bytes: mkfs.xfs: %w: %s", size, err, strings.TrimSpace(string(out)))
	}
	if err := atomicfile.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("disk template of %d bytes: %w", size, err)
	}
	return path, nil
}

// Close stops refilling the warm cache and releases it (unmounts and deletes
// the warm disks). Jail disks and the pool mount stay. Idempotent.
func (p *Pool) Close() error {
	var errs []error
	p.closeOnce.Do(func() {
		close(p.stop)
		<-p.done
		for drained := false; !drained; {
			select {
			case w := <-p.warm:
				errs = append(errs, p.release(w))
			default:
				drained = true
			}
		}
	})
	return errors.Join(errs...)
}

// refill keeps the warm cache full until the pool is closed.
func (p *Pool) refill() {
	defer close(p.done)
	for {
		w, err := p.makeWarm()
		if err != nil {
			slog.Warn("storage: cannot prepare a warm disk", "pool", p.dir, "err", err)
			select {
			case <-p.kick:
				continue
			case <-p.stop:
				return
			}
		}
		select {
		case p.warm <- w:
		case <-p.stop:
			if err := p.release(w); err != nil {
				slog.Warn("storage: cannot release a warm disk", "pool", p.dir, "err", err)
			}
			return
		}
	}
}

// makeWarm makes and mounts one disk of the default size in pool/warm.
func (p *Pool) makeWarm() (warmDisk, error) {
	n := strconv.FormatUint(p.seq.Add(1), 10)
	w := warmDisk{img: filepath.Join(p.dir, "warm", n+".img"), mnt: filepath.Join(p.dir, "warm", n)}
	if err := p.newDisk(w.img, p.defaultSize, w.mnt); err != nil {
		return warmDisk{}, err
	}
	return w, nil
}

// release unmounts and deletes the warm disk w.
func (p *Pool) release(w warmDisk) error {
	if err := Unmount(w.mnt); err != nil {
		return err
	}
	if err := os.Remove(w.mnt); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove warm disk mount point: %w", err)
	}
	if err := os.Remove(w.img); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove warm disk: %w", err)
	}
	return nil
}

// poolBusyGrace is how long Teardown retries a busy pool. A mount
// namespace made while a disk was mounted (a container being set up, an
// `ip netns exec`) holds a copy of that mount, and with it the disk's loop
// device and its image in the pool, until the namespace's process moves on
// or exits; that is a matter of moments, which no event announces.
const poolBusyGrace = 10 * time.Second

// unmountPool unmounts the pool, retrying while it is busy for at most
// poolBusyGrace.
func unmountPool(poolDir string) error {
	deadline := time.Now().Add(poolBusyGrace)
	for {
		err := unix.Unmount(poolDir, unix.UMOUNT_NOFOLLOW)
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Teardown unmounts the storage pool of dataDir and detaches its loop
// device. Warm disks are unmounted first; a jail disk from the pool that is
// still mounted makes it fail with errdefs.ErrConflict naming the mount, as
// does a pool that stays busy for poolBusyGrace. Idempotent: a pool that is
// not mounted is not an error.
func Teardown(dataDir string) error {
	dataDir = filepath.Clean(dataDir)
	poolDir := filepath.Join(dataDir, "pool")
	warmDir := filepath.Join(poolDir, "warm")
	mounts, err := mountinfo.GetMounts(nil)
	if err != nil {
		return fmt.Errorf("storage pool teardown: read mount table: %w", err)
	}
	for _, m := range mounts {
		if m.Mountpoint != warmDir && within(m.Mountpoint, warmDir) {
			if err := Unmount(m.Mountpoint); err != nil {
				return fmt.Errorf("storage pool teardown: %w", err)
			}
		}
	}
	for _, m := range mounts {
		if within(m.Mountpoint, warmDir) {
			continue
		}
		if b := backingOfDevice(uint32(m.Major), uint32(m.Minor)); b != "" && within(b, poolDir) {
			return errdefs.Conflictf("storage pool %s: disk %s is still mounted at %s", poolDir, b, m.Mountpoint)
		}
	}
	mounted, err := IsMounted(poolDir)
	if err != nil {
		return fmt.Errorf("storage pool teardown: %w", err)
	}
	if mounted {
		if err := unmountPool(poolDir); err != nil {
			if errors.Is(err, unix.EBUSY) {
				return errdefs.Wrap(errdefs.ErrConflict, err, "storage pool %s is busy", poolDir)
			}
			return fmt.Errorf("storage pool teardown: unmount %s: %w", poolDir, err)
		}
	}
	img := filepath.Join(dataDir, "storage.img")
	devs, err := LoopDevicesFor(img)
	if err != nil {
		return fmt.Errorf("storage pool teardown: %w", err)
	}
	for _, dev := range devs {
		if err := detachLoop(dev); err != nil {
			return fmt.Errorf("storage pool teardown: %w", err)
		}
	}
	return nil
}

// DiskPath returns the image path of the disk of jail id.
func (p *Pool) DiskPath(id string) string {
	return filepath.Join(p.dir, "disks", id+".img")
}

// validID checks that a jail id can name a file.
func validID(id string) error {
	if id == "" || id == "." || id == ".." || len(id) > 200 || strings.ContainsAny(id, "/\x00") {
		return errdefs.Invalidf("disk: jail id %q cannot name a disk", id)
	}
	return nil
}

// CreateDisk makes the disk of jail id: pool/disks/{id}.img, an XFS
// filesystem of exactly size bytes, mounted at mountpoint (created if
// missing) with empty upper/ and work/ directories inside. A disk of the
// default size comes from the warm cache when one is ready. Errors:
// errdefs.ErrInvalid for a bad id or relative mountpoint,
// errdefs.ErrUnprocessable for a size below MinDiskSize, errdefs.ErrConflict
// if the disk exists or mountpoint is already a mount point. On error
// nothing is left behind.
func (p *Pool) CreateDisk(id string, size int64, mountpoint string) error {
	if err := validID(id); err != nil {
		return err
	}
	if size < MinDiskSize {
		return errdefs.Unprocessablef("disk %s: size %d bytes is below the minimum of %d", id, size, MinDiskSize)
	}
	if !filepath.IsAbs(mountpoint) {
		return errdefs.Invalidf("disk %s: mount point %q is not absolute", id, mountpoint)
	}
	mountpoint = filepath.Clean(mountpoint)
	img := p.DiskPath(id)
	if _, err := os.Lstat(img); err == nil {
		return errdefs.Conflictf("disk %s: %s already exists", id, img)
	}
	if mounted, err := IsMounted(mountpoint); err != nil {
		return fmt.Errorf("disk %s: %w", id, err)
	} else if mounted {
		return errdefs.Conflictf("disk %s: %s is already a mount point", id, mountpoint)
	}
	if size == p.defaultSize {
		select {
		case w := <-p.warm:
			return p.adopt(id, w, img, mountpoint)
		default:
			select {
			case p.kick <- struct{}{}:
			default:
			}
		}
	}
	if err := p.newDisk(img, size, mountpoint); err != nil {
		return fmt.Errorf("disk %s: %w", id, err)
	}
	return nil
}

// adopt turns the warm disk w into the disk img mounted at mountpoint.
func (p *Pool) adopt(id string, w warmDisk, img, mountpoint string) (err error) {
	defer func() {
		if err != nil {
			if rerr := p.release(w); rerr != nil {
				slog.Warn("storage: cannot release a warm disk", "pool", p.dir, "err", rerr)
			}
		}
	}()
	if err := unix.Renameat2(unix.AT_FDCWD, w.img, unix.AT_FDCWD, img, unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return errdefs.Conflictf("disk %s: %s already exists", id, img)
		}
		return fmt.Errorf("disk %s: claim warm disk: %w", id, err)
	}
	defer func() {
		if err != nil {
			os.Remove(img)
		}
	}()
	created, err := mkdirMountPoint(mountpoint)
	if err != nil {
		return fmt.Errorf("disk %s: %w", id, err)
	}
	if err := unix.Mount(w.mnt, mountpoint, "", unix.MS_MOVE, ""); err != nil {
		if created {
			os.Remove(mountpoint)
		}
		return fmt.Errorf("disk %s: move warm disk to %s: %w", id, mountpoint, err)
	}
	if err := os.Remove(w.mnt); err != nil {
		slog.Warn("storage: cannot remove a warm disk's mount point", "path", w.mnt, "err", err)
	}
	return nil
}

// mkdirMountPoint creates dir (and its parents) if missing and reports
// whether dir itself was created.
func mkdirMountPoint(dir string) (bool, error) {
	if _, err := os.Lstat(dir); err == nil {
		return false, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("create mount point: %w", err)
	}
	return true, nil
}

// newDisk makes img as a copy of the template of size and mounts it at mnt
// with upper/ and work/ inside; errdefs.ErrConflict if img exists. On error
// nothing is left behind.
func (p *Pool) newDisk(img string, size int64, mnt string) (err error) {
	tmpl, err := p.template(size)
	if err != nil {
		return err
	}
	src, err := os.Open(tmpl)
	if err != nil {
		return fmt.Errorf("open disk template: %w", err)
	}
	defer src.Close()
	dst, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return errdefs.Conflictf("%s already exists", img)
	}
	if err != nil {
		return fmt.Errorf("create disk image: %w", err)
	}
	defer dst.Close()
	defer func() {
		if err != nil {
			os.Remove(img)
		}
	}()
	if err := unix.IoctlFileClone(int(dst.Fd()), int(src.Fd())); err != nil {
		return fmt.Errorf("clone %s to %s: %w", tmpl, img, err)
	}
	created, err := mkdirMountPoint(mnt)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil && created {
			os.Remove(mnt)
		}
	}()
	if err := mountImage(dst, mnt); err != nil {
		return err
	}
	for _, d := range []string{"upper", "work"} {
		if err := os.Mkdir(filepath.Join(mnt, d), 0o755); err != nil {
			if uerr := Unmount(mnt); uerr != nil {
				slog.Warn("storage: cannot unmount a half-made disk", "path", mnt, "err", uerr)
			}
			return fmt.Errorf("prepare disk: %w", err)
		}
	}
	return nil
}

// mountImage binds the open XFS image f to a loop device and mounts it at mnt.
// The mount holds the device; the device is released with the mount.
func mountImage(f *os.File, mnt string) error {
	dev, fd, err := attachLoop(f, false)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Mount(dev, mnt, "xfs", diskMountFlags, diskMountData); err != nil {
		return fmt.Errorf("mount %s (%s) at %s: %w", dev, f.Name(), mnt, err)
	}
	return nil
}

// MountReadOnly mounts the filesystem image img (of type fstype, with the
// filesystem's options data) read-only, without devices, setuid programs or
// exec, at the existing directory dir, through a loop device bound
// read-only. The device goes with the mount (Unmount releases both).
func MountReadOnly(img, dir, fstype, data string) error {
	f, err := os.Open(img)
	if err != nil {
		return fmt.Errorf("mount %s: %w", img, err)
	}
	defer f.Close()
	dev, fd, err := attachLoop(f, true)
	if err != nil {
		return fmt.Errorf("mount %s: %w", img, err)
	}
	defer unix.Close(fd)
	flags := uintptr(unix.MS_RDONLY | unix.MS_NODEV | unix.MS_NOSUID | unix.MS_NOEXEC)
	if err := unix.Mount(dev, dir, fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s (%s) read-only at %s: %w", dev, img, dir, err)
	}
	return nil
}

// MountDisk mounts the existing disk of jail id at mountpoint (created if
// missing). It is a no-op if that disk is already mounted there (recovery
// after a daemon restart); errdefs.ErrNotFound if the disk does not exist;
// errdefs.ErrConflict if another filesystem is mounted at mountpoint or the
// disk is in use elsewhere.
func (p *Pool) MountDisk(id, mountpoint string) error {
	if err := validID(id); err != nil {
		return err
	}
	if !filepath.IsAbs(mountpoint) {
		return errdefs.Invalidf("disk %s: mount point %q is not absolute", id, mountpoint)
	}
	mountpoint = filepath.Clean(mountpoint)
	img := p.DiskPath(id)
	p.mountMu.Lock()
	defer p.mountMu.Unlock()
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return errdefs.NotFoundf("disk %s: %s does not exist", id, img)
	}
	if err != nil {
		return fmt.Errorf("disk %s: %w", id, err)
	}
	defer f.Close()
	mounted, err := IsMounted(mountpoint)
	if err != nil {
		return fmt.Errorf("disk %s: %w", id, err)
	}
	if mounted {
		var stx unix.Statx_t
		if err := unix.Statx(unix.AT_FDCWD, mountpoint, unix.AT_SYMLINK_NOFOLLOW, 0, &stx); err != nil {
			return fmt.Errorf("disk %s: %w", id, err)
		}
		if backingOfDevice(stx.Dev_major, stx.Dev_minor) == img {
			return nil
		}
		return errdefs.Conflictf("disk %s: another filesystem is mounted at %s", id, mountpoint)
	}
	devs, err := LoopDevicesFor(img)
	if err != nil {
		return fmt.Errorf("disk %s: %w", id, err)
	}
	if len(devs) > 0 {
		return errdefs.Conflictf("disk %s: %s is in use by %s", id, img, devs[0])
	}
	created, err := mkdirMountPoint(mountpoint)
	if err != nil {
		return fmt.Errorf("disk %s: %w", id, err)
	}
	if err := mountImage(f, mountpoint); err != nil {
		if created {
			os.Remove(mountpoint)
		}
		return fmt.Errorf("disk %s: %w", id, err)
	}
	return nil
}

// UnmountDisk unmounts the disk mounted at mountpoint, first returning the
// space of its deleted files to the pool (a trim). Its loop device is
// released with the mount (at once, or when its last user goes away if it
// was busy and had to be detached lazily). Idempotent.
func UnmountDisk(mountpoint string) error {
	if mounted, err := IsMounted(mountpoint); err == nil && mounted {
		if err := trim(mountpoint); err != nil {
			slog.Warn("storage: cannot trim a disk", "path", mountpoint, "err", err)
		}
	}
	if err := Unmount(mountpoint); err != nil {
		return fmt.Errorf("unmount disk: %w", err)
	}
	return nil
}

// RemoveDisk deletes the image of the disk of jail id; errdefs.ErrConflict
// while a loop device still uses it (the disk is mounted). Idempotent.
func (p *Pool) RemoveDisk(id string) error {
	if err := validID(id); err != nil {
		return err
	}
	img := p.DiskPath(id)
	devs, err := LoopDevicesFor(img)
	if err != nil {
		return fmt.Errorf("disk %s: %w", id, err)
	}
	if dev := mountedHere(devs); dev != "" {
		return errdefs.Conflictf("disk %s: %s is still mounted from %s", id, img, dev)
	}
	if devs := waitLoopRelease(img, releaseWait); len(devs) > 0 {
		// A lazily detached mount of the disk lives on in another mount
		// namespace made while it was mounted (e.g. by `unshare -m`, whose
		// default propagation is private). Deleting the image is still
		// right: the kernel frees it with that namespace.
		slog.Warn("storage: disk image still held by a mount in another namespace; deleting it anyway",
			"disk", id, "loop", devs[0])
	}
	if err := os.Remove(img); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("disk %s: %w", id, err)
	}
	return nil
}

// releaseWait bounds how long RemoveDisk waits for the loop device of an
// unmounted disk to go away (the kernel releases it when the last
// reference to the filesystem, e.g. a dying jail's mount namespace, drops).
const releaseWait = 2 * time.Second

// waitLoopRelease waits until no loop device is backed by img, or until
// the deadline, and returns the devices still using it.
func waitLoopRelease(img string, d time.Duration) []string {
	deadline := time.Now().Add(d)
	for {
		devs, err := LoopDevicesFor(img)
		if err != nil || len(devs) == 0 || time.Now().After(deadline) {
			return devs
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// mountedHere returns the first of devs that a mount of this mount
// namespace uses, or "".
func mountedHere(devs []string) string {
	if len(devs) == 0 {
		return ""
	}
	mounts, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) {
		return !slices.Contains(devs, m.Source), false
	})
	if err != nil || len(mounts) == 0 {
		return ""
	}
	return mounts[0].Source
}

// trim discards the free space of the filesystem mounted at mountpoint, which
// punches it out of the disk's image in the pool.
func trim(mountpoint string) error {
	fd, err := unix.Open(mountpoint, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("trim %s: %w", mountpoint, err)
	}
	defer unix.Close(fd)
	// XFS frees a deleted file's blocks in the background (inode
	// inactivation); syncfs waits for that, so that FITRIM finds them free.
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("trim %s: syncfs: %w", mountpoint, err)
	}
	r := struct{ start, len, minLen uint64 }{len: math.MaxUint64}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), ioctlFITRIM, uintptr(unsafe.Pointer(&r))); errno != 0 {
		return fmt.Errorf("trim %s: %w", mountpoint, errno)
	}
	return nil
}
