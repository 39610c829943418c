package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/errdefs"
)

// IsMounted reports whether path is a mount point (the root of a mount). A
// path that does not exist is not mounted.
func IsMounted(path string) (bool, error) {
	var stx unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS, &stx)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("stat %s: %w", path, err)
	}
	if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		return false, errdefs.Unavailablef("stat %s: kernel does not report mount roots (needs Linux 5.8)", path)
	}
	return stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0, nil
}

// Unmount unmounts path if it is a mount point, repeating while mounts are
// stacked there. A busy mount is detached lazily (it disappears from the tree
// at once and is released when its last user goes away). Idempotent: a path
// that is not mounted, or does not exist, is not an error.
func Unmount(path string) error {
	for {
		mounted, err := IsMounted(path)
		if err != nil || !mounted {
			return err
		}
		err = unix.Unmount(path, unix.UMOUNT_NOFOLLOW)
		if errors.Is(err, unix.EBUSY) {
			err = unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		}
		switch {
		case err == nil:
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			// Unmounted concurrently by someone else.
			return nil
		default:
			return fmt.Errorf("unmount %s: %w", path, err)
		}
	}
}

// UnmountAll unmounts every mount at or below dir, deepest first — what a
// killed tool (CRIU's cgroup yard, runc's restore root) left mounted there.
// Idempotent; a dir that does not exist is not an error.
func UnmountAll(dir string) error {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return fmt.Errorf("listing mounts below %s: %w", dir, err)
	}
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i].Mountpoint) > len(mounts[j].Mountpoint) })
	var errs []error
	for _, m := range mounts {
		errs = append(errs, Unmount(m.Mountpoint))
	}
	return errors.Join(errs...)
}

// MountOverlay mounts an overlay at merged (created if missing) whose lower
// layers are lowers, top first, with upper and work as its writable layer;
// with upper and work empty the overlay is read-only (it then needs at
// least two lowers). Paths must be absolute and may not contain ',', ':'
// or '\\' (the overlay option syntax); errdefs.ErrInvalid otherwise. Lower
// lists too long for mount(2)'s one page of options are given one by one
// (fsconfig "lowerdir+", Linux 6.8).
func MountOverlay(lowers []string, upper, work, merged string) error {
	if len(lowers) == 0 {
		return errdefs.Invalidf("overlay %s: at least one lower directory is required", merged)
	}
	paths := append([]string{merged}, lowers...)
	if upper != "" || work != "" {
		paths = append(paths, upper, work)
	}
	for _, p := range paths {
		if !filepath.IsAbs(p) {
			return errdefs.Invalidf("overlay %s: path %q is not absolute", merged, p)
		}
		if strings.ContainsAny(p, ",:\\") {
			return errdefs.Invalidf("overlay %s: path %q contains ',', ':' or '\\'", merged, p)
		}
	}
	if err := os.MkdirAll(merged, 0o755); err != nil {
		return fmt.Errorf("overlay mount point: %w", err)
	}
	opts := "lowerdir=" + strings.Join(lowers, ":")
	var flags uintptr
	if upper != "" {
		opts += ",upperdir=" + upper + ",workdir=" + work
	} else {
		flags = unix.MS_RDONLY
	}
	if len(opts) >= maxMountOptions {
		return mountOverlayFS(lowers, upper, work, merged)
	}
	if err := unix.Mount("overlay", merged, "overlay", flags, opts); err != nil {
		return fmt.Errorf("mount overlay at %s (%s): %w", merged, opts, err)
	}
	return nil
}

// maxMountOptions is what mount(2) takes of an option string (one page,
// with its terminating NUL).
const maxMountOptions = 4095

// mountOverlayFS mounts an overlay with the new mount API, one lower
// directory per fsconfig call.
func mountOverlayFS(lowers []string, upper, work, merged string) error {
	fd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("mount overlay at %s: fsopen: %w", merged, err)
	}
	defer unix.Close(fd)
	for _, l := range lowers {
		if err := unix.FsconfigSetString(fd, "lowerdir+", l); err != nil {
			return fmt.Errorf("mount overlay at %s: lower %s: %w (needs Linux 6.8 for %d lowers)", merged, l, err, len(lowers))
		}
	}
	attrs := 0
	if upper != "" {
		if err := unix.FsconfigSetString(fd, "upperdir", upper); err != nil {
			return fmt.Errorf("mount overlay at %s: upper: %w", merged, err)
		}
		if err := unix.FsconfigSetString(fd, "workdir", work); err != nil {
			return fmt.Errorf("mount overlay at %s: work: %w", merged, err)
		}
	} else {
		attrs = unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.FsconfigCreate(fd); err != nil {
		return fmt.Errorf("mount overlay at %s: %w", merged, err)
	}
	mfd, err := unix.Fsmount(fd, unix.FSMOUNT_CLOEXEC, attrs)
	if err != nil {
		return fmt.Errorf("mount overlay at %s: fsmount: %w", merged, err)
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, merged, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("mount overlay at %s: %w", merged, err)
	}
	return nil
}

// Usage reports the used and total bytes of the filesystem mounted at
// mountpoint.
func Usage(mountpoint string) (used, total uint64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(mountpoint, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return 0, 0, errdefs.NotFoundf("disk usage: %s does not exist", mountpoint)
		}
		return 0, 0, fmt.Errorf("disk usage of %s: %w", mountpoint, err)
	}
	bs := uint64(st.Bsize)
	return (st.Blocks - st.Bfree) * bs, st.Blocks * bs, nil
}

// within reports whether path is dir or lies below it (both cleaned).
func within(path, dir string) bool {
	path, dir = filepath.Clean(path), filepath.Clean(dir)
	return path == dir || strings.HasPrefix(path, dir+"/") || dir == "/"
}
