package initd

import (
	"os"
	"os/signal"
	"sync"

	"golang.org/x/sys/unix"
)

// reaper is the single place where init waits for children. On every
// SIGCHLD it collects exit statuses with wait4(WNOHANG) and hands each to
// the callback registered for that pid. In reap-all mode (PID 1) it waits
// for any child, so orphans reparented to init are reaped too; otherwise it
// waits only for the pids it started, leaving other children of the
// process alone.
type reaper struct {
	all   bool
	mu    sync.Mutex
	procs map[int]func(unix.WaitStatus)
	sigs  chan os.Signal
	kick  chan struct{}
	stop  chan struct{}
	done  chan struct{}
}

// newReaper starts the reaper goroutine.
func newReaper(all bool) *reaper {
	r := &reaper{
		all:   all,
		procs: make(map[int]func(unix.WaitStatus)),
		sigs:  make(chan os.Signal, 1),
		kick:  make(chan struct{}, 1),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	signal.Notify(r.sigs, unix.SIGCHLD)
	go r.loop()
	return r
}

// start runs fork (which starts one child and returns its pid) and
// registers onExit for that pid atomically with respect to reaping, so an
// exit status collected before registration is not lost. onExit runs on
// the reaper goroutine and must not block.
func (r *reaper) start(fork func() (int, error), onExit func(unix.WaitStatus)) (int, error) {
	r.mu.Lock()
	pid, err := fork()
	if err == nil {
		r.procs[pid] = onExit
	}
	r.mu.Unlock()
	if err == nil {
		// A SIGCHLD that arrived before registration was consumed by a pass
		// that could not see this pid in tracked mode; run another pass.
		select {
		case r.kick <- struct{}{}:
		default:
		}
	}
	return pid, err
}

// close stops the reaper goroutine and waits for it.
func (r *reaper) close() {
	signal.Stop(r.sigs)
	close(r.stop)
	<-r.done
}

func (r *reaper) loop() {
	defer close(r.done)
	for {
		select {
		case <-r.sigs:
		case <-r.kick:
		case <-r.stop:
			return
		}
		r.reap()
	}
}

// reap collects every exit status available now.
func (r *reaper) reap() {
	var ws unix.WaitStatus
	if r.all {
		for {
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if err == unix.EINTR {
				continue
			}
			if pid <= 0 || err != nil {
				return
			}
			r.dispatch(pid, ws)
		}
	}
	r.mu.Lock()
	pids := make([]int, 0, len(r.procs))
	for pid := range r.procs {
		pids = append(pids, pid)
	}
	r.mu.Unlock()
	for _, pid := range pids {
		got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		for err == unix.EINTR {
			got, err = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		}
		if got == pid {
			r.dispatch(pid, ws)
		}
	}
}

// dispatch hands a collected status to its callback, if any.
func (r *reaper) dispatch(pid int, ws unix.WaitStatus) {
	r.mu.Lock()
	fn := r.procs[pid]
	delete(r.procs, pid)
	r.mu.Unlock()
	if fn != nil {
		fn(ws)
	}
}
