package mcptools

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentjail/agentjail/internal/api"
	"github.com/agentjail/agentjail/internal/api/apitest"
	"github.com/agentjail/agentjail/internal/apikey"
)

type bearer string

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}

// TestHTTPToolsActAsTheCaller: the daemon's POST /mcp (the API's own
// handler over an in-memory service) answers an MCP client of the
// go-sdk; its tools are API requests with the caller's credential: a
// viewer key's run_command is refused by the API, not by the tools.
func TestHTTPToolsActAsTheCaller(t *testing.T) {
	store, err := apikey.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	_, user, _ := store.Create("u", "t1", apikey.RoleUser)
	_, viewer, _ := store.Create("v", "t1", apikey.RoleViewer)
	h := api.NewServer(apitest.New(), "the-token", nil, api.WithKeys(store),
		api.WithMCP(func(h http.Handler) http.Handler { return Handler(h, "test") }))
	srv := httptest.NewServer(h)
	defer srv.Close()
	connect := func(key string) *mcp.ClientSession {
		c := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil)
		s, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp",
			HTTPClient: &http.Client{Transport: bearer(key)}, DisableStandaloneSSE: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	call := func(s *mcp.ClientSession, name string, args map[string]any) (string, bool) {
		res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		b, _ := json.Marshal(res.Content)
		return string(b), res.IsError
	}
	u := connect(user)
	if out, isErr := call(u, "create_jail", map[string]any{"name": "box"}); isErr || !strings.Contains(out, `\"name\":\"box\"`) {
		t.Fatalf("create_jail: %s", out)
	}
	if out, isErr := call(u, "run_command", map[string]any{"jail": "box", "argv": []string{"echo", "hello"}}); isErr || !strings.Contains(out, `hello\\n`) {
		t.Fatalf("run_command: %s", out)
	}
	if out, isErr := call(u, "run_command", map[string]any{"jail": "box"}); !isErr || !strings.Contains(out, "required") {
		t.Errorf("run_command without a command: %s", out)
	}
	v := connect(viewer)
	if out, isErr := call(v, "run_command", map[string]any{"jail": "box", "argv": []string{"echo"}}); !isErr || !strings.Contains(out, "viewer") {
		t.Errorf("a viewer's run_command: %s", out)
	}
	if out, isErr := call(v, "list_jails", nil); isErr || !strings.Contains(out, "box") {
		t.Errorf("a viewer's list_jails: %s", out)
	}
	// Without a credential the route itself refuses.
	r, _ := http.Post(srv.URL+"/mcp", "application/json", strings.NewReader(`{}`))
	if r.StatusCode != http.StatusUnauthorized {
		t.Errorf("POST /mcp without a credential: %d", r.StatusCode)
	}
	r.Body.Close()
}
