package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/api/apitest"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/model"
)

// fuzzJails is the in-memory jail service with the process and watch
// operations the control plane does not use.
type fuzzJails struct{ *apitest.Service }

var errNoProcesses = errdefs.NotImplementedf("no processes in the in-memory service")

func (fuzzJails) Rename(context.Context, string, string, string) (*model.FileInfo, error) {
	return nil, errNoProcesses
}
func (fuzzJails) WatchDir(context.Context, string, string, bool) (*initclient.Watch, error) {
	return nil, errNoProcesses
}
func (fuzzJails) StartProcess(context.Context, string, model.ExecRequest, bool, *model.TerminalRequest) (*initclient.Process, error) {
	return nil, errNoProcesses
}
func (fuzzJails) AttachProcess(context.Context, string, int) (*initclient.Process, error) {
	return nil, errNoProcesses
}
func (fuzzJails) ProcessInput(context.Context, string, int, []byte, bool) error {
	return errNoProcesses
}
func (fuzzJails) ResizeProcess(context.Context, string, int, int, int) error { return errNoProcesses }
func (fuzzJails) SignalProcess(context.Context, string, int, string) error   { return errNoProcesses }
func (fuzzJails) Commands(context.Context, string) ([]initproto.ProcessInfo, error) {
	return nil, errNoProcesses
}

var _ Jails = fuzzJails{}

// e2bFuzzRoutes are the control plane's routes; SBX is a running sandbox,
// SNAP a snapshot of it, TPL a template with a waiting build BLD, VOL a
// volume.
var e2bFuzzRoutes = []struct{ method, path string }{
	{"POST", "/e2b/v2/sandboxes"},
	{"POST", "/e2b/sandboxes"},
	{"GET", "/e2b/v2/sandboxes"},
	{"GET", "/e2b/sandboxes/SBX"},
	{"DELETE", "/e2b/sandboxes/SBX"},
	{"POST", "/e2b/sandboxes/SBX/timeout"},
	{"POST", "/e2b/sandboxes/SBX/pause"},
	{"POST", "/e2b/v2/sandboxes/SBX/connect"},
	{"POST", "/e2b/sandboxes/SBX/fork"},
	{"GET", "/e2b/sandboxes/SBX/metrics"},
	{"POST", "/e2b/sandboxes/SBX/snapshots"},
	{"GET", "/e2b/snapshots"},
	{"DELETE", "/e2b/templates/SNAP"},
	{"GET", "/e2b/sandboxes/SBX/report"},
	{"PUT", "/e2b/sandboxes/SBX/network"},
	{"POST", "/e2b/v3/templates"},
	{"GET", "/e2b/templates/TPL/files/0000000000000000000000000000000000000000000000000000000000000000"},
	{"PUT", "/e2b/templates/TPL/files/0000000000000000000000000000000000000000000000000000000000000000"},
	{"POST", "/e2b/v2/templates/TPL/builds/BLD"},
	{"GET", "/e2b/templates/TPL/builds/BLD/status"},
	{"GET", "/e2b/templates/aliases/fz"},
	{"GET", "/e2b/templates/TPL/tags"},
	{"POST", "/e2b/templates/tags"},
	{"DELETE", "/e2b/templates/tags"},
	{"DELETE", "/e2b/templates/TPL"},
	{"GET", "/e2b/templates"},
	{"POST", "/e2b/volumes"},
	{"GET", "/e2b/volumes/VOL"},
	{"DELETE", "/e2b/volumes/VOL"},
	{"PUT", "/e2b/volumecontent/VOL/file"},
	{"GET", "/e2b/volumecontent/VOL/dir"},
}

// FuzzControlPlane sends arbitrary bodies and queries to the E2B control
// plane over the in-memory jail service (SBX and SNAP in a body or query
// name the sandbox and its snapshot): nothing panics or hangs, and
// every answer is a success or an error the SDK can read ({"code": the
// status, "message"}) whose status is a 4xx, or 501 for what agentjail
// does not implement — never another 5xx.
func FuzzControlPlane(f *testing.F) {
	for _, s := range []struct {
		route       uint8
		query, body string
	}{
		{0, "", `{"templateID":"base","timeout":60,"metadata":{"a":"b"},"envVars":{"X":"1"},"autoPause":true}`},
		{0, "", `{"templateID":"SNAP"}`},
		{0, "", `{"mcp":{"x":1}}`},
		{0, "", `{"timeout":-1}`},
		{2, "metadata=a%3Db&state=running,paused&limit=2&nextToken=x", ""},
		{5, "", `{"timeout":5}`},
		{5, "", `{}`},
		{7, "", `{"timeout":86401}`},
		{8, "", `{"count":3,"timeout":10}`},
		{10, "", `{"name":"snap-1"}`},
		{11, "sandboxID=SBX", ""},
		{12, "", ""},
		{9, "start=0&end=99999999999", ""},
		{0, "", `{"allow_internet_access":true,"network":{"allowOut":["a.example","10.0.0.0/8"],"denyOut":["0.0.0.0/0"],"rules":{"a.example":[{"transform":{"headers":{"X-A":"b"}}}]},"maskRequestHost":"${PORT}.x"}}`},
		{14, "", `{"allowOut":["a.example"],"denyOut":["0.0.0.0/0"],"allow_internet_access":false}`},
		{14, "", `{"denyOut":["a.example"]}`},
		{0, "", `{"autoPause":true,"autoResume":{"enabled":true}}`},
		{0, "", `{"autoResume":{"enabled":true}}`},
		{15, "", `{"name":"fz:v1","tags":["a"],"cpuCount":1,"memoryMB":128}`},
		{16, "", ""},
		{17, "token=x", "data"},
		{18, "", `{"fromImage":"busybox","steps":[{"type":"RUN","args":["echo hi"]},{"type":"ENV","args":["A","1"]},{"type":"WORKDIR","args":["/srv"]}],"startCmd":"sleep 1","readyCmd":"true"}`},
		{18, "", `{"fromTemplate":"fz","steps":[{"type":"COPY","args":["a","/b"],"filesHash":"0000000000000000000000000000000000000000000000000000000000000000"}]}`},
		{19, "logsOffset=3", ""},
		{22, "", `{"target":"fz:default","tags":["b"]}`},
		{23, "", `{"name":"fz","tags":["default"]}`},
		{0, "", `{"templateID":"fz:default"}`},
		{0, "", `{"volumeMounts":[{"name":"fzv","path":"/data"}]}`},
		{0, "", `{"volumeMounts":[{"name":"fzv","path":"data"},{"name":"nope","path":"/x"}]}`},
		{26, "", `{"name":"fzv2"}`},
		{29, "path=/a/../../b&force=true", "data"},
		{30, "path=/&depth=3", ""},
	} {
		f.Add(s.route, s.query, []byte(s.body))
	}
	const token = "e2b-fuzz-admin-token-0123456789"
	// A sandbox whose timeout is 0 expires at once, and its expiry may
	// still be writing its record when the input is done: the data dirs
	// live until the end of the run, not of each input.
	base, err := os.MkdirTemp("", "e2b-fuzz-")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { os.RemoveAll(base) })
	f.Fuzz(func(t *testing.T, route uint8, rawQuery string, body []byte) {
		dir, err := os.MkdirTemp(base, "")
		if err != nil {
			t.Fatal(err)
		}
		svc, err := New(context.Background(), fuzzJails{apitest.New()}, Options{DataDir: dir, AdminToken: token, Images: &fakeImages{}, Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		defer svc.Close()
		// volToken authorizes the volume content API once the volume is made.
		volToken := ""
		do := func(method, target string, body []byte) *httptest.ResponseRecorder {
			r, err := http.NewRequest(method, target, bytes.NewReader(body))
			if err != nil {
				return nil
			}
			r.RequestURI = target
			r.Header.Set("X-API-KEY", token)
			r.Header.Set("Authorization", "Bearer "+volToken)
			w := httptest.NewRecorder()
			svc.ServeHTTP(w, r)
			return w
		}
		var sbx struct {
			SandboxID string `json:"sandboxID"`
		}
		var snap struct {
			SnapshotID string `json:"snapshotID"`
		}
		w := do("POST", "/e2b/v2/sandboxes", []byte(`{}`))
		if w.Code != http.StatusCreated || json.Unmarshal(w.Body.Bytes(), &sbx) != nil {
			t.Fatalf("create: %d %s", w.Code, w.Body)
		}
		w = do("POST", "/e2b/sandboxes/"+sbx.SandboxID+"/snapshots", nil)
		if w.Code != http.StatusCreated || json.Unmarshal(w.Body.Bytes(), &snap) != nil {
			t.Fatalf("snapshot: %d %s", w.Code, w.Body)
		}

		var vol struct{ VolumeID, Token string }
		w = do("POST", "/e2b/volumes", []byte(`{"name":"fzv"}`))
		if w.Code != http.StatusCreated || json.Unmarshal(w.Body.Bytes(), &vol) != nil {
			t.Fatalf("volume: %d %s", w.Code, w.Body)
		}
		volToken = vol.Token
		var tpl struct{ TemplateID, BuildID string }
		w = do("POST", "/e2b/v3/templates", []byte(`{"name":"fz"}`))
		if w.Code != http.StatusAccepted || json.Unmarshal(w.Body.Bytes(), &tpl) != nil {
			t.Fatalf("template: %d %s", w.Code, w.Body)
		}

		rt := e2bFuzzRoutes[int(route)%len(e2bFuzzRoutes)]
		target := rt.path
		if rawQuery != "" {
			target += "?" + rawQuery
		}
		ids := strings.NewReplacer("SBX", sbx.SandboxID, "SNAP", snap.SnapshotID, "TPL", tpl.TemplateID, "BLD", tpl.BuildID, "VOL", vol.VolumeID)
		target = ids.Replace(target)
		body = []byte(ids.Replace(string(body)))
		guard := time.AfterFunc(15*time.Second, func() { panic(fmt.Sprintf("%s %s did not finish in 15s", rt.method, target)) })
		defer guard.Stop()
		w = do(rt.method, target, body)
		if w == nil || w.Code/100 == 2 {
			return
		}
		var eb struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &eb); err != nil || eb.Code != w.Code || eb.Message == "" {
			t.Fatalf("%s %s: %d with the body %q", rt.method, target, w.Code, w.Body)
		}
		if w.Code/100 != 4 && w.Code != http.StatusNotImplemented {
			t.Fatalf("%s %s: %d %s\nbody %q", rt.method, target, w.Code, w.Body, body)
		}
		io.Copy(io.Discard, w.Body)
	})
}
