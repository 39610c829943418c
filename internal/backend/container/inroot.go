package container

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// writeInRoot writes data to the jail path p below root (the jail's merged
// directory, seen from the host) without ever leaving root: every component
// resolves with RESOLVE_IN_ROOT, so a symlink planted by the jail (or by a
// dir rootfs) cannot make the daemon write a host file. Missing parent
// directories are created (0755, root-owned); a final symlink is replaced.
func writeInRoot(root, p string, data []byte, mode uint32) error {
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open jail root: %w", err)
	}
	defer unix.Close(rootFD)
	dir, name := path.Split(path.Clean("/" + p))
	dirFD := rootFD
	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS}
	cur := "/"
	for _, part := range strings.Split(strings.Trim(dir, "/"), "/") {
		if part == "" {
			continue
		}
		cur = path.Join(cur, part)
		fd, err := unix.Openat2(rootFD, cur, how)
		if errors.Is(err, unix.ENOENT) {
			parent, perr := unix.Openat2(rootFD, path.Dir(cur), how)
			if perr != nil {
				return fmt.Errorf("jail path %s: %w", cur, perr)
			}
			merr := unix.Mkdirat(parent, part, 0o755)
			unix.Close(parent)
			if merr != nil && !errors.Is(merr, unix.EEXIST) {
				return fmt.Errorf("jail path %s: %w", cur, merr)
			}
			fd, err = unix.Openat2(rootFD, cur, how)
		}
		if err != nil {
			return fmt.Errorf("jail path %s: %w", cur, err)
		}
		if dirFD != rootFD {
			unix.Close(dirFD)
		}
		dirFD = fd
	}
	if dirFD != rootFD {
		defer unix.Close(dirFD)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dirFD, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT != unix.S_IFREG {
		if err := unix.Unlinkat(dirFD, name, 0); err != nil {
			return fmt.Errorf("jail path %s: %w", p, err)
		}
	}
	fd, err := unix.Openat(dirFD, name, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		return fmt.Errorf("jail path %s: %w", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("jail path %s: %w", p, err)
	}
	return f.Chmod(os.FileMode(mode))
}

// readInRoot reads the regular file at jail path p below root, resolving
// every component inside root like writeInRoot, and reads at most limit
// bytes (a longer file is an error). A file the jail replaced with a FIFO
// or device is refused without blocking.
func readInRoot(root, p string, limit int64) ([]byte, error) {
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open jail root: %w", err)
	}
	defer unix.Close(rootFD)
	how := &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS}
	fd, err := unix.Openat2(rootFD, path.Clean("/"+p), how)
	if err != nil {
		return nil, fmt.Errorf("jail path %s: %w", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("jail path %s: %w", p, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("jail path %s: not a regular file", p)
	}
	if st.Size() > limit {
		return nil, fmt.Errorf("jail path %s: larger than %d bytes", p, limit)
	}
	data := make([]byte, st.Size())
	n, err := io.ReadFull(f, data)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, fmt.Errorf("jail path %s: %w", p, err)
	}
	return data[:n], nil
}
