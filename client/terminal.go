package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/coder/websocket"

	"github.com/agentjail/agentjail/internal/model"
)

// Terminal types, named here for programs outside this module.
type (
	// TerminalSession describes a terminal session of a jail.
	TerminalSession = model.TerminalSession
	// TerminalExit is how a terminal session's command ended.
	TerminalExit = model.TerminalExit
	// Recording describes a terminal session's recording.
	Recording = model.Recording
)

// TerminalOptions open a terminal: a new session running Cmd (default:
// the user's login shell), or, with Session set, an attachment to a
// running one.
type TerminalOptions struct {
	Cmd      []string
	Session  string
	ReadOnly bool
	// Rows and Cols are the window size (0: the daemon's default 24x80).
	Rows, Cols int
	User, Cwd  string
	Term       string
	Env        map[string]string
}

// closeStatusExitBase plus the exit code is the close status of a
// terminal whose command exited.
const closeStatusExitBase = 4000

// Terminal is a WebSocket attached to a terminal session in a jail.
// Read is for one goroutine; Write, Resize, Signal and Close may be used
// from any goroutine.
type Terminal struct {
	conn    *websocket.Conn
	session TerminalSession

	wmu sync.Mutex

	mu     sync.Mutex
	exit   *TerminalExit
	reader io.Reader
	err    error
}

// terminalMessage is a control message (a text frame).
type terminalMessage struct {
	Type    string           `json:"type"`
	Rows    int              `json:"rows,omitempty"`
	Cols    int              `json:"cols,omitempty"`
	Signal  string           `json:"signal,omitempty"`
	ID      string           `json:"id,omitempty"`
	Session *TerminalSession `json:"session,omitempty"`
	Code    *int             `json:"code,omitempty"`
}

// Terminal opens WS /jails/{ref}/terminal. ctx bounds the opening only.
// Errors answered before the upgrade are *APIError.
func (c *Client) Terminal(ctx context.Context, ref string, opts TerminalOptions) (*Terminal, error) {
	q := url.Values{}
	for _, a := range opts.Cmd {
		q.Add("cmd", a)
	}
	set := func(k, v string) {
		if v != "" {
			q.Set(k, v)
		}
	}
	set("session", opts.Session)
	set("user", opts.User)
	set("cwd", opts.Cwd)
	set("term", opts.Term)
	if opts.ReadOnly {
		q.Set("readonly", "true")
	}
	if opts.Rows > 0 {
		q.Set("rows", strconv.Itoa(opts.Rows))
	}
	if opts.Cols > 0 {
		q.Set("cols", strconv.Itoa(opts.Cols))
	}
	for k, v := range opts.Env {
		q.Add("env", k+"="+v)
	}
	conn, err := c.dialWS(ctx, jailURL(ref)+"/terminal?"+q.Encode(), "terminal")
	if err != nil {
		return nil, err
	}
	typ, data, err := conn.Read(ctx)
	if err != nil {
		conn.CloseNow()
		return nil, fmt.Errorf("terminal: reading the session message: %w", err)
	}
	var m terminalMessage
	if typ != websocket.MessageText || json.Unmarshal(data, &m) != nil || m.Type != "session" || m.Session == nil {
		conn.CloseNow()
		return nil, fmt.Errorf("terminal: the daemon did not start with a session message (got %q)", data)
	}
	return &Terminal{conn: conn, session: *m.Session}, nil
}

// Session describes the session as it was when the terminal attached.
func (t *Terminal) Session() TerminalSession { return t.session }

// Read reads terminal output. After the command exits it returns io.EOF
// (Exit then has the status); when the connection ends otherwise, an
// error.
func (t *Terminal) Read(p []byte) (int, error) {
	for {
		if t.reader != nil {
			n, err := t.reader.Read(p)
			if errors.Is(err, io.EOF) {
				t.reader = nil
				err = nil
			}
			if n > 0 || err != nil {
				return n, err
			}
			continue
		}
		if t.err != nil {
			return 0, t.err
		}
		typ, r, err := t.conn.Reader(context.Background())
		if err != nil {
			t.err = t.closeError(err)
			return 0, t.err
		}
		if typ == websocket.MessageBinary {
			t.reader = r
			continue
		}
		data, err := io.ReadAll(io.LimitReader(r, 1<<20))
		if err != nil {
			t.err = t.closeError(err)
			return 0, t.err
		}
		var m terminalMessage
		if json.Unmarshal(data, &m) != nil {
			continue
		}
		if m.Type == "exit" {
			ex := TerminalExit{Signal: m.Signal}
			if m.Code != nil {
				ex.Code = *m.Code
			}
			t.mu.Lock()
			t.exit = &ex
			t.mu.Unlock()
		}
		// Other control messages (a refused resize or signal) carry
		// nothing a reader of the output needs.
	}
}

// closeError converts the end of the connection: io.EOF after an exit
// (from the exit message or the close status), else an error.
func (t *Terminal) closeError(err error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.exit == nil {
		if st := websocket.CloseStatus(err); st >= closeStatusExitBase && st < closeStatusExitBase+256 {
			t.exit = &TerminalExit{Code: int(st) - closeStatusExitBase}
		}
	}
	if t.exit != nil {
		return io.EOF
	}
	return fmt.Errorf("terminal: connection ended without an exit: %w", err)
}

// Exit returns the exit status once Read returned io.EOF.
func (t *Terminal) Exit() (TerminalExit, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.exit == nil {
		return TerminalExit{}, false
	}
	return *t.exit, true
}

// Write types p into the terminal.
func (t *Terminal) Write(p []byte) (int, error) {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	if err := t.conn.Write(context.Background(), websocket.MessageBinary, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (t *Terminal) control(ctx context.Context, m terminalMessage) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	t.wmu.Lock()
	defer t.wmu.Unlock()
	return t.conn.Write(ctx, websocket.MessageText, b)
}

// Resize sets the window size. The daemon refuses it on a read-only
// terminal (with a control message that Read skips).
func (t *Terminal) Resize(ctx context.Context, rows, cols int) error {
	return t.control(ctx, terminalMessage{Type: "resize", Rows: rows, Cols: cols})
}

// Signal sends a signal ("SIGINT", "TERM", or a number) to the terminal's
// foreground process group.
func (t *Terminal) Signal(ctx context.Context, sig string) error {
	return t.control(ctx, terminalMessage{Type: "signal", Signal: sig})
}

// Close detaches: the session keeps running in the jail.
func (t *Terminal) Close() error {
	return t.conn.Close(websocket.StatusNormalClosure, "detached")
}

// TerminalTicket returns a single-use ticket that authorises one terminal
// WebSocket for ref (as ?ticket=) within 30 seconds, for clients that
// cannot send the token.
func (c *Client) TerminalTicket(ctx context.Context, ref string) (string, error) {
	var t struct {
		Ticket string `json:"ticket"`
	}
	if err := c.call(ctx, http.MethodPost, jailURL(ref)+"/terminal/ticket", nil, &t); err != nil {
		return "", err
	}
	return t.Ticket, nil
}

// Terminals lists a running jail's terminal sessions.
func (c *Client) Terminals(ctx context.Context, ref string) ([]TerminalSession, error) {
	var l struct {
		Terminals []TerminalSession `json:"terminals"`
	}
	if err := c.call(ctx, http.MethodGet, jailURL(ref)+"/terminals", nil, &l); err != nil {
		return nil, err
	}
	return l.Terminals, nil
}

// Recordings lists a jail's terminal recordings.
func (c *Client) Recordings(ctx context.Context, ref string) ([]Recording, error) {
	var l struct {
		Recordings []Recording `json:"recordings"`
	}
	if err := c.call(ctx, http.MethodGet, jailURL(ref)+"/recordings", nil, &l); err != nil {
		return nil, err
	}
	return l.Recordings, nil
}

// OpenRecording returns a reader of a recording's asciicast v2 content;
// the caller closes it. A recording modified since it was stored is an
// *APIError with status 409.
func (c *Client) OpenRecording(ctx context.Context, rid string) (io.ReadCloser, error) {
	if rid == "" || strings.ContainsAny(rid, "/?#") {
		return nil, fmt.Errorf("recording id %q is not valid", rid)
	}
	resp, err := c.do(ctx, request{method: http.MethodGet, path: "/recordings/" + url.PathEscape(rid)})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}
