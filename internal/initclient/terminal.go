package initclient

import (
	"context"
	"errors"
	"io"
	"sync"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initproto"
)

// Terminal is one connection attached to a terminal session in the jail.
// Next is for one reader goroutine; Input, Resize, Signal and Close may be
// called from any goroutine.
type Terminal struct {
	cn   *conn
	info initproto.SessionInfo

	wmu sync.Mutex // serialises frames sent

	exit    initproto.ExitStatus
	exited  bool
	readErr error
}

// StartTerminal starts req as a terminal session (req.PTY must be set; an
// empty Argv runs the user's login shell) and returns the connection
// attached to it. Errors are mapped as Exec's; an executable that cannot
// be run is a session that prints why and exits with 127 or 126.
// Cancelling ctx only matters until the session has started; Close
// detaches without ending it.
func (c *Client) StartTerminal(ctx context.Context, req initproto.ExecRequest) (*Terminal, error) {
	if req.PTY == nil {
		return nil, errdefs.Invalidf("pty: terminal options are required")
	}
	if req.Cwd != "" {
		if err := checkPath("cwd", req.Cwd); err != nil {
			return nil, err
		}
	}
	req.Stdin = false
	return c.openTerminal(ctx, "terminal", initproto.MsgExec, req)
}

// AttachTerminal attaches to a running session: Next first returns its
// recent output (up to 256 KiB), then the live output. An unknown or
// ended session is ErrNotFound.
func (c *Client) AttachTerminal(ctx context.Context, req initproto.AttachRequest) (*Terminal, error) {
	if req.Session == "" {
		return nil, errdefs.Invalidf("session: an id is required")
	}
	return c.openTerminal(ctx, "attach", initproto.MsgAttach, req)
}

func (c *Client) openTerminal(ctx context.Context, op string, t initproto.MsgType, req any) (*Terminal, error) {
	cn, st, err := c.open(ctx, op, t, req)
	if err != nil {
		return nil, err
	}
	term := &Terminal{cn: cn}
	if st.Session != nil {
		term.info = *st.Session
	} else {
		// The command could not be started: its message and exit follow.
		term.info = initproto.SessionInfo{Pid: st.Pid}
	}
	return term, nil
}

// Session describes the session as it was when the connection attached
// (an empty ID when the command could not be started).
func (t *Terminal) Session() initproto.SessionInfo { return t.info }

// Next returns the next chunk of terminal output; it is valid until the
// next call. After the command's exit it returns io.EOF (Exit then has the
// status); a connection that ends without an exit report returns
// ErrUnavailable.
func (t *Terminal) Next() ([]byte, error) {
	if t.readErr != nil {
		return nil, t.readErr
	}
	for {
		rt, payload, err := t.cn.read()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errNoExit
			}
			t.readErr = connError(t.cn, "terminal: connection to jail init ended", err)
			return nil, t.readErr
		}
		switch rt {
		case initproto.MsgStdout, initproto.MsgStderr:
			return payload, nil
		case initproto.MsgExit:
			if err := initproto.Decode(rt, payload, &t.exit); err != nil {
				t.readErr = err
				return nil, err
			}
			t.exited = true
			t.readErr = io.EOF
			return nil, io.EOF
		case initproto.MsgError:
			t.readErr = decodeError(payload)
			return nil, t.readErr
		default:
			t.readErr = unexpected("terminal", rt)
			return nil, t.readErr
		}
	}
}

// Exit returns the command's exit status once Next returned io.EOF.
func (t *Terminal) Exit() (initproto.ExitStatus, bool) { return t.exit, t.exited }

func (t *Terminal) send(typ initproto.MsgType, payload []byte) error {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	if err := initproto.WriteFrame(t.cn, typ, payload); err != nil {
		return connError(t.cn, "terminal: connection to jail init failed", err)
	}
	return nil
}

func (t *Terminal) sendJSON(typ initproto.MsgType, v any) error {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	if err := initproto.WriteJSON(t.cn, typ, v); err != nil {
		return connError(t.cn, "terminal: connection to jail init failed", err)
	}
	return nil
}

// Input types p into the terminal (ignored by init on a read-only
// attachment). Large inputs are split into frames.
func (t *Terminal) Input(p []byte) error {
	for len(p) > 0 {
		n := min(len(p), initproto.ChunkSize)
		if err := t.send(initproto.MsgStdin, p[:n]); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// Resize sets the terminal's window size; both must be positive.
func (t *Terminal) Resize(rows, cols uint16) error {
	if rows == 0 || cols == 0 {
		return errdefs.Invalidf("resize: rows (%d) and cols (%d) must be positive", rows, cols)
	}
	return t.sendJSON(initproto.MsgResize, initproto.ResizeRequest{Rows: rows, Cols: cols})
}

// Signal sends a signal (a name such as "SIGINT" or a number) to the
// terminal's foreground process group.
func (t *Terminal) Signal(sig string) error {
	return t.sendJSON(initproto.MsgPTYSignal, initproto.SignalRequest{Signal: sig})
}

// Close detaches: the session keeps running. A blocked Next returns.
func (t *Terminal) Close() error { return t.cn.Close() }

// Sessions describes the jail's running terminal sessions, oldest first.
func (c *Client) Sessions(ctx context.Context) ([]initproto.SessionInfo, error) {
	var out []initproto.SessionInfo
	if err := c.call(ctx, "sessions", initproto.MsgSessions, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}
