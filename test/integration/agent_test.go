package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ajclient "github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/internal/agent"
	"github.com/agentjail/agentjail/internal/testenv"
	"github.com/agentjail/agentjail/test/fakemodel"
)

// agentToolsDir is where the agent tests install the CLIs: once per
// machine (npm installs of about 1.2 GB), shared by every run.
func agentToolsDir() string {
	if d := os.Getenv("AGENTJAIL_TOOLS_CACHE"); d != "" {
		return d
	}
	return "/var/cache/agentjail/tools"
}

// agentCommand is the tool call the fake model asks for: it writes a file
// and runs a command.
const (
	agentFileContent = "agentjail-was-here"
	agentCommand     = "printf %s " + agentFileContent + " > /workspace/agent-hello.txt && ls /workspace"
)

// agentEnv is a daemon with the model keys in its secrets file, the fake
// model server on loopback, and a host repository with local changes.
type agentEnv struct {
	d       *daemon
	fake    *fakemodel.Server
	fakeURL string
	keys    map[string]string // secret name → value
	env     []string          // for runBin
	repo    string
	// tmpl is a home template directory the agents get.
	tmpl string
}

func newAgentEnv(t *testing.T) *agentEnv {
	t.Helper()
	requireEnv(t)
	for _, tool := range []string{"git", "npm", "tmux"} {
		testenv.RequireTool(t, tool)
	}
	dir, err := os.MkdirTemp("", "agentjail-it-")
	if err != nil {
		t.Fatal(err)
	}
	e := &agentEnv{keys: map[string]string{}}
	var secrets strings.Builder
	for _, name := range []string{"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY"} {
		v := "real-" + strings.ToLower(name[:3]) + "-key-" + randHex(12)
		e.keys[name] = v
		fmt.Fprintf(&secrets, "%s=%s\n", name, v)
	}
	if err := os.WriteFile(filepath.Join(dir, "secrets.env"), []byte(secrets.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := startDaemon(dir, "--tools-dir", agentToolsDir())
	if err != nil {
		t.Fatalf("starting a daemon: %v", err)
	}
	t.Cleanup(func() {
		if err := d.shutdown(); err != nil {
			t.Errorf("shutting down the daemon: %v", err)
		}
	})
	e.d = d
	e.env = []string{"AGENTJAIL_ADDR=" + d.addr, "AGENTJAIL_TOKEN=" + d.token}
	e.fake = fakemodel.New(fakemodel.Config{Command: agentCommand})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: e.fake}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	e.fakeURL = "http://" + ln.Addr().String()
	e.repo = newHostRepo(t)
	e.tmpl = t.TempDir()
	os.MkdirAll(filepath.Join(e.tmpl, ".config", "team"), 0o755)
	os.WriteFile(filepath.Join(e.tmpl, ".config", "team", "mcp.json"), []byte(`{"servers":{}}`), 0o644)
	return e
}

// newHostRepo makes a repository with two commits on main, a modified
// tracked file and an untracked one (the working tree a sync must leave
// alone).
func newHostRepo(t *testing.T) string {
	t.Helper()
	repo := t.TempDir()
	for _, args := range [][]string{
		{"init", "-q", "-b", "main"},
		{"config", "user.name", "host"}, {"config", "user.email", "host@example.com"},
	} {
		gitIn(t, repo, args...)
	}
	os.WriteFile(filepath.Join(repo, "README.md"), []byte("# demo\n"), 0o644)
	gitIn(t, repo, "add", ".")
	gitIn(t, repo, "commit", "-qm", "first")
	os.WriteFile(filepath.Join(repo, "main.go"), []byte("package main\n"), 0o644)
	gitIn(t, repo, "add", ".")
	gitIn(t, repo, "commit", "-qm", "second")
	os.WriteFile(filepath.Join(repo, "README.md"), []byte("# demo\nlocal edit, not committed\n"), 0o644)
	os.WriteFile(filepath.Join(repo, "notes.txt"), []byte("untracked\n"), 0o644)
	return repo
}

func gitIn(t testing.TB, dir string, args ...string) string {
	t.Helper()
	out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// hostState is what a sync must not change in the host repository.
func hostState(t testing.TB, repo string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString(gitIn(t, repo, "symbolic-ref", "HEAD") + "\n")
	b.WriteString(gitIn(t, repo, "rev-parse", "HEAD") + "\n")
	b.WriteString(gitIn(t, repo, "status", "--porcelain", "--untracked-files=all") + "\n")
	for _, f := range []string{"README.md", "main.go", "notes.txt"} {
		data, _ := os.ReadFile(filepath.Join(repo, f))
		b.Write(data)
	}
	_, err := os.Stat(filepath.Join(repo, "agent-hello.txt"))
	fmt.Fprintf(&b, "agent-hello.txt in the working tree: %v\n", err == nil)
	return b.String()
}

// installAgents installs the four CLIs (a no-op where the machine has them).
func (e *agentEnv) install(t *testing.T, name string) {
	t.Helper()
	start := time.Now()
	out, stderr, code := runBinTimeout(t, 15*time.Minute, e.env, "", "agent", "install", name)
	if code != 0 {
		t.Fatalf("agent install %s: exit %d\n%s%s", name, code, out, stderr)
	}
	t.Logf("agent install %s: %s (%.1f s)", name, strings.TrimSpace(out), time.Since(start).Seconds())
	out, _, code = runBin(t, e.env, "", "agent", "install", name)
	if code != 0 || !strings.Contains(out, "already installed") {
		t.Fatalf("second install of %s: exit %d: %s", name, code, out)
	}
}

// runBinTimeout is runBin with a longer deadline.
func runBinTimeout(tb testing.TB, timeout time.Duration, env []string, stdin string, args ...string) (string, string, int) {
	tb.Helper()
	cmd := exec.Command(binPath, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(timeout):
		cmd.Process.Kill()
		<-done
		tb.Fatalf("agentjail %s: no exit within %v", strings.Join(args, " "), timeout)
	}
	return stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()
}

// agentCase is what differs between the four CLIs.
type agentCase struct {
	name      string
	secret    string // the daemon's key
	header    string // the header the key travels in
	prefix    string // before the key in it
	host      string // the model host in the jail
	modelPath string // in the model request
}

var agentCases = []agentCase{
	{"claude", "ANTHROPIC_API_KEY", "X-Api-Key", "", "api.anthropic.com", "/v1/messages"},
	{"codex", "OPENAI_API_KEY", "Authorization", "Bearer ", "api.openai.com", "/v1/responses"},
	{"gemini", "GEMINI_API_KEY", "X-Goog-Api-Key", "", "generativelanguage.googleapis.com", "streamGenerateContent"},
	{"opencode", "ANTHROPIC_API_KEY", "X-Api-Key", "", "api.anthropic.com", "/v1/messages"},
}

// TestAgents: each of the four agent CLIs, installed from npm, runs
// headless in a jail on a clone of a host repository against the fake
// model API: the file its tool call wrote is in the workspace, sync puts
// it on branch agentjail/<jail> of the host repository and leaves the
// host's branch and working tree alone, the process tree shows the agent
// and its tool's shell, the network log shows the model request with the
// key header the proxy added (which the model server received), and the
// key is nowhere in the jail. Claude Code and Codex also run in a
// terminal session whose recording replays.
func TestAgents(t *testing.T) {
	e := newAgentEnv(t)
	for _, c := range agentCases {
		e.install(t, c.name)
	}
	t.Run("manifest", func(t *testing.T) {
		var list []struct {
			Name      string `json:"name"`
			Installed []struct {
				Version string `json:"version"`
				SHA256  string `json:"sha256"`
				Dir     string `json:"dir"`
			} `json:"installed"`
		}
		e.d.api.want(t, http.StatusOK, "GET", "/agents", nil, &list)
		for _, a := range list {
			if a.Name != "gemini" {
				continue
			}
			if len(a.Installed) == 0 {
				t.Fatalf("gemini is not listed as installed: %+v", a)
			}
			m := a.Installed[len(a.Installed)-1]
			sum, _, _, err := agent.HashTree(m.Dir)
			if err != nil || sum != m.SHA256 {
				t.Fatalf("gemini's tree hashes to %s (%v); its manifest says %s", sum, err, m.SHA256)
			}
			// The tree is not writable through a jail, and jails share it.
			if st, err := os.Stat(m.Dir); err != nil || st.Mode().Perm()&0o022 != 0 {
				t.Fatalf("tool tree %s: %v %v", m.Dir, st.Mode(), err)
			}
		}
	})
	for _, c := range agentCases {
		t.Run(c.name, func(t *testing.T) { e.headless(t, c) })
	}
	t.Run("claude-terminal", func(t *testing.T) { e.interactive(t, agentCases[0], "bypass permissions on") })
	t.Run("on-profile", e.onProfile)
	t.Run("codex-terminal", func(t *testing.T) { e.interactive(t, agentCases[1], "Ask Codex") })
}

func (e *agentEnv) headless(t *testing.T, c agentCase) {
	name := "ag-" + c.name + "-" + randHex(3)
	e.fake.Reset()
	before := hostState(t, e.repo)
	out, stderr, code := runBinTimeout(t, 5*time.Minute, e.env, "", "agent", "start", name, "--agent", c.name, "--project", e.repo,
		"--endpoint", e.fakeURL, "--model", "fake-model", "--home-template", e.tmpl, "--prompt", "Write the file and list the workspace")
	id := e.d.getJail(t, name).ID
	t.Cleanup(func() { e.d.destroy(t, id) })
	if code != 0 || !strings.Contains(out, "FAKE-DONE") || !strings.Contains(out, "agent-hello.txt") {
		t.Fatalf("agent start --prompt: exit %d\nstdout:\n%s\nstderr:\n%s\nmodel requests:\n%s", code, out, tail(stderr, 3000), e.fake.LogJSON())
	}

	// The file the tool call wrote is in the workspace.
	if got := e.d.mustSh(t, id, "cat /workspace/agent-hello.txt"); got != agentFileContent {
		t.Fatalf("workspace file: %q", got)
	}
	// The user's home template is in the agent's home, the user's own.
	if got := e.d.mustSh(t, id, "cat ~/.config/team/mcp.json; stat -c %U ~/.config/team/mcp.json"); got != "{\"servers\":{}}agent\n" {
		t.Fatalf("home template file: %q", got)
	}
	// The shared tool tree is read-only in the jail, to its root too.
	if res := e.d.shAs(t, id, "root", "touch "+agent.ToolRoot+"/"+c.name+"/bin/x"); res.ExitCode == 0 || !strings.Contains(res.Stderr, "Read-only file system") {
		t.Fatalf("writing into the tool tree as the jail's root: %s", &res)
	}

	// The model server got the daemon's key, never the jail's dummy.
	reqs := e.fake.ModelRequests()
	if len(reqs) < 2 {
		t.Fatalf("%d model requests, want the tool call and the final answer:\n%s", len(reqs), e.fake.LogJSON())
	}
	for _, r := range reqs {
		if got := r.Header.Get(c.header); got != c.prefix+e.keys[c.secret] {
			t.Fatalf("model request %s %s: %s is %.16q…, want the daemon's key", r.Method, r.Path, c.header, got)
		}
	}

	// The network log shows the model request, routed, with the header added.
	log := e.d.api.want(t, http.StatusOK, "GET", "/jails/"+id+"/network/log", nil, nil).body
	found := false
	for _, line := range bytes.Split(log, []byte("\n")) {
		var ev struct {
			Host        string   `json:"host"`
			Path        string   `json:"path"`
			Status      int      `json:"status"`
			Upstream    string   `json:"upstream"`
			Credentials []string `json:"credentials"`
			Comm        string   `json:"comm"`
		}
		if json.Unmarshal(line, &ev) != nil || ev.Host != c.host || !strings.Contains(ev.Path, c.modelPath) {
			continue
		}
		if ev.Status == 200 && ev.Upstream == e.fakeURL && len(ev.Credentials) == 1 && strings.EqualFold(ev.Credentials[0], c.header) {
			found = true
		}
	}
	if !found {
		t.Fatalf("no network record of the model request to %s with the %s header added:\n%s", c.host, c.header, tail(string(log), 4000))
	}

	// The process tree shows the agent and its tool's shell below it.
	var tree struct {
		Roots []*procNode `json:"roots"`
	}
	e.d.api.want(t, http.StatusOK, "GET", "/jails/"+id+"/processes", nil, &tree)
	if !agentWithTool(tree.Roots, c.name, false) {
		t.Fatalf("no %s process with the tool's command below it in the tree:\n%s", c.name, flatTree(&strings.Builder{}, tree.Roots, 0))
	}

	e.noKeyInJail(t, id)

	// Sync: the work lands on agentjail/<jail>; the host's branch and
	// working tree stay as they were.
	out, stderr, code = runBin(t, e.env, "", "sync", name)
	if code != 0 {
		t.Fatalf("sync: exit %d: %s%s", code, out, stderr)
	}
	if got := gitIn(t, e.repo, "show", "agentjail/"+name+":agent-hello.txt"); got != agentFileContent {
		t.Fatalf("agentjail/%s:agent-hello.txt is %q", name, got)
	}
	if got := gitIn(t, e.repo, "rev-parse", "agentjail/"+name+"~1"); got != gitIn(t, e.repo, "rev-parse", "main") {
		t.Fatalf("agentjail/%s does not continue main: parent %s", name, got)
	}
	if after := hostState(t, e.repo); after != before {
		t.Fatalf("the sync changed the host repository's checkout:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// procNode is a node of GET /jails/{id}/processes.
type procNode struct {
	Pid      int         `json:"pid"`
	Comm     string      `json:"comm"`
	Argv     []string    `json:"argv"`
	Children []*procNode `json:"children"`
}

// agentWithTool reports whether the tree holds the agent's process with
// the tool call's child below it: the ls the command runs (the tree keeps
// exited processes).
func agentWithTool(nodes []*procNode, name string, under bool) bool {
	for _, n := range nodes {
		argv := strings.Join(n.Argv, " ")
		if under && argv == "ls /workspace" {
			return true
		}
		isAgent := under || n.Comm == name || (len(n.Argv) > 0 && filepath.Base(n.Argv[0]) == name) ||
			strings.Contains(argv, agent.ToolRoot+"/"+name+"/")
		if agentWithTool(n.Children, name, isAgent) {
			return true
		}
	}
	return false
}

// flatTree renders a process tree one process a line.
func flatTree(b *strings.Builder, nodes []*procNode, depth int) string {
	for _, n := range nodes {
		fmt.Fprintf(b, "%s%d %s %q\n", strings.Repeat("  ", depth), n.Pid, n.Comm, n.Argv)
		flatTree(b, n.Children, depth+1)
	}
	return b.String()
}

// noKeyInJail looks for every daemon key in the jail's writable layer (all
// it wrote and was given: home, workspace, /tmp) and in every process's
// environment and command line.
func (e *agentEnv) noKeyInJail(t *testing.T, id string) {
	t.Helper()
	upper := filepath.Join(e.d.dir, "jails", id, "rootfs", "upper")
	files := 0
	err := filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files++
		for name, v := range e.keys {
			if bytes.Contains(data, []byte(v)) {
				t.Errorf("%s found in the jail's file %s", name, strings.TrimPrefix(p, upper))
			}
		}
		return nil
	})
	if err != nil || files == 0 {
		t.Fatalf("walking the jail's layer: %d files, %v", files, err)
	}
	dump := e.d.shAs(t, id, "root", `for p in /proc/[0-9]*; do tr '\0' '\n' < $p/environ; tr '\0' ' ' < $p/cmdline; echo; done 2>/dev/null`).Stdout
	if !strings.Contains(dump, agent.DummyKey) {
		t.Fatalf("the process dump does not show the dummy key; it read nothing?\n%s", tail(dump, 2000))
	}
	for name, v := range e.keys {
		if strings.Contains(dump, v) {
			t.Errorf("%s found in a jail process's environment or argv", name)
		}
	}
}

// interactive runs the agent's TUI in a terminal session under tmux:
// prompt, tool call and answer on the screen; detach and attach again;
// the key is nowhere in the jail while the agent runs; the recording
// replays the answer.
func (e *agentEnv) interactive(t *testing.T, c agentCase, ready string) {
	name := "tui-" + c.name + "-" + randHex(3)
	e.fake.Reset()
	live := newTmux(t, 120, 40, e.env, binPath+" agent start "+name+" --agent "+c.name+" --project "+e.repo+
		" --endpoint "+e.fakeURL+" --model fake-model; echo CLI-EXIT=$?")
	t.Cleanup(func() {
		if j, err := e.d.api.send("GET", "/jails/"+name, nil); err == nil && j.status == http.StatusOK {
			e.d.api.send("DELETE", "/jails/"+name, nil)
		}
	})
	waitScreenFor(t, live, ready, 90*time.Second)
	live.literal("List the files")
	// The TUI reads a pasted line and the Enter key apart.
	waitScreenFor(t, live, "List the files", 30*time.Second)
	live.keys("Enter")
	waitScreenFor(t, live, "FAKE-DONE", 90*time.Second)
	id := e.d.getJail(t, name).ID
	if got := e.d.mustSh(t, id, "cat /workspace/agent-hello.txt"); got != agentFileContent {
		t.Fatalf("workspace file: %q", got)
	}
	e.noKeyInJail(t, id) // with the agent running

	live.keys("C-p", "C-q")
	waitScreenFor(t, live, "CLI-EXIT=0", 30*time.Second)
	att := newTmux(t, 120, 40, e.env, binPath+" agent attach "+name+"; echo CLI-EXIT=$?")
	waitScreenFor(t, att, "FAKE-DONE", 30*time.Second)
	// End the agent: the session ends and its recording is finished.
	if res := e.d.shAs(t, id, "root", "pkill -KILL -x "+c.name); res.ExitCode != 0 {
		t.Fatalf("no %s process to end: %s", c.name, &res)
	}
	waitScreenFor(t, att, "CLI-EXIT=", 60*time.Second)

	var recs struct {
		Recordings []recordingInfo `json:"recordings"`
	}
	if err := waitFor(30*time.Second, func() error {
		e.d.api.want(t, http.StatusOK, "GET", "/jails/"+id+"/recordings", nil, &recs)
		if len(recs.Recordings) == 1 && recs.Recordings[0].Status == "complete" {
			return nil
		}
		return fmt.Errorf("recordings: %+v", recs.Recordings)
	}); err != nil {
		t.Fatal(err)
	}
	rp := newTmux(t, 120, 40, e.env, binPath+" replay --speed 100 --idle-limit 100ms "+recs.Recordings[0].ID+"; echo REPLAY-EXIT=$?")
	waitScreenFor(t, rp, "REPLAY-EXIT=0", 60*time.Second)
	if !strings.Contains(rp.screen(), "FAKE-DONE") {
		t.Fatalf("the replay does not show the answer:\n%s", rp.screen())
	}
}

func waitScreenFor(t *testing.T, tm *tmux, s string, timeout time.Duration) {
	t.Helper()
	if err := waitFor(timeout, func() error {
		if strings.Contains(tm.screen(), s) {
			return nil
		}
		return fmt.Errorf("no %q on the screen", s)
	}); err != nil {
		t.Fatalf("%v:\n%s", err, tm.screen())
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// TestAgentErrors: an unknown agent, an agent not installed, a workspace
// that is no repository and a git URL that cannot be read are precise
// errors that leave no jail behind; a sync with nothing new and a sync
// after the branch moved on the host are refused without writing
// anything; a failed install leaves no tree; running the agent of a jail
// without one is refused.
func TestAgentErrors(t *testing.T) {
	e := newAgentEnv(t)
	jailDirs := func() int {
		ents, _ := os.ReadDir(filepath.Join(e.d.dir, "jails"))
		return len(ents)
	}
	plain := t.TempDir()
	os.WriteFile(filepath.Join(plain, "file.txt"), []byte("not a repository\n"), 0o644)
	for _, tc := range []struct {
		what string
		body map[string]any
		want string
	}{
		{"unknown agent", map[string]any{"agent": map[string]any{"name": "nope"}}, `unknown agent "nope"`},
		{"agent not installed", map[string]any{"agent": map[string]any{"name": "claude", "version": "0.0.1"}}, "claude 0.0.1 is not installed"},
		{"not a repository", map[string]any{"workspace": map[string]any{"repo": plain}}, "is not a git repository"},
		{"failing git URL", map[string]any{"workspace": map[string]any{"repo": "file:///nonexistent/agentjail/repo.git"}}, "cannot read file:///nonexistent/agentjail/repo.git"},
		{"unknown ref", map[string]any{"workspace": map[string]any{"repo": e.repo, "ref": "no-such-branch"}}, `"no-such-branch" names no commit`},
	} {
		t.Run(tc.what, func(t *testing.T) {
			before := jailDirs()
			name := uniqueName(t)
			body := map[string]any{"name": name}
			for k, v := range tc.body {
				body[k] = v
			}
			r := e.d.api.do(t, "POST", "/jails", body)
			if r.status != http.StatusUnprocessableEntity || !strings.Contains(r.errorMessage(), tc.want) {
				t.Fatalf("create with %s: %s; want 422 with %q", tc.what, r, tc.want)
			}
			if got := e.d.api.do(t, "GET", "/jails/"+name, nil); got.status != http.StatusNotFound {
				t.Fatalf("after the failed create: GET /jails/%s: %s", name, got)
			}
			if after := jailDirs(); after != before {
				t.Fatalf("the failed create left %d jail directories (had %d)", after, before)
			}
		})
	}

	t.Run("sync", func(t *testing.T) {
		j := e.d.createJail(t, map[string]any{"workspace": map[string]any{"repo": e.repo}})
		branch := "agentjail/" + j.Name
		hasBranch := func() string {
			out, _ := exec.Command("git", "-C", e.repo, "rev-parse", "--verify", "--quiet", branch).Output()
			return strings.TrimSpace(string(out))
		}
		// Nothing changed yet.
		r := e.d.api.do(t, "POST", "/jails/"+j.ID+"/sync", nil)
		if r.status != http.StatusConflict || !strings.Contains(r.errorMessage(), "nothing to sync") {
			t.Fatalf("empty sync: %s", r)
		}
		if hasBranch() != "" {
			t.Fatal("an empty sync made the branch")
		}
		// A change syncs.
		e.d.mustSh(t, j.ID, "echo one > /workspace/one.txt")
		e.d.api.want(t, http.StatusOK, "POST", "/jails/"+j.ID+"/sync", nil, nil)
		first := hasBranch()
		if first == "" {
			t.Fatal("the sync made no branch")
		}
		// The host moves the branch; the next sync is refused and writes nothing.
		gitIn(t, e.repo, "branch", "-f", branch, "main")
		moved := hasBranch()
		e.d.mustSh(t, j.ID, "echo two > /workspace/two.txt")
		r = e.d.api.do(t, "POST", "/jails/"+j.ID+"/sync", nil)
		if r.status != http.StatusConflict || !strings.Contains(r.errorMessage(), "moved to") || !strings.Contains(r.errorMessage(), "nothing was written") {
			t.Fatalf("sync after the branch moved on the host: %s", r)
		}
		if hasBranch() != moved {
			t.Fatal("the refused sync changed the branch")
		}
		if st := e.d.mustSh(t, j.ID, "cd /workspace && git status --porcelain"); !strings.Contains(st, "two.txt") {
			t.Fatalf("the refused sync committed in the jail: status %q", st)
		}
		// A workspace that is no repository any more.
		e.d.mustSh(t, j.ID, "rm -rf /workspace/.git")
		gitIn(t, e.repo, "branch", "-f", branch, first)
		r = e.d.api.do(t, "POST", "/jails/"+j.ID+"/sync", nil)
		if r.status != http.StatusUnprocessableEntity || !strings.Contains(r.errorMessage(), "is not a git repository") {
			t.Fatalf("sync of a workspace without .git: %s", r)
		}
	})

	t.Run("auto sync", func(t *testing.T) {
		for _, mode := range []map[string]any{{"mode": "auto-commit", "interval_s": 1}, {"mode": "auto-idle", "idle_s": 1}} {
			j := e.d.createJail(t, map[string]any{"workspace": map[string]any{"repo": e.repo, "sync": mode}})
			e.d.mustSh(t, j.ID, "echo auto > /workspace/auto.txt")
			if err := waitFor(30*time.Second, func() error {
				out, err := exec.Command("git", "-C", e.repo, "show", "agentjail/"+j.Name+":auto.txt").Output()
				if err != nil || strings.TrimSpace(string(out)) != "auto" {
					return fmt.Errorf("%s: no auto.txt on agentjail/%s yet", mode["mode"], j.Name)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("no agent", func(t *testing.T) {
		j := e.d.createJail(t, nil)
		r := e.d.api.do(t, "POST", "/jails/"+j.ID+"/agent/run", map[string]any{"prompt": "hi"})
		if r.status != http.StatusConflict || !strings.Contains(r.errorMessage(), "has no agent") {
			t.Fatalf("agent run in a jail without an agent: %s", r)
		}
		r = e.d.api.do(t, "POST", "/jails/"+j.ID+"/sync", nil)
		if r.status != http.StatusUnprocessableEntity || !strings.Contains(r.errorMessage(), "no workspace from a host repository") {
			t.Fatalf("sync of a jail without a workspace: %s", r)
		}
	})

	t.Run("failed install", func(t *testing.T) {
		const version = "0.0.0-agentjail-none"
		_, stderr, code := runBinTimeout(t, 5*time.Minute, e.env, "", "agent", "install", "claude", "--version", version)
		if code == 0 || !strings.Contains(stderr, "npm") {
			t.Fatalf("install of a version that does not exist: exit %d: %s", code, tail(stderr, 2000))
		}
		if _, err := os.Stat(filepath.Join(agentToolsDir(), "claude", version)); !os.IsNotExist(err) {
			t.Fatalf("the failed install left a tree: %v", err)
		}
		staged, _ := filepath.Glob(filepath.Join(agentToolsDir(), ".staging", "claude@"+version+"*"))
		if len(staged) > 0 {
			t.Fatalf("the failed install left its staging directory: %v", staged)
		}
		r := e.d.api.do(t, "POST", "/agents/nope/install", nil)
		if r.status != http.StatusNotFound || !strings.Contains(r.errorMessage(), `unknown agent "nope"`) {
			t.Fatalf("install of an unknown agent: %s", r)
		}
	})
}

// onProfile runs Claude Code (a glibc binary) and Gemini CLI (on the Node
// its tool tree brings) in jails whose root is the minimal Debian profile
// image instead of the host's tree.
func (e *agentEnv) onProfile(t *testing.T) {
	testenv.RequireTool(t, "mmdebstrap")
	c := ajclient.New(e.d.addr, e.d.token)
	for _, ac := range []agentCase{agentCases[0], agentCases[2]} {
		e.fake.Reset()
		req := ajclient.CreateRequest{Name: "prof-" + ac.name + "-" + randHex(3)}
		req.Isolation.Filesystem.Rootfs = "profile:minimal"
		req.Agent = &ajclient.Agent{Name: ac.name, Endpoint: e.fakeURL, Model: "fake-model"}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		j, err := c.Create(ctx, req)
		if err != nil {
			cancel()
			t.Fatalf("%s on profile:minimal: %v", ac.name, err)
		}
		t.Cleanup(func() { e.d.destroy(t, j.ID) })
		var out bytes.Buffer
		res, err := c.RunAgent(ctx, j.ID, ajclient.AgentRunRequest{Prompt: "Write the file and list the workspace"}, func(_ string, b []byte) error {
			out.Write(b)
			return nil
		})
		cancel()
		if err != nil || res.ExitCode != 0 || !strings.Contains(out.String(), "FAKE-DONE") {
			t.Fatalf("%s on profile:minimal: %v %+v\n%s\nmodel requests:\n%s", ac.name, err, res, tail(out.String(), 3000), e.fake.LogJSON())
		}
		if got := e.d.mustSh(t, j.ID, "cat /workspace/agent-hello.txt"); got != agentFileContent {
			t.Fatalf("%s on profile:minimal: workspace file %q", ac.name, got)
		}
	}
}
