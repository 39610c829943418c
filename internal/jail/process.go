package jail

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/netpolicy"
)

// Commands that outlive the request that started them (the E2B surface's
// processes): a detached command, or a terminal session, each a child of
// the jail's init like any exec, observed and (a terminal) recorded.

// StartProcess starts req in the running jail ref as a command that keeps
// running when the returned attachment is closed: a terminal session
// (pty's Rows, Cols and Term) when pty is set, else a detached command,
// with a stdin to feed when stdin is set. req.TimeoutMs kills it
// (req.Stdin is ignored).
func (m *Manager) StartProcess(ctx context.Context, ref string, req model.ExecRequest, stdin bool, pty *model.TerminalRequest) (*initclient.Process, error) {
	if err := validateExec(&req); err != nil {
		return nil, err
	}
	inst, c, err := m.running(ctx, ref)
	if err != nil {
		return nil, err
	}
	user, err := m.userFor(inst, req.User)
	if err != nil {
		return nil, err
	}
	ir := initproto.ExecRequest{Argv: req.Cmd, Env: envList(req.Env), Cwd: req.Cwd, User: user, TimeoutMs: req.TimeoutMs, Stdin: stdin}
	if pty != nil {
		if err := checkTermSize("rows", pty.Rows); err != nil {
			return nil, err
		}
		if err := checkTermSize("cols", pty.Cols); err != nil {
			return nil, err
		}
		ir.Stdin = false
		ir.PTY = &initproto.PTYOptions{Rows: uint16(pty.Rows), Cols: uint16(pty.Cols), Term: pty.Term, RecordInput: inst.Config.Recording.Input}
	}
	return c.StartProcess(ctx, ir)
}

// AttachProcess attaches to a command started by StartProcess, by its
// pid: its output from now on, then its exit (see initclient.AttachProcess).
func (m *Manager) AttachProcess(ctx context.Context, ref string, pid int) (*initclient.Process, error) {
	_, c, err := m.running(ctx, ref)
	if err != nil {
		return nil, err
	}
	return c.AttachProcess(ctx, pid, true)
}

// ProcessInput writes to the stdin of a command started by StartProcess
// (types into its terminal), then with close ends its stdin.
func (m *Manager) ProcessInput(ctx context.Context, ref string, pid int, data []byte, close bool) error {
	_, c, err := m.running(ctx, ref)
	if err != nil {
		return err
	}
	return c.Input(ctx, pid, data, close)
}

// ResizeProcess resizes the terminal of a command started by StartProcess
// with a terminal.
func (m *Manager) ResizeProcess(ctx context.Context, ref string, pid, rows, cols int) error {
	if rows < 1 || cols < 1 || rows > maxTermSize || cols > maxTermSize {
		return invalidSize(rows, cols)
	}
	_, c, err := m.running(ctx, ref)
	if err != nil {
		return err
	}
	return c.SetSize(ctx, pid, uint16(rows), uint16(cols))
}

// SignalProcess sends sig (a name or number) to the running command pid
// of the jail (ErrNotFound when init runs no command with that pid).
func (m *Manager) SignalProcess(ctx context.Context, ref string, pid int, sig string) error {
	if !validSignal(sig) {
		return invalidSignal(sig)
	}
	_, c, err := m.running(ctx, ref)
	if err != nil {
		return err
	}
	return c.Signal(ctx, pid, sig)
}

// Commands lists the commands init runs in the jail (execs, detached
// commands and terminal sessions), by pid.
func (m *Manager) Commands(ctx context.Context, ref string) ([]initproto.ProcessInfo, error) {
	_, c, err := m.running(ctx, ref)
	if err != nil {
		return nil, err
	}
	return c.List(ctx)
}

// WatchDir watches a directory of the running jail (and its
// subdirectories when recursive); the caller closes the watch.
func (m *Manager) WatchDir(ctx context.Context, ref, p string, recursive bool) (*initclient.Watch, error) {
	if err := checkPath(p); err != nil {
		return nil, err
	}
	_, c, err := m.runningPath(ctx, ref, p)
	if err != nil {
		return nil, err
	}
	return c.Watch(ctx, p, recursive)
}

// DialPort connects to TCP port of the running jail's loopback from inside
// the jail (through its init, at every isolation level): what previews and
// forwarded sandbox ports reach. The connection shows in the jail's
// network record when it closes (dir ingress, via preview, its bytes each
// way and its duration).
func (m *Manager) DialPort(ctx context.Context, ref string, port int) (net.Conn, error) {
	inst, c, err := m.running(ctx, ref)
	if err != nil {
		return nil, err
	}
	pc, err := c.DialPort(ctx, port)
	if err != nil {
		return nil, err
	}
	return &ingressConn{Conn: pc, start: time.Now(), record: func(ev netpolicy.ConnEvent) { m.recordNet(inst.ID, ev) }}, nil
}

// ingressConn is a connection into a jail that records itself once closed.
type ingressConn struct {
	net.Conn
	start   time.Time
	in, out atomic.Int64 // bytes written into the jail, read from it
	once    sync.Once
	record  func(netpolicy.ConnEvent)
}

func (c *ingressConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.out.Add(int64(n))
	return n, err
}

func (c *ingressConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.in.Add(int64(n))
	return n, err
}

func (c *ingressConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.record(netpolicy.ConnEvent{
			Time: c.start, Dir: "ingress", Proto: "tcp", Via: netpolicy.ViaPreview, Dst: c.RemoteAddr().String(),
			Verdict: netpolicy.VerdictAllow, BytesIn: c.in.Load(), BytesOut: c.out.Load(), DurNS: time.Since(c.start).Nanoseconds(),
		})
	})
	return err
}

// Rename moves a path of the running jail (replacing a file at to) and
// describes it at its new place.
func (m *Manager) Rename(ctx context.Context, ref, from, to string) (*model.FileInfo, error) {
	for _, p := range []string{from, to} {
		if err := checkPath(p); err != nil {
			return nil, err
		}
		if p == "/" {
			return nil, invalidRoot()
		}
	}
	_, c, err := m.runningPath(ctx, ref, from)
	if err != nil {
		return nil, err
	}
	if _, _, err := m.runningPath(ctx, ref, to); err != nil {
		return nil, err
	}
	if err := c.Rename(ctx, from, to); err != nil {
		return nil, err
	}
	fi, err := c.Stat(ctx, to)
	if err != nil {
		return nil, err
	}
	out := fileInfo(fi)
	return &out, nil
}

func invalidSize(rows, cols int) error {
	return errdefs.Invalidf("size: rows %d and cols %d must be between 1 and %d", rows, cols, maxTermSize)
}

func invalidSignal(sig string) error {
	return errdefs.Invalidf("signal: %q is not a signal name or number", sig)
}

func invalidRoot() error { return errdefs.Forbiddenf("refusing to move the jail's root") }
