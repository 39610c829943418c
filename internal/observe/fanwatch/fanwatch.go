// Package fanwatch cross-checks the syscall-derived file record with the
// kernel's own view: a fanotify filesystem mark on a jail's root (its
// overlay superblock, so it keeps working after pivot_root inside the jail)
// reports every file closed after writing, with the writer's pid. The
// daemon compares those paths with the files the syscall stream says were
// written, and reports any it missed.
package fanwatch

import (
	"fmt"
	"os"
	"strconv"
	"strings"
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
	// f is the fanotify descriptor, non-blocking and waited on through
	// Go's network poller: an idle watcher holds no thread and makes no
	// system call.
	f    *os.File
	root string
	done chan struct{}
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
	w := &Watcher{f: os.NewFile(uintptr(fd), "fanotify"), root: strings.TrimSuffix(root, "/"), done: make(chan struct{})}
	go w.run(fn)
	return w, nil
}

// Close stops the watcher; fn is not called after it returns.
func (w *Watcher) Close() error {
	err := w.f.Close() // ends a read in progress
	<-w.done
	return err
}

func (w *Watcher) run(fn func(Event)) {
	defer close(w.done)
	buf := make([]byte, 64<<10)
	const meta = int(unsafe.Sizeof(unix.FanotifyEventMetadata{}))
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			return // closed
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
