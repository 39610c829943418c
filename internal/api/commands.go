package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/model"
)

// CommandService starts commands that may outlive the request that
// started them, and attaches to them again; *jail.Manager implements it.
type CommandService interface {
	// StartProcess starts req in the running jail as a detached command
	// (with a stdin to feed when stdin is set) and returns the caller's
	// attachment, which it must Close; closing detaches.
	StartProcess(ctx context.Context, ref string, req model.ExecRequest, stdin bool, pty *model.TerminalRequest) (*initclient.Process, error)
	// AttachProcess attaches to the detached command pid: its output from
	// now on, then its exit. ErrNotFound when no such command runs or
	// ended recently.
	AttachProcess(ctx context.Context, ref string, pid int) (*initclient.Process, error)
	// ProcessInput writes data to the command's stdin; close then ends it.
	// ErrConflict when the command closed its stdin or ended (closing the
	// input of one that ended is a no-op); ErrUnprocessable when it does
	// not read the data in time.
	ProcessInput(ctx context.Context, ref string, pid int, data []byte, close bool) error
	// SignalProcess sends the named signal to the command.
	SignalProcess(ctx context.Context, ref string, pid int, sig string) error
}

// WithCommands serves WS /jails/{id}/commands/ws over svc (without it the
// route answers 501).
func WithCommands(svc CommandService) Option { return func(s *server) { s.commands = svc } }

// CommandMessage is a control message of WS /jails/{id}/commands/ws, a
// text frame. Output travels in binary frames whose first byte is the
// stream (1 stdout, 2 stderr); the client's binary frames are the
// command's stdin.
//
// Server to client: first {"type":"started","pid":N}, then
// {"type":"error","error":{...}} for a control message that was refused,
// and {"type":"exit","code":N,"signal":"..."} when the command exits,
// after which the server closes the connection with status 4000+N.
// Client to server: {"type":"close_stdin"} and {"type":"signal",
// "signal":"SIGTERM"}.
type CommandMessage struct {
	// Type is started, exit, error, close_stdin or signal.
	Type string `json:"type"`
	// Pid is the command's pid in the jail (started).
	Pid int `json:"pid,omitempty"`
	// Code is the exit code (exit).
	Code *int `json:"code,omitempty"`
	// Signal names the signal to send, or the one that killed the command.
	Signal string `json:"signal,omitempty"`
	// TimedOut says the command's timeout_ms killed it (exit).
	TimedOut bool `json:"timed_out,omitempty"`
	// Error says why a control message was refused (error).
	Error *ErrorDetail `json:"error,omitempty"`
}

// Stream bytes of the command WebSocket's binary frames.
const (
	CommandStdout byte = 1
	CommandStderr byte = 2
)

// commandRequest decodes the query of WS /jails/{id}/commands/ws: a new
// command (cmd, env, cwd, user, timeout_ms, stdin, detach) or, with pid,
// an attachment to a running detached one.
func commandRequest(r *http.Request) (req model.ExecRequest, pid int, stdin, detach bool, err error) {
	q := r.URL.Query()
	for k := range q {
		switch k {
		case "cmd", "env", "cwd", "user", "timeout_ms", "stdin", "detach", "pid":
		default:
			return req, 0, false, false, errdefs.Invalidf("unknown query parameter %q", k)
		}
	}
	if v := q.Get("pid"); v != "" {
		if len(q) > 1 {
			return req, 0, false, false, errdefs.Invalidf("pid: attaching to a command takes no other parameter")
		}
		pid, err = strconv.Atoi(v)
		if err != nil || pid < 1 {
			return req, 0, false, false, errdefs.Invalidf("pid: %q is not a positive number", v)
		}
		return req, pid, false, false, nil
	}
	req = model.ExecRequest{Cmd: q["cmd"], Cwd: q.Get("cwd"), User: q.Get("user")}
	if len(req.Cmd) == 0 {
		return req, 0, false, false, errdefs.Invalidf("cmd: give the command, one cmd parameter per argument")
	}
	for _, kv := range q["env"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return req, 0, false, false, errdefs.Invalidf("env: %q is not KEY=VALUE", kv)
		}
		if req.Env == nil {
			req.Env = map[string]string{}
		}
		req.Env[k] = v
	}
	if v := q.Get("timeout_ms"); v != "" {
		req.TimeoutMs, err = strconv.ParseInt(v, 10, 64)
		if err != nil || req.TimeoutMs < 0 {
			return req, 0, false, false, errdefs.Invalidf("timeout_ms: %q is not a number of milliseconds", v)
		}
	}
	if stdin, err = boolParam(q, "stdin"); err != nil {
		return req, 0, false, false, err
	}
	if detach, err = boolParam(q, "detach"); err != nil {
		return req, 0, false, false, err
	}
	return req, 0, stdin, detach, nil
}

func (s *server) commandSocket(w http.ResponseWriter, r *http.Request) error {
	if s.commands == nil {
		return errdefs.NotImplementedf("this daemon does not serve background commands")
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		w.Header().Set("Upgrade", "websocket")
		return errdefs.Invalidf("this endpoint is a WebSocket: the request must ask to upgrade (Upgrade: websocket)")
	}
	req, pid, stdin, detach, err := commandRequest(r)
	if err != nil {
		return err
	}
	ref := r.PathValue("id")
	var p *initclient.Process
	if pid != 0 {
		detach = true
		p, err = s.commands.AttachProcess(r.Context(), ref, pid)
	} else {
		p, err = s.commands.StartProcess(r.Context(), ref, req, stdin, nil)
	}
	if err != nil {
		return err
	}
	defer p.Close()
	pid = p.Started().Pid
	// Clients authenticate with the bearer token or an admin key, never
	// with ambient credentials: any origin may connect.
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true, CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return nil // Accept has answered the request
	}
	defer conn.CloseNow()
	conn.SetReadLimit(wsReadLimit)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs := &commandSession{s: s, r: r, conn: conn, ref: ref, pid: pid}
	if err := cs.sendJSON(ctx, CommandMessage{Type: "started", Pid: pid}); err != nil {
		return nil
	}
	clientGone := make(chan struct{})
	go func() {
		defer close(clientGone)
		cs.readClient(ctx)
		// The client went away: stop waiting for output.
		p.Close()
	}()
	exited := cs.forwardOutput(ctx, p)
	if !exited {
		conn.CloseNow()
		<-clientGone
		if !detach && pid != 0 {
			// The command belonged to this connection.
			kctx, kcancel := context.WithTimeout(context.Background(), requestDeadline)
			defer kcancel()
			_ = s.commands.SignalProcess(kctx, ref, pid, "KILL")
		}
	}
	return nil
}

// requestDeadline bounds a call into a jail made on a connection's behalf
// after the connection is gone.
const requestDeadline = 10 * time.Second

// commandSession is one WebSocket attached to a command.
type commandSession struct {
	s    *server
	r    *http.Request
	conn *websocket.Conn
	ref  string
	pid  int
	wmu  sync.Mutex
}

func (cs *commandSession) sendJSON(ctx context.Context, m CommandMessage) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	cs.wmu.Lock()
	defer cs.wmu.Unlock()
	return cs.conn.Write(ctx, websocket.MessageText, b)
}

// forwardOutput sends the command's output; when it exits it sends the
// exit message, closes with 4000+code and reports true. It reports false
// when the connection to the client or to the jail failed first.
func (cs *commandSession) forwardOutput(ctx context.Context, p *initclient.Process) bool {
	frame := make([]byte, 0, 256<<10+1)
	for {
		typ, data, err := p.Next()
		if errors.Is(err, io.EOF) {
			exit, _ := p.Exit()
			code := exit.Code
			if cs.sendJSON(ctx, CommandMessage{Type: "exit", Code: &code, Signal: exit.Signal, TimedOut: exit.TimedOut}) == nil {
				cs.conn.Close(websocket.StatusCode(CloseStatusExitBase+min(max(code, 0), 255)), "exit "+strconv.Itoa(code))
			}
			return true
		}
		if err != nil {
			cs.conn.Close(websocket.StatusInternalError, "the connection to the command failed")
			return false
		}
		stream := CommandStdout
		if typ == initproto.MsgStderr {
			stream = CommandStderr
		}
		frame = append(append(frame[:0], stream), data...)
		cs.wmu.Lock()
		werr := cs.conn.Write(ctx, websocket.MessageBinary, frame)
		cs.wmu.Unlock()
		if werr != nil {
			return false
		}
	}
}

// readClient applies the client's stdin and control messages until it
// closes.
func (cs *commandSession) readClient(ctx context.Context) {
	for {
		typ, data, err := cs.conn.Read(ctx)
		if err != nil {
			return
		}
		if typ == websocket.MessageBinary {
			err = cs.s.commands.ProcessInput(ctx, cs.ref, cs.pid, data, false)
		} else {
			var m CommandMessage
			if jerr := json.Unmarshal(data, &m); jerr != nil {
				err = errdefs.Invalidf("control message: not JSON: %v", jerr)
			} else {
				switch m.Type {
				case "close_stdin":
					err = cs.s.commands.ProcessInput(ctx, cs.ref, cs.pid, nil, true)
				case "signal":
					err = cs.s.commands.SignalProcess(ctx, cs.ref, cs.pid, m.Signal)
				default:
					err = errdefs.Invalidf("control message: unknown type %q (close_stdin or signal)", m.Type)
				}
			}
		}
		if err != nil {
			d := cs.s.errorDetail(cs.r, err)
			_ = cs.sendJSON(ctx, CommandMessage{Type: "error", Error: &d})
		}
	}
}
