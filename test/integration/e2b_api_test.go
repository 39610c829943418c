package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/agentjail/agentjail/internal/e2b/envd/filesystem"
	"github.com/agentjail/agentjail/internal/e2b/envd/filesystem/filesystemconnect"
	"github.com/agentjail/agentjail/internal/e2b/envd/process"
	"github.com/agentjail/agentjail/internal/e2b/envd/process/processconnect"
)

// e2bSandbox is the Sandbox object of the control plane.
type e2bSandbox struct {
	SandboxID       string `json:"sandboxID"`
	EnvdAccessToken string `json:"envdAccessToken"`
}

// e2bCall makes a control-plane request with key and returns the response.
func e2bCall(t testing.TB, d *daemon, key, method, path string, in any) *response {
	t.Helper()
	r, err := d.api.send(method, "/e2b"+path, in, "X-API-KEY", key)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func e2bCreate(t testing.TB, d *daemon, key string, body map[string]any) e2bSandbox {
	t.Helper()
	r := e2bCall(t, d, key, "POST", "/v2/sandboxes", body)
	if r.status != http.StatusCreated {
		t.Fatalf("create: %s", r)
	}
	var sb e2bSandbox
	if err := json.Unmarshal(r.body, &sb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e2bCall(t, d, key, "DELETE", "/sandboxes/"+sb.SandboxID, nil) })
	return sb
}

// e2bState is a sandbox's state ("" once it is gone).
func e2bState(t testing.TB, d *daemon, key, id string) string {
	r := e2bCall(t, d, key, "GET", "/sandboxes/"+id, nil)
	if r.status == http.StatusNotFound {
		return ""
	}
	var info struct {
		State string `json:"state"`
	}
	if r.status != http.StatusOK || json.Unmarshal(r.body, &info) != nil {
		t.Fatalf("get: %s", r)
	}
	return info.State
}

// TestE2BTimeouts: a sandbox is killed at the end of its timeout, or
// paused when it asked for auto-pause; a paused one resumes on connect.
func TestE2BTimeouts(t *testing.T) {
	d := shared(t)
	key := e2bKey(t, d)
	killed := e2bCreate(t, d, key, map[string]any{"templateID": "base", "timeout": 1})
	paused := e2bCreate(t, d, key, map[string]any{"templateID": "base", "timeout": 1, "autoPause": true})
	if err := waitFor(30*time.Second, func() error {
		if s := e2bState(t, d, key, killed.SandboxID); s != "" {
			return fmt.Errorf("the sandbox past its timeout is %q", s)
		}
		if s := e2bState(t, d, key, paused.SandboxID); s != "paused" {
			return fmt.Errorf("the auto-pause sandbox past its timeout is %q", s)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Paused, it holds no jail: no process, no memory, no CPU.
	var detail struct {
		Agentjail struct {
			JailID string   `json:"jailID"`
			Jails  []string `json:"jails"`
		} `json:"agentjail"`
	}
	if r := e2bCall(t, d, key, "GET", "/sandboxes/"+paused.SandboxID, nil); json.Unmarshal(r.body, &detail) != nil || detail.Agentjail.JailID == "" {
		t.Fatalf("detail: %s", r)
	}
	if r, err := d.api.send("GET", "/jails/"+detail.Agentjail.JailID, nil); err != nil || r.status != http.StatusNotFound {
		t.Fatalf("the paused sandbox's jail still exists: %v %v", r, err)
	}
	if r := e2bCall(t, d, key, "POST", "/v2/sandboxes/"+paused.SandboxID+"/connect", map[string]any{"timeout": 60}); r.status != http.StatusCreated {
		t.Fatalf("resume: %s", r)
	}
	if s := e2bState(t, d, key, paused.SandboxID); s != "running" {
		t.Fatalf("after connect: %q", s)
	}
}

// TestE2BTenantsAndRoles: a key sees only its tenant's sandboxes; a viewer
// key reads but changes nothing; an admin key sees every tenant's.
func TestE2BTenantsAndRoles(t *testing.T) {
	d := shared(t)
	mk := func(tenant, role string) string {
		var k struct {
			Secret string `json:"secret"`
		}
		d.api.want(t, http.StatusCreated, "POST", "/keys", map[string]any{"tenant": tenant, "role": role}, &k)
		return k.Secret
	}
	a, b, viewer, admin := mk("tenant-a", "user"), mk("tenant-b", "user"), mk("tenant-a", "viewer"), mk("ops", "admin")
	sb := e2bCreate(t, d, a, map[string]any{"templateID": "base", "timeout": 120, "metadata": map[string]string{"owner": "a"}})
	for _, c := range []struct{ method, path string }{
		{"GET", "/sandboxes/" + sb.SandboxID}, {"DELETE", "/sandboxes/" + sb.SandboxID},
		{"POST", "/sandboxes/" + sb.SandboxID + "/pause"}, {"GET", "/sandboxes/" + sb.SandboxID + "/report"},
		{"PUT", "/sandboxes/" + sb.SandboxID + "/network"},
	} {
		if r := e2bCall(t, d, b, c.method, c.path, nil); r.status != http.StatusNotFound {
			t.Errorf("tenant b: %s %s: %s", c.method, c.path, r)
		}
	}
	var list []map[string]any
	if r := e2bCall(t, d, b, "GET", "/v2/sandboxes", nil); json.Unmarshal(r.body, &list) != nil || len(list) != 0 {
		t.Errorf("tenant b lists %s", r)
	}
	if r := e2bCall(t, d, viewer, "GET", "/sandboxes/"+sb.SandboxID, nil); r.status != http.StatusOK {
		t.Errorf("viewer get: %s", r)
	}
	for _, c := range []struct{ method, path string }{
		{"DELETE", "/sandboxes/" + sb.SandboxID}, {"POST", "/v2/sandboxes"}, {"PUT", "/sandboxes/" + sb.SandboxID + "/network"},
	} {
		if r := e2bCall(t, d, viewer, c.method, c.path, map[string]any{}); r.status != http.StatusForbidden {
			t.Errorf("viewer %s %s: %s", c.method, c.path, r)
		}
	}
	if r := e2bCall(t, d, admin, "GET", "/sandboxes/"+sb.SandboxID, nil); r.status != http.StatusOK {
		t.Errorf("admin get: %s", r)
	}
	if r := e2bCall(t, d, "aj_000000000000_"+"x", "GET", "/v2/sandboxes", nil); r.status != http.StatusUnauthorized || !json.Valid(r.body) {
		t.Errorf("a malformed key: %s", r)
	}
	// Bad input: precise 4xx with the body the SDK reads, nothing made.
	for _, c := range []struct {
		method, path string
		body         any
		want         int
	}{
		{"POST", "/v2/sandboxes", "{", http.StatusBadRequest},
		{"POST", "/v2/sandboxes", map[string]any{"timeout": -1}, http.StatusBadRequest},
		{"POST", "/v2/sandboxes", map[string]any{"timeout": 1 << 40}, http.StatusBadRequest},
		{"POST", "/v2/sandboxes", map[string]any{"templateID": "no/such:template"}, http.StatusNotFound},
		{"GET", "/v2/sandboxes?limit=0", nil, http.StatusBadRequest},
		{"GET", "/v2/sandboxes?metadata=%zz", nil, http.StatusBadRequest},
		{"GET", "/sandboxes/nosuchsandbox", nil, http.StatusNotFound},
		{"POST", "/sandboxes/" + sb.SandboxID + "/fork", map[string]any{"count": 99}, http.StatusBadRequest},
		{"POST", "/sandboxes/" + sb.SandboxID + "/timeout", map[string]any{}, http.StatusBadRequest},
		{"PUT", "/sandboxes/" + sb.SandboxID + "/network", map[string]any{"denyOut": []string{"example.com"}}, http.StatusBadRequest},
		{"PUT", "/sandboxes/" + sb.SandboxID + "/network", map[string]any{"allowOut": "example.com"}, http.StatusBadRequest},
		{"POST", "/v2/sandboxes", map[string]any{"network": map[string]any{"allowOut": []string{"bad host!"}}}, http.StatusBadRequest},
		{"POST", "/v2/sandboxes", map[string]any{"network": map[string]any{"egressProxy": map[string]any{"address": "p:1080"}}}, http.StatusNotImplemented},
		{"POST", "/v2/sandboxes", map[string]any{"iam": map[string]any{"tokens": map[string]any{"aws": map[string]any{}}}}, http.StatusNotImplemented},
	} {
		r := e2bCall(t, d, a, c.method, c.path, c.body)
		var body struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if r.status != c.want || json.Unmarshal(r.body, &body) != nil || body.Code != c.want || body.Message == "" {
			t.Errorf("%s %s: want %d with {code, message}, got %s", c.method, c.path, c.want, r)
		}
	}
	if r := e2bCall(t, d, a, "GET", "/v2/sandboxes", nil); json.Unmarshal(r.body, &list) != nil || len(list) != 1 {
		t.Errorf("after the bad creates tenant a lists %s", r)
	}
}

// headerTransport adds the sandbox plane's routing and token headers.
type headerTransport struct{ id, token string }

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("E2b-Sandbox-Id", h.id)
	r.Header.Set("X-Access-Token", h.token)
	return http.DefaultTransport.RoundTrip(r)
}

// envdClient is a Connect client of the sandbox plane for one sandbox:
// process over JSON (as the JS SDK), filesystem over binary protobuf.
func envdClient(d *daemon, sb e2bSandbox, token string) (processconnect.ProcessClient, filesystemconnect.FilesystemClient) {
	hc := &http.Client{Transport: headerTransport{sb.SandboxID, token}}
	base := "http://" + d.addr + "/e2b/envd"
	return processconnect.NewProcessClient(hc, base, connect.WithProtoJSON()), filesystemconnect.NewFilesystemClient(hc, base)
}

// TestE2BPolledWatcherAndStreamInput drives what the JS SDK does not:
// the polled watcher of the Python SDK, client-streamed input, the binary
// protocol, and the answers for an unknown sandbox and a wrong token.
func TestE2BPolledWatcherAndStreamInput(t *testing.T) {
	d := shared(t)
	key := e2bKey(t, d)
	sb := e2bCreate(t, d, key, map[string]any{"templateID": "base", "timeout": 120})
	proc, fs := envdClient(d, sb, sb.EnvdAccessToken)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := fs.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: "/tmp/polled"})); err != nil {
		t.Fatal(err)
	}
	w, err := fs.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "/tmp/polled", Recursive: true}))
	if err != nil {
		t.Fatal(err)
	}
	start, err := proc.Start(ctx, connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "cat > /tmp/polled/in.txt"}}, Stdin: ptr(true),
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer start.Close()
	if !start.Receive() || start.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("no start event: %v", start.Err())
	}
	pid := start.Msg().GetEvent().GetStart().GetPid()
	in := proc.StreamInput(ctx)
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
	msgs := []*process.StreamInputRequest{
		{Event: &process.StreamInputRequest_Start{Start: &process.StreamInputRequest_StartEvent{Process: sel}}},
		{Event: &process.StreamInputRequest_Data{Data: &process.StreamInputRequest_DataEvent{Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("streamed\n")}}}}},
	}
	for _, m := range msgs {
		if err := in.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := in.CloseAndReceive(); err != nil {
		t.Fatalf("stream input: %v", err)
	}
	if _, err := proc.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	var end *process.ProcessEvent_EndEvent
	for start.Receive() {
		if e := start.Msg().GetEvent().GetEnd(); e != nil {
			end = e
		}
	}
	if end == nil || end.GetExitCode() != 0 || !end.GetExited() {
		t.Fatalf("end: %v %v", end, start.Err())
	}
	var names []string
	if err := waitFor(10*time.Second, func() error {
		r, err := fs.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: w.Msg.GetWatcherId()}))
		if err != nil {
			return err
		}
		for _, ev := range r.Msg.GetEvents() {
			names = append(names, ev.GetName()+":"+ev.GetType().String())
		}
		for _, n := range names {
			if n == "in.txt:EVENT_TYPE_CREATE" {
				return nil
			}
		}
		return fmt.Errorf("events %v", names)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.RemoveWatcher(ctx, connect.NewRequest(&filesystem.RemoveWatcherRequest{WatcherId: w.Msg.GetWatcherId()})); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: w.Msg.GetWatcherId()})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("a removed watcher: %v", err)
	}
	// The file the command wrote, read back through the plane's files API.
	r, err := d.api.send("GET", "/e2b/envd/files?path=/tmp/polled/in.txt", nil, "E2b-Sandbox-Id", sb.SandboxID, "X-Access-Token", sb.EnvdAccessToken)
	if err != nil || r.status != http.StatusOK || string(r.body) != "streamed\n" {
		t.Fatalf("download: %v %v", r, err)
	}
	// The command shows in the sandbox's live events (an extension).
	// (The kernel's events reach the record a moment after the command ran.)
	if err := waitFor(10*time.Second, func() error {
		ev, err := d.api.send("GET", "/e2b/sandboxes/"+sb.SandboxID+"/events?type=proc&follow=false", nil, "X-API-KEY", key)
		if err != nil || ev.status != http.StatusOK || !strings.Contains(string(ev.body), "/tmp/polled/in.txt") {
			return fmt.Errorf("events: %v %v", ev, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// envd's /metrics: the sandbox's resource use.
	if r, err := d.api.send("GET", "/e2b/envd/metrics", nil, "E2b-Sandbox-Id", sb.SandboxID, "X-Access-Token", sb.EnvdAccessToken); err != nil || r.status != http.StatusOK || !strings.Contains(string(r.body), `"mem_total"`) {
		t.Fatalf("metrics: %v %v", r, err)
	}
	// A wrong token is 401, an unknown sandbox 502 (E2B's edge answer).
	_, badFS := envdClient(d, sb, "wrong")
	if _, err := badFS.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: "/"})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("wrong token: %v", err)
	}
	_, goneFS := envdClient(d, e2bSandbox{SandboxID: "nosuchsandbox0000000"}, "x")
	if _, err := goneFS.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: "/"})); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("unknown sandbox: %v", err)
	}
}

func ptr[T any](v T) *T { return &v }

// startDetached starts a command in sandbox sb and leaves it running
// without a stream (a command outlives the stream that started it); it
// returns the command's pid.
func startDetached(t *testing.T, d *daemon, sb e2bSandbox, req *process.StartRequest) uint32 {
	t.Helper()
	proc, _ := envdClient(d, sb, sb.EnvdAccessToken)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := proc.Start(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !st.Receive() || st.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("no start event: %v", st.Err())
	}
	return st.Msg().GetEvent().GetStart().GetPid()
}

// portEcho is a server for a sandbox's port 8000: it answers every
// request with its path, headers and body, as JSON.
const portEcho = `
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self): self.answer(b"")
    def do_POST(self): self.answer(self.rfile.read(int(self.headers.get("Content-Length", 0))))
    def answer(self, body):
        out = json.dumps({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body.decode()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", 8000), H).serve_forever()
`

// TestE2BSandboxPorts: a request on the sandbox plane that names another
// port (E2b-Sandbox-Port, as E2B's edge routes it and the code
// interpreter's SDK sends it) reaches that port in the sandbox, a server
// bound to the sandbox's loopback included; it needs the sandbox's access
// token, and neither that token, the daemon's nor the routing headers
// reach the sandbox; each connection shows in the sandbox's network
// record. Bad ports and ports where nothing listens get a precise error.
func TestE2BSandboxPorts(t *testing.T) {
	d := shared(t)
	key := e2bKey(t, d)
	sb := e2bCreate(t, d, key, map[string]any{"templateID": "base", "timeout": 120,
		"network": map[string]any{"maskRequestHost": "app-${PORT}.sandbox.test"}})
	// The server outlives the stream that started it, as any command.
	startDetached(t, d, sb, &process.StartRequest{Process: &process.ProcessConfig{Cmd: "python3", Args: []string{"-c", portEcho}}})

	forward := func(method, path string, in any, port, token string) *response {
		t.Helper()
		hdr := []string{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", port}
		if token != "" {
			hdr = append(hdr, "X-Access-Token", token)
		}
		r, err := d.api.send(method, "/e2b/envd"+path, in, hdr...)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	type echo struct {
		Path    string            `json:"path"`
		Headers map[string]string `json:"headers"`
		Body    string            `json:"body"`
	}
	var got echo
	if err := waitFor(20*time.Second, func() error {
		r := forward("GET", "/hello?x=1", nil, "8000", sb.EnvdAccessToken)
		if r.status != http.StatusOK {
			return fmt.Errorf("GET through port 8000: %s", r)
		}
		return json.Unmarshal(r.body, &got)
	}); err != nil {
		t.Fatal(err)
	}
	if got.Path != "/hello?x=1" {
		t.Errorf("the server saw path %q, want /hello?x=1", got.Path)
	}
	if h := got.Headers["host"]; h != "app-8000.sandbox.test" {
		t.Errorf("the server saw Host %q, want the sandbox's maskRequestHost, app-8000.sandbox.test", h)
	}
	for _, h := range []string{"x-access-token", "authorization", "e2b-sandbox-id", "e2b-sandbox-port"} {
		if v, ok := got.Headers[h]; ok {
			t.Errorf("header %s reached the sandbox: %q", h, v)
		}
	}
	r := forward("POST", "/upload", map[string]string{"a": "b"}, "8000", sb.EnvdAccessToken)
	if r.status != http.StatusOK || json.Unmarshal(r.body, &got) != nil || got.Body != `{"a":"b"}` {
		t.Fatalf("POST through port 8000: %s", r)
	}
	// Each connection into the sandbox shows in its network record (the
	// server closes them after each answer, HTTP/1.0).
	if err := waitFor(10*time.Second, func() error {
		ev, err := d.api.send("GET", "/e2b/sandboxes/"+sb.SandboxID+"/events?type=net&follow=false", nil, "X-API-KEY", key)
		if err != nil || ev.status != http.StatusOK {
			return fmt.Errorf("events: %v %v", ev, err)
		}
		n := 0
		for _, line := range strings.Split(strings.TrimSpace(string(ev.body)), "\n") {
			var e struct {
				Dir, Via, Dst, Verdict string
				Bytes                  int64 `json:"bytes"`
				BytesIn                int64 `json:"bytes_in"`
			}
			if json.Unmarshal([]byte(line), &e) == nil && e.Dir == "ingress" && e.Via == "preview" && e.Verdict == "allow" &&
				e.Dst == "127.0.0.1:8000" && e.Bytes > 0 && e.BytesIn > 0 {
				n++
			}
		}
		if n < 2 {
			return fmt.Errorf("%d records of connections into port 8000, want 2 or more: %s", n, ev.body)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		what, port, token string
		status            int
	}{
		{"no token", "8000", "", http.StatusUnauthorized},
		{"a wrong token", "8000", "wrong", http.StatusUnauthorized},
		{"a port nothing listens on", "8001", sb.EnvdAccessToken, http.StatusBadGateway},
		{"port 0", "0", sb.EnvdAccessToken, http.StatusBadRequest},
		{"a port above 65535", "70000", sb.EnvdAccessToken, http.StatusBadRequest},
		{"not a number", "http", sb.EnvdAccessToken, http.StatusBadRequest},
	} {
		if r := forward("GET", "/", nil, tc.port, tc.token); r.status != tc.status {
			t.Errorf("%s: %s, want %d", tc.what, r, tc.status)
		}
	}
}

// TestE2BSurvivesRestart: a sandbox, its token, its detached command and
// its timeout outlive a daemon restart; the key still works.
func TestE2BSurvivesRestart(t *testing.T) {
	d := newDaemon(t)
	key := e2bKey(t, d)
	sb := e2bCreate(t, d, key, map[string]any{"templateID": "base", "timeout": 120})
	pid := startDetached(t, d, sb, &process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/sleep", Args: []string{"600"}}, Tag: ptr("sleeper"),
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	if err := d.restart(); err != nil {
		t.Fatal(err)
	}
	if s := e2bState(t, d, key, sb.SandboxID); s != "running" {
		t.Fatalf("after the restart the sandbox is %q", s)
	}
	proc, _ := envdClient(d, sb, sb.EnvdAccessToken)
	list, err := proc.List(ctx, connect.NewRequest(&process.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range list.Msg.GetProcesses() {
		found = found || (p.GetPid() == pid && p.GetTag() == "sleeper" && p.GetConfig().GetCmd() == "/bin/sleep")
	}
	if !found {
		t.Fatalf("the detached command %d (tag sleeper) is gone after the restart: %v", pid, list.Msg.GetProcesses())
	}
	if _, err := proc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: "sleeper"}}, Signal: process.Signal_SIGNAL_SIGKILL,
	})); err != nil {
		t.Fatal(err)
	}
}

// TestE2BKeepaliveAndLifetime: an idle stream gets keepalives at the
// client's Keepalive-Ping-Interval, and Connect-Timeout-Ms is the
// command's lifetime: the stream ends deadline_exceeded and the command
// is killed, not left running.
func TestE2BKeepaliveAndLifetime(t *testing.T) {
	d := shared(t)
	key := e2bKey(t, d)
	sb := e2bCreate(t, d, key, map[string]any{"templateID": "base", "timeout": 120})
	proc, _ := envdClient(d, sb, sb.EnvdAccessToken)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/sleep", Args: []string{"600"}}})
	req.Header().Set("Keepalive-Ping-Interval", "1")
	sctx, scancel := context.WithTimeout(ctx, 2500*time.Millisecond) // sent as Connect-Timeout-Ms
	defer scancel()
	st, err := proc.Start(sctx, req)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var pid uint32
	keepalives := 0
	for st.Receive() {
		switch ev := st.Msg().GetEvent(); {
		case ev.GetStart() != nil:
			pid = ev.GetStart().GetPid()
		case ev.GetKeepalive() != nil:
			keepalives++
		}
	}
	if keepalives < 1 || connect.CodeOf(st.Err()) != connect.CodeDeadlineExceeded {
		t.Fatalf("%d keepalives, end %v", keepalives, st.Err())
	}
	if err := waitFor(10*time.Second, func() error {
		list, err := proc.List(ctx, connect.NewRequest(&process.ListRequest{}))
		if err != nil {
			return err
		}
		for _, p := range list.Msg.GetProcesses() {
			if p.GetPid() == pid {
				return fmt.Errorf("pid %d still runs past its lifetime", pid)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
