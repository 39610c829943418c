package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/api/apitest"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
)

const testToken = "0123456789abcdef0123456789abcdef"

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type harness struct {
	t   *testing.T
	svc *apitest.Service
	h   http.Handler
	log *syncBuffer
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	svc := apitest.New()
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return &harness{t: t, svc: svc, h: NewServer(svc, testToken, log), log: logs}
}

// do serves one request in-process, with the token unless auth is false.
func (h *harness) do(method, target string, body io.Reader, hdr map[string]string) *httptest.ResponseRecorder {
	h.t.Helper()
	r := httptest.NewRequest(method, target, body)
	r.Header.Set("Authorization", "Bearer "+testToken)
	for k, v := range hdr {
		if v == "" {
			r.Header.Del(k)
		} else {
			r.Header.Set(k, v)
		}
	}
	w := httptest.NewRecorder()
	h.h.ServeHTTP(w, r)
	return w
}

func (h *harness) create(name string) *model.Jail {
	h.t.Helper()
	w := h.do("POST", "/jails", strings.NewReader(`{"name":"`+name+`"}`), nil)
	if w.Code != http.StatusCreated {
		h.t.Fatalf("create: %d %s", w.Code, w.Body)
	}
	var j model.Jail
	if err := json.Unmarshal(w.Body.Bytes(), &j); err != nil {
		h.t.Fatal(err)
	}
	return &j
}

// wantError checks an error response's status, JSON shape and code, and
// returns its message.
func wantError(t *testing.T, w *httptest.ResponseRecorder, status int, code string) string {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status %d, want %d; body %s", w.Code, status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	var eb map[string]map[string]string
	if err := json.Unmarshal(w.Body.Bytes(), &eb); err != nil {
		t.Fatalf("error body %q: %v", w.Body, err)
	}
	if len(eb) != 1 || len(eb["error"]) != 2 {
		t.Fatalf("error body %s: want exactly {\"error\":{\"code\",\"message\"}}", w.Body)
	}
	if eb["error"]["code"] != code {
		t.Errorf("code %q, want %q", eb["error"]["code"], code)
	}
	if eb["error"]["message"] == "" {
		t.Errorf("empty message")
	}
	return eb["error"]["message"]
}

func TestAuth(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		name, header string
	}{
		{"none", ""},
		{"wrong token", "Bearer nope"},
		{"token prefix", "Bearer " + testToken[:10]},
		{"wrong scheme", "Basic " + testToken},
		{"no scheme", testToken},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := h.do("GET", "/jails", nil, map[string]string{"Authorization": tc.header})
			wantError(t, w, http.StatusUnauthorized, "unauthorized")
			if w.Header().Get("WWW-Authenticate") == "" {
				t.Error("no WWW-Authenticate header")
			}
		})
	}
	if w := h.do("GET", "/jails", nil, map[string]string{"Authorization": "bearer " + testToken}); w.Code != http.StatusOK {
		t.Errorf("lower-case scheme: %d %s", w.Code, w.Body)
	}
	if w := h.do("GET", "/health", nil, map[string]string{"Authorization": ""}); w.Code != http.StatusOK {
		t.Errorf("health without a token: %d %s", w.Code, w.Body)
	}
	// Every route but /health needs the token, whether or not its target exists.
	for _, rt := range routes {
		target := strings.NewReplacer("{id}", "x", "{path...}", "a/b").Replace(rt.pattern)
		w := h.do(rt.method, target, nil, map[string]string{"Authorization": ""})
		if (rt.access != public) != (w.Code == http.StatusUnauthorized) {
			t.Errorf("%s %s without a token: status %d (access %v)", rt.method, rt.pattern, w.Code, rt.access)
		}
	}
}

func TestNoTokenInLogs(t *testing.T) {
	h := newHarness(t)
	h.do("GET", "/jails?token="+testToken, nil, nil)
	h.do("GET", "/nothing-here", nil, nil)
	h.do("GET", "/jails", nil, map[string]string{"Authorization": "Bearer wrong-" + testToken})
	logs := h.log.String()
	if !strings.Contains(logs, "path=/jails") {
		t.Fatalf("requests not logged: %s", logs)
	}
	if strings.Contains(logs, testToken) || strings.Contains(logs, "Bearer") {
		t.Fatalf("the token reached the log:\n%s", logs)
	}
}

func TestDecodeErrors(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		name, body, ctype string
		status            int
		code, mention     string
	}{
		{"malformed", `{"name":`, "", 400, "invalid_argument", "JSON"},
		{"not an object", `[1]`, "", 400, "invalid_argument", ""},
		{"unknown top key", `{"nmae":"a"}`, "", 400, "invalid_argument", `"nmae"`},
		{"unknown nested key", `{"isolation":{"resources":{"memroy_bytes":1}}}`, "", 400, "invalid_argument", "memroy_bytes"},
		{"wrong type", `{"isolation":{"resources":{"memory_bytes":"lots"}}}`, "", 400, "invalid_argument", "memory_bytes"},
		{"trailing data", `{} {}`, "", 400, "invalid_argument", "after"},
		{"empty", ``, "", 400, "invalid_argument", "empty"},
		{"yaml unknown key", "isolation:\n  netwrk: {}\n", "application/yaml", 400, "invalid_argument", "netwrk"},
		{"malformed content type", `{}`, "text/plain; charset=\"", 400, "invalid_argument", "Content-Type"},
		{"bad name", `{"name":"-x"}`, "", 422, "unprocessable", "name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := h.do("POST", "/jails", strings.NewReader(tc.body), map[string]string{"Content-Type": tc.ctype})
			msg := wantError(t, w, tc.status, tc.code)
			if !strings.Contains(msg, tc.mention) {
				t.Errorf("message %q does not mention %q", msg, tc.mention)
			}
		})
	}
	// The exec body is as strict.
	j := h.create("strict")
	w := h.do("POST", "/jails/"+j.ID+"/exec", strings.NewReader(`{"cmd":["echo"],"time_out":5}`), nil)
	if msg := wantError(t, w, 400, "invalid_argument"); !strings.Contains(msg, "time_out") {
		t.Errorf("message %q does not name the field", msg)
	}
}

func TestCreateYAML(t *testing.T) {
	h := newHarness(t)
	body := "name: from-yaml\nstart: false\nisolation:\n  resources:\n    memory_bytes: 268435456\nenv:\n  A: b\n"
	w := h.do("POST", "/jails", strings.NewReader(body), map[string]string{"Content-Type": "application/yaml; charset=utf-8"})
	if w.Code != http.StatusCreated {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	var j model.Jail
	if err := json.Unmarshal(w.Body.Bytes(), &j); err != nil {
		t.Fatal(err)
	}
	if j.Name != "from-yaml" || j.Status != model.StateCreated || j.Config.Isolation.Resources.MemoryBytes != 256<<20 || j.Config.Env["A"] != "b" {
		t.Fatalf("jail %+v does not reflect the YAML", j)
	}
}

// infiniteReader yields zeros without end.
type infiniteReader struct{}

func (infiniteReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// chunked hides a reader's length so that the request has no Content-Length.
type chunked struct{ io.Reader }

func TestBodyLimits(t *testing.T) {
	h := newHarness(t)
	big := `{"name":"` + strings.Repeat("a", MaxJSONBody) + `"}`
	w := h.do("POST", "/jails", strings.NewReader(big), nil)
	wantError(t, w, http.StatusRequestEntityTooLarge, "too_large")

	r := httptest.NewRequest("POST", "/jails", chunked{strings.NewReader(big)})
	r.ContentLength = -1
	r.Header.Set("Authorization", "Bearer "+testToken)
	w = httptest.NewRecorder()
	h.h.ServeHTTP(w, r)
	wantError(t, w, http.StatusRequestEntityTooLarge, "too_large")

	j := h.create("up")
	// Declared too large: refused before reading.
	r = httptest.NewRequest("PUT", "/jails/"+j.ID+"/files/workspace/big", infiniteReader{})
	r.ContentLength = MaxUpload + 1
	r.Header.Set("Authorization", "Bearer "+testToken)
	w = httptest.NewRecorder()
	h.h.ServeHTTP(w, r)
	wantError(t, w, http.StatusRequestEntityTooLarge, "too_large")

	// Undeclared and too large: cut off at the limit while the service reads.
	var got int64
	h.svc.WriteHook = func(_ context.Context, _, _ string, r io.Reader, _ model.WriteOptions) (*model.FileInfo, error) {
		n, err := io.Copy(io.Discard, r)
		got = n
		return nil, fmt.Errorf("writing: %w", err)
	}
	r = httptest.NewRequest("PUT", "/jails/"+j.ID+"/files/workspace/big", io.LimitReader(infiniteReader{}, MaxUpload+1))
	r.ContentLength = -1
	r.Header.Set("Authorization", "Bearer "+testToken)
	w = httptest.NewRecorder()
	h.h.ServeHTTP(w, r)
	wantError(t, w, http.StatusRequestEntityTooLarge, "too_large")
	if got != MaxUpload {
		t.Errorf("the service read %d bytes, want exactly the limit %d", got, MaxUpload)
	}
}

// errService answers every jail call with one error.
type errService struct {
	*apitest.Service
	err error
}

func (e errService) Get(context.Context, string) (*model.Jail, error) { return nil, e.err }

func TestErrorMapping(t *testing.T) {
	cases := []struct {
		err    error
		status int
		code   string
	}{
		{errdefs.Invalidf("x"), 400, "invalid_argument"},
		{errdefs.Unprocessablef("x"), 422, "unprocessable"},
		{errdefs.NotFoundf("x"), 404, "not_found"},
		{errdefs.Conflictf("x"), 409, "conflict"},
		{errdefs.Forbiddenf("x"), 403, "forbidden"},
		{errdefs.New(errdefs.ErrUnauthorized, "x"), 401, "unauthorized"},
		{errdefs.New(errdefs.ErrTooLarge, "x"), 413, "too_large"},
		{errdefs.NotImplementedf("x"), 501, "not_implemented"},
		{errdefs.Unavailablef("x"), 503, "unavailable"},
		{errdefs.New(errdefs.ErrTimeout, "x"), 504, "timeout"},
		{fmt.Errorf("layer: %w", errdefs.Conflictf("x")), 409, "conflict"},
		{errors.New("secret internal detail"), 500, "internal"},
	}
	for _, tc := range cases {
		logs := &syncBuffer{}
		h := NewServer(errService{apitest.New(), tc.err}, testToken, slog.New(slog.NewTextHandler(logs, nil)))
		r := httptest.NewRequest("GET", "/jails/x", nil)
		r.Header.Set("Authorization", "Bearer "+testToken)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		msg := wantError(t, w, tc.status, tc.code)
		if tc.status == 500 {
			if strings.Contains(msg, "secret") {
				t.Errorf("500 message leaks the error: %q", msg)
			}
			if !strings.Contains(logs.String(), "secret internal detail") {
				t.Errorf("500 error not logged: %s", logs)
			}
		} else if msg != tc.err.Error() {
			t.Errorf("message %q, want %q", msg, tc.err.Error())
		}
	}
}

func TestNoRoute(t *testing.T) {
	h := newHarness(t)
	wantError(t, h.do("GET", "/nope", nil, nil), 404, "not_found")
	wantError(t, h.do("GET", "/jails/x/nope", nil, nil), 404, "not_found")
	w := h.do("PATCH", "/jails/x", nil, nil)
	wantError(t, w, 405, "method_not_allowed")
	if allow := w.Header().Get("Allow"); !strings.Contains(allow, "GET") || !strings.Contains(allow, "DELETE") {
		t.Errorf("Allow %q", allow)
	}
	wantError(t, h.do("PUT", "/jails", nil, nil), 405, "method_not_allowed")
}

type panicService struct{ *apitest.Service }

func (panicService) List(context.Context) ([]*model.Jail, error) { panic("boom") }

func TestPanicRecovered(t *testing.T) {
	logs := &syncBuffer{}
	h := NewServer(panicService{apitest.New()}, testToken, slog.New(slog.NewTextHandler(logs, nil)))
	r := httptest.NewRequest("GET", "/jails", nil)
	r.Header.Set("Authorization", "Bearer "+testToken)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	wantError(t, w, 500, "internal")
	if !strings.Contains(logs.String(), "boom") {
		t.Errorf("panic not logged: %s", logs)
	}
}

func TestLifecycle(t *testing.T) {
	h := newHarness(t)
	j := h.create("life")
	if j.Status != model.StateRunning {
		t.Fatalf("status %s", j.Status)
	}
	wantError(t, h.do("POST", "/jails", strings.NewReader(`{"name":"life"}`), nil), 409, "conflict")

	w := h.do("GET", "/jails", nil, nil)
	var l JailList
	if err := json.Unmarshal(w.Body.Bytes(), &l); err != nil || len(l.Jails) != 1 {
		t.Fatalf("list: %s %v", w.Body, err)
	}
	w = h.do("GET", "/jails/life", nil, nil)
	var got model.Jail
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || got.ID != j.ID || got.Stats == nil {
		t.Fatalf("get by name: %s %v", w.Body, err)
	}
	if w := h.do("POST", "/jails/life/stop", nil, nil); w.Code != 200 {
		t.Fatalf("stop: %d %s", w.Code, w.Body)
	}
	wantError(t, h.do("POST", "/jails/life/stop", nil, nil), 409, "conflict")
	if w := h.do("POST", "/jails/life/start", nil, nil); w.Code != 200 {
		t.Fatalf("start: %d %s", w.Code, w.Body)
	}
	if w := h.do("POST", "/jails/life/stop", strings.NewReader(`{"timeout_s":3}`), nil); w.Code != 200 {
		t.Fatalf("stop 3s: %d %s", w.Code, w.Body)
	}
	if want := []time.Duration{DefaultStopTimeout, 3 * time.Second}; fmt.Sprint(h.svc.Stops) != fmt.Sprint(want) {
		t.Errorf("stop graces %v, want %v", h.svc.Stops, want)
	}
	wantError(t, h.do("POST", "/jails/life/stop", strings.NewReader(`{"timeout_s":-1}`), nil), 422, "unprocessable")
	wantError(t, h.do("POST", "/jails/life/stop", strings.NewReader(`{"grace":1}`), nil), 400, "invalid_argument")
	if w := h.do("DELETE", "/jails/life", nil, nil); w.Code != 204 || w.Body.Len() != 0 {
		t.Fatalf("destroy: %d %q", w.Code, w.Body)
	}
	wantError(t, h.do("GET", "/jails/life", nil, nil), 404, "not_found")
	w = h.do("GET", "/jails", nil, nil)
	if strings.TrimSpace(w.Body.String()) != `{"jails":[]}` {
		t.Errorf("empty list %s", w.Body)
	}
}

func TestExecBuffered(t *testing.T) {
	h := newHarness(t)
	j := h.create("ex")
	w := h.do("POST", "/jails/ex/exec", strings.NewReader(`{"cmd":["fail","3","bad"]}`), nil)
	var res model.ExecResult
	if err := json.Unmarshal(w.Body.Bytes(), &res); err != nil || w.Code != 200 {
		t.Fatalf("%d %s %v", w.Code, w.Body, err)
	}
	if res.ExitCode != 3 || res.Stderr != "bad" {
		t.Errorf("result %+v", res)
	}
	// base64 both ways, with bytes that are not UTF-8.
	raw := "\xff\x00\xfe binary"
	body, _ := json.Marshal(model.ExecRequest{Cmd: []string{"cat"}, Stdin: base64.StdEncoding.EncodeToString([]byte(raw)), Encoding: "base64"})
	w = h.do("POST", "/jails/"+j.ID+"/exec", bytes.NewReader(body), nil)
	if err := json.Unmarshal(w.Body.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	if got, _ := base64.StdEncoding.DecodeString(res.Stdout); string(got) != raw {
		t.Errorf("stdout %q, want base64 of %q", res.Stdout, raw)
	}
	wantError(t, h.do("POST", "/jails/ex/exec", strings.NewReader(`{"cmd":["cat"],"stdin":"!!","encoding":"base64"}`), nil), 400, "invalid_argument")
	wantError(t, h.do("POST", "/jails/ex/exec", strings.NewReader(`{"cmd":["cat"],"encoding":"latin1"}`), nil), 422, "unprocessable")
}

// streamServer serves the API over HTTP (streams need a real connection)
// with one jail, name.
func streamServer(t *testing.T, name string) (*apitest.Service, *httptest.Server) {
	t.Helper()
	svc := apitest.New()
	srv := httptest.NewServer(NewServer(svc, testToken, nil))
	t.Cleanup(srv.Close)
	if _, err := svc.Create(context.Background(), model.CreateRequest{Name: name}); err != nil {
		t.Fatal(err)
	}
	return svc, srv
}

func TestExecStream(t *testing.T) {
	svc, srv := streamServer(t, "st")
	release := make(chan struct{})
	cancelled := make(chan error, 1)
	svc.ExecHook = func(ctx context.Context, _ string, req model.ExecRequest, out model.ExecOutput) (*model.ExecResult, error) {
		if err := out("stdout", []byte("first\n")); err != nil {
			return nil, err
		}
		if req.Cmd[0] == "hang" {
			<-ctx.Done()
			cancelled <- ctx.Err()
			return nil, ctx.Err()
		}
		<-release
		if err := out("stderr", []byte("second\n")); err != nil {
			return nil, err
		}
		if req.Cmd[0] == "break" {
			return nil, errdefs.Unavailablef("init went away")
		}
		return &model.ExecResult{ExitCode: 7, DurationMs: 1}, nil
	}
	post := func(ctx context.Context, cmd string) *http.Response {
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/jails/st/exec/stream", strings.NewReader(`{"cmd":["`+cmd+`"]}`))
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	readEvent := func(br *bufio.Reader) StreamEvent {
		t.Helper()
		line, err := br.ReadBytes('\n')
		if err != nil {
			t.Fatalf("reading an event: %v", err)
		}
		var ev StreamEvent
		if err := json.Unmarshal(line, &ev); err != nil {
			t.Fatalf("event %q: %v", line, err)
		}
		return ev
	}

	// The first chunk arrives while the command is still running (it waits
	// on release, which only this reader closes).
	resp := post(context.Background(), "run")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("status %d, Content-Type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	br := bufio.NewReader(resp.Body)
	if ev := readEvent(br); ev.Type != "stdout" || ev.Data != "first\n" {
		t.Fatalf("first event %+v", ev)
	}
	close(release)
	if ev := readEvent(br); ev.Type != "stderr" || ev.Data != "second\n" {
		t.Fatalf("second event %+v", ev)
	}
	ev := readEvent(br)
	if ev.Type != "exit" || ev.ExecResult == nil || ev.ExitCode != 7 {
		t.Fatalf("exit event %+v", ev)
	}
	resp.Body.Close()

	// An error after output began ends the stream with an error event.
	resp = post(context.Background(), "break")
	br = bufio.NewReader(resp.Body)
	readEvent(br)
	readEvent(br)
	if ev := readEvent(br); ev.Type != "error" || ev.Error == nil || ev.Error.Code != "unavailable" {
		t.Fatalf("error event %+v", ev)
	}
	resp.Body.Close()

	// An error before any output is a plain error response.
	resp = post(context.Background(), "x")
	resp.Body.Close()
	req, _ := http.NewRequest("POST", srv.URL+"/jails/none/exec/stream", strings.NewReader(`{"cmd":["echo"]}`))
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Fatalf("stream on a missing jail: %d", resp.StatusCode)
	}

	// The client going away cancels the command's context.
	ctx, cancel := context.WithCancel(context.Background())
	resp = post(ctx, "hang")
	if ev := readEvent(bufio.NewReader(resp.Body)); ev.Type != "stdout" {
		t.Fatalf("hang: first event %+v", ev)
	}
	cancel()
	resp.Body.Close()
	select {
	case err := <-cancelled:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("exec context ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the exec context was not cancelled within 10s of the client leaving")
	}
}

func TestFiles(t *testing.T) {
	h := newHarness(t)
	h.create("fs")
	base := "/jails/fs/files/"
	w := h.do("PUT", base+"workspace/dir/a%20b.txt?mode=0600", strings.NewReader("hello"), nil)
	if w.Code != 201 {
		t.Fatalf("put: %d %s", w.Code, w.Body)
	}
	var fi model.FileInfo
	if err := json.Unmarshal(w.Body.Bytes(), &fi); err != nil || fi.Path != "/workspace/dir/a b.txt" || fi.Mode != "0600" || fi.Size != 5 {
		t.Fatalf("put answer %s %v", w.Body, err)
	}
	w = h.do("GET", base+"workspace/dir/a%20b.txt", nil, nil)
	if w.Code != 200 || w.Body.String() != "hello" {
		t.Fatalf("get: %d %q", w.Code, w.Body)
	}
	for k, v := range map[string]string{"Content-Type": "application/octet-stream", "Content-Length": "5", HeaderMode: "0600"} {
		if got := w.Header().Get(k); got != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
	if _, err := time.Parse(time.RFC3339Nano, w.Header().Get(HeaderMtime)); err != nil {
		t.Errorf("%s: %v", HeaderMtime, err)
	}
	w = h.do("GET", base+"workspace/dir", nil, nil)
	var dl DirListing
	if err := json.Unmarshal(w.Body.Bytes(), &dl); err != nil || dl.Path != "/workspace/dir" || len(dl.Entries) != 1 || dl.Entries[0].Name != "a b.txt" {
		t.Fatalf("listing %s %v", w.Body, err)
	}
	w = h.do("GET", base+"workspace?stat=true", nil, nil)
	if err := json.Unmarshal(w.Body.Bytes(), &fi); err != nil || fi.Type != "dir" {
		t.Fatalf("stat %s %v", w.Body, err)
	}
	w = h.do("GET", base+"workspace?access=write&user=root", nil, nil)
	var ar model.AccessResult
	if err := json.Unmarshal(w.Body.Bytes(), &ar); err != nil || !ar.Accessible || ar.User != "root" || ar.Mode != "write" {
		t.Fatalf("access %s %v", w.Body, err)
	}
	w = h.do("PUT", base+"workspace/new/sub?type=dir&mode=750", nil, nil)
	if err := json.Unmarshal(w.Body.Bytes(), &fi); w.Code != 201 || err != nil || fi.Type != "dir" || fi.Mode != "0750" {
		t.Fatalf("mkdir %d %s %v", w.Code, w.Body, err)
	}
	w = h.do("PUT", base+"workspace/new/link?type=symlink&target=../a.txt", nil, nil)
	if err := json.Unmarshal(w.Body.Bytes(), &fi); w.Code != 201 || err != nil || fi.Type != "symlink" || fi.LinkTarget != "../a.txt" {
		t.Fatalf("symlink %d %s %v", w.Code, w.Body, err)
	}
	wantError(t, h.do("PUT", base+"workspace/new/link?type=symlink&target=x", nil, nil), 409, "conflict")
	wantError(t, h.do("DELETE", base+"workspace/dir", nil, nil), 409, "conflict")
	if w := h.do("DELETE", base+"workspace/dir?recursive=true", nil, nil); w.Code != 204 {
		t.Fatalf("delete: %d %s", w.Code, w.Body)
	}
	wantError(t, h.do("GET", base+"workspace/dir", nil, nil), 404, "not_found")

	for _, tc := range []struct{ method, target, mention string }{
		{"GET", base, "path"},
		{"PUT", base, "path"},
		{"DELETE", base, "path"},
		{"GET", base + "a%00b", "NUL"},
		{"PUT", base + "a%00b", "NUL"},
		{"GET", base + "workspace?bogus=1", "bogus"},
		{"GET", base + "workspace?stat=maybe", "stat"},
		{"GET", base + "workspace?access=exec", "access"},
		{"GET", base + "workspace?user=root", "user"},
		{"GET", base + "workspace?stat=true&stat=false", "stat"},
		{"PUT", base + "workspace/f?mode=0999", "mode"},
		{"PUT", base + "workspace/f?mode=17777", "mode"},
		{"PUT", base + "workspace/f?type=fifo", "type"},
		{"PUT", base + "workspace/l?type=symlink", "target"},
		{"PUT", base + "workspace/l?type=symlink&target=", "target"},
		{"PUT", base + "workspace/l?type=symlink&target=a%00b", "target"},
		{"PUT", base + "workspace/l?type=symlink&target=" + strings.Repeat("a", 4096), "target"},
		{"PUT", base + "workspace/l?type=symlink&target=x&mode=0644", "mode"},
		{"PUT", base + "workspace/l?target=x", "target"},
		{"DELETE", base + "workspace?recursive=yes", "recursive"},
	} {
		msg := wantError(t, h.do(tc.method, tc.target, nil, nil), 400, "invalid_argument")
		if !strings.Contains(msg, tc.mention) {
			t.Errorf("%s %s: message %q does not mention %q", tc.method, tc.target, msg, tc.mention)
		}
	}
	wantError(t, h.do("PUT", base+"workspace/d?type=dir", strings.NewReader("x"), nil), 400, "invalid_argument")
	wantError(t, h.do("PUT", base+"workspace/l?type=symlink&target=x", strings.NewReader("x"), nil), 400, "invalid_argument")
}

func TestRouteTable(t *testing.T) {
	seen := map[string]bool{}
	for _, rt := range routes {
		key := rt.method + " " + rt.pattern
		if seen[key] {
			t.Errorf("route %s listed twice", key)
		}
		seen[key] = true
		if rt.handler == nil {
			t.Errorf("route %s has no handler", key)
		}
		if (rt.access == public) != (rt.pattern == "/health") || rt.access < public || rt.access > tokenOnly {
			t.Errorf("route %s: access %v", key, rt.access)
		}
		// A route that changes state is written to the audit log and
		// refused to viewers: only GET routes may be read-only (and
		// POST /mcp, whose every tool is an API request of its own).
		if rt.access == read && rt.method != http.MethodGet && rt.pattern != "/mcp" {
			t.Errorf("route %s changes state but is open to viewers", key)
		}
	}
	// Every route is reachable: an authorised request never gets the
	// mux's 404 or 405.
	h := newHarness(t)
	h.create("x")
	for _, rt := range routes {
		target := strings.NewReplacer("{id}", "x", "{path...}", "workspace").Replace(rt.pattern)
		if rt.pattern == "/stats" {
			target += "?follow=false" // a stream that never ends otherwise
		}
		w := h.do(rt.method, target, strings.NewReader(`{"cmd":["echo"]}`), nil)
		if w.Code == 405 || (w.Code == 404 && strings.Contains(w.Body.String(), "no route")) {
			t.Errorf("%s %s: %d %s", rt.method, target, w.Code, w.Body)
		}
	}
}

// TestExecStreamEncodings: an output event is JSON whatever the output
// holds: with utf8, quotes, backslashes, control characters and bytes
// that are not UTF-8 (as U+FFFD) come back as written; with base64, every
// byte does.
func TestExecStreamEncodings(t *testing.T) {
	svc, srv := streamServer(t, "enc")
	raw := "say \"hi\" \\ there\n\x01\t\xff<&> é"
	svc.ExecHook = func(_ context.Context, _ string, _ model.ExecRequest, out model.ExecOutput) (*model.ExecResult, error) {
		if err := out("stdout", []byte(raw)); err != nil {
			return nil, err
		}
		return &model.ExecResult{}, out("stderr", nil)
	}
	for enc, want := range map[string]string{"utf8": strings.ToValidUTF8(raw, "\ufffd"), "base64": raw} {
		req, _ := http.NewRequest("POST", srv.URL+"/jails/enc/exec/stream", strings.NewReader(`{"cmd":["x"],"encoding":"`+enc+`"}`))
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		lines := strings.Split(strings.TrimSpace(string(body)), "\n")
		if len(lines) != 3 {
			t.Fatalf("%s: %d lines: %s", enc, len(lines), body)
		}
		var evs [2]StreamEvent
		for i := range evs {
			if err := json.Unmarshal([]byte(lines[i]), &evs[i]); err != nil {
				t.Fatalf("%s: line %q: %v", enc, lines[i], err)
			}
		}
		got := evs[0].Data
		if enc == "base64" {
			b, err := base64.StdEncoding.DecodeString(got)
			if err != nil {
				t.Fatalf("base64: %v", err)
			}
			got = string(b)
		}
		if evs[0].Type != "stdout" || got != want || evs[1].Type != "stderr" || evs[1].Data != "" {
			t.Errorf("%s: events %+v, want stdout %q and an empty stderr", enc, evs, want)
		}
	}
}
