package integration

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentjail/agentjail/test/fakemodel"
)

// bearerTransport adds a bearer credential to every request.
type bearerTransport struct{ key string }

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return http.DefaultTransport.RoundTrip(r)
}

// mcpHTTP connects an MCP client of the go-sdk to the daemon's POST /mcp
// with key.
func mcpHTTP(t *testing.T, d *daemon, key string) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "agentjail-test", Version: "1"}, nil)
	s, err := c.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint: "http://" + d.addr + "/mcp", HTTPClient: &http.Client{Transport: bearerTransport{key}}, DisableStandaloneSSE: true,
	}, nil)
	if err != nil {
		t.Fatalf("MCP over HTTP: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// mcpStdio starts `agentjail mcp` with key and connects an MCP client of
// the go-sdk to it.
func mcpStdio(t *testing.T, d *daemon, key string) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.Command(binPath, "mcp")
	cmd.Env = append(os.Environ(), "AGENTJAIL_ADDR="+d.addr, "AGENTJAIL_TOKEN="+key)
	c := mcp.NewClient(&mcp.Implementation{Name: "agentjail-test", Version: "1"}, nil)
	s, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("agentjail mcp: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// callTool calls a tool and decodes its structured answer into out (when
// not nil); it returns the result's text and whether it is an error.
func callTool(t *testing.T, s *mcp.ClientSession, name string, args map[string]any, out any) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("tool %s: %v", name, err)
	}
	var text strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text.WriteString(tc.Text)
		}
	}
	if out != nil && !res.IsError {
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("tool %s: decoding %s: %v", name, b, err)
		}
	}
	return text.String(), res.IsError
}

// TestMCP: MCP clients of the go-sdk, over `agentjail mcp` (stdio) and the
// daemon's streamable HTTP transport, create a jail, write and read its
// files, run a command, snapshot, branch, diff, report and destroy —
// bound to their key: another tenant's jail is out of reach, a viewer
// key reads only, and the calls are in the audit log.
func TestMCP(t *testing.T) {
	d := shared(t)
	a := d.makeKey(t, "mcp-a", "user")
	b := d.makeKey(t, "mcp-b", "user")
	av := d.makeKey(t, "mcp-a", "viewer")
	for _, tr := range []struct {
		name    string
		connect func(*testing.T, *daemon, string) *mcp.ClientSession
	}{{"stdio", mcpStdio}, {"http", mcpHTTP}} {
		t.Run(tr.name, func(t *testing.T) {
			s := tr.connect(t, d, a.Secret)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			tl, err := s.ListTools(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, tool := range tl.Tools {
				names = append(names, tool.Name)
			}
			for _, want := range []string{"create_jail", "run_command", "read_file", "write_file", "snapshot", "branch", "diff", "report", "destroy_jail", "list_jails"} {
				if !strings.Contains(strings.Join(names, " "), want) {
					t.Errorf("no tool %s in %v", want, names)
				}
			}
			var j struct{ ID, Name, Status, Tenant string }
			if text, isErr := callTool(t, s, "create_jail", map[string]any{"name": uniqueName(t)}, &j); isErr || j.Status != "running" || j.Tenant != "mcp-a" {
				t.Fatalf("create_jail: %s %+v", text, j)
			}
			t.Cleanup(func() { d.destroy(t, j.ID) })
			if text, isErr := callTool(t, s, "write_file", map[string]any{"jail": j.ID, "path": "/workspace/mcp.txt", "content": "from mcp\n"}, nil); isErr {
				t.Fatalf("write_file: %s", text)
			}
			var run struct {
				ExitCode int    `json:"exit_code"`
				Stdout   string `json:"stdout"`
			}
			if text, isErr := callTool(t, s, "run_command", map[string]any{"jail": j.Name, "command": "cat /workspace/mcp.txt; echo $((6*7)) > /workspace/answer"}, &run); isErr || run.ExitCode != 0 || run.Stdout != "from mcp\n" {
				t.Fatalf("run_command: %s %+v", text, run)
			}
			var file struct{ Content string }
			if text, isErr := callTool(t, s, "read_file", map[string]any{"jail": j.ID, "path": "/workspace/answer"}, &file); isErr || file.Content != "42\n" {
				t.Fatalf("read_file: %s %+v", text, file)
			}
			var snap struct{ ID string }
			if text, isErr := callTool(t, s, "snapshot", map[string]any{"jail": j.ID, "mode": "fs"}, &snap); isErr || snap.ID == "" {
				t.Fatalf("snapshot: %s", text)
			}
			t.Cleanup(func() { d.api.do(t, "DELETE", "/snapshots/"+snap.ID, nil) })
			var br struct{ Jails []struct{ ID string } }
			if text, isErr := callTool(t, s, "branch", map[string]any{"snapshot": snap.ID}, &br); isErr || len(br.Jails) != 1 {
				t.Fatalf("branch: %s", text)
			}
			t.Cleanup(func() { d.destroy(t, br.Jails[0].ID) })
			callTool(t, s, "run_command", map[string]any{"jail": br.Jails[0].ID, "command": "echo branched > /workspace/mcp.txt"}, nil)
			if text, isErr := callTool(t, s, "diff", map[string]any{"from": j.ID, "to": br.Jails[0].ID, "text": true}, nil); isErr || !strings.Contains(text, "/workspace/mcp.txt") || !strings.Contains(text, "+branched") {
				t.Errorf("diff: %s", text)
			}
			if text, isErr := callTool(t, s, "report", map[string]any{"jail": j.ID}, nil); isErr || !strings.Contains(text, "cat") {
				t.Errorf("report: %.500s", text)
			}

			// Another tenant's key reaches none of it; a's viewer reads
			// but does not run.
			other := tr.connect(t, d, b.Secret)
			if text, isErr := callTool(t, other, "run_command", map[string]any{"jail": j.ID, "command": "id"}, nil); !isErr || !strings.Contains(text, "no jail") {
				t.Errorf("tenant b's run_command in a's jail: error %v: %s", isErr, text)
			}
			if text, isErr := callTool(t, other, "read_file", map[string]any{"jail": j.ID, "path": "/workspace/mcp.txt"}, nil); !isErr {
				t.Errorf("tenant b's read_file of a's jail: %s", text)
			}
			var list struct{ Jails []struct{ ID string } }
			callTool(t, other, "list_jails", nil, &list)
			for _, x := range list.Jails {
				if x.ID == j.ID {
					t.Errorf("tenant b lists a's jail")
				}
			}
			viewer := tr.connect(t, d, av.Secret)
			if text, isErr := callTool(t, viewer, "run_command", map[string]any{"jail": j.ID, "command": "id"}, nil); !isErr || !strings.Contains(text, "viewer") {
				t.Errorf("a's viewer runs a command: error %v: %s", isErr, text)
			}
			if text, isErr := callTool(t, viewer, "read_file", map[string]any{"jail": j.ID, "path": "/workspace/answer"}, &file); isErr || file.Content != "42\n" {
				t.Errorf("a's viewer reads a file: %s", text)
			}
			if text, isErr := callTool(t, s, "destroy_jail", map[string]any{"jail": j.ID}, nil); isErr {
				t.Errorf("destroy_jail: %s", text)
			}
		})
	}
	// The tool calls are audited as the API requests they are.
	// (those of POST /mcp as surface "mcp"; `agentjail mcp` is a client
	// of the API over HTTP like any other).
	var lines struct {
		Entries []struct {
			Surface string `json:"surface"`
			Action  string `json:"action"`
			Result  string `json:"result"`
			Who     string `json:"who"`
		} `json:"entries"`
	}
	d.as(a.Secret).want(t, http.StatusOK, "GET", "/audit?limit=200", nil, &lines)
	count := map[string]int{}
	for _, e := range lines.Entries {
		if e.Who == "key:"+a.ID && e.Result == "ok" {
			count[e.Surface+" "+e.Action]++
		}
	}
	for _, op := range []string{"POST /jails", "POST /jails/{id}/exec", "PUT /jails/{id}/files/{path...}", "POST /jails/{id}/snapshot", "POST /snapshots/{sid}/branch", "DELETE /jails/{id}"} {
		if count["api "+op] < 1 || count["mcp "+op] < 1 {
			t.Errorf("%s: audit lines of a's MCP calls: %d over stdio (surface api), %d over HTTP (surface mcp), want one each", op, count["api "+op], count["mcp "+op])
		}
	}
}

// TestMCPClaudeCode: Claude Code, given `agentjail mcp` as an MCP server
// (claude -p --mcp-config), runs a command in a jail through the
// run_command tool when the model (the fake model server) asks for it,
// and reports the command's output.
func TestMCPClaudeCode(t *testing.T) {
	d := shared(t)
	claude, err := filepath.Glob(filepath.Join(agentToolsDir(), "claude", "*", "bin", "claude"))
	if err != nil || len(claude) == 0 {
		// Install it as TestAgents does: through a daemon whose tool tree
		// is the machine's shared one.
		td := newDaemon(t, "--tools-dir", agentToolsDir())
		out, stderr, code := runBinTimeout(t, 15*time.Minute, []string{"AGENTJAIL_ADDR=" + td.addr, "AGENTJAIL_TOKEN=" + td.token}, "", "agent", "install", "claude")
		t.Logf("agent install claude: exit %d %s %s", code, out, stderr)
		claude, _ = filepath.Glob(filepath.Join(agentToolsDir(), "claude", "*", "bin", "claude"))
	}
	if len(claude) == 0 {
		t.Fatalf("no Claude Code under %s (agentjail agent install claude; the daemon's --tools-dir)", agentToolsDir())
	}
	key := d.makeKey(t, "mcp-claude", "user")
	j := d.as(key.Secret)
	var jl jailInfo
	j.want(t, http.StatusCreated, "POST", "/jails", map[string]any{"name": uniqueName(t)}, &jl)
	t.Cleanup(func() { d.destroy(t, jl.ID) })

	fake := fakemodel.New(fakemodel.Config{Tool: "mcp__agentjail__run_command",
		ToolInput: map[string]any{"jail": jl.ID, "command": "echo claude-was-in-$(hostname) > /workspace/claude.txt; cat /workspace/claude.txt"}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: fake}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	home := t.TempDir()
	cfg := filepath.Join(home, "mcp.json")
	mcpCfg, _ := json.Marshal(map[string]any{"mcpServers": map[string]any{"agentjail": map[string]any{
		"command": binPath, "args": []string{"mcp"},
		"env": map[string]string{"AGENTJAIL_ADDR": d.addr, "AGENTJAIL_TOKEN": key.Secret},
	}}})
	if err := os.WriteFile(cfg, mcpCfg, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, claude[0], "-p", "Run the command in the jail", "--mcp-config", cfg, "--strict-mcp-config",
		"--allowedTools", "mcp__agentjail__run_command", "--model", "fake-model")
	cmd.Dir = home
	cmd.Env = []string{"HOME=" + home, "PATH=/usr/local/bin:/usr/bin:/bin", "ANTHROPIC_BASE_URL=http://" + ln.Addr().String(),
		"ANTHROPIC_API_KEY=fake-key", "DISABLE_AUTOUPDATER=1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "DISABLE_TELEMETRY=1",
		// MCP tools are offered to the model at once, not deferred behind a tool search.
		"ENABLE_TOOL_SEARCH=false"}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "FAKE-DONE") || !strings.Contains(string(out), "claude-was-in-") {
		t.Fatalf("claude -p with agentjail mcp: %v\n%s\nmodel requests:\n%s", err, tail(string(out), 3000), tail(fake.LogJSON(), 6000))
	}
	// The command ran in the jail, as the key's tenant.
	if got := d.mustSh(t, jl.ID, "cat /workspace/claude.txt"); !strings.HasPrefix(got, "claude-was-in-") {
		t.Errorf("the jail's file: %q", got)
	}
	var lines struct {
		Entries []struct{ Action, Result, Who string } `json:"entries"`
	}
	j.want(t, http.StatusOK, "GET", "/audit?limit=50", nil, &lines)
	ran := false
	for _, e := range lines.Entries {
		ran = ran || e.Action == "POST /jails/{id}/exec" && e.Result == "ok" && e.Who == "key:"+key.ID
	}
	if !ran {
		t.Errorf("no audit line of the exec Claude Code's tool call made: %+v", lines.Entries)
	}
}
