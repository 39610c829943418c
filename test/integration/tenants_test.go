package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"sigs.k8s.io/yaml"

	"github.com/agentjail/agentjail/internal/image/imagetest"
)

// tenantKey is an API key made for a test.
type tenantKey struct {
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	Role   string `json:"role"`
	Secret string `json:"secret"`
}

// makeKey creates an API key with the daemon's token.
func (d *daemon) makeKey(t *testing.T, tenant, role string) tenantKey {
	t.Helper()
	var k tenantKey
	d.api.want(t, http.StatusCreated, "POST", "/keys", map[string]any{"name": t.Name(), "tenant": tenant, "role": role}, &k)
	t.Cleanup(func() { d.api.do(t, "DELETE", "/keys/"+k.ID, nil) })
	return k
}

// as is a client of the daemon's API with key.
func (d *daemon) as(key string) *client { return newClient("http://"+d.addr, key) }

// tenantResources are one tenant's resources of every kind.
type tenantResources struct {
	tenant, jail, jailName, snapshot, recording, image, keyID string
}

// openAPIOperations lists the operations of api/openapi.yaml as
// "METHOD /path" (path templates as documented), sorted.
func openAPIOperations(t *testing.T) []string {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "api", "openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("api/openapi.yaml: %v", err)
	}
	var ops []string
	for p, item := range doc.Paths {
		for m := range item {
			switch m {
			case "get", "put", "post", "delete", "patch":
				ops = append(ops, strings.ToUpper(m)+" "+p)
			}
		}
	}
	sort.Strings(ops)
	if len(ops) < 40 {
		t.Fatalf("api/openapi.yaml lists only %d operations", len(ops))
	}
	return ops
}

// crossTenantBodies are valid request bodies for the routes that take
// one, so that what refuses another tenant's request is the tenant check,
// not the body's validation. A route that changes state and is missing
// here is sent "{}"; if that is refused as malformed (400/422) the test
// fails and asks for a body here.
var crossTenantBodies = map[string]any{
	"POST /jails/{id}/exec":            map[string]any{"cmd": []string{"cat", "/workspace/secret.txt"}},
	"POST /jails/{id}/exec/stream":     map[string]any{"cmd": []string{"cat", "/workspace/secret.txt"}},
	"PUT /jails/{id}/files/{path}":     "stolen",
	"PUT /jails/{id}/network":          map[string]any{"mode": "none"},
	"POST /jails/{id}/snapshot":        map[string]any{"mode": "fs"},
	"POST /snapshots/{sid}/restore":    map[string]any{},
	"POST /snapshots/{sid}/branch":     map[string]any{"count": 1},
	"POST /snapshots/{sid}/push":       map[string]any{"ref": "127.0.0.1:1/none/such:1"},
	"POST /snapshots/pull":             map[string]any{"ref": "127.0.0.1:1/none/such:1"},
	"POST /jails/{id}/commit":          map[string]any{"ref": "stolen/image:1"},
	"POST /jails/{id}/previews":        map[string]any{"port": 8080},
	"POST /jails/{id}/agent/run":       map[string]any{"prompt": "hi"},
	"POST /jails/{id}/agent/session":   map[string]any{},
	"POST /jails/{id}/sync":            map[string]any{},
	"POST /jails/{id}/stop":            map[string]any{"timeout_s": 1},
	"POST /jails/{id}/terminal/ticket": map[string]any{},
	"PUT /quotas/{tenant}":             map[string]any{"jails": 100},
	"PUT /profiles/{name}":             map[string]any{"packages": []string{"jq"}},
	"POST /images/prune":               map[string]any{},
	"POST /agents/{name}/install":      map[string]any{},
	"POST /keys":                       map[string]any{"tenant": "x"},
	"DELETE /jails/{id}/files/{path}":  nil,
	"POST /jails/{id}/start":           nil,
	"GET /jails/{id}/commands/ws":      nil,
	"GET /jails/{id}/terminal":         nil,
	"DELETE /snapshots/{sid}":          nil,
	"DELETE /images/{ref}":             nil,
	"DELETE /jails/{id}":               nil,
	"DELETE /keys/{kid}":               nil,
	"DELETE /profiles/{name}":          nil,
	"POST /profiles/{name}/build":      nil,
	"POST /images/pull":                map[string]any{"ref": "127.0.0.1:1/none/such:1"},
	"POST /jails":                      map[string]any{},
	"POST /images/load":                "",
	"GET /jails/{id}/files/{path}":     nil,
	"GET /recordings/{rid}":            nil,
	"GET /snapshots/{sid}/diff":        nil,
	"GET /diff":                        nil,
	"GET /jails/{id}/snapshots":        nil,
	"GET /jails/{id}/recordings":       nil,
	"GET /jails/{id}/terminals":        nil,
	"GET /jails/{id}/events":           nil,
	"GET /jails/{id}/report":           nil,
	"GET /jails/{id}/fs/diff":          nil,
	"GET /jails/{id}/processes":        nil,
	"GET /jails/{id}/network/log":      nil,
	"GET /jails/{id}":                  nil,
	"GET /snapshots/{sid}":             nil,
	"GET /images/{ref}":                nil,
	"GET /quotas/{tenant}":             nil,
	"GET /profiles":                    nil,
	"GET /agents":                      nil,
	"GET /keys":                        nil,
	"GET /audit":                       nil,
	"GET /metrics":                     nil,
	"POST /mcp":                        nil, // a tools/call of run_command on a's jail: see below
	"GET /images":                      nil,
	"GET /snapshots":                   nil,
	"GET /jails":                       nil,
	"GET /stats":                       nil,
	"GET /whoami":                      nil,
	"GET /health":                      nil,
}

// ownRoutes are the routes that name no resource of another tenant:
// they act on the caller's own tenant (or on nothing), and what they
// answer must not mention the other tenant's resources.
var ownRoutes = map[string]string{
	"GET /health":          "public: jail counts only",
	"GET /whoami":          "the caller itself",
	"GET /jails":           "a list: the caller's tenant's jails",
	"GET /stats":           "a list: the caller's tenant's jails",
	"GET /snapshots":       "a list: the caller's tenant's snapshots",
	"GET /images":          "a list: the caller's tenant's images",
	"GET /audit":           "a list: the caller's tenant's audit lines",
	"GET /metrics":         "admin only: names every tenant's jails",
	"POST /mcp":            "its tools are API requests with the caller's key: run_command on a's jail is tried below",
	"GET /profiles":        "shared definitions every tenant may use",
	"GET /agents":          "the agent CLIs installed on the host, shared",
	"POST /jails":          "creates a jail of the caller's tenant",
	"POST /images/pull":    "pulls into the caller's tenant",
	"POST /images/load":    "loads into the caller's tenant",
	"POST /snapshots/pull": "pulls into the caller's tenant",
	"POST /images/prune":   "admin only: touches every tenant's images",
	"GET /keys":            "the token only",
	"POST /keys":           "the token only",
	"GET /diff":            "names jails and snapshots in its query: checked below",
}

// adminRoutes are refused (403) to user and viewer keys whatever they
// name.
var adminRoutes = []string{
	"POST /images/prune", "PUT /profiles/{name}", "DELETE /profiles/{name}", "POST /agents/{name}/install",
	"PUT /quotas/{tenant}", "GET /keys", "POST /keys", "DELETE /keys/{kid}", "GET /metrics",
}

// TestTenantIsolation: two tenants' keys, through every route of
// api/openapi.yaml: neither can list, read, exec in, write the files of,
// snapshot, attach to or delete the other's jails, snapshots, recordings
// and images, and the other's resources are unchanged afterwards; viewer
// keys only read; every attempt to change state is in the audit log; a
// tenant's quota refuses what goes over it (429, 403). A route added to
// the API without a tenant check fails here, since every documented
// route is tried.
func TestTenantIsolation(t *testing.T) {
	d := shared(t)
	sfx := fmt.Sprint(time.Now().UnixNano() % 1e9)
	ta, tb := "iso-a-"+sfx, "iso-b-"+sfx
	a, b := d.makeKey(t, ta, "user"), d.makeKey(t, tb, "user")
	bv, av := d.makeKey(t, tb, "viewer"), d.makeKey(t, ta, "viewer")
	ca, cb, cbv, cav := d.as(a.Secret), d.as(b.Secret), d.as(bv.Secret), d.as(av.Secret)

	// Tenant A's resources: a running jail holding a secret, a snapshot,
	// a terminal recording, an image.
	res := tenantResources{tenant: ta, keyID: a.ID, jailName: uniqueName(t)}
	var j jailInfo
	ca.want(t, http.StatusCreated, "POST", "/jails", map[string]any{"name": res.jailName}, &j)
	res.jail = j.ID
	t.Cleanup(func() { d.api.do(t, "DELETE", "/jails/"+j.ID, nil) })
	ca.want(t, http.StatusCreated, "PUT", "/jails/"+j.ID+"/files/workspace/secret.txt", "A-SECRET", nil)
	var snap struct {
		ID     string `json:"id"`
		Tenant string `json:"tenant"`
	}
	ca.want(t, http.StatusCreated, "POST", "/jails/"+j.ID+"/snapshot", map[string]any{"mode": "fs"}, &snap)
	res.snapshot = snap.ID
	t.Cleanup(func() { d.api.do(t, "DELETE", "/snapshots/"+snap.ID, nil) })
	if snap.Tenant != ta {
		t.Errorf("a's snapshot belongs to %q", snap.Tenant)
	}
	res.recording = recordTerminal(t, d, ca, j.ID)
	res.image = loadTenantImage(t, d, ca, "iso-a-"+sfx+"/secret:1")

	ops := openAPIOperations(t)
	hasParam := func(op string) bool { return strings.Contains(op, "{") }
	for _, op := range ops {
		if _, ok := crossTenantBodies[op]; !ok {
			t.Errorf("%s: no entry in crossTenantBodies (give it a valid body, or nil)", op)
		}
		if !hasParam(op) {
			if _, ok := ownRoutes[op]; !ok {
				t.Errorf("%s names no resource: say in ownRoutes why another tenant's resources cannot leak through it", op)
			}
		}
	}

	secrets := []string{res.jail, res.jailName, res.snapshot, res.recording, "A-SECRET", strings.TrimSuffix(res.image, ":1")}
	// leaks names a resource of tenant a that an answer shows, beyond
	// what the request itself said (an error may echo the id asked for).
	leaks := func(body []byte, asked string) string {
		for _, s := range secrets {
			if strings.Contains(string(body), s) && !strings.Contains(asked, s) {
				return s
			}
		}
		return ""
	}
	type attempt struct {
		who    string
		c      *client
		viewer bool
	}
	for _, op := range ops {
		method, tmpl, _ := strings.Cut(op, " ")
		target := strings.NewReplacer("{id}", res.jail, "{sid}", res.snapshot, "{rid}", res.recording,
			"{ref}", res.image, "{path}", "workspace/secret.txt", "{kid}", res.keyID, "{tenant}", res.tenant,
			"{name}", "claude").Replace(tmpl)
		switch tmpl {
		case "/diff":
			target += "?from=" + res.jail + "&to=" + res.snapshot
		case "/stats":
			target += "?follow=false"
		case "/images/load":
			continue // its body is an archive: checked by loadTenantImage's ownership below
		}
		body := crossTenantBodies[op]
		for _, at := range []attempt{{"b", cb, false}, {"b's viewer", cbv, true}} {
			var r *response
			if tmpl == "/mcp" {
				call := map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{
					"name": "run_command", "arguments": map[string]any{"jail": res.jail, "command": "cat /workspace/secret.txt"}}}
				r = at.c.do(t, method, target, call, "Accept", "application/json, text/event-stream")
				if r.status != http.StatusOK || !strings.Contains(string(r.body), `"isError":true`) {
					t.Errorf("MCP run_command in a's jail as %s: %s, want a tool error", at.who, r)
				}
				if s := leaks(r.body, target+" "+res.jail); s != "" {
					t.Errorf("MCP as %s shows a's %q: %s", at.who, s, r)
				}
				continue
			}
			if strings.HasSuffix(tmpl, "/terminal") || strings.HasSuffix(tmpl, "/ws") {
				r = wsAttempt(t, d, at.c.token, target+"?cmd=cat&cmd=/workspace/secret.txt")
			} else {
				r = at.c.do(t, method, target, body)
			}
			admin := slices.Contains(adminRoutes, op)
			switch {
			case admin:
				if r.status != http.StatusForbidden {
					t.Errorf("%s %s as %s: %s, want 403 (admin only)", method, target, at.who, r)
				}
			case at.viewer && method != http.MethodGet || op == "GET /jails/{id}/terminal" || op == "GET /jails/{id}/commands/ws":
				if at.viewer && r.status != http.StatusForbidden {
					t.Errorf("%s %s as %s: %s, want 403 (read only)", method, target, at.who, r)
				} else if !at.viewer && r.status != http.StatusNotFound {
					t.Errorf("%s %s as %s: %s, want 404", method, target, at.who, r)
				}
			case hasParam(op) || tmpl == "/diff":
				if r.status != http.StatusNotFound {
					t.Errorf("%s %s as %s: %s, want 404: the other tenant's resource must look absent", method, target, at.who, r)
				}
			case tmpl == "/snapshots/pull":
				if r.status < 400 || r.status == http.StatusForbidden {
					t.Errorf("%s %s as %s: %s, want a failed pull (nothing answers at the ref)", method, target, at.who, r)
				}
			case tmpl == "/images/pull":
				if r.status < 400 && !strings.Contains(string(r.body), `"type":"error"`) || r.status == http.StatusForbidden && !at.viewer {
					t.Errorf("%s %s as %s: %s, want a failed pull", method, target, at.who, r)
				}
			case tmpl == "/jails" && method == http.MethodPost:
				if at.viewer && r.status != http.StatusForbidden {
					t.Errorf("%s as %s: %s, want 403", op, at.who, r)
				}
				if r.status == http.StatusCreated {
					var nj jailInfo
					_ = json.Unmarshal(r.body, &nj)
					d.api.do(t, "DELETE", "/jails/"+nj.ID, nil)
				}
			default:
				if r.status != http.StatusOK {
					t.Errorf("%s %s as %s: %s, want 200", method, target, at.who, r)
				}
			}
			if hasParam(op) && (r.status == http.StatusBadRequest || r.status == http.StatusUnprocessableEntity) {
				t.Errorf("%s as %s: %s: the body was refused before the tenant check; give it a valid one in crossTenantBodies", op, at.who, r)
			}
			if tmpl == "/audit" {
				continue // b's own lines echo what b asked for; their tenant is checked below
			}
			if s := leaks(r.body, target); s != "" {
				t.Errorf("%s %s as %s: the answer shows tenant a's %q: %s", method, target, at.who, s, r)
			}
		}
	}

	// Tenant A's resources are as they were; A's viewer reads them and
	// changes nothing.
	var after jailInfo
	ca.want(t, http.StatusOK, "GET", "/jails/"+res.jail, nil, &after)
	if after.Status != "running" {
		t.Errorf("a's jail after b's attempts: %s", after.Status)
	}
	if r := cav.do(t, "GET", "/jails/"+res.jail+"/files/workspace/secret.txt", nil); r.status != http.StatusOK || string(r.body) != "A-SECRET" {
		t.Errorf("a's secret after b's attempts, read by a's viewer: %s", r)
	}
	for _, p := range []string{"/snapshots/" + res.snapshot, "/recordings/" + res.recording, "/images/" + res.image} {
		if r := cav.do(t, "GET", p, nil); r.status != http.StatusOK {
			t.Errorf("a's viewer reads %s: %s", p, r)
		}
	}
	if r := cav.do(t, "DELETE", "/jails/"+res.jail, nil); r.status != http.StatusForbidden {
		t.Errorf("a's viewer deletes a's jail: %s", r)
	}
	if r := cav.do(t, "POST", "/jails/"+res.jail+"/exec", map[string]any{"cmd": []string{"true"}}); r.status != http.StatusForbidden {
		t.Errorf("a's viewer execs in a's jail: %s", r)
	}
	// An admin sees both tenants; the token is the bootstrap admin.
	var all struct {
		Jails []jailInfo `json:"jails"`
	}
	d.api.want(t, http.StatusOK, "GET", "/jails", nil, &all)
	if !slices.ContainsFunc(all.Jails, func(x jailInfo) bool { return x.ID == res.jail }) {
		t.Errorf("the token does not see a's jail")
	}

	// Every attempt of b's to change state is in the audit log, refused.
	var lines struct {
		Entries []struct {
			Who    string `json:"who"`
			Tenant string `json:"tenant"`
			Action string `json:"action"`
			Status int    `json:"status"`
			Result string `json:"result"`
		} `json:"entries"`
	}
	cb.want(t, http.StatusOK, "GET", "/audit?limit=1000", nil, &lines)
	seen := map[string]int{}
	for _, e := range lines.Entries {
		if e.Tenant != tb {
			t.Errorf("b's GET /audit shows another tenant's line: %+v", e)
		}
		if e.Result == "ok" && e.Action != "POST /jails" {
			t.Errorf("b's attempt succeeded: %+v", e)
		}
		seen[strings.ReplaceAll(e.Action, "...}", "}")]++
	}
	for _, op := range ops {
		method, _, _ := strings.Cut(op, " ")
		if method != http.MethodGet && op != "POST /images/load" && op != "POST /mcp" && seen[op] < 2 {
			t.Errorf("%s: %d audit lines for b's and b's viewer's attempts, want 2", op, seen[op])
		}
	}

	// Console: user and viewer keys log in and see their own tenant.
	for _, k := range []tenantKey{b, bv} {
		cs := consoleLogin(t, d, k.Secret)
		r := cs.do(t, "GET", "/api/jails", nil)
		if r.status != http.StatusOK || leaks(r.body, "") != "" {
			t.Errorf("console of %s: GET /api/jails: %s", k.Role, r)
		}
		r = cs.do(t, "DELETE", "/api/jails/"+res.jail, nil)
		if want := map[string]int{"user": 404, "viewer": 403}[k.Role]; r.status != want {
			t.Errorf("console of %s: DELETE a's jail: %s, want %d", k.Role, r, want)
		}
	}

	// Names are each tenant's own: b may name a jail as a's is named
	// (a 409 would tell b that a has one), and each finds its own.
	var twin jailInfo
	cb.want(t, http.StatusCreated, "POST", "/jails", map[string]any{"name": res.jailName, "start": false}, &twin)
	var mine jailInfo
	ca.want(t, http.StatusOK, "GET", "/jails/"+res.jailName, nil, &mine)
	if twin.ID == res.jail || mine.ID != res.jail {
		t.Errorf("a jail named %s in each tenant: b's %s, a finds %s (a's is %s)", res.jailName, twin.ID, mine.ID, res.jail)
	}
	cb.want(t, http.StatusNoContent, "DELETE", "/jails/"+twin.ID, nil, nil)

	t.Run("e2b", func(t *testing.T) {
		// A sandbox made through the E2B API with b's key is a jail of
		// b's tenant: b lists it, a finds it nowhere.
		list := func(c *client) map[string]bool {
			var l struct {
				Jails []jailInfo `json:"jails"`
			}
			c.want(t, http.StatusOK, "GET", "/jails", nil, &l)
			out := map[string]bool{}
			for _, x := range l.Jails {
				out[x.ID] = true
			}
			return out
		}
		before := list(cb)
		e2bCreate(t, d, b.Secret, map[string]any{"templateID": "base", "timeout": 120})
		var made []string
		for id := range list(cb) {
			if !before[id] {
				made = append(made, id)
			}
		}
		if len(made) != 1 {
			t.Fatalf("b's jails after an E2B create: %d new, want 1", len(made))
		}
		if list(ca)[made[0]] {
			t.Errorf("a lists b's sandbox jail")
		}
		if r := ca.do(t, "POST", "/jails/"+made[0]+"/exec", map[string]any{"cmd": []string{"id"}}); r.status != http.StatusNotFound {
			t.Errorf("a execs in b's sandbox jail: %s", r)
		}
	})

	t.Run("quotas", func(t *testing.T) {
		d.api.want(t, http.StatusOK, "PUT", "/quotas/"+tb, map[string]any{"jails": 1, "memory_bytes": 1 << 30, "snapshots": 1}, nil)
		t.Cleanup(func() { d.api.do(t, "PUT", "/quotas/"+tb, map[string]any{}) })
		var j1 jailInfo
		cb.want(t, http.StatusCreated, "POST", "/jails", map[string]any{"name": uniqueName(t)}, &j1)
		t.Cleanup(func() { d.api.do(t, "DELETE", "/jails/"+j1.ID, nil) })
		r := cb.do(t, "POST", "/jails", map[string]any{"name": uniqueName(t)})
		var e apiError
		_ = json.Unmarshal(r.body, &e)
		if r.status != http.StatusTooManyRequests || e.Error.Code != "quota_exceeded" || !strings.Contains(e.Error.Message, "jails") {
			t.Errorf("b's second jail over a quota of one: %s, want 429 quota_exceeded", r)
		}
		d.api.want(t, http.StatusOK, "PUT", "/quotas/"+tb, map[string]any{"jails": 3, "memory_bytes": 1 << 30, "snapshots": 1}, nil)
		r = cb.do(t, "POST", "/jails", map[string]any{"name": uniqueName(t), "isolation": map[string]any{"resources": map[string]any{"memory_bytes": 2 << 30}}})
		if r.status != http.StatusForbidden || !strings.Contains(r.errorMessage(), "memory") {
			t.Errorf("a jail bigger than b's whole memory quota: %s, want 403", r)
		}
		cb.want(t, http.StatusCreated, "POST", "/jails/"+j1.ID+"/snapshot", map[string]any{"mode": "fs"}, &snap)
		t.Cleanup(func() { d.api.do(t, "DELETE", "/snapshots/"+snap.ID, nil) })
		if r := cb.do(t, "POST", "/jails/"+j1.ID+"/snapshot", map[string]any{"mode": "fs"}); r.status != http.StatusTooManyRequests {
			t.Errorf("b's second snapshot over a quota of one: %s, want 429", r)
		}
		var st struct {
			Usage struct {
				Jails     int `json:"jails"`
				Snapshots int `json:"snapshots"`
			} `json:"usage"`
		}
		cb.want(t, http.StatusOK, "GET", "/quotas/"+tb, nil, &st)
		if st.Usage.Jails != 1 || st.Usage.Snapshots != 1 {
			t.Errorf("b's usage: %+v", st)
		}
		if r := cb.do(t, "GET", "/quotas/"+ta, nil); r.status != http.StatusNotFound {
			t.Errorf("b reads a's quota: %s", r)
		}
		cb.want(t, http.StatusOK, "GET", "/audit?limit=20", nil, &lines)
		denied := 0
		for _, e := range lines.Entries {
			if e.Status == http.StatusTooManyRequests && e.Result == "denied" {
				denied++
			}
		}
		if denied < 2 {
			t.Errorf("the quota refusals are not in the audit log: %+v", lines.Entries)
		}

		// The CLI: an admin sets a quota, a key reads its own and its
		// tenant's audit lines.
		admin := []string{"AGENTJAIL_ADDR=" + d.addr, "AGENTJAIL_TOKEN=" + d.token}
		asB := []string{"AGENTJAIL_ADDR=" + d.addr, "AGENTJAIL_TOKEN=" + b.Secret}
		if out, stderr, code := runBin(t, admin, "", "quota", tb, "--jails", "4", "--memory", "2g"); code != 0 || !strings.Contains(out, "jails      1 of 4") || !strings.Contains(out, "memory     512 MiB of 2048 MiB") {
			t.Errorf("agentjail quota (set): exit %d %q %q", code, out, stderr)
		}
		if out, stderr, code := runBin(t, asB, "", "quota", tb, "--jails", "9"); code == 0 || !strings.Contains(stderr, "admin") {
			t.Errorf("agentjail quota set with b's user key: exit %d %q %q", code, out, stderr)
		}
		out, stderr, code := runBin(t, asB, "", "audit", "--json", "--limit", "5")
		if code != 0 || strings.Count(out, "\n") != 5 || strings.Count(out, `"tenant":"`+tb+`"`) != 5 {
			t.Errorf("agentjail audit --json with b's key: exit %d %q %q", code, out, stderr)
		}
	})
}

// recordTerminal runs a short terminal session in jail id as c's key
// (through a ticket) and returns its recording's id.
func recordTerminal(t *testing.T, d *daemon, c *client, id string) string {
	t.Helper()
	var tk struct {
		Ticket string `json:"ticket"`
	}
	c.want(t, http.StatusCreated, "POST", "/jails/"+id+"/terminal/ticket", map[string]any{}, &tk)
	term := dialTerm(t, d, id, url.Values{"ticket": {tk.Ticket}, "cmd": {"sh"}}).start()
	term.send(t, "echo recorded-$((6*7)); exit\n")
	term.waitText(t, "recorded-42")
	term.waitExit(t)
	var recs struct {
		Recordings []struct {
			ID string `json:"id"`
		} `json:"recordings"`
	}
	c.want(t, http.StatusOK, "GET", "/jails/"+id+"/recordings", nil, &recs)
	if len(recs.Recordings) == 0 {
		t.Fatal("no recording of the terminal session")
	}
	return recs.Recordings[0].ID
}

// loadTenantImage loads a one-layer image tagged tag as c's key and
// returns the tag.
func loadTenantImage(t *testing.T, d *daemon, c *client, tag string) string {
	t.Helper()
	img := imagetest.Image(t, v1.Config{Env: []string{"PATH=/bin"}}, imagetest.Layer(t, imagetest.Entry{Name: "owned-by-a", Body: "a\n"}))
	path := imagetest.DockerArchive(t, t.TempDir(), tag, img)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r := c.do(t, "POST", "/images/load", data)
	if r.status != http.StatusOK || !strings.Contains(string(r.body), tag) {
		t.Fatalf("load as a: %s", r)
	}
	t.Cleanup(func() { d.api.do(t, "DELETE", "/images/"+tag+"?force=true", nil) })
	return tag
}

// consoleSession is a logged-in console client.
type consoleSession struct {
	c    *http.Client
	base string
	csrf string
}

func consoleLogin(t *testing.T, d *daemon, cred string) *consoleSession {
	t.Helper()
	cs := &consoleSession{c: &http.Client{Timeout: requestTimeout, Jar: newJar()}, base: "http://" + d.addr}
	r := cs.do(t, "POST", "/console/login", map[string]any{"credential": cred})
	var info struct {
		CSRF string `json:"csrf_token"`
	}
	if r.status != http.StatusOK || json.Unmarshal(r.body, &info) != nil {
		t.Fatalf("console login: %s", r)
	}
	cs.csrf = info.CSRF
	return cs
}

func (cs *consoleSession) do(t *testing.T, method, path string, in any) *response {
	t.Helper()
	var body *strings.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = strings.NewReader(string(b))
	} else {
		body = strings.NewReader("")
	}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, cs.base+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Origin", cs.base)
	if cs.csrf != "" {
		req.Header.Set("X-CSRF-Token", cs.csrf)
	}
	resp, err := cs.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return &response{status: resp.StatusCode, header: resp.Header, body: b}
}

// wsAttempt opens a WebSocket to path with key as its bearer credential
// and returns the handshake's answer: a refusal's status and body, or
// 101 when the socket opened (it is closed at once).
func wsAttempt(t *testing.T, d *daemon, key, path string) *response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	conn, resp, err := websocket.Dial(ctx, "ws://"+d.addr+path, &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + key}},
	})
	if err == nil {
		conn.CloseNow()
		return &response{status: http.StatusSwitchingProtocols}
	}
	if resp == nil {
		t.Fatalf("WebSocket %s: %v", path, err)
	}
	var b []byte
	if resp.Body != nil {
		b, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	return &response{status: resp.StatusCode, header: resp.Header, body: b}
}

func newJar() http.CookieJar {
	j, _ := cookiejar.New(nil)
	return j
}
