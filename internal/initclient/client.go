// Package initclient is the daemon's client of the in-jail init: it runs
// commands, signals them and performs file operations in a jail over the
// init's control socket (protocol: internal/initproto), and maps init's
// errors to internal/errdefs kinds.
//
// A Client is safe for concurrent use. One made by New opens a connection
// per call and holds no resources between calls; one made by NewKeepAlive
// keeps a few connections open between calls.
//
// Deadlines. Nothing a jail does may hang the daemon, and a jail's root
// may stop its init (or init may be frozen, or starved). Connecting has a
// deadline (DialTimeout). Calls may legitimately take long (a recursive
// remove, a quiet command, an idle terminal), so the answer itself has no
// fixed deadline: instead, while a connection is open, init's liveness is
// checked over a second connection (a ping after LivenessAfter, then every
// LivenessInterval, each answered within PingTimeout). When init does not
// answer, every blocked read and write of the connection fails, the call
// returns errdefs.ErrUnresponsive, and the client's OnUnresponsive hook is
// told.
package initclient

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/tracing"
)

// Client talks to one jail's init.
type Client struct {
	dialer Dialer
	pool   *pool // idle keep-alive connections; nil: a connection per call
	// OnUnresponsive, when set, is called (on its own goroutine) each
	// time a call finds that init does not answer.
	OnUnresponsive func(err error)
}

// Dialer opens a new connection to a jail's init control channel: a unix
// socket for the process and container levels, a virtio-serial port for a
// virtual machine, a stream through another node. It honours ctx's
// deadline and cancellation (the client bounds each dial by DialTimeout).
// Every call of the client dials anew.
type Dialer func(ctx context.Context) (net.Conn, error)

// New returns a client of the init that d reaches. New does not connect.
func New(d Dialer) *Client {
	return &Client{dialer: d}
}

// UnixSocket returns the dialer of the init listening on the unix socket
// at path (a host path). Paths longer than a socket address allows are
// reached through the directory's /proc/self/fd entry. Failing to connect
// is ErrUnavailable; a done ctx is ctx's error.
func UnixSocket(path string) Dialer {
	return func(ctx context.Context) (net.Conn, error) {
		addr := path
		if len(addr) > maxSunPath {
			fd, err := unix.Open(filepath.Dir(addr), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return nil, errdefs.Wrap(errdefs.ErrUnavailable, err, "jail init is not reachable at %s", path)
			}
			defer unix.Close(fd)
			addr = "/proc/self/fd/" + strconv.Itoa(fd) + "/" + filepath.Base(addr)
		}
		var d net.Dialer
		nc, err := d.DialContext(ctx, "unix", addr)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, errdefs.Wrap(errdefs.ErrUnavailable, err, "jail init is not reachable at %s", path)
		}
		return nc, nil
	}
}

// The deadlines of the daemon's calls into a jail (see the package doc).
const (
	// DialTimeout bounds connecting to init's socket.
	DialTimeout = 5 * time.Second
	// LivenessAfter is how long a call runs before init's liveness is
	// first checked.
	LivenessAfter = 2 * time.Second
	// LivenessInterval is the period of the checks after the first.
	LivenessInterval = 5 * time.Second
	// PingTimeout bounds one check, connection included.
	PingTimeout = 5 * time.Second
)

// unresponsive is the error of a call to an init that did not answer.
func (c *Client) unresponsive(op string, cause error) error {
	err := errdefs.Wrap(errdefs.ErrUnresponsive, cause, "%s: the jail's init does not answer", op)
	if c.OnUnresponsive != nil {
		go c.OnUnresponsive(err)
	}
	return err
}

// readBuffer is the size of a connection's read buffer: most answers are
// small, and frames larger than it are read past it, straight into the
// frame's buffer.
const readBuffer = 4 << 10

// maxSunPath is the longest path a unix socket address holds.
const maxSunPath = 107

// killTimeout bounds the kill request and the wait for the exit report
// after an exec is cancelled.
const killTimeout = 10 * time.Second

// conn is one control connection, watched for init's liveness until it
// is closed.
type conn struct {
	net.Conn
	r   *bufio.Reader
	buf []byte

	c     *Client
	mu    sync.Mutex
	timer *time.Timer // the next liveness check; nil once closed
	idle  bool        // in the pool: no liveness checks
	dead  error       // set when init did not answer a check

	// keep is set on a keep-alive connection; pending until init
	// answered the keep-alive request; reused once a request sent on it
	// that init closes without answering did not run (see exchange).
	keep, pending, reused bool
}

// dial connects to init and starts watching its liveness. Failing to
// connect is ErrUnavailable; not connecting within DialTimeout is
// ErrUnresponsive.
func (c *Client) dial(ctx context.Context) (*conn, error) {
	nc, err := c.connect(ctx, "connect")
	if err != nil {
		return nil, err
	}
	cn := &conn{Conn: nc, r: bufio.NewReaderSize(nc, readBuffer), c: c}
	cn.timer = time.AfterFunc(LivenessAfter, cn.check)
	return cn, nil
}

// check pings init over a connection of its own; when init does not
// answer, it fails the blocked I/O of cn. Else it schedules the next
// check.
func (cn *conn) check() {
	ctx, cancel := context.WithTimeout(context.Background(), PingTimeout)
	err := cn.c.ping(ctx)
	cancel()
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.timer == nil || cn.idle {
		return // closed or pooled meanwhile
	}
	if errors.Is(err, errdefs.ErrUnresponsive) {
		cn.dead = err
		cn.Conn.SetDeadline(time.Unix(1, 0))
		return
	}
	// Any other failure (init gone) shows on cn itself.
	cn.timer.Reset(LivenessInterval)
}

// Close stops the liveness checks and closes the connection.
func (cn *conn) Close() error {
	cn.mu.Lock()
	if cn.timer != nil {
		cn.timer.Stop()
		cn.timer = nil
	}
	cn.mu.Unlock()
	return cn.Conn.Close()
}

// unwatch stops the liveness checks of a connection going idle; false
// when it is closed.
func (cn *conn) unwatch() bool {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.timer == nil {
		return false
	}
	cn.timer.Stop()
	cn.idle = true
	return true
}

// watch starts the liveness checks of a connection taken from the pool.
func (cn *conn) watch() {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	cn.idle = false
	cn.timer.Reset(LivenessAfter)
}

// connError is the error of a long-lived connection that ended:
// ErrUnresponsive when a liveness check found init unresponsive, else
// ErrUnavailable with msg.
func connError(cn *conn, msg string, err error) error {
	if dead := cn.deadErr(); dead != nil {
		return fmt.Errorf("%s: %w", msg, dead)
	}
	return errdefs.Wrap(errdefs.ErrUnavailable, err, "%s", msg)
}

// deadErr is the error of a check that found init unresponsive, or nil.
func (cn *conn) deadErr() error {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.dead
}

// ping sends one ping on a connection of its own, unwatched: ctx's
// deadline bounds the dial and the answer, and missing it is
// ErrUnresponsive.
func (c *Client) ping(ctx context.Context) error {
	nc, err := c.connect(ctx, "ping")
	if err != nil {
		return err
	}
	defer nc.Close()
	if d, ok := ctx.Deadline(); ok {
		nc.SetDeadline(d)
	}
	cn := &conn{Conn: nc, r: bufio.NewReaderSize(nc, 512)}
	err = initproto.WriteJSON(cn, initproto.MsgPing, nil)
	if err == nil {
		_, _, err = cn.read()
	}
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return c.unresponsive("liveness check", err)
		}
		return errdefs.Wrap(errdefs.ErrUnavailable, err, "ping: connection to jail init failed")
	}
	return nil
}

// connect opens a connection to init's channel within DialTimeout.
func (c *Client) connect(ctx context.Context, op string) (net.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, DialTimeout)
	defer cancel()
	nc, err := c.dialer(dctx)
	if err != nil {
		if ctx.Err() != nil {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) && op == "ping" {
				return nil, c.unresponsive(op, err)
			}
			return nil, ctx.Err()
		}
		var ne net.Error
		if dctx.Err() != nil || errors.As(err, &ne) && ne.Timeout() {
			return nil, c.unresponsive(op, err)
		}
		return nil, err
	}
	return nc, nil
}

// read reads one frame; the payload is valid until the next read.
func (cn *conn) read() (initproto.MsgType, []byte, error) {
	t, p, err := initproto.ReadFrame(cn.r, cn.buf)
	if err == nil && cap(p) > cap(cn.buf) {
		cn.buf = p[:0]
	}
	return t, p, err
}

// guard makes blocked I/O on cn fail when ctx is done; the returned stop
// function reports whether ctx fired.
func guard(ctx context.Context, cn *conn) (stop func() bool) {
	s := context.AfterFunc(ctx, func() { cn.SetDeadline(time.Unix(1, 0)) })
	return func() bool { return !s() && ctx.Err() != nil }
}

// ioError converts a failure of the connection itself: ctx's error when
// ctx is done, ErrUnresponsive when init did not answer (a liveness check
// or a read deadline), else ErrUnavailable.
func ioError(ctx context.Context, cn *conn, op string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if dead := cn.deadErr(); dead != nil {
		return fmt.Errorf("%s: %w", op, dead)
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return cn.c.unresponsive(op, err)
	}
	return errdefs.Wrap(errdefs.ErrUnavailable, err, "%s: connection to jail init failed", op)
}

// remoteError maps an error reported by init to its errdefs kind.
func remoteError(e *initproto.Error) error {
	switch e.Kind {
	case initproto.KindNotFound:
		return errdefs.New(errdefs.ErrNotFound, "%s", e.Message)
	case initproto.KindForbidden:
		return errdefs.New(errdefs.ErrForbidden, "%s", e.Message)
	case initproto.KindBlocked:
		return errdefs.New(errdefs.ErrForbidden, "path %q is blocked by the jail's policy", e.Path)
	case initproto.KindConflict:
		return errdefs.New(errdefs.ErrConflict, "%s", e.Message)
	case initproto.KindUnprocessable:
		return errdefs.New(errdefs.ErrUnprocessable, "%s", e.Message)
	case initproto.KindInvalid:
		return errdefs.New(errdefs.ErrInvalid, "%s", e.Message)
	case initproto.KindNoSpace:
		return errdefs.New(errdefs.ErrTooLarge, "no space left in the jail's disk (%s)", e.Message)
	case initproto.KindNotImplemented:
		return errdefs.New(errdefs.ErrNotImplemented, "%s", e.Message)
	}
	return fmt.Errorf("jail init: %s", e.Message)
}

// decodeError decodes an Error frame into the mapped error.
func decodeError(payload []byte) error {
	var e initproto.Error
	if err := initproto.Decode(initproto.MsgError, payload, &e); err != nil {
		return fmt.Errorf("jail init: %w", err)
	}
	return remoteError(&e)
}

// unexpected is the error of a frame that does not fit the protocol.
func unexpected(op string, t initproto.MsgType) error {
	return fmt.Errorf("%s: jail init sent an unexpected %s frame", op, t)
}

// call runs a request/answer operation: it sends req as a frame of type
// t, and decodes the OK answer into out (unless out is nil).
func (c *Client) call(ctx context.Context, op string, t initproto.MsgType, req, out any) error {
	return c.request(ctx, op, t, req, out, false)
}

// request is call; with awaitClose it also waits, after the answer, until
// init has closed its end of the connection.
func (c *Client) request(ctx context.Context, op string, t initproto.MsgType, req, out any, awaitClose bool) (err error) {
	ctx, span := tracing.Start(ctx, "init."+op)
	defer func() { tracing.End(span, err) }()
	if !awaitClose {
		cn, rt, payload, err := c.start(ctx, op, t, req, false)
		if err != nil {
			return err
		}
		err = answer(op, rt, payload, out)
		if rt == initproto.MsgOK || rt == initproto.MsgError {
			c.put(cn) // init awaits the next request
		} else {
			cn.Close()
		}
		return err
	}
	cn, err := c.dial(ctx)
	if err != nil {
		return err
	}
	defer cn.Close()
	stop := guard(ctx, cn)
	defer stop()
	if err := initproto.WriteJSON(cn, t, req); err != nil {
		return ioError(ctx, cn, op, err)
	}
	if err := readAnswer(ctx, cn, op, out); err != nil || !awaitClose {
		return err
	}
	switch _, err := cn.r.ReadByte(); {
	case errors.Is(err, io.EOF):
		return nil
	case err == nil:
		return errdefs.New(errdefs.ErrUnavailable, "%s: init sent more than its answer", op)
	default:
		return ioError(ctx, cn, op, err)
	}
}

// readAnswer reads an OK (decoded into out) or Error frame.
func readAnswer(ctx context.Context, cn *conn, op string, out any) error {
	rt, payload, err := cn.read()
	if err != nil {
		return ioError(ctx, cn, op, err)
	}
	return answer(op, rt, payload, out)
}

// answer decodes an OK frame into out, or an Error frame into its error.
func answer(op string, rt initproto.MsgType, payload []byte, out any) error {
	switch rt {
	case initproto.MsgOK:
		if out == nil || len(payload) == 0 {
			return nil
		}
		return initproto.Decode(rt, payload, out)
	case initproto.MsgError:
		return decodeError(payload)
	}
	return unexpected(op, rt)
}

// checkPath validates a jail path before it is sent: absolute and without
// NUL bytes.
func checkPath(field, p string) error {
	if strings.IndexByte(p, 0) >= 0 {
		return errdefs.Invalidf("%s %q contains a NUL byte", field, p)
	}
	if !strings.HasPrefix(p, "/") {
		return errdefs.Invalidf("%s %q is not an absolute jail path", field, p)
	}
	return nil
}

// Ping checks that init answers. A missing or refusing socket is
// ErrUnavailable.
func (c *Client) Ping(ctx context.Context) error {
	return c.call(ctx, "ping", initproto.MsgPing, nil, nil)
}

// Signal sends a signal (a name such as "SIGTERM" or a number) to the
// running command with in-jail pid. An unknown pid is ErrNotFound.
func (c *Client) Signal(ctx context.Context, pid int, signal string) error {
	return c.call(ctx, "signal", initproto.MsgSignal, initproto.SignalRequest{Pid: pid, Signal: signal}, nil)
}

// Kill kills the running command with in-jail pid and all its
// descendants; it returns once the kill is requested (the command's Exec
// then reports SIGKILL). An unknown pid is ErrNotFound.
func (c *Client) Kill(ctx context.Context, pid int) error {
	return c.call(ctx, "kill", initproto.MsgKill, initproto.KillRequest{Pid: pid}, nil)
}

// SetIdleShims empties init's pool of idle shims (idle false), returning
// once they have exited, or starts filling it again (idle true). An init
// that predates the request answers ErrInvalid.
func (c *Client) SetIdleShims(ctx context.Context, idle bool) error {
	return c.call(ctx, "shims", initproto.MsgShims, initproto.ShimsRequest{Idle: idle}, nil)
}

// ReadyForCheckpoint empties init's pool of idle shims and returns once
// init has seen every other control connection close and has closed this
// one, so that none is left open in the jail for a checkpoint to trip on;
// or, after a short wait, with how many are still open (an attached
// terminal, a running command's stream). The answer also counts the
// jail's terminal sessions.
func (c *Client) ReadyForCheckpoint(ctx context.Context) (initproto.ShimsAnswer, error) {
	var ans initproto.ShimsAnswer
	err := c.request(ctx, "shims", initproto.MsgShims, initproto.ShimsRequest{Checkpoint: true}, &ans, true)
	return ans, err
}

// List describes the running commands, ordered by pid.
func (c *Client) List(ctx context.Context) ([]initproto.ProcessInfo, error) {
	var out []initproto.ProcessInfo
	if err := c.call(ctx, "list", initproto.MsgList, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// errNoExit is reported when init closes an exec connection without an
// exit report.
var errNoExit = errors.New("connection closed before the command's exit was reported")
