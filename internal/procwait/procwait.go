// Package procwait waits for processes that are not the caller's children
// (a jail's init is re-parented away from the daemon so that jails outlive
// it) using pidfds: race-free against pid reuse once the pidfd is open.
package procwait

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Handle refers to one process through a pidfd.
type Handle struct {
	fd int
}

// Open returns a handle on pid. It fails with unix.ESRCH when pid does not exist.
func Open(pid int) (*Handle, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	return &Handle{fd: fd}, nil
}

// Close releases the handle.
func (h *Handle) Close() error { return unix.Close(h.fd) }

// Wait blocks until the process exits or ctx is done (then ctx.Err()).
func (h *Handle) Wait(ctx context.Context) error {
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// Poll in short slices so a cancelled ctx is noticed promptly.
		fds := []unix.PollFd{{Fd: int32(h.fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 100)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("poll pidfd: %w", err)
		}
		if n > 0 {
			return nil
		}
	}
}

// WaitPid waits for pid to exit (nil at once if it does not exist).
func WaitPid(ctx context.Context, pid int) error {
	h, err := Open(pid)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return err
	}
	defer h.Close()
	return h.Wait(ctx)
}

// Watcher calls a function when a watched process exits, for any number of
// processes, from one goroutine blocked in epoll on their pidfds.
type Watcher struct {
	epfd  int
	mu    sync.Mutex
	next  uint64
	items map[uint64]*watch
}

type watch struct {
	fd     int
	onExit func()
}

// NewWatcher starts a watcher.
func NewWatcher() (*Watcher, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create: %w", err)
	}
	w := &Watcher{epfd: epfd, items: map[uint64]*watch{}}
	go w.loop()
	return w, nil
}

// Watch calls onExit (in its own goroutine) once pid exits; at once if it
// already has. The returned cancel stops the watch; after it returns,
// onExit is not called.
func (w *Watcher) Watch(pid int, onExit func()) (cancel func(), err error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		go onExit()
		return func() {}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	w.mu.Lock()
	w.next++
	token := w.next
	w.items[token] = &watch{fd: fd, onExit: onExit}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLONESHOT}
	*(*uint64)(unsafe.Pointer(&ev.Fd)) = token
	err = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, fd, &ev)
	if err != nil {
		delete(w.items, token)
		w.mu.Unlock()
		unix.Close(fd)
		return nil, fmt.Errorf("epoll_ctl: %w", err)
	}
	w.mu.Unlock()
	return func() { w.remove(token) }, nil
}

func (w *Watcher) remove(token uint64) *watch {
	w.mu.Lock()
	defer w.mu.Unlock()
	it, ok := w.items[token]
	if !ok {
		return nil
	}
	delete(w.items, token)
	_ = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_DEL, it.fd, nil)
	unix.Close(it.fd)
	return it
}

func (w *Watcher) loop() {
	events := make([]unix.EpollEvent, 32)
	for {
		n, err := unix.EpollWait(w.epfd, events, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return
		}
		for i := 0; i < n; i++ {
			token := *(*uint64)(unsafe.Pointer(&events[i].Fd))
			if it := w.remove(token); it != nil {
				go it.onExit()
			}
		}
	}
}
