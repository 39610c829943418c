package api

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/tenant"
)

// TerminalService is the part of Service behind the terminal routes;
// *jail.Manager implements it.
type TerminalService interface {
	// OpenTerminal starts a terminal session in the running jail (or, with
	// req.Session, attaches to one: ErrNotFound when it is not running)
	// and returns the caller's attachment, which it must Close.
	OpenTerminal(ctx context.Context, ref string, req model.TerminalRequest) (model.Terminal, error)
	// Terminals lists the running jail's terminal sessions.
	Terminals(ctx context.Context, ref string) ([]model.TerminalSession, error)
	// Recordings lists the jail's terminal recordings, oldest first.
	Recordings(ctx context.Context, ref string) ([]model.Recording, error)
	// OpenRecording returns the recording rid and a reader of its
	// asciicast v2 content (the caller closes it). A recording that fails
	// its integrity check is ErrConflict.
	OpenRecording(ctx context.Context, rid string) (*model.Recording, io.ReadCloser, error)
}

// TerminalMessage is a control message of WS /jails/{id}/terminal, sent
// as a text frame (terminal bytes travel in binary frames).
//
// Client to server: {"type":"resize","rows":R,"cols":C} and
// {"type":"signal","signal":"SIGINT"} (to the terminal's foreground
// process group). Server to client: first {"type":"session","id":...,
// "session":{...}}, then {"type":"error","error":{...}} for a control
// message that was refused, and {"type":"exit","code":N} when the
// command exits, after which the server closes the connection with status
// 4000+N (reason "exit N").
type TerminalMessage struct {
	// Type is resize, signal, session, exit or error.
	Type string `json:"type"`
	// Rows and Cols are the window size of a resize.
	Rows int `json:"rows,omitempty"`
	Cols int `json:"cols,omitempty"`
	// Signal names the signal of a signal message, or the signal that
	// killed the command on exit.
	Signal string `json:"signal,omitempty"`
	// ID is the session's id (session message).
	ID string `json:"id,omitempty"`
	// Session describes the session (session message).
	Session *model.TerminalSession `json:"session,omitempty"`
	// Code is the exit code (exit message).
	Code *int `json:"code,omitempty"`
	// Error says why a control message was refused (error message).
	Error *ErrorDetail `json:"error,omitempty"`
}

// CloseStatusExitBase plus the exit code is the WebSocket close status
// of a terminal whose command exited.
const CloseStatusExitBase = 4000

// TerminalTicket is the answer of POST /jails/{id}/terminal/ticket.
type TerminalTicket struct {
	// Ticket authorises one WS /jails/{id}/terminal request (?ticket=) for
	// the same jail reference, once, until ExpiresAt.
	Ticket    string    `json:"ticket"`
	ExpiresAt time.Time `json:"expires_at"`
}

// TerminalList is the body of GET /jails/{id}/terminals.
type TerminalList struct {
	Terminals []model.TerminalSession `json:"terminals"`
}

// RecordingList is the body of GET /jails/{id}/recordings.
type RecordingList struct {
	Recordings []model.Recording `json:"recordings"`
}

// ticketTTL is how long a terminal ticket is valid.
const ticketTTL = 30 * time.Second

// ticketStore holds the terminal tickets not used yet; its zero value is
// ready.
type ticketStore struct {
	mu sync.Mutex
	m  map[string]ticket
}

type ticket struct {
	jail    string
	who     tenant.Principal
	expires time.Time
}

// issue makes a ticket for jail ref, acting for who.
func (ts *ticketStore) issue(ref string, who tenant.Principal) (string, time.Time, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", time.Time{}, fmt.Errorf("terminal ticket: %w", err)
	}
	tok := hex.EncodeToString(b)
	now := time.Now()
	exp := now.Add(ticketTTL)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.m == nil {
		ts.m = map[string]ticket{}
	}
	for k, t := range ts.m {
		if now.After(t.expires) {
			delete(ts.m, k)
		}
	}
	ts.m[tok] = ticket{jail: ref, who: who, expires: exp}
	return tok, exp, nil
}

// redeem consumes a ticket; it returns whom it acts for when it was
// valid for ref.
func (ts *ticketStore) redeem(tok, ref string) (tenant.Principal, bool) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t, ok := ts.m[tok]
	if !ok {
		return tenant.Principal{}, false
	}
	delete(ts.m, tok)
	return t.who, t.jail == ref && time.Now().Before(t.expires)
}

// terminalPattern is the route of the terminal WebSocket, whose query
// may carry credentials.
const terminalPattern = "GET /jails/{id}/terminal"

// queryPrincipal accepts the token as the token query parameter
// (browsers cannot set headers on a WebSocket) or a ticket from POST
// /jails/{id}/terminal/ticket as the ticket parameter, which acts for
// whoever asked for it. Query strings are never logged.
func (s *server) queryPrincipal(r *http.Request) (tenant.Principal, bool) {
	q := r.URL.Query()
	if tok := q.Get("token"); tok != "" && s.token != "" {
		return tenant.Token, subtle.ConstantTimeCompare([]byte(tok), []byte(s.token)) == 1
	}
	if t := q.Get("ticket"); t != "" {
		return s.tickets.redeem(t, r.PathValue("id"))
	}
	return tenant.Principal{}, false
}

func (s *server) terminalTicket(w http.ResponseWriter, r *http.Request) error {
	// The jail must exist; a ticket for nothing is an error now, not later.
	if _, err := s.svc.Get(r.Context(), r.PathValue("id")); err != nil {
		return err
	}
	who, _ := tenant.FromContext(r.Context())
	tok, exp, err := s.tickets.issue(r.PathValue("id"), who)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, TerminalTicket{Ticket: tok, ExpiresAt: exp.UTC()})
	return nil
}

// terminalRequest decodes the query of WS /jails/{id}/terminal.
func terminalRequest(r *http.Request) (model.TerminalRequest, error) {
	q := r.URL.Query()
	req := model.TerminalRequest{
		Cmd: q["cmd"], Session: q.Get("session"), User: q.Get("user"), Cwd: q.Get("cwd"), Term: q.Get("term"),
	}
	for _, f := range []struct {
		name string
		dst  *int
	}{{"rows", &req.Rows}, {"cols", &req.Cols}} {
		if v := q.Get(f.name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return req, errdefs.Invalidf("%s: %q is not a positive number", f.name, v)
			}
			*f.dst = n
		}
	}
	if v := q.Get("readonly"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return req, errdefs.Invalidf("readonly: %q is not a boolean", v)
		}
		req.ReadOnly = b
	}
	for _, kv := range q["env"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return req, errdefs.Invalidf("env: %q is not KEY=VALUE", kv)
		}
		if req.Env == nil {
			req.Env = map[string]string{}
		}
		req.Env[k] = v
	}
	if req.Session != "" && (len(req.Cmd) > 0 || req.User != "" || req.Cwd != "" || req.Env != nil) {
		return req, errdefs.Invalidf("session: attaching to a session takes no cmd, user, cwd or env")
	}
	return req, nil
}

// wsReadLimit bounds one message from a terminal client.
const wsReadLimit = 1 << 20

func (s *server) terminal(w http.ResponseWriter, r *http.Request) error {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		w.Header().Set("Upgrade", "websocket")
		return errdefs.Invalidf("this endpoint is a WebSocket: the request must ask to upgrade (Upgrade: websocket)")
	}
	req, err := terminalRequest(r)
	if err != nil {
		return err
	}
	term, err := s.svc.OpenTerminal(r.Context(), r.PathValue("id"), req)
	if err != nil {
		return err
	}
	defer term.Close()
	// Clients authenticate with the token or a ticket, never with ambient
	// credentials such as cookies, so a page from another origin gains
	// nothing by connecting: browsers on any origin may use the endpoint.
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		InsecureSkipVerify: true,
		CompressionMode:    websocket.CompressionDisabled,
	})
	if err != nil {
		return nil // Accept has answered the request
	}
	defer conn.CloseNow()
	conn.SetReadLimit(wsReadLimit)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ts := &termSession{conn: conn, term: term}
	info := term.Session()
	if err := ts.sendJSON(ctx, TerminalMessage{Type: "session", ID: info.ID, Session: &info}); err != nil {
		return nil
	}
	go func() {
		ts.readClient(ctx, s, r)
		// The client went away (or broke the protocol): detach.
		term.Close()
	}()
	ts.forwardOutput(ctx)
	return nil
}

// termSession is one WebSocket attached to a terminal.
type termSession struct {
	conn *websocket.Conn
	term model.Terminal
	wmu  sync.Mutex
}

func (ts *termSession) sendJSON(ctx context.Context, m TerminalMessage) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	ts.wmu.Lock()
	defer ts.wmu.Unlock()
	return ts.conn.Write(ctx, websocket.MessageText, b)
}

// forwardOutput sends the terminal's output as binary messages; when the
// command exits it sends the exit message and closes with 4000+code.
func (ts *termSession) forwardOutput(ctx context.Context) {
	// As large as init's frames, so one frame is one message.
	buf := make([]byte, 256<<10)
	for {
		n, err := ts.term.Read(buf)
		if n > 0 {
			ts.wmu.Lock()
			werr := ts.conn.Write(ctx, websocket.MessageBinary, buf[:n])
			ts.wmu.Unlock()
			if werr != nil {
				return
			}
		}
		if errors.Is(err, io.EOF) {
			exit, _ := ts.term.Exit()
			code := exit.Code
			if ts.sendJSON(ctx, TerminalMessage{Type: "exit", Code: &code, Signal: exit.Signal}) != nil {
				return
			}
			status := CloseStatusExitBase + min(max(code, 0), 255)
			ts.conn.Close(websocket.StatusCode(status), "exit "+strconv.Itoa(code))
			return
		}
		if err != nil {
			ts.conn.Close(websocket.StatusInternalError, "the connection to the jail's terminal failed")
			return
		}
	}
}

// readClient applies the client's messages until it closes.
func (ts *termSession) readClient(ctx context.Context, s *server, r *http.Request) {
	for {
		typ, data, err := ts.conn.Read(ctx)
		if err != nil {
			return
		}
		if typ == websocket.MessageBinary {
			if _, err := ts.term.Write(data); err != nil {
				return
			}
			continue
		}
		var m TerminalMessage
		if err := json.Unmarshal(data, &m); err != nil {
			err = errdefs.Invalidf("control message: not JSON: %v", err)
			ts.refuse(ctx, s, r, err)
			continue
		}
		switch m.Type {
		case "resize":
			err = ts.term.Resize(m.Rows, m.Cols)
		case "signal":
			err = ts.term.Signal(m.Signal)
		default:
			err = errdefs.Invalidf("control message: unknown type %q (resize or signal)", m.Type)
		}
		if err != nil {
			ts.refuse(ctx, s, r, err)
		}
	}
}

// refuse tells the client that a control message failed.
func (ts *termSession) refuse(ctx context.Context, s *server, r *http.Request, err error) {
	d := s.errorDetail(r, err)
	_ = ts.sendJSON(ctx, TerminalMessage{Type: "error", Error: &d})
}

func (s *server) listTerminals(w http.ResponseWriter, r *http.Request) error {
	list, err := s.svc.Terminals(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	if list == nil {
		list = []model.TerminalSession{}
	}
	writeJSON(w, http.StatusOK, TerminalList{Terminals: list})
	return nil
}

func (s *server) listRecordings(w http.ResponseWriter, r *http.Request) error {
	list, err := s.svc.Recordings(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	if list == nil {
		list = []model.Recording{}
	}
	writeJSON(w, http.StatusOK, RecordingList{Recordings: list})
	return nil
}

func (s *server) getRecording(w http.ResponseWriter, r *http.Request) error {
	rec, rc, err := s.svc.OpenRecording(r.Context(), r.PathValue("rid"))
	if err != nil {
		return err
	}
	defer rc.Close()
	h := w.Header()
	h.Set("Content-Type", "application/x-asciicast")
	h.Set("X-Agentjail-Recording-Status", rec.Status)
	if rec.SHA256 != "" {
		h.Set("X-Agentjail-Sha256", rec.SHA256)
	}
	if rec.Status == model.RecordingComplete {
		h.Set("Content-Length", strconv.FormatInt(rec.Size, 10))
	}
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		s.log.Warn("sending a recording", "recording", rec.ID, "err", err)
	}
	return nil
}
