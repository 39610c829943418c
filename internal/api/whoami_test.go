package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agentjail/agentjail/internal/api/apitest"
	"github.com/agentjail/agentjail/internal/apikey"
)

// TestAdminKeys: an admin API key may use the REST API as the token does
// (but not manage keys); keys of other roles, scoped to a tenant, are
// refused; GET /whoami says who a credential is.
func TestAdminKeys(t *testing.T) {
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
		{admin, "GET", "/keys", 401},
		{admin, "POST", "/keys", 401},
		{user, "GET", "/jails", 401},
		{user, "GET", "/whoami", 401},
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
	if w := do(testToken, "GET", "/whoami"); json.Unmarshal(w.Body.Bytes(), &who) != nil || who.Kind != "token" || who.Role != "admin" {
		t.Fatalf("whoami with the token: %s", w.Body)
	}
}
