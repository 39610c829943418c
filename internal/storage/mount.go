package storage

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

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

// MountOverlay mounts an overlay at merged (created if missing) whose lower
// layers are lowers, top first, with upper and work as its writable layer.
// Paths must be absolute and may not contain ',', ':' or '\' (the overlay
// option syntax); errdefs.ErrInvalid otherwise.
func MountOverlay(lowers []string, upper, work, merged string) error {
	if len(lowers) == 0 {
		return errdefs.Invalidf("overlay %s: at least one lower directory is required", merged)
	}
	for _, p := range append([]string{upper, work, merged}, lowers...) {
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
	opts := "lowerdir=" + strings.Join(lowers, ":") + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay at %s (%s): %w", merged, opts, err)
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

// mountInfo is one line of /proc/self/mountinfo.
type mountInfo struct {
	major, minor uint32
	mountPoint   string
	fsType       string
	source       string
}

// readMounts parses /proc/self/mountinfo.
func readMounts() ([]mountInfo, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	defer f.Close()
	var out []mountInfo
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// id parent major:minor root mountpoint opts [optional...] - fstype source superopts
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if len(fields) < 5 || sep < 0 || sep+2 >= len(fields) {
			continue
		}
		var m mountInfo
		if maj, min, ok := strings.Cut(fields[2], ":"); ok {
			a, _ := strconv.ParseUint(maj, 10, 32)
			b, _ := strconv.ParseUint(min, 10, 32)
			m.major, m.minor = uint32(a), uint32(b)
		}
		m.mountPoint = unescapeMount(fields[4])
		m.fsType = fields[sep+1]
		m.source = unescapeMount(fields[sep+2])
		out = append(out, m)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	return out, nil
}

// unescapeMount undoes the octal escapes (\040 etc.) of mountinfo fields.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// within reports whether path is dir or lies below it (both cleaned).
func within(path, dir string) bool {
	path, dir = filepath.Clean(path), filepath.Clean(dir)
	return path == dir || strings.HasPrefix(path, dir+"/") || dir == "/"
}
