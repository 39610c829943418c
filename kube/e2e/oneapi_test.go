package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/agentjail/agentjail/internal/image/imagetest"
	"github.com/agentjail/agentjail/internal/testenv"
	"github.com/agentjail/agentjail/kube/gateway"
	"github.com/agentjail/agentjail/kube/internal/kubetest"
)

// e2bProject is test/e2b, the Node project with the official e2b SDK
// (scripts/setup.sh runs npm ci there).
func e2bProject(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(wd, "..", "..", "test", "e2b")
	_, nodeErr := exec.LookPath("node")
	_, sdkErr := os.Stat(filepath.Join(dir, "node_modules", "e2b", "package.json"))
	if nodeErr != nil || sdkErr != nil {
		testenv.Need(t, "node and the e2b SDK (scripts/setup.sh runs npm ci in test/e2b)")
	}
	return dir
}

// testE2BTemplate: the SDK's template builds (test/e2b/template.test.mjs)
// through the gateway: each request about a template, its uploads
// included, reaches the node that builds it, and sandboxes of a template
// land there.
func (e *env) testE2BTemplate(t *testing.T) {
	dir := e2bProject(t)
	bb := testenv.RequireTool(t, "busybox")
	// The SDK runs commands with bash: busybox's sh stands in for it.
	bash := imagetest.Layer(t, imagetest.Entry{Name: "bin/bash", Body: "#!/bin/sh\nexec /bin/sh \"$@\"\n", Mode: 0o755})
	base := imagetest.Image(t, v1.Config{Env: []string{"PATH=/bin"}}, imagetest.Layer(t, imagetest.Busybox(t, bb)...), bash)
	img := e.reg.Push(t, "test/template-base:1", base)
	private := e.reg.Push(t, "private/template-base:1", base)
	e.reg.RequireAuth("private/", "robot", "s3cret")
	defer e.reg.SetHook(nil)
	e.runE2BScenario(t, dir, "template.test.mjs", "AJ_TEST_IMAGE="+img, "AJ_TEST_PRIVATE_IMAGE="+private, "AJ_TEST_PRIVATE_AUTH=robot:s3cret")
}

// testE2BVolume: the SDK's volumes (test/e2b/volume.test.mjs) through the
// gateway. A volume is one node's directory: it is made on a node, its
// content API (authorized by the volume's token) reaches that node, and
// every sandbox that mounts it lands there.
func (e *env) testE2BVolume(t *testing.T) {
	e.runE2BScenario(t, e2bProject(t), "volume.test.mjs", "E2B_VOLUME_API_URL="+e.gateway+"/e2b")
}

// runE2BScenario runs a node test file of test/e2b with the SDK pointed
// at the gateway (and env added); it fails t, with the gateway's log, if
// the scenario does.
func (e *env) runE2BScenario(t *testing.T, dir, file string, env ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	base := e.gateway + "/e2b"
	cmd := exec.CommandContext(ctx, "node", "--test", "--test-concurrency=1", "--test-reporter=spec", file)
	cmd.Dir = dir
	cmd.Env = append([]string{"E2B_API_KEY=" + e.c.AgentjailToken, "E2B_API_URL=" + base, "E2B_SANDBOX_URL=" + base + "/envd"}, env...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "E2B_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	t.Logf("node --test %s through the gateway:\n%s", file, out)
	if err != nil {
		if b, rerr := os.ReadFile(filepath.Join(e.c.Dir, "gateway.log")); rerr == nil {
			t.Logf("the gateway's log:\n%s", b)
		}
		t.Fatalf("the E2B scenario %s through the gateway failed: %v", file, err)
	}
}

// testE2B: the official e2b SDK, unchanged, runs the whole E2B wire
// contract scenario (test/e2b/compat.test.mjs: commands, streams, files,
// signed URLs, PTY, pause and resume, fork, snapshots as templates, typed
// errors) against the gateway; new sandboxes land on both nodes, each
// reachable through the gateway and held by one node.
func (e *env) testE2B(t *testing.T) {
	e.runE2BScenario(t, e2bProject(t), "compat.test.mjs")
	base := e.gateway + "/e2b"

	// Two new sandboxes: one on each node, found through the gateway.
	key := http.Header{"X-Api-Key": {e.c.AgentjailToken}, "Content-Type": {"application/json"}}
	placed := map[string]string{}
	for range 2 {
		res, body := do(t, "POST", base+"/v2/sandboxes", key, `{"templateID":"base","timeout":120}`)
		var sb struct {
			SandboxID string `json:"sandboxID"`
		}
		if res.StatusCode != http.StatusCreated && res.StatusCode != http.StatusOK || json.Unmarshal(body, &sb) != nil || sb.SandboxID == "" {
			t.Fatalf("create through the gateway: %d %s", res.StatusCode, body)
		}
		placed[sb.SandboxID] = res.Header.Get(gateway.NodeHeader)
	}
	for id, node := range placed {
		for _, nd := range e.nodes {
			res, body := do(t, "GET", nd.DaemonURL+"/e2b/sandboxes/"+id, key, "")
			if held := res.StatusCode == http.StatusOK; held != (nd.Name == node) {
				t.Fatalf("sandbox %s (placed on %s) on node %s: %d %s", id, node, nd.Name, res.StatusCode, body)
			}
		}
		if res, body := do(t, "GET", base+"/sandboxes/"+id, key, ""); res.StatusCode != http.StatusOK || res.Header.Get(gateway.NodeHeader) != node {
			t.Fatalf("sandbox %s through the gateway: %d %s from %s", id, res.StatusCode, body, res.Header.Get(gateway.NodeHeader))
		}
		// The sandbox plane finds it by its E2b-Sandbox-Id header.
		envd := http.Header{"E2b-Sandbox-Id": {id}}
		if res, body := do(t, "GET", base+"/envd/health", envd, ""); res.StatusCode != http.StatusNoContent || res.Header.Get(gateway.NodeHeader) != node {
			t.Fatalf("sandbox plane of %s through the gateway: %d %s from %s", id, res.StatusCode, body, res.Header.Get(gateway.NodeHeader))
		}
	}
	if len(uniq(placed)) != 2 {
		t.Fatalf("two sandboxes placed on %v, want both nodes", placed)
	}
	res, body := do(t, "GET", base+"/v2/sandboxes", key, "")
	var listed []struct {
		SandboxID string `json:"sandboxID"`
	}
	if res.StatusCode != http.StatusOK || json.Unmarshal(body, &listed) != nil || len(listed) != 2 {
		t.Fatalf("the gateway's list of sandboxes: %d %s", res.StatusCode, body)
	}
	for id := range placed {
		if res, body := do(t, "DELETE", base+"/sandboxes/"+id, key, ""); res.StatusCode != http.StatusNoContent {
			t.Fatalf("kill %s through the gateway: %d %s", id, res.StatusCode, body)
		}
	}
	if res, body := do(t, "GET", base+"/v2/sandboxes", http.Header{"X-Api-Key": {"aj_wrong"}}, ""); res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a wrong key through the gateway: %d %s", res.StatusCode, body)
	}

	// An API key is known to the node that issued it only: through the
	// gateway its sandboxes go there, and its lists hold them.
	issuer := e.nodes[0]
	res, body = do(t, "POST", issuer.DaemonURL+"/keys", http.Header{"Authorization": {"Bearer " + e.c.AgentjailToken}, "Content-Type": {"application/json"}},
		`{"name":"gateway-test","tenant":"gateway-test"}`)
	var k struct {
		Secret string `json:"secret"`
	}
	if res.StatusCode != http.StatusCreated || json.Unmarshal(body, &k) != nil || k.Secret == "" {
		t.Fatalf("a key on %s: %d %s", issuer.Name, res.StatusCode, body)
	}
	withKey := http.Header{"X-Api-Key": {k.Secret}, "Content-Type": {"application/json"}}
	var mine []string
	for range 2 {
		res, body := do(t, "POST", base+"/v2/sandboxes", withKey, `{"templateID":"base","timeout":120}`)
		var sb struct {
			SandboxID string `json:"sandboxID"`
		}
		if res.StatusCode/100 != 2 || json.Unmarshal(body, &sb) != nil || res.Header.Get(gateway.NodeHeader) != issuer.Name {
			t.Fatalf("create with %s's key through the gateway: %d %s on %s", issuer.Name, res.StatusCode, body, res.Header.Get(gateway.NodeHeader))
		}
		mine = append(mine, sb.SandboxID)
	}
	res, body = do(t, "GET", base+"/v2/sandboxes", withKey, "")
	if res.StatusCode != http.StatusOK || json.Unmarshal(body, &listed) != nil || len(listed) != 2 {
		t.Fatalf("the list with %s's key through the gateway: %d %s", issuer.Name, res.StatusCode, body)
	}
	for _, id := range mine {
		if res, body := do(t, "DELETE", base+"/sandboxes/"+id, withKey, ""); res.StatusCode != http.StatusNoContent {
			t.Fatalf("kill %s with the key through the gateway: %d %s", id, res.StatusCode, body)
		}
	}
	e.noJails(t)
}

// testConsole: the web console served by the gateway logs in with the
// cluster's token, and its API (/api/...) creates jails on both nodes,
// lists them together, opens a terminal (a WebSocket) in each and
// destroys them; without a session or the CSRF token it refuses.
func (e *env) testConsole(t *testing.T) {
	ctx := context.Background()
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar, Timeout: 2 * time.Minute}
	gw := e.gateway

	res, body := doWith(t, hc, "GET", gw+"/", nil, "")
	if res.StatusCode != http.StatusOK || !bytes.Contains(body, []byte("<form")) {
		t.Fatalf("the console's login page through the gateway: %d %.200s", res.StatusCode, body)
	}
	if res, body := doWith(t, hc, "GET", gw+"/api/jails", nil, ""); res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the console's API without a session: %d %s", res.StatusCode, body)
	}
	if res, body := doWith(t, hc, "POST", gw+"/console/login", nil, `{"credential":"wrong"}`); res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a login with a wrong token: %d %s", res.StatusCode, body)
	}
	res, body = doWith(t, hc, "POST", gw+"/console/login", nil, `{"credential":"`+e.c.AgentjailToken+`"}`)
	var session struct {
		CSRF string `json:"csrf_token"`
	}
	if res.StatusCode != http.StatusOK || json.Unmarshal(body, &session) != nil || session.CSRF == "" {
		t.Fatalf("console login through the gateway: %d %s", res.StatusCode, body)
	}
	csrf := http.Header{"X-Csrf-Token": {session.CSRF}, "Content-Type": {"application/json"}}
	if res, body := doWith(t, hc, "POST", gw+"/api/jails", nil, `{"name":"no-csrf"}`); res.StatusCode != http.StatusForbidden {
		t.Fatalf("a create without the CSRF token: %d %s", res.StatusCode, body)
	}

	placed := map[string]string{}
	for _, name := range []string{"console-a", "console-b"} {
		res, body := doWith(t, hc, "POST", gw+"/api/jails", csrf, `{"name":"`+name+`"}`)
		var j struct {
			ID string `json:"id"`
		}
		if res.StatusCode != http.StatusCreated || json.Unmarshal(body, &j) != nil || j.ID == "" {
			t.Fatalf("create %s through the console's API: %d %s", name, res.StatusCode, body)
		}
		placed[j.ID] = res.Header.Get(gateway.NodeHeader)
		// Found by asking the nodes (nothing has listed it yet).
		if res, body := doWith(t, hc, "GET", gw+"/api/jails/"+j.ID, nil, ""); res.StatusCode != http.StatusOK || res.Header.Get(gateway.NodeHeader) != placed[j.ID] {
			t.Fatalf("jail %s through the console: %d %s from %s", j.ID, res.StatusCode, body, res.Header.Get(gateway.NodeHeader))
		}
	}
	t.Cleanup(func() {
		for id := range placed {
			doWith(t, hc, "DELETE", gw+"/api/jails/"+id, csrf, "")
		}
	})
	if len(uniq(placed)) != 2 {
		t.Fatalf("two jails placed on %v, want both nodes", placed)
	}
	res, body = doWith(t, hc, "GET", gw+"/api/jails", nil, "")
	var list struct {
		Jails []struct {
			ID string `json:"id"`
		} `json:"jails"`
	}
	if res.StatusCode != http.StatusOK || json.Unmarshal(body, &list) != nil {
		t.Fatalf("the console's list: %d %s", res.StatusCode, body)
	}
	for id := range placed {
		if !slices.ContainsFunc(list.Jails, func(j struct {
			ID string `json:"id"`
		}) bool {
			return j.ID == id
		}) {
			t.Fatalf("the console's list lacks %s: %s", id, body)
		}
	}

	// A terminal in each jail, through the console's WebSocket.
	u, _ := url.Parse(gw)
	for id := range placed {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		h := http.Header{"Origin": {gw}}
		for _, c := range jar.Cookies(u) {
			h.Add("Cookie", c.Name+"="+c.Value)
		}
		conn, _, err := websocket.Dial(wctx, "ws://"+u.Host+"/api/jails/"+id+"/terminal?cmd=sh", &websocket.DialOptions{HTTPHeader: h})
		if err != nil {
			cancel()
			t.Fatalf("the console's terminal of %s through the gateway: %v", id, err)
		}
		if err := conn.Write(wctx, websocket.MessageBinary, []byte("echo term-$((6*7)); exit 3\n")); err != nil {
			t.Fatal(err)
		}
		var screen strings.Builder
		for !strings.Contains(screen.String(), "term-42") {
			typ, data, err := conn.Read(wctx)
			if err != nil {
				cancel()
				t.Fatalf("the terminal of %s: %v (so far %q)", id, err, screen.String())
			}
			if typ == websocket.MessageBinary {
				screen.Write(data)
			}
		}
		conn.Close(websocket.StatusNormalClosure, "")
		cancel()
	}
	for id := range placed {
		if res, body := doWith(t, hc, "DELETE", gw+"/api/jails/"+id, csrf, ""); res.StatusCode/100 != 2 {
			t.Fatalf("destroy %s through the console: %d %s", id, res.StatusCode, body)
		}
	}
	e.noJails(t)
	ids := make([]string, 0, len(placed))
	for id := range placed {
		ids = append(ids, id)
	}
	if left := kubetest.Leftovers(ids...); len(left) > 0 {
		t.Fatalf("the console's jails left: %v", left)
	}
}

// noJails fails t when a node still has a jail.
func (e *env) noJails(t *testing.T) {
	t.Helper()
	for _, nd := range e.nodes {
		js, err := nd.Daemon.List(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(js) != 0 {
			t.Fatalf("node %s has %d jails left", nd.Name, len(js))
		}
	}
}

func uniq(m map[string]string) map[string]bool {
	out := map[string]bool{}
	for _, v := range m {
		out[v] = true
	}
	return out
}

// do sends one request with header h and body (if any) and returns the
// answer and its body.
func do(t *testing.T, method, u string, h http.Header, body string) (*http.Response, []byte) {
	t.Helper()
	return doWith(t, &http.Client{Timeout: 2 * time.Minute}, method, u, h, body)
}

func doWith(t *testing.T, hc *http.Client, method, u string, h http.Header, body string) (*http.Response, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	res, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	return res, b
}
