package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentjail/agentjail/internal/api/apitest"
	"github.com/agentjail/agentjail/internal/apikey"
	"github.com/agentjail/agentjail/internal/audit"
)

// TestKeyRoles: an admin API key may use the REST API as the token does
// (but not manage keys); a user key may use it for its tenant, a viewer
// key may only read; only the token manages keys; GET /whoami says who a
// credential is.
func TestKeyRoles(t *testing.T) {
	store, err := apikey.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	h := NewServer(apitest.New(), testToken, nil, WithKeys(store))
	_, admin, err := store.Create("ops", "", apikey.RoleAdmin)
	if err != nil {
		t.Fatal(err)
	}
	_, user, err := store.Create("dev", "team-a", apikey.RoleUser)
	if err != nil {
		t.Fatal(err)
	}
	_, viewer, err := store.Create("watch", "team-a", apikey.RoleViewer)
	if err != nil {
		t.Fatal(err)
	}
	do := func(cred, method, path string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, strings.NewReader(`{"name":"k"}`))
		r.Header.Set("Authorization", "Bearer "+cred)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for _, tc := range []struct {
		cred, method, path string
		want               int
	}{
		{admin, "GET", "/jails", 200},
		{admin, "POST", "/jails", 201},
		{admin, "GET", "/keys", 403},
		{admin, "POST", "/keys", 403},
		{user, "GET", "/jails", 200},
		{user, "GET", "/whoami", 200},
		{user, "GET", "/keys", 403},
		{user, "POST", "/images/prune", 403},
		{viewer, "GET", "/jails", 200},
		{viewer, "POST", "/jails", 403},
		{viewer, "DELETE", "/jails/x", 403},
		{admin + "x", "GET", "/jails", 401},
		{testToken, "GET", "/keys", 200},
	} {
		if w := do(tc.cred, tc.method, tc.path); w.Code != tc.want {
			t.Errorf("%s %s with %.12s…: %d, want %d (%s)", tc.method, tc.path, tc.cred, w.Code, tc.want, w.Body)
		}
	}
	var who Whoami
	if w := do(admin, "GET", "/whoami"); w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &who) != nil || who.Kind != "key" || who.Role != "admin" || who.KeyName != "ops" {
		t.Fatalf("whoami with the admin key: %d %s", w.Code, w.Body)
	}
	if w := do(viewer, "GET", "/whoami"); json.Unmarshal(w.Body.Bytes(), &who) != nil || who.Role != "viewer" || who.Tenant != "team-a" {
		t.Fatalf("whoami with the viewer key: %s", w.Body)
	}
	if w := do(testToken, "GET", "/whoami"); json.Unmarshal(w.Body.Bytes(), &who) != nil || who.Kind != "token" || who.Role != "admin" || who.Tenant != "default" {
		t.Fatalf("whoami with the token: %s", w.Body)
	}
}

// TestAuditLines: every request to a route that changes state is written
// to the audit log with who, what, when and how it ended, refusals too;
// GET /audit shows a key its own tenant's lines.
func TestAuditLines(t *testing.T) {
	dir := t.TempDir()
	store, err := apikey.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	log, err := audit.Open(filepath.Join(dir, audit.FileName), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	h := NewServer(apitest.New(), testToken, nil, WithKeys(store), WithAudit(log))
	_, user, _ := store.Create("dev", "team-a", apikey.RoleUser)
	_, viewer, _ := store.Create("watch", "team-b", apikey.RoleViewer)
	do := func(cred, method, path, body string) int {
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+cred)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	do(user, "POST", "/jails", `{"name":"a1"}`)
	do(viewer, "DELETE", "/jails/a1", "")
	do("wrong", "POST", "/jails/a1/stop", "")
	do(user, "GET", "/jails", "") // a read: not audited
	got, err := log.Tail(10, func(*audit.Entry) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	want := []struct{ who, tenant, action, result string }{
		{"key:", "team-a", "POST /jails", "ok"},
		{"key:", "team-b", "DELETE /jails/{id}", "denied"},
		{"anonymous", "", "POST /jails/{id}/stop", "denied"},
	}
	if len(got) != len(want) {
		t.Fatalf("audit lines: %+v", got)
	}
	for i, w := range want {
		g := got[i]
		if !strings.HasPrefix(g.Who, w.who) || g.Tenant != w.tenant || g.Action != w.action || g.Result != w.result || g.Time.IsZero() || g.Surface != "api" {
			t.Errorf("line %d: %+v, want %+v", i, g, w)
		}
	}
	if got[1].Status != http.StatusForbidden || got[2].Status != http.StatusUnauthorized || got[0].Target != "/jails" {
		t.Errorf("statuses and targets: %+v", got)
	}
	r := httptest.NewRequest("GET", "/audit", nil)
	r.Header.Set("Authorization", "Bearer "+user)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	var list AuditList
	if err := json.Unmarshal(w.Body.Bytes(), &list); err != nil || len(list.Entries) != 1 || list.Entries[0].Tenant != "team-a" {
		t.Errorf("team-a's GET /audit: %d %s", w.Code, w.Body)
	}
}
