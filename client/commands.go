package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"sync"

	"github.com/coder/websocket"
)

// CommandOptions start a command in the background (WS
// /jails/{id}/commands/ws).
type CommandOptions struct {
	Cmd       []string
	Env       map[string]string
	Cwd, User string
	TimeoutMs int64
	// Stdin gives the command a stdin fed by Command.Write.
	Stdin bool
	// Detach lets the command outlive the connection; AttachCommand then
	// attaches to it again by its pid.
	Detach bool
}

// CommandExit is how a command ended.
type CommandExit struct {
	Code     int    `json:"code"`
	Signal   string `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
}

// commandMessage is a control message of the command WebSocket.
type commandMessage struct {
	Type     string    `json:"type"`
	Pid      int       `json:"pid,omitempty"`
	Code     *int      `json:"code,omitempty"`
	Signal   string    `json:"signal,omitempty"`
	TimedOut bool      `json:"timed_out,omitempty"`
	Error    *APIError `json:"error,omitempty"`
}

// Command is a WebSocket attached to a command in a jail. Next is for one
// goroutine; Write, CloseStdin, Signal and Close may be used from any.
type Command struct {
	conn *websocket.Conn
	pid  int
	wmu  sync.Mutex
	exit *CommandExit
}

// Command starts opts.Cmd in the running jail ref; the returned
// attachment delivers its output. ctx bounds the opening only. Errors
// answered before the upgrade are *APIError.
func (c *Client) Command(ctx context.Context, ref string, opts CommandOptions) (*Command, error) {
	q := url.Values{}
	for _, a := range opts.Cmd {
		q.Add("cmd", a)
	}
	for k, v := range opts.Env {
		q.Add("env", k+"="+v)
	}
	if opts.Cwd != "" {
		q.Set("cwd", opts.Cwd)
	}
	if opts.User != "" {
		q.Set("user", opts.User)
	}
	if opts.TimeoutMs > 0 {
		q.Set("timeout_ms", strconv.FormatInt(opts.TimeoutMs, 10))
	}
	if opts.Stdin {
		q.Set("stdin", "true")
	}
	if opts.Detach {
		q.Set("detach", "true")
	}
	return c.dialCommand(ctx, ref, q)
}

// AttachCommand attaches to the detached command pid of jail ref: its
// output from now on, then its exit.
func (c *Client) AttachCommand(ctx context.Context, ref string, pid int) (*Command, error) {
	return c.dialCommand(ctx, ref, url.Values{"pid": {strconv.Itoa(pid)}})
}

func (c *Client) dialCommand(ctx context.Context, ref string, q url.Values) (*Command, error) {
	conn, err := c.dialWS(ctx, jailURL(ref)+"/commands/ws?"+q.Encode(), "command")
	if err != nil {
		return nil, err
	}
	typ, data, err := conn.Read(ctx)
	if err != nil {
		conn.CloseNow()
		return nil, fmt.Errorf("command: reading the started message: %w", err)
	}
	var m commandMessage
	if typ != websocket.MessageText || json.Unmarshal(data, &m) != nil || m.Type != "started" {
		conn.CloseNow()
		return nil, fmt.Errorf("command: the daemon did not start with a started message (got %q)", data)
	}
	return &Command{conn: conn, pid: m.Pid}, nil
}

// Pid is the command's pid in the jail (0 when its executable could not
// be run: it then prints why and exits with 126 or 127).
func (cm *Command) Pid() int { return cm.pid }

// Stream numbers of Command.Next.
const (
	Stdout = 1
	Stderr = 2
)

// Next returns the next chunk of output and its stream (Stdout or
// Stderr). After the command exits it returns io.EOF, and Exit has the
// status; when the connection ends otherwise, an error. Input or a
// control message the daemon refused comes as an *APIError between
// chunks (409 when the command closed its input or ended), and the
// stream goes on.
func (cm *Command) Next(ctx context.Context) (stream int, data []byte, err error) {
	for {
		typ, b, err := cm.conn.Read(ctx)
		if err != nil {
			if cm.exit == nil {
				if st := websocket.CloseStatus(err); st >= closeStatusExitBase && st < closeStatusExitBase+256 {
					cm.exit = &CommandExit{Code: int(st) - closeStatusExitBase}
				}
			}
			if cm.exit != nil {
				return 0, nil, io.EOF
			}
			return 0, nil, fmt.Errorf("command: connection ended without an exit: %w", err)
		}
		if typ == websocket.MessageBinary {
			if len(b) == 0 {
				continue
			}
			return int(b[0]), b[1:], nil
		}
		var m commandMessage
		if json.Unmarshal(b, &m) != nil {
			continue
		}
		switch m.Type {
		case "exit":
			ex := CommandExit{Signal: m.Signal, TimedOut: m.TimedOut}
			if m.Code != nil {
				ex.Code = *m.Code
			}
			cm.exit = &ex
		case "error":
			if m.Error != nil {
				m.Error.Status = statusOfCode(m.Error.Code)
				return 0, nil, m.Error
			}
		}
	}
}

// Exit returns the exit status once Next returned io.EOF.
func (cm *Command) Exit() (CommandExit, bool) {
	if cm.exit == nil {
		return CommandExit{}, false
	}
	return *cm.exit, true
}

// Write sends p to the command's stdin.
func (cm *Command) Write(p []byte) (int, error) {
	cm.wmu.Lock()
	defer cm.wmu.Unlock()
	if err := cm.conn.Write(context.Background(), websocket.MessageBinary, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (cm *Command) control(ctx context.Context, m commandMessage) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	cm.wmu.Lock()
	defer cm.wmu.Unlock()
	return cm.conn.Write(ctx, websocket.MessageText, b)
}

// CloseStdin ends the command's stdin.
func (cm *Command) CloseStdin(ctx context.Context) error {
	return cm.control(ctx, commandMessage{Type: "close_stdin"})
}

// Signal sends a signal ("SIGTERM", "TERM" or a number) to the command.
func (cm *Command) Signal(ctx context.Context, sig string) error {
	return cm.control(ctx, commandMessage{Type: "signal", Signal: sig})
}

// Close ends the attachment: a detached command keeps running, another
// is killed.
func (cm *Command) Close() error {
	return cm.conn.Close(websocket.StatusNormalClosure, "closed")
}
