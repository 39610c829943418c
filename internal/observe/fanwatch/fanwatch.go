// Package fanwatch cross-checks the syscall-derived file record with the
// kernel's own view: a fanotify filesystem mark on a jail's root (its
// overlay superblock, so it keeps working after pivot_root inside the jail)
// reports every file closed after writing, with the writer's pid. The
// daemon compares those paths with the files the syscall stream says were
// written, and reports any it missed.
package fanwatch

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Event is a file closed after writing.
type Event struct {
	// Path is the jail path of the file.
	Path string
	// HostPid is the writer's pid on the host.
	HostPid int32
}

// Watcher reads fanotify events of one jail root.
type Watcher struct {
	fd   int
	root string
	stop chan struct{}
	done sync.WaitGroup
}

// Watch marks the filesystem mounted at root (a jail's merged overlay
// directory, seen from the host) and calls fn for every file closed after
// writing, from its own goroutine. fn must not block for long.
func Watch(root string, fn func(Event)) (*Watcher, error) {
	fd, err := unix.FanotifyInit(unix.FAN_CLASS_NOTIF|unix.FAN_CLOEXEC|unix.FAN_NONBLOCK, unix.O_RDONLY|unix.O_LARGEFILE|unix.O_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("fanotify_init: %w", err)
	}
	if err := unix.FanotifyMark(fd, unix.FAN_MARK_ADD|unix.FAN_MARK_FILESYSTEM, unix.FAN_CLOSE_WRITE, unix.AT_FDCWD, root); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("fanotify_mark %s: %w", root, err)
	}
	w := &Watcher{fd: fd, root: strings.TrimSuffix(root, "/"), stop: make(chan struct{})}
	w.done.Add(1)
	go w.run(fn)
	return w, nil
}

// Close stops the watcher; fn is not called after it returns.
func (w *Watcher) Close() error {
	close(w.stop)
	w.done.Wait()
	return unix.Close(w.fd)
}

func (w *Watcher) run(fn func(Event)) {
	defer w.done.Done()
	buf := make([]byte, 64<<10)
	const meta = int(unsafe.Sizeof(unix.FanotifyEventMetadata{}))
	for {
		select {
		case <-w.stop:
			return
		default:
		}
		fds := []unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, 100); err != nil && !errors.Is(err, unix.EINTR) {
			return
		}
		n, err := unix.Read(w.fd, buf)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return
		}
		for off := 0; off+meta <= n; {
			m := (*unix.FanotifyEventMetadata)(unsafe.Pointer(&buf[off]))
			if m.Event_len < uint32(meta) {
				break
			}
			if m.Fd >= 0 {
				p, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(m.Fd)))
				unix.Close(int(m.Fd))
				if err == nil {
					fn(Event{Path: w.jailPath(p), HostPid: m.Pid})
				}
			}
			off += int(m.Event_len)
		}
	}
}

// jailPath turns the path of an event's descriptor into a jail path: a
// file reached through the host's view of the root has the root as its
// prefix; one reached inside the jail (a mount the daemon cannot see) is
// already named from the jail's root.
func (w *Watcher) jailPath(p string) string {
	p = strings.TrimSuffix(p, " (deleted)")
	if p == w.root {
		return "/"
	}
	if rest, ok := strings.CutPrefix(p, w.root+"/"); ok {
		return "/" + rest
	}
	return p
}
