package initclient

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/tracing"
)

// Exec runs a command in the jail and returns how it ended.
//
// req.Stdin is set by Exec: a nil stdin gives the command an empty stdin,
// otherwise stdin is streamed until it returns EOF (or an error), then the
// command's stdin is closed. stdout and stderr (nil discards) receive
// chunks as the command produces them, from Exec's goroutine. An error
// from either writer kills the command and all its descendants, and Exec
// returns that error once the exit is reported. When ctx is done, the
// command and all its descendants are killed and Exec returns ctx.Err()
// (with the exit status when init reported it in time).
//
// Init-side failures map to errdefs kinds: an unknown user is ErrInvalid,
// an unusable cwd ErrUnprocessable. An executable that is not found or
// not executable is not an error: the command exits with 127 or 126
// after a message on stderr. Exec returns without waiting for a stdin
// Read that is still blocked.
func (c *Client) Exec(ctx context.Context, req initproto.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (st initproto.ExitStatus, err error) {
	ctx, span := tracing.Start(ctx, "init.exec")
	defer func() { tracing.End(span, err) }()
	if len(req.Argv) == 0 {
		return initproto.ExitStatus{}, errdefs.Invalidf("argv is empty")
	}
	if req.Cwd != "" {
		if err := checkPath("cwd", req.Cwd); err != nil {
			return initproto.ExitStatus{}, err
		}
	}
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	req.Stdin = stdin != nil
	// Without a stdin stream nothing is sent while the command runs: init
	// need not announce its start nor wait for a release.
	req.Brief = !req.Stdin && !req.Detach && req.PTY == nil
	// Until the pid is known, cancelling fails the connection's I/O and
	// closes it, which init treats as a cancellation.
	cn, t, payload, err := c.start(ctx, "exec", initproto.MsgExec, req, req.Stdin)
	if err != nil {
		return initproto.ExitStatus{}, err
	}
	reuse := false
	defer func() {
		if reuse {
			c.put(cn)
		} else {
			cn.Close()
		}
	}()
	// A brief exec's first frame is already its output or exit (an init
	// that predates brief execs answers Started all the same).
	var started initproto.Started
	brief := false
	switch t {
	case initproto.MsgStarted:
		if err := initproto.Decode(t, payload, &started); err != nil {
			return initproto.ExitStatus{}, err
		}
	case initproto.MsgError:
		reuse = true // init awaits the next request
		return initproto.ExitStatus{}, decodeError(payload)
	case initproto.MsgStdout, initproto.MsgStderr, initproto.MsgExit:
		if !req.Brief {
			return initproto.ExitStatus{}, unexpected("exec", t)
		}
		brief = true
	default:
		return initproto.ExitStatus{}, unexpected("exec", t)
	}

	if stdin != nil {
		go sendStdin(cn, stdin)
	}
	var writeErr error
	var killOnce sync.Once
	kill := func() {
		killOnce.Do(func() {
			// Bound the wait for the exit report, then ask init to kill the
			// tree over a second connection: this one may be blocked behind
			// stdin the command does not read.
			cn.SetReadDeadline(time.Now().Add(killTimeout))
			if brief {
				// The pid is not known yet: half-closing the connection
				// has init kill the tree and still send the exit.
				if hc, ok := cn.Conn.(interface{ CloseWrite() error }); !ok || hc.CloseWrite() != nil {
					cn.Close()
				}
				return
			}
			go func() {
				kctx, cancel := context.WithTimeout(context.Background(), killTimeout)
				defer cancel()
				if err := c.Kill(kctx, started.Pid); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
					cn.Close() // init kills the tree when the connection drops
				}
			}()
		})
	}
	stop := context.AfterFunc(ctx, kill)
	defer stop()
	// release ends the exec on a keep-alive connection, which then carries
	// the next call, unless the exec was cut short.
	release := func() {
		if cn.keep && writeErr == nil && stop() {
			reuse = brief || initproto.WriteFrame(cn, initproto.MsgRelease, nil) == nil
		}
	}

	for first := brief; ; first = false {
		if !first {
			t, payload, err = cn.read()
		}
		if err != nil {
			if ctx.Err() != nil {
				return initproto.ExitStatus{Pid: started.Pid}, ctx.Err()
			}
			if writeErr != nil {
				return initproto.ExitStatus{Pid: started.Pid}, writeErr
			}
			if errors.Is(err, io.EOF) {
				err = errNoExit
			}
			return initproto.ExitStatus{Pid: started.Pid}, ioError(ctx, cn, "exec", err)
		}
		switch t {
		case initproto.MsgStdout, initproto.MsgStderr:
			if writeErr != nil {
				continue
			}
			w := stdout
			if t == initproto.MsgStderr {
				w = stderr
			}
			if _, err := w.Write(payload); err != nil {
				writeErr = err
				kill()
			}
		case initproto.MsgExit:
			var st initproto.ExitStatus
			if err := initproto.Decode(t, payload, &st); err != nil {
				return initproto.ExitStatus{Pid: started.Pid}, err
			}
			if ctx.Err() != nil {
				return st, ctx.Err()
			}
			release()
			return st, writeErr
		case initproto.MsgError:
			return initproto.ExitStatus{Pid: started.Pid}, decodeError(payload)
		default:
			return initproto.ExitStatus{Pid: started.Pid}, unexpected("exec", t)
		}
	}
}

// sendStdin streams r as stdin frames, then closes the command's stdin.
// It stops at the first write error (the exec has ended).
func sendStdin(cn *conn, r io.Reader) {
	buf := make([]byte, initproto.ChunkSize)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if werr := initproto.WriteFrame(cn, initproto.MsgStdin, buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			_ = initproto.WriteFrame(cn, initproto.MsgStdinClose, nil)
			return
		}
	}
}
