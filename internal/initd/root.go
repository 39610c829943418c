package initd

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/initproto"
)

// fsRoot confines path resolution to one directory: every lookup goes
// through openat2 with RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS relative to
// the root's directory fd, so "..", absolute and relative symlinks, symlinks
// swapped during a request and /proc magic links never leave it.
type fsRoot struct {
	fd      int      // O_PATH directory fd of the root
	prefix  string   // the root's own path on init's filesystem ("/" in a jail)
	blocked []string // cleaned jail paths
	users   identityCache
}

// openRoot opens dir as the resolution root and records the blocked paths.
func openRoot(dir string, blocked []string) (*fsRoot, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open file root %q: %w", dir, err)
	}
	prefix, err := fdPath(fd)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("resolve file root %q: %w", dir, err)
	}
	r := &fsRoot{fd: fd, prefix: prefix}
	for _, b := range blocked {
		if !path.IsAbs(b) {
			unix.Close(fd)
			return nil, fmt.Errorf("blocked path %q is not absolute", b)
		}
		r.blocked = append(r.blocked, path.Clean(b))
	}
	return r, nil
}

// close releases the root's fd.
func (r *fsRoot) close() error { return unix.Close(r.fd) }

// resolveFlags are the openat2 resolve flags of every lookup.
const resolveFlags = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS

// open resolves the jail path p inside the root and opens it with flags
// (O_CLOEXEC is added). Symlinks are followed inside the root unless
// O_NOFOLLOW is among flags.
func (r *fsRoot) open(p string, flags int, mode uint32) (int, error) {
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Resolve: resolveFlags}
	if flags&unix.O_CREAT != 0 {
		how.Mode = uint64(mode)
	}
	for attempt := 0; ; attempt++ {
		fd, err := unix.Openat2(r.fd, p, &how)
		// EAGAIN: a concurrent rename or mount raced the in-root resolution
		// of ".."; the kernel asks for a retry. Bounded, so that a process
		// renaming in a loop cannot hold a request forever.
		if (err == unix.EINTR || err == unix.EAGAIN) && attempt < 100 {
			continue
		}
		return fd, err
	}
}

// openDir opens the directory p inside the root as an O_PATH fd.
func (r *fsRoot) openDir(p string) (int, error) {
	return r.open(p, unix.O_PATH|unix.O_DIRECTORY, 0)
}

// fdPath is the path of an open fd on init's filesystem.
func fdPath(fd int) (string, error) {
	p, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("fd %d resolves to %q, not a path", fd, p)
	}
	return p, nil
}

// jailPath is the fully resolved jail path of an fd opened inside the root.
func (r *fsRoot) jailPath(fd int) (string, error) {
	p, err := fdPath(fd)
	if err != nil {
		return "", err
	}
	if r.prefix == "/" {
		return p, nil
	}
	if p == r.prefix {
		return "/", nil
	}
	if rest, ok := strings.CutPrefix(p, r.prefix+"/"); ok {
		return "/" + rest, nil
	}
	return "", fmt.Errorf("%q resolved outside the jail's root", p)
}

// isBlocked reports whether the resolved jail path p equals or is under a
// blocked path.
func (r *fsRoot) isBlocked(p string) bool {
	for _, b := range r.blocked {
		if p == b || b == "/" || strings.HasPrefix(p, b+"/") {
			return true
		}
	}
	return false
}

// containsBlocked reports whether a blocked path is p or lies under p.
func (r *fsRoot) containsBlocked(p string) bool {
	if r.isBlocked(p) {
		return true
	}
	for _, b := range r.blocked {
		if p == "/" || strings.HasPrefix(b, p+"/") {
			return true
		}
	}
	return false
}

// checkFd fails with a blocked error when the fd's resolved path is blocked,
// and returns that path.
func (r *fsRoot) checkFd(fd int, reqPath string) (string, error) {
	p, err := r.jailPath(fd)
	if err != nil {
		return "", pathError("resolve", reqPath, err)
	}
	if r.isBlocked(p) {
		return "", blockedError(reqPath)
	}
	return p, nil
}

// openParent opens the parent directory of the jail path p (O_PATH),
// following symlinks inside the root, and returns it with p's last element
// and the resolved jail path of p itself (parent resolved, last element not
// followed). It fails for "/" and for blocked resolved paths.
func (r *fsRoot) openParent(p string) (dirfd int, base, resolved string, err error) {
	if p == "/" {
		return -1, "", "", newError(initproto.KindUnprocessable, p, "path %q has no parent directory", p)
	}
	dir, base := path.Split(p)
	dirfd, err = r.openDir(dir)
	if err != nil {
		return -1, "", "", pathError("open parent directory of", p, err)
	}
	dp, err := r.jailPath(dirfd)
	if err != nil {
		unix.Close(dirfd)
		return -1, "", "", pathError("resolve", p, err)
	}
	resolved = path.Join(dp, base)
	if r.isBlocked(resolved) {
		unix.Close(dirfd)
		return -1, "", "", blockedError(p)
	}
	return dirfd, base, resolved, nil
}

// cleanPath validates a jail path from a request: absolute, without NUL
// bytes; it returns the cleaned path.
func cleanPath(field, p string) (string, error) {
	if p == "" {
		return "", newError(initproto.KindInvalid, p, "%s is empty", field)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", newError(initproto.KindInvalid, p, "%s %q contains a NUL byte", field, p)
	}
	if !path.IsAbs(p) {
		return "", newError(initproto.KindInvalid, p, "%s %q is not an absolute path", field, p)
	}
	return path.Clean(p), nil
}

// isErrno reports whether err is the errno e.
func isErrno(err error, e unix.Errno) bool { return errors.Is(err, e) }
