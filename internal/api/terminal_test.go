package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/agentjail/agentjail/internal/model"
)

// dialWS opens the terminal WebSocket of jail x on srv with query q.
func dialWS(t *testing.T, srv *httptest.Server, q url.Values, hdr http.Header) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/jails/x/terminal?"+q.Encode(), &websocket.DialOptions{HTTPHeader: hdr})
}

func readMsg(t *testing.T, c *websocket.Conn) (websocket.MessageType, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	typ, data, err := c.Read(ctx)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return typ, data
}

func TestTerminalProtocol(t *testing.T) {
	h := newHarness(t)
	h.create("x")
	srv := httptest.NewServer(h.h)
	defer srv.Close()

	// Without credentials: 401; a plain GET (no upgrade): 400.
	if _, resp, err := dialWS(t, srv, url.Values{}, nil); err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no token: %v %v", resp, err)
	}
	if w := h.do("GET", "/jails/x/terminal", nil, nil); w.Code != http.StatusBadRequest {
		t.Fatalf("no upgrade: %d %s", w.Code, w.Body)
	}
	// The token in the query works, and is not logged.
	c, _, err := dialWS(t, srv, url.Values{"token": {testToken}, "cmd": {"sh"}, "rows": {"30"}, "cols": {"100"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	typ, data := readMsg(t, c)
	var m TerminalMessage
	if typ != websocket.MessageText || json.Unmarshal(data, &m) != nil || m.Type != "session" || m.Session == nil || m.ID != m.Session.ID || m.Session.Rows != 30 {
		t.Fatalf("first message %s", data)
	}
	ctx := context.Background()
	if err := c.Write(ctx, websocket.MessageBinary, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if typ, data := readMsg(t, c); typ != websocket.MessageBinary || string(data) != "hello" {
		t.Fatalf("echo: %v %q", typ, data)
	}
	ctl, _ := json.Marshal(TerminalMessage{Type: "resize", Rows: 40, Cols: 120})
	c.Write(ctx, websocket.MessageText, ctl)
	if _, data := readMsg(t, c); string(data) != "[resize 40x120]" {
		t.Fatalf("resize: %q", data)
	}
	c.Write(ctx, websocket.MessageText, []byte(`{"type":"bogus"}`))
	if _, data := readMsg(t, c); !strings.Contains(string(data), `"type":"error"`) {
		t.Fatalf("unknown control message: %s", data)
	}
	sig, _ := json.Marshal(TerminalMessage{Type: "signal", Signal: "SIGINT"})
	c.Write(ctx, websocket.MessageText, sig)
	if _, data := readMsg(t, c); !strings.Contains(string(data), `"type":"exit"`) || !strings.Contains(string(data), `"code":130`) {
		t.Fatalf("exit message: %s", data)
	}
	_, _, err = c.Read(ctx)
	if st := websocket.CloseStatus(err); st != CloseStatusExitBase+130 {
		t.Fatalf("close status %d (%v)", st, err)
	}
	if strings.Contains(h.log.String(), testToken) {
		t.Fatalf("the token was logged:\n%s", h.log.String())
	}

	// A ticket is single-use and bound to its jail reference.
	var tk TerminalTicket
	w := h.do("POST", "/jails/x/terminal/ticket", nil, nil)
	if w.Code != http.StatusCreated || json.Unmarshal(w.Body.Bytes(), &tk) != nil || tk.Ticket == "" {
		t.Fatalf("ticket: %d %s", w.Code, w.Body)
	}
	c2, _, err := dialWS(t, srv, url.Values{"ticket": {tk.Ticket}}, nil)
	if err != nil {
		t.Fatalf("ticket refused: %v", err)
	}
	c2.CloseNow()
	if _, resp, err := dialWS(t, srv, url.Values{"ticket": {tk.Ticket}}, nil); err == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("ticket reused: %v", err)
	}
	if w := h.do("POST", "/jails/nope/terminal/ticket", nil, nil); w.Code != http.StatusNotFound {
		t.Fatalf("ticket for a missing jail: %d", w.Code)
	}
	// Bad parameters are refused before the upgrade.
	hdr := http.Header{"Authorization": {"Bearer " + testToken}}
	if _, resp, err := dialWS(t, srv, url.Values{"rows": {"x"}}, hdr); err == nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("bad rows: %v", err)
	}
	if _, resp, err := dialWS(t, srv, url.Values{"session": {"s9"}}, hdr); err == nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown session: %v", err)
	}
}

func TestRecordingRoutes(t *testing.T) {
	h := newHarness(t)
	j := h.create("x")
	h.svc.AddRecording(model.Recording{ID: j.ID + "-a", JailID: j.ID, Status: model.RecordingComplete}, "{\"version\":2}\n")
	h.svc.AddRecording(model.Recording{ID: j.ID + "-b", JailID: j.ID, Status: "tampered"}, "")
	w := h.do("GET", "/jails/x/recordings", nil, nil)
	var l RecordingList
	if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &l) != nil || len(l.Recordings) != 2 {
		t.Fatalf("list: %d %s", w.Code, w.Body)
	}
	w = h.do("GET", "/recordings/"+j.ID+"-a", nil, nil)
	if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "application/x-asciicast" || w.Body.String() != "{\"version\":2}\n" {
		t.Fatalf("get: %d %v %q", w.Code, w.Header(), w.Body)
	}
	wantError(t, h.do("GET", "/recordings/"+j.ID+"-b", nil, nil), http.StatusConflict, "conflict")
	wantError(t, h.do("GET", "/recordings/nope", nil, nil), http.StatusNotFound, "not_found")
}
