package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/api/apitest"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
)

// fuzzRoutes are the routes FuzzAPIRequests sends bodies, paths and
// queries to: every route that decodes a body, and the routes that read a
// jail path or query parameters without streaming forever. {path} is
// replaced by the fuzzed path, SID by a snapshot of the jail "box".
// A stream that follows (?follow, the default) is answered with 200 and
// runs until the client leaves: its request is given a short deadline.
var fuzzRoutes = []struct {
	method, target string
	stream         bool // follows until the client leaves (unless follow=false)
}{
	{"POST", "/jails", false},
	{"POST", "/jails/box/stop", false},
	{"POST", "/jails/box/exec", false},
	{"POST", "/jails/box/exec/stream", false},
	{"PUT", "/jails/box/network", false},
	{"POST", "/jails/box/terminal/ticket", false},
	{"POST", "/jails/box/snapshot", false},
	{"POST", "/snapshots/SID/restore", false},
	{"POST", "/snapshots/SID/branch", false},
	{"GET", "/jails/box/files/{path}", false},
	{"PUT", "/jails/box/files/{path}", false},
	{"DELETE", "/jails/box/files/{path}", false},
	{"GET", "/jails/box/fs/diff", false},
	{"GET", "/snapshots/SID/diff", false},
	{"GET", "/diff", false},
	{"GET", "/jails/box/events", true},
	{"GET", "/stats", true},
	{"GET", "/jails/{path}", false},
}

// validatingService checks a create's config as the jail manager does
// (defaults, then validation for the daemon's host), so that a config
// the daemon refuses is refused here too.
type validatingService struct{ *apitest.Service }

var fuzzHost = config.Host{NofileMax: 1 << 20, CPUs: 2, Levels: []string{config.LevelContainer}, NetworkModes: []string{config.NetIsolated, config.NetNone, config.NetBridge}}

func (v validatingService) Create(ctx context.Context, req model.CreateRequest) (*model.Jail, error) {
	cfg := req.Config
	cfg.ApplyDefaults()
	if err := cfg.Validate(fuzzHost); err != nil {
		return nil, err
	}
	return v.Service.Create(ctx, req)
}

// statusOfCode maps every error code to the status it must come with.
var statusOfCode = func() map[string]int {
	m := map[string]int{"not_found": 404, "method_not_allowed": 405, "redirect": 0, "unauthorized": 401}
	for _, k := range statusKinds {
		m[errdefs.Code(k.kind)] = k.status
	}
	return m
}()

// FuzzAPIRequests sends arbitrary bodies (JSON or YAML), jail paths and
// query strings through the API's real handler, over the in-memory
// service with a running jail "box" that has a file and a snapshot. No
// request panics, hangs or gets a 5xx: each is served (2xx), redirected to
// its clean path (3xx) or refused with a precise 4xx whose JSON error
// body's code matches its status.
func FuzzAPIRequests(f *testing.F) {
	seeds := []struct {
		route        uint8
		path, query  string
		body         string
		contentYAML  bool
		contentIsSet bool
	}{
		{0, "", "", `{"name":"a","isolation":{"resources":{"memory_bytes":1073741824}}}`, false, true},
		{0, "", "", "name: a\nenv:\n  A: b\nisolation:\n  resources:\n    pids_limit: 64\n", true, true},
		{0, "", "", `{"name":"a","start":false,"isolation":{"network":{"mode":"none"}},"tracing":{"mode":"off"}}`, false, false},
		{1, "", "", `{"timeout_s":3}`, false, true},
		{2, "", "", `{"cmd":["echo","hi"],"env":{"A":"b"},"cwd":"/","timeout_ms":100}`, false, true},
		{2, "", "", `{"cmd":["cat"],"stdin":"aGk=","encoding":"base64"}`, false, true},
		{3, "", "", `{"cmd":["fail","3","no"]}`, false, true},
		{2, "", "", `{"cmd":["kill"]}`, false, true},
		{4, "", "", `{"mode":"isolated","allowed_egress":[{"destination":"pypi.org","ports":[443]}]}`, false, true},
		{5, "", "", `{"cols":80,"rows":24}`, false, true},
		{6, "", "", `{"name":"s2","mode":"fs"}`, false, true},
		{7, "", "", `{"name":"r"}`, false, true},
		{8, "", "", `{"count":2,"name_prefix":"b"}`, false, true},
		{9, "workspace/a.txt", "stat=true", "", false, false},
		{9, "workspace", "access=write&user=root", "", false, false},
		{10, "workspace/new.txt", "mode=0600", "data", false, false},
		{10, "workspace/dir", "type=dir", "", false, false},
		{10, "workspace/link", "type=symlink&target=a.txt", "", false, false},
		{11, "workspace/a.txt", "recursive=true", "", false, false},
		{12, "", "text=true", "", false, false},
		{13, "", "text=false", "", false, false},
		{14, "", "from=box&to=SID&text=true", "", false, false},
		{15, "", "follow=false&history=10&types=proc,net", "", false, false},
		{16, "", "follow=false&interval_ms=500", "", false, false},
		{17, "box", "", "", false, false},
		{9, "../../etc/passwd", "", "", false, false},
		{10, "%2e%2e/x", "mode=9999", "x", false, false},
	}
	for _, s := range seeds {
		f.Add(s.route, s.path, s.query, []byte(s.body), s.contentYAML, s.contentIsSet)
	}
	f.Fuzz(func(t *testing.T, route uint8, jailPath, rawQuery string, body []byte, contentYAML, contentIsSet bool) {
		svc := apitest.New()
		var logs bytes.Buffer
		h := NewServer(validatingService{svc}, testToken, slog.New(slog.NewTextHandler(&logs, nil)))
		must := func(method, target, body string) []byte {
			r := httptest.NewRequest(method, target, strings.NewReader(body))
			r.Header.Set("Authorization", "Bearer "+testToken)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code/100 != 2 {
				t.Fatalf("setup %s %s: %d %s", method, target, w.Code, w.Body)
			}
			return w.Body.Bytes()
		}
		must("POST", "/jails", `{"name":"box"}`)
		must("PUT", "/jails/box/files/workspace/a.txt", "hello\n")
		var snap model.Snapshot
		if err := json.Unmarshal(must("POST", "/jails/box/snapshot", `{"name":"s1"}`), &snap); err != nil {
			t.Fatal(err)
		}

		rt := fuzzRoutes[int(route)%len(fuzzRoutes)]
		target := strings.ReplaceAll(rt.target, "SID", snap.ID)
		target = strings.ReplaceAll(target, "{path}", jailPath)
		rawQuery = strings.ReplaceAll(rawQuery, "SID", snap.ID)
		if rawQuery != "" {
			target += "?" + rawQuery
		}
		r, err := http.NewRequest(rt.method, target, bytes.NewReader(body))
		if err != nil || r.URL.Path == "" || r.URL.Path[0] != '/' || r.URL.Host != "" || r.URL.Opaque != "" {
			return // not a request line an HTTP server would pass on
		}
		r.RequestURI = target
		r.Header.Set("Authorization", "Bearer "+testToken)
		if contentIsSet {
			if contentYAML {
				r.Header.Set("Content-Type", "application/yaml")
			} else {
				r.Header.Set("Content-Type", "application/json")
			}
		}
		deadline := 10 * time.Second
		if rt.stream {
			deadline = 200 * time.Millisecond
		}
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		r = r.WithContext(ctx)
		guard := time.AfterFunc(15*time.Second, func() { panic(fmt.Sprintf("%s %s did not finish in 15s", rt.method, target)) })
		defer guard.Stop()
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if ctx.Err() != nil && !rt.stream {
			t.Fatalf("%s %s ran until its deadline (%d)", rt.method, target, w.Code)
		}
		switch w.Code / 100 {
		case 2:
			return
		case 3:
			if w.Header().Get("Location") == "" {
				t.Fatalf("%s %s: %d without a Location", rt.method, target, w.Code)
			}
			return
		case 4:
		default:
			t.Fatalf("%s %s: %d %s\nbody: %q\nlog: %s", rt.method, target, w.Code, w.Body, body, logs.String())
		}
		var eb ErrorBody
		dec := json.NewDecoder(bytes.NewReader(w.Body.Bytes()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&eb); err != nil || eb.Error.Code == "" || eb.Error.Message == "" {
			t.Fatalf("%s %s: %d with the error body %q (%v)", rt.method, target, w.Code, w.Body, err)
		}
		if want, ok := statusOfCode[eb.Error.Code]; !ok || want != w.Code {
			t.Fatalf("%s %s: status %d with code %q", rt.method, target, w.Code, eb.Error.Code)
		}
		if _, err := io.Copy(io.Discard, w.Body); err != nil {
			t.Fatal(err)
		}
	})
}
