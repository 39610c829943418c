// Package netns makes the per-jail network namespaces: each is created by
// the daemon with its loopback interface up and kept alive by a bind mount
// at a path (DATA_DIR/run/netns/{id}) that is handed to the runtime. The
// daemon's own threads never change namespace: the work happens on a locked
// OS thread that is discarded afterwards.
package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/errdefs"
)

// Create makes a new network namespace, brings its loopback interface up and
// bind-mounts it at path (the parent directory is created if missing).
// errdefs.ErrConflict if path already is a network namespace. On error
// nothing is left behind. The calling goroutine's and the process's own
// namespaces are not changed.
func Create(path string) error {
	if !filepath.IsAbs(path) {
		return errdefs.Invalidf("netns: path %q is not absolute", path)
	}
	path = filepath.Clean(path)
	if Exists(path) {
		return errdefs.Conflictf("netns: %s already is a network namespace", path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("netns %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	created := err == nil
	if errors.Is(err, os.ErrExist) {
		// A stale mount point left by an earlier run: re-use it.
		f, err = os.OpenFile(path, os.O_RDONLY, 0)
	}
	if err != nil {
		return fmt.Errorf("netns %s: %w", path, err)
	}
	f.Close()

	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread exits with this goroutine and takes
		// the new namespace with it, so no other goroutine runs in it.
		runtime.LockOSThread()
		errc <- createOnThisThread(path)
	}()
	if err := <-errc; err != nil {
		if created {
			os.Remove(path)
		}
		return fmt.Errorf("netns %s: %w", path, err)
	}
	return nil
}

// createOnThisThread moves the (locked, to be discarded) calling thread into
// a new network namespace, sets lo up and bind-mounts the namespace at path.
func createOnThisThread(path string) error {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	h, err := netlink.NewHandle()
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
	if err := unix.Mount(self, path, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount: %w", err)
	}
	return nil
}

// Exists reports whether path is a mounted network namespace.
func Exists(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil || st.Type != unix.NSFS_MAGIC {
		return false
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	t, err := unix.IoctlRetInt(fd, unix.NS_GET_NSTYPE)
	return err == nil && t == unix.CLONE_NEWNET
}

// maxStacked bounds how many mounts stacked at one path Remove takes off.
const maxStacked = 16

// Remove unmounts path (lazily, so a namespace still in use by a process
// lives on until that process exits) and deletes it. Idempotent.
func Remove(path string) error {
	for range maxStacked {
		err := unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			break // not (or no longer) a mount point
		}
		if err != nil {
			return fmt.Errorf("netns %s: unmount: %w", path, err)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("netns %s: %w", path, err)
	}
	return nil
}

// Do runs fn on an OS thread that has entered the network namespace at
// path (a bind-mounted namespace, or /proc/PID/ns/net), and returns fn's
// error. Sockets fn opens stay in that namespace whichever thread uses
// them later. The calling goroutine's namespace is not changed; a thread
// that cannot return to the original namespace stays locked, so the
// runtime retires it instead of reusing it.
func Do(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("current netns: %w", err)
			return
		}
		defer unix.Close(orig)
		target, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("opening netns %s: %w", path, err)
			return
		}
		defer unix.Close(target)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("entering netns %s: %w", path, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err == nil {
			runtime.UnlockOSThread()
		}
		errc <- ferr
	}()
	return <-errc
}
