package oci

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	runc "github.com/containerd/go-runc"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/procwait"
	"github.com/agentjail/agentjail/internal/timerslack"
	"github.com/agentjail/agentjail/internal/tracing"
)

// The runtime binary is driven through containerd/go-runc rather than a
// hand-rolled exec of it: go-runc builds the argument lists and parses the
// JSON of state, list and (for snapshots) the CRIU checkpoint/restore
// options of the same CLI, which runc and runsc share. Two of its
// behaviours shape this file:
//
//   - It waits for every runtime process with exec.Cmd.Wait through the
//     package-level runc.Monitor. The daemon keeps that default monitor and
//     never reaps globally (no wait(-1) loop, no SIGCHLD handler), so no
//     exit status is stolen from it.
//   - `runc create` hands its own stdio to the container's process. Given
//     no IO, go-runc captures output through an in-process pipe and then
//     waits for every writer of that pipe, i.e. for the container to exit.
//     Create therefore always passes pipes (which CRIU also requires: it
//     cannot restore stdio that are host files) and closes its copies of
//     the container's ends once runc has started.
//
// The container's init is reparented when `runc create` exits, to the
// nearest subreaper or the host's init, never to the daemon: the daemon
// must not set PR_SET_CHILD_SUBREAPER, so that jails outlive a daemon
// crash or restart.

const (
	// createTimeout bounds `runc create`, which runs to completion even when
	// the caller's context ends: killing it half-way could leave state that
	// `runc delete` cannot find (cgroups made before state.json is written).
	createTimeout = time.Minute
	// cleanupTimeout bounds the kill and delete of a container whose
	// creation or start failed.
	cleanupTimeout = 30 * time.Second
	// existsWait bounds the wait for a failed create's stderr to end.
	existsWait = 2 * time.Second
	// maxReadyLine is the longest first line init may write; more is an
	// unexpected answer.
	maxReadyLine = 256
	// stderrTail is how much of init's stderr (its last bytes) is kept for
	// error messages.
	stderrTail = 64 << 10
)

// ReadyLine is what init writes on its stdout once it serves its control
// socket.
const ReadyLine = "ready"

// Runtime drives one OCI runtime binary with one state directory. It keeps
// the read ends of the stdout and stderr pipes of the containers it created
// (until Delete), which Start needs for the readiness handshake. Methods may
// be called concurrently for different ids.
type Runtime struct {
	rc *runc.Runc
	// ordinarySlack starts containers with the ordinary timer slack.
	ordinarySlack bool

	mu    sync.Mutex
	stdio map[string]*containerIO
}

// containerIO is the daemon's side of a container's stdio pipes.
type containerIO struct {
	pipes  runc.IO
	stdout *bufio.Reader
	// stdoutFile is the read end behind stdout; a deadline on it unblocks
	// the readiness wait.
	stdoutFile *os.File
	stderr     *tailBuffer
	// stderrDone is closed once stderr reached EOF (every writer is gone).
	stderrDone chan struct{}
	// started is set (under Runtime.mu) by the first Start.
	started bool
	// pid is the container process's host pid.
	pid int
}

// NewRuntime returns a Runtime for binary ("runc", "runsc", or a path)
// whose container state lives under root (created by the runtime on first
// use), run with the global flags globalArgs (runsc's platform, file and
// network options) before each command.
func NewRuntime(binary, root string, globalArgs ...string) *Runtime {
	return &Runtime{
		rc:    &runc.Runc{Command: binary, Root: root, ExtraArgs: globalArgs},
		stdio: map[string]*containerIO{},
	}
}

// UseOrdinarySlack makes the containers this Runtime creates start with the
// ordinary timer slack (timerslack.Ordinary) rather than the daemon's: for
// a runtime whose container runs the jail's code itself (gVisor's sandbox,
// whose timers are the jail's), not agentjail's init. Call it before the
// first Create.
func (r *Runtime) UseOrdinarySlack() { r.ordinarySlack = true }

// Create runs `create` for the bundle directory (which holds config.json):
// the container's process exists, in its namespaces and cgroup, but has not
// executed init yet, so the caller can register the cgroup for observation
// first. The container's stdin, stdout and stderr are pipes; the Runtime
// keeps the stdout and stderr read ends for Start (stdin reads EOF). It
// returns the container process's host pid. An id that already exists is
// errdefs.ErrConflict (and that container is left alone). On any other
// error, including ctx ending, nothing is left behind: the container is
// deleted and the pipes closed; the error carries the runtime's stderr.
func (r *Runtime) Create(ctx context.Context, id, bundle string) (pid int, err error) {
	if id == "" {
		return 0, errdefs.Invalidf("create: container id is required")
	}
	pipes, err := runc.NewPipeIO(0, 0)
	if err != nil {
		return 0, fmt.Errorf("create %s: stdio pipes: %w", id, err)
	}
	cio, err := newContainerIO(pipes)
	if err != nil {
		pipes.Close()
		return 0, fmt.Errorf("create %s: %w", id, err)
	}
	// In the bundle, not the host's temp dir: a daemon killed meanwhile
	// leaves it to go with the jail.
	tmp, err := os.MkdirTemp(bundle, ".runc-create-")
	if err != nil {
		cio.close()
		return 0, fmt.Errorf("create %s: pid file dir: %w", id, err)
	}
	defer os.RemoveAll(tmp)
	pidFile := filepath.Join(tmp, "pid")

	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), createTimeout)
	defer cancel()
	create := func() error { return r.rc.Create(cctx, id, bundle, &runc.CreateOpts{IO: pipes, PidFile: pidFile}) }
	if r.ordinarySlack {
		err = timerslack.StartOrdinary(create)
	} else {
		err = create()
	}
	// Only the container (if it exists) holds the write ends from here on:
	// go-runc closes its copies once runc started, this covers the case
	// where runc never started.
	_ = pipes.(runc.StartCloser).CloseAfterStart()
	_ = pipes.Stdin().Close()
	if err != nil && cio.exists() {
		// runc refused the id before making anything: the container that
		// holds it is not this call's to delete.
		cio.close()
		return 0, errdefs.Conflictf("create %s: container already exists", id)
	}
	if err == nil {
		err = ctx.Err()
	}
	if err == nil {
		pid, err = ReadPidFile(pidFile)
	}
	if err != nil {
		text := r.discard(id, cio)
		return 0, fmt.Errorf("create container %s: %w%s", id, err, detail(text))
	}
	cio.pid = pid
	r.mu.Lock()
	r.stdio[id] = cio
	r.mu.Unlock()
	return pid, nil
}

// Start starts a container made by this Runtime's Create and returns once
// its init has written the line ReadyLine on its stdout. If init exits or
// writes anything else first, or ctx ends, Start kills and deletes the
// container and returns an error carrying init's stderr (wrapping
// errdefs.ErrTimeout when ctx ended). Starting a container twice is
// errdefs.ErrConflict and leaves it alone. An id this Runtime did not
// create is errdefs.ErrNotFound when the runtime does not know it either,
// else errdefs.ErrConflict.
func (r *Runtime) Start(ctx context.Context, id string) error {
	r.mu.Lock()
	cio := r.stdio[id]
	started := cio != nil && cio.started
	if cio != nil {
		cio.started = true
	}
	r.mu.Unlock()
	if started {
		return errdefs.Conflictf("start %s: the container was already started", id)
	}
	if cio == nil {
		if _, _, err := r.State(ctx, id); err != nil {
			return err
		}
		return errdefs.Conflictf("start %s: the container was not created by this daemon process (its stdio is gone)", id)
	}
	released, err := r.releaseFifo(ctx, id, cio.pid)
	if err == nil && !released {
		err = r.rc.Start(ctx, id)
		if err != nil {
			err = runcError("start", id, err)
		}
	}
	if err != nil {
		r.forget(id)
		text := r.discard(id, cio)
		return fmt.Errorf("%w%s", err, detail(text))
	}
	_, span := tracing.Start(ctx, "init.ready")
	line, err := cio.waitReady(ctx)
	tracing.End(span, err)
	if err == nil && line == ReadyLine {
		go func() { _, _ = io.Copy(io.Discard, cio.stdout) }()
		return nil
	}
	r.forget(id)
	text := r.discard(id, cio)
	switch {
	case ctx.Err() != nil:
		return errdefs.Wrap(errdefs.ErrTimeout, ctx.Err(), "start container %s: init was not ready in time%s", id, detail(text))
	case err == io.EOF:
		return fmt.Errorf("start container %s: init exited before it was ready%s", id, detail(text))
	case err != nil:
		return fmt.Errorf("start container %s: reading init's stdout: %w%s", id, err, detail(text))
	default:
		return fmt.Errorf("start container %s: init wrote %q instead of %q%s", id, line, ReadyLine, detail(text))
	}
}

// execFifo is the FIFO in runc's state directory of a created container
// (runc's libcontainer names it so, from runc 1.0 on): the container's
// process, its namespaces, mounts and cgroups set up, blocks opening it
// for writing until `runc start` opens it for reading; it then writes one
// byte and executes the container's program, and `runc start` removes
// the FIFO, which is what makes runc report the container running.
const execFifo = "exec.fifo"

// releaseFifo does what `runc start` does, without starting a runc
// process (which costs milliseconds of CPU at every jail start): it reads
// the byte the container process pid writes to its exec FIFO, and removes
// the FIFO. It reports false, having done nothing, when the container has
// no exec FIFO (a runtime that starts containers another way). It fails
// when pid exits before it wrote, or ctx ends first.
func (r *Runtime) releaseFifo(ctx context.Context, id string, pid int) (bool, error) {
	path := filepath.Join(r.rc.Root, id, execFifo)
	// Opening a FIFO read-write never blocks (a read-only open waits for a
	// writer); the byte is all that is needed, not the writer's close.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return false, nil
	}
	if err != nil {
		return true, fmt.Errorf("start container %s: %w", id, err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || st.Mode().Type() != os.ModeNamedPipe {
		return true, fmt.Errorf("start container %s: %s is not the runtime's exec FIFO", id, path)
	}
	h, err := procwait.Open(pid)
	if err != nil {
		return true, fmt.Errorf("start container %s: the container process exited before it started (%w)", id, err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	exited := make(chan struct{})
	go func() {
		defer h.Close()
		// The process exited, or ctx ended: unblock the read.
		if h.Wait(wctx) == nil {
			close(exited)
			_ = f.SetReadDeadline(time.Unix(1, 0))
		} else if ctx.Err() != nil {
			_ = f.SetReadDeadline(time.Unix(1, 0))
		}
	}()
	var b [1]byte
	_, err = f.Read(b[:])
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return true, errdefs.Wrap(errdefs.ErrTimeout, ctx.Err(), "start container %s: the container process did not start in time", id)
	default:
		select {
		case <-exited:
			return true, fmt.Errorf("start container %s: the container process exited before it started", id)
		default:
		}
		return true, fmt.Errorf("start container %s: read %s: %w", id, path, err)
	}
	if err := os.Remove(path); err != nil {
		return true, fmt.Errorf("start container %s: %w", id, err)
	}
	return true, nil
}

// Kill sends sig to the container's init, or to every process of the
// container when all is true. An unknown id is errdefs.ErrNotFound; a
// container that does not run is errdefs.ErrConflict.
func (r *Runtime) Kill(ctx context.Context, id string, sig syscall.Signal, all bool) error {
	if err := r.rc.Kill(ctx, id, int(sig), &runc.KillOpts{All: all}); err != nil {
		return runcError("kill", id, err)
	}
	return nil
}

// Delete removes the container's runtime state and cgroups and closes the
// Runtime's stdio pipes of it. With force a running container is killed
// first; without, deleting a running container is errdefs.ErrConflict.
// Deleting an unknown id returns nil.
func (r *Runtime) Delete(ctx context.Context, id string, force bool) error {
	err := r.rc.Delete(ctx, id, &runc.DeleteOpts{Force: force})
	if err != nil {
		err = runcError("delete", id, err)
		if !errors.Is(err, errdefs.ErrNotFound) {
			return err
		}
	}
	if cio := r.forget(id); cio != nil {
		cio.close()
	}
	return nil
}

// State returns the container's status ("created", "running", "paused",
// "stopped") and its init's host pid (0 once stopped). An unknown id is
// errdefs.ErrNotFound.
func (r *Runtime) State(ctx context.Context, id string) (status string, pid int, err error) {
	c, err := r.rc.State(ctx, id)
	if err != nil {
		return "", 0, runcError("state", id, err)
	}
	if c.Status == "stopped" {
		return c.Status, 0, nil
	}
	return c.Status, c.Pid, nil
}

// List returns the ids of every container in the runtime's state root.
func (r *Runtime) List(ctx context.Context) ([]string, error) {
	cs, err := r.rc.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	ids := make([]string, 0, len(cs))
	for _, c := range cs {
		ids = append(ids, c.ID)
	}
	return ids, nil
}

// Pause freezes every process of the container. An unknown id is
// errdefs.ErrNotFound; a container that does not run is
// errdefs.ErrConflict.
func (r *Runtime) Pause(ctx context.Context, id string) error {
	if err := r.rc.Pause(ctx, id); err != nil {
		return runcError("pause", id, err)
	}
	return nil
}

// Resume thaws a paused container. An unknown id is errdefs.ErrNotFound; a
// container that is not paused is errdefs.ErrConflict.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	if err := r.rc.Resume(ctx, id); err != nil {
		return runcError("resume", id, err)
	}
	return nil
}

// forget removes id's stdio from the Runtime and returns it.
func (r *Runtime) forget(id string) *containerIO {
	r.mu.Lock()
	defer r.mu.Unlock()
	cio := r.stdio[id]
	delete(r.stdio, id)
	return cio
}

// discard force-deletes a container whose creation or start failed, waits
// (bounded) until every writer of its stderr is gone, closes its pipes and
// returns what it wrote on stderr.
func (r *Runtime) discard(id string, cio *containerIO) string {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	// A failure here leaves the container to the caller's Destroy, which
	// deletes by id again; the stderr text below still explains the cause.
	_ = r.Delete(ctx, id, true)
	select {
	case <-cio.stderrDone:
	case <-ctx.Done():
	}
	cio.close()
	return cio.stderr.String()
}

func newContainerIO(pipes runc.IO) (*containerIO, error) {
	out, ok1 := pipes.Stdout().(*os.File)
	errf, ok2 := pipes.Stderr().(*os.File)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("stdio pipes are not files")
	}
	cio := &containerIO{
		pipes:      pipes,
		stdout:     bufio.NewReaderSize(out, maxReadyLine),
		stdoutFile: out,
		stderr:     &tailBuffer{max: stderrTail},
		stderrDone: make(chan struct{}),
	}
	go func() {
		defer close(cio.stderrDone)
		_, _ = io.Copy(cio.stderr, errf)
	}()
	return cio, nil
}

// exists reports whether the runtime's stderr says the id was taken. It is
// called after a failed create: the runtime has exited, so stderr ends at
// once unless a half-made container holds it, hence the bound.
func (c *containerIO) exists() bool {
	select {
	case <-c.stderrDone:
	case <-time.After(existsWait):
	}
	return strings.Contains(c.stderr.String(), "already exists")
}

// waitReady reads init's first stdout line (without its newline). It
// returns io.EOF when init's stdout closed first, and ctx's error when ctx
// ended first.
func (c *containerIO) waitReady(ctx context.Context) (string, error) {
	type result struct {
		line string
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		line, err := c.stdout.ReadSlice('\n')
		switch {
		case err == nil:
			ch <- result{string(bytes.TrimSuffix(line, []byte("\n"))), nil}
		case errors.Is(err, bufio.ErrBufferFull):
			ch <- result{string(line) + "...", nil}
		case err == io.EOF && len(line) > 0:
			ch <- result{string(line), nil}
		default:
			ch <- result{"", err}
		}
	}()
	select {
	case res := <-ch:
		return res.line, res.err
	case <-ctx.Done():
		// Unblock the reader; it is done with the pipe once it reports.
		_ = c.stdoutFile.SetReadDeadline(time.Unix(1, 0))
		<-ch
		return "", ctx.Err()
	}
}

// close closes every pipe end the daemon holds; the stderr copier then ends.
func (c *containerIO) close() {
	_ = c.pipes.Close()
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// ReadPidFile reads the pid the runtime wrote to a --pid-file.
func ReadPidFile(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read runtime pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("runtime pid file holds %q, not a pid", data)
	}
	return pid, nil
}

// runcError gives a runtime CLI failure its errdefs kind, read from the
// runtime's message: an unknown container is ErrNotFound, an operation the
// container's state forbids is ErrConflict.
func runcError(op, id string, err error) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "does not exist"):
		return errdefs.Wrap(errdefs.ErrNotFound, errors.New(runtimeMessage(msg)), "%s container %s", op, id)
	case strings.Contains(msg, "not running"), strings.Contains(msg, "not paused"),
		strings.Contains(msg, "not stopped"), strings.Contains(msg, "cannot start"),
		strings.Contains(msg, "already"):
		return errdefs.Wrap(errdefs.ErrConflict, errors.New(runtimeMessage(msg)), "%s container %s", op, id)
	}
	return fmt.Errorf("%s container %s: %w", op, id, err)
}

// runtimeMessage extracts the msg="..." parts of runc's logfmt error lines
// from text, keeping other lines as they are.
func runtimeMessage(text string) string {
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		if i := strings.Index(line, ` msg="`); i >= 0 && strings.Contains(line, "level=") {
			if m, err := strconv.Unquote(line[i+len(" msg="):]); err == nil {
				line = m
			}
		}
		if line = strings.TrimSpace(line); line != "" {
			out = append(out, line)
		}
	}
	return strings.Join(out, "; ")
}

// detail formats captured stderr text for the end of an error message.
func detail(stderr string) string {
	if s := runtimeMessage(stderr); s != "" {
		return ": stderr: " + s
	}
	return ""
}
