package initclient

import (
	"context"
	"errors"
	"io"
	"net"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initproto"
)

// Process is one connection attached to a detached command or a terminal
// session (see initproto's package documentation): the command runs on
// whether or not anything is attached. Next is for one reader goroutine;
// Close may be called from any goroutine.
type Process struct {
	cn      *conn
	started initproto.Started

	exit    initproto.ExitStatus
	exited  bool
	readErr error
}

// StartProcess starts req as a command that outlives the connection: a
// detached command, or a terminal session when req.PTY is set. Errors are
// mapped as Exec's; an executable that cannot be run is a command that
// prints why and exits with 127 or 126 (Started().Pid is then 0).
// Cancelling ctx only matters until the command has started; Close
// detaches without ending it.
func (c *Client) StartProcess(ctx context.Context, req initproto.ExecRequest) (*Process, error) {
	if req.Cwd != "" {
		if err := checkPath("cwd", req.Cwd); err != nil {
			return nil, err
		}
	}
	req.Detach = true
	return c.openProcess(ctx, "start", initproto.MsgExec, req)
}

// AttachProcess attaches to the detached command or terminal session
// whose command has pid: Next returns its output from now on (a session's
// recent output first unless noScrollback). One that ended less than
// initproto.EndedRetention ago gives its exit at once; otherwise an
// unknown pid is ErrNotFound.
func (c *Client) AttachProcess(ctx context.Context, pid int, noScrollback bool) (*Process, error) {
	if pid <= 0 {
		return nil, errdefs.Invalidf("pid: %d is not a process id", pid)
	}
	return c.openProcess(ctx, "attach", initproto.MsgAttach, initproto.AttachRequest{Pid: pid, NoScrollback: noScrollback})
}

// open sends a request that answers Started and returns the connection.
func (c *Client) open(ctx context.Context, op string, t initproto.MsgType, req any) (*conn, initproto.Started, error) {
	var st initproto.Started
	cn, err := c.dial(ctx)
	if err != nil {
		return nil, st, err
	}
	early := context.AfterFunc(ctx, func() { cn.Close() })
	fail := func(err error) (*conn, initproto.Started, error) {
		early()
		cn.Close()
		if ctx.Err() != nil {
			return nil, st, ctx.Err()
		}
		return nil, st, err
	}
	if err := initproto.WriteJSON(cn, t, req); err != nil {
		return fail(ioError(ctx, cn, op, err))
	}
	rt, payload, err := cn.read()
	if err != nil {
		return fail(ioError(ctx, cn, op, err))
	}
	if !early() {
		cn.Close()
		return nil, st, ctx.Err()
	}
	switch rt {
	case initproto.MsgStarted:
		if err := initproto.Decode(rt, payload, &st); err != nil {
			cn.Close()
			return nil, st, err
		}
		return cn, st, nil
	case initproto.MsgError:
		cn.Close()
		return nil, st, decodeError(payload)
	}
	cn.Close()
	return nil, st, unexpected(op, rt)
}

func (c *Client) openProcess(ctx context.Context, op string, t initproto.MsgType, req any) (*Process, error) {
	cn, st, err := c.open(ctx, op, t, req)
	if err != nil {
		return nil, err
	}
	return &Process{cn: cn, started: st}, nil
}

// Started is init's answer: the command's pid (0 when it could not be
// started) and, for a terminal session, the session.
func (p *Process) Started() initproto.Started { return p.started }

// Next returns the next chunk of output and its stream (MsgStdout or
// MsgStderr; a terminal's output is MsgStdout); the chunk is valid until
// the next call. After the command's exit it returns io.EOF (Exit then
// has the status); a connection that ends without an exit report returns
// ErrUnavailable.
func (p *Process) Next() (initproto.MsgType, []byte, error) {
	if p.readErr != nil {
		return 0, nil, p.readErr
	}
	rt, payload, err := p.cn.read()
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = errNoExit
		}
		p.readErr = connError(p.cn, "process: connection to jail init ended", err)
		return 0, nil, p.readErr
	}
	switch rt {
	case initproto.MsgStdout, initproto.MsgStderr:
		return rt, payload, nil
	case initproto.MsgExit:
		if err := initproto.Decode(rt, payload, &p.exit); err != nil {
			p.readErr = err
			return 0, nil, err
		}
		p.exited = true
		p.readErr = io.EOF
		return 0, nil, io.EOF
	case initproto.MsgError:
		p.readErr = decodeError(payload)
	default:
		p.readErr = unexpected("process", rt)
	}
	return 0, nil, p.readErr
}

// Exit returns the command's exit status once Next returned io.EOF.
func (p *Process) Exit() (initproto.ExitStatus, bool) { return p.exit, p.exited }

// Close detaches: the command keeps running. A blocked Next returns.
func (p *Process) Close() error { return p.cn.Close() }

// Input writes data to the stdin of the detached command pid, or types it
// into the terminal session whose command is pid, then (with close) ends
// the command's stdin. A command started without stdin, or one that does
// not read for initproto.MaxInputWait, is ErrUnprocessable; an unknown
// pid ErrNotFound.
func (c *Client) Input(ctx context.Context, pid int, data []byte, close bool) error {
	for len(data) > initproto.MaxPayload/2 {
		chunk := data[:initproto.MaxPayload/2]
		if err := c.call(ctx, "input", initproto.MsgInput, initproto.InputRequest{Pid: pid, Data: chunk}, nil); err != nil {
			return err
		}
		data = data[len(chunk):]
	}
	return c.call(ctx, "input", initproto.MsgInput, initproto.InputRequest{Pid: pid, Data: data, Close: close}, nil)
}

// SetSize resizes the terminal session whose command is pid.
func (c *Client) SetSize(ctx context.Context, pid int, rows, cols uint16) error {
	if rows == 0 || cols == 0 {
		return errdefs.Invalidf("size: rows (%d) and cols (%d) must be positive", rows, cols)
	}
	return c.call(ctx, "set-size", initproto.MsgSetSize, initproto.SizeRequest{Pid: pid, Rows: rows, Cols: cols}, nil)
}

// Watch is a watch of a jail directory; Next is for one goroutine, Close
// for any.
type Watch struct {
	cn *conn
}

// Watch watches the jail directory path (and its subdirectories when
// recursive). A missing path is ErrNotFound, a file ErrUnprocessable.
func (c *Client) Watch(ctx context.Context, path string, recursive bool) (*Watch, error) {
	if err := checkPath("path", path); err != nil {
		return nil, err
	}
	cn, err := c.openStream(ctx, "watch", initproto.MsgWatch, initproto.WatchRequest{Path: path, Recursive: recursive}, nil)
	if err != nil {
		return nil, err
	}
	return &Watch{cn: cn}, nil
}

// openStream sends a request answered by one MsgOK (decoded into out,
// when not nil) on a connection of its own, which then carries the
// operation's stream, and returns that connection.
func (c *Client) openStream(ctx context.Context, op string, t initproto.MsgType, req, out any) (*conn, error) {
	cn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	stop := guard(ctx, cn)
	err = initproto.WriteJSON(cn, t, req)
	if err == nil {
		err = readAnswer(ctx, cn, op, out)
	} else {
		err = ioError(ctx, cn, op, err)
	}
	if fired := stop(); err != nil || fired {
		cn.Close()
		if err == nil {
			err = ctx.Err()
		}
		return nil, err
	}
	return cn, nil
}

// DialPort connects to TCP port of the jail's loopback (127.0.0.1, else
// ::1) from inside the jail, through init, whatever the jail's isolation
// level: the connection carries that TCP connection's bytes. Nothing
// listening there is ErrNotFound. The connection's RemoteAddr is the
// address init connected to. A checkpoint's preparation closes the
// connection.
func (c *Client) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, errdefs.Invalidf("port %d is not a TCP port (1-65535)", port)
	}
	var ans initproto.DialAnswer
	cn, err := c.openStream(ctx, "dial", initproto.MsgDial, initproto.DialRequest{Port: port}, &ans)
	if err != nil {
		return nil, err
	}
	return portConn{cn, portAddr(ans.Addr)}, nil
}

// portConn is a connection to a port of the jail: what init sends after
// its answer may already be in the connection's reader.
type portConn struct {
	*conn
	remote portAddr
}

func (p portConn) Read(b []byte) (int, error) { return p.r.Read(b) }

// RemoteAddr is the address in the jail that init connected to.
func (p portConn) RemoteAddr() net.Addr { return p.remote }

// portAddr is a TCP address in a jail, as init reported it.
type portAddr string

func (a portAddr) Network() string { return "tcp" }
func (a portAddr) String() string  { return string(a) }

// Next returns the next change. A watch that failed (its directory
// removed, events lost) returns init's error; a closed one ErrUnavailable.
func (w *Watch) Next() (initproto.WatchEvent, error) {
	var ev initproto.WatchEvent
	rt, payload, err := w.cn.read()
	if err != nil {
		return ev, connError(w.cn, "watch: connection to jail init ended", err)
	}
	switch rt {
	case initproto.MsgOK:
		err = initproto.Decode(rt, payload, &ev)
	case initproto.MsgError:
		err = decodeError(payload)
	default:
		err = unexpected("watch", rt)
	}
	return ev, err
}

// Close ends the watch; a blocked Next returns.
func (w *Watch) Close() error { return w.cn.Close() }
