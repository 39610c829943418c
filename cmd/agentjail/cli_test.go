package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/internal/api"
	"github.com/agentjail/agentjail/internal/api/apitest"
	"github.com/agentjail/agentjail/internal/apikey"
	"github.com/agentjail/agentjail/internal/model"
)

type cli struct {
	t    *testing.T
	addr string
	data string
	svc  *apitest.Service
}

func newCLI(t *testing.T) *cli {
	svc := apitest.New()
	keys, err := apikey.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.NewServer(svc, "tok", nil, api.WithKeys(keys)))
	t.Cleanup(srv.Close)
	t.Setenv("AGENTJAIL_TOKEN", "tok")
	t.Setenv("AGENTJAIL_ADDR", "")
	data := t.TempDir()
	t.Setenv("AGENTJAIL_DATA_DIR", data)
	return &cli{t: t, addr: strings.TrimPrefix(srv.URL, "http://"), data: data, svc: svc}
}

// run runs the CLI with args (after --addr) and stdin, returning the exit
// status and what it wrote.
func (c *cli) run(stdin string, args ...string) (code int, stdout, stderr string) {
	c.t.Helper()
	root := newRootCmd()
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetIn(strings.NewReader(stdin))
	root.SetArgs(append([]string{"--addr", c.addr}, args...))
	code = exitStatus(root.ExecuteContext(context.Background()), &errb)
	return code, out.String(), errb.String()
}

func (c *cli) ok(args ...string) string {
	c.t.Helper()
	code, out, errs := c.run("", args...)
	if code != 0 {
		c.t.Fatalf("agentjail %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

func TestCreateInspectList(t *testing.T) {
	c := newCLI(t)
	id := strings.TrimSpace(c.ok("create", "--name", "a", "--memory", "256m", "--disk", "2g", "--pids", "64", "--env", "A=B=C", "--rootfs", "dir:/srv/tree"))
	var j model.Jail
	if err := json.Unmarshal([]byte(c.ok("--json", "inspect", "a")), &j); err != nil {
		t.Fatal(err)
	}
	r := j.Config.Isolation.Resources
	if j.ID != id || r.MemoryBytes != 256<<20 || r.DiskBytes != 2<<30 || r.PidsLimit != 64 || j.Config.Env["A"] != "B=C" || j.Config.Isolation.Filesystem.Rootfs != "dir:/srv/tree" {
		t.Fatalf("jail %+v does not reflect the flags", j)
	}
	out := c.ok("inspect", "a")
	for _, want := range []string{"id:", id, "status:", "running", "memory limit:", "256MiB", "memory used:"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out)
		}
	}
	// A config file, with flags over it.
	cfg := filepath.Join(t.TempDir(), "jail.yaml")
	if err := os.WriteFile(cfg, []byte("name: fromfile\nisolation:\n  resources:\n    memory_bytes: 134217728\n    pids_limit: 32\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c.ok("create", "-f", cfg, "--pids", "99", "--no-start")
	if err := json.Unmarshal([]byte(c.ok("--json", "inspect", "fromfile")), &j); err != nil {
		t.Fatal(err)
	}
	if r := j.Config.Isolation.Resources; r.MemoryBytes != 128<<20 || r.PidsLimit != 99 || j.Status != model.StateCreated {
		t.Fatalf("jail %+v: want memory from the file, pids from the flag, not started", j)
	}
	if err := os.WriteFile(cfg, []byte("nmae: typo\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := c.run("", "create", "-f", cfg); code != 1 || !strings.Contains(errs, "nmae") {
		t.Fatalf("bad config file: exit %d, stderr %q", code, errs)
	}

	out = c.ok("ls")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(out, "fromfile") || !strings.Contains(out, "created") {
		t.Fatalf("ls:\n%s", out)
	}
	var list []model.Jail
	if err := json.Unmarshal([]byte(c.ok("--json", "ls")), &list); err != nil || len(list) != 2 {
		t.Fatalf("ls --json: %v %v", list, err)
	}
}

func TestLifecycleVerbs(t *testing.T) {
	c := newCLI(t)
	c.ok("create", "--name", "b")
	c.ok("stop", "--timeout", "3s", "b")
	if len(c.svc.Stops) != 1 || c.svc.Stops[0] != 3*time.Second {
		t.Fatalf("stops %v", c.svc.Stops)
	}
	c.ok("start", "b")
	if code, _, errs := c.run("", "rm", "b"); code != 1 || !strings.Contains(errs, "rm -f") {
		t.Fatalf("rm of a running jail: exit %d %q", code, errs)
	}
	c.ok("rm", "-f", "b")
	code, _, errs := c.run("", "inspect", "b")
	if code != 1 || !strings.HasPrefix(errs, "agentjail: ") || !strings.Contains(errs, `"b"`) {
		t.Fatalf("inspect of a removed jail: exit %d %q", code, errs)
	}
	if code, _, _ := c.run("", "start", "nope", "other"); code != 1 {
		t.Fatalf("start of missing jails: exit %d", code)
	}
}

func TestExecVerb(t *testing.T) {
	c := newCLI(t)
	c.ok("create", "--name", "e")
	if out := c.ok("exec", "e", "--", "echo", "hi", "-n"); out != "hi -n\n" {
		t.Fatalf("exec echo: %q", out)
	}
	if out := c.ok("exec", "e", "echo", "--flag-like"); out != "--flag-like\n" {
		t.Fatalf("exec without --: %q", out)
	}
	code, out, errs := c.run("", "exec", "e", "fail", "3", "bad")
	if code != 3 || out != "" || errs != "bad" {
		t.Fatalf("fail: exit %d stdout %q stderr %q", code, out, errs)
	}
	if code, _, _ := c.run("", "exec", "e", "kill", "SIGKILL"); code != 137 {
		t.Fatalf("killed: exit %d, want 137", code)
	}
	if code, out, _ := c.run("in\x00put", "exec", "-i", "e", "cat"); code != 0 || out != "in\x00put" {
		t.Fatalf("exec -i: exit %d %q", code, out)
	}
	for _, args := range [][]string{
		{"exec", "e"},
		{"exec", "e", "--"},
		{"exec", "--bogus", "e", "ls"},
		{"frobnicate"},
		{"create", "--memory", "lots"},
		{"create", "--env", "NOEQUALS"},
		{"cp", "a", "b"},
		{"inspect"},
	} {
		if code, _, errs := c.run("", args...); code != 2 || !strings.HasPrefix(errs, "agentjail: ") {
			t.Errorf("agentjail %v: exit %d, stderr %q; want a usage error (2)", args, code, errs)
		}
	}
	if code, _, errs := c.run("", "exec", "missing", "echo"); code != 1 || !strings.Contains(errs, "missing") {
		t.Fatalf("exec in a missing jail: exit %d %q", code, errs)
	}
}

func TestResultStatus(t *testing.T) {
	for _, tc := range []struct {
		res  model.ExecResult
		want int
	}{
		{model.ExecResult{}, 0},
		{model.ExecResult{ExitCode: 5}, 5},
		{model.ExecResult{ExitCode: 137, Signal: "SIGKILL", TimedOut: true}, 124},
		{model.ExecResult{ExitCode: 143, Signal: "SIGTERM"}, 143},
		{model.ExecResult{ExitCode: -1, Signal: "SIGSEGV"}, 139},
	} {
		if got := resultStatus(&tc.res); got != tc.want {
			t.Errorf("%+v: %d, want %d", tc.res, got, tc.want)
		}
	}
}

func TestRunVerb(t *testing.T) {
	c := newCLI(t)
	code, out, _ := c.run("", "run", "--rm", "--name", "r", "--memory", "64m", "--", "fail", "2", "x")
	if code != 2 {
		t.Fatalf("run: exit %d %q", code, out)
	}
	if js, _ := c.svc.List(context.Background()); len(js) != 0 {
		t.Fatalf("run --rm left %d jails", len(js))
	}
	code, out, errs := c.run("", "run", "echo", "kept")
	if code != 0 || out != "kept\n" || !strings.Contains(errs, "kept (remove it with") {
		t.Fatalf("run: exit %d %q %q", code, out, errs)
	}
	if js, _ := c.svc.List(context.Background()); len(js) != 1 {
		t.Fatalf("run without --rm: %d jails, want 1", len(js))
	}
}

func TestCpVerb(t *testing.T) {
	c := newCLI(t)
	c.ok("create", "--name", "cp")
	src := filepath.Join(t.TempDir(), "tree")
	for p, mode := range map[string]os.FileMode{"a.txt": 0o640, "sub/b.sh": 0o755, "sub/deep/c": 0o600} {
		full := filepath.Join(src, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte("content of "+p), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(full, mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("a.txt", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	// Into an existing jail directory: the tree lands inside it, its
	// link as a link; copied again, the link replaces the one there.
	c.ok("cp", src, "cp:/workspace")
	if err := c.svc.AddSymlink("cp", "/workspace/tree/ln", "a.txt"); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sub/b.sh", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	c.ok("cp", src, "cp:/workspace")
	if fi, err := c.svc.Stat(context.Background(), "cp", "/workspace/tree/link"); err != nil || fi.Type != "symlink" || fi.LinkTarget != "sub/b.sh" {
		t.Fatalf("the copied link in the jail: %+v %v", fi, err)
	}
	dst := t.TempDir()
	c.ok("cp", "cp:/workspace/tree", filepath.Join(dst, "back"))
	for p, mode := range map[string]os.FileMode{"a.txt": 0o640, "sub/b.sh": 0o755, "sub/deep/c": 0o600} {
		full := filepath.Join(dst, "back", p)
		b, err := os.ReadFile(full)
		if err != nil || string(b) != "content of "+p {
			t.Fatalf("%s: %q %v", p, b, err)
		}
		if st, _ := os.Stat(full); st.Mode().Perm() != mode {
			t.Errorf("%s: mode %v, want %v", p, st.Mode().Perm(), mode)
		}
	}
	if st, _ := os.Stat(filepath.Join(dst, "back", "sub")); st.Mode().Perm() != 0o750 {
		t.Errorf("sub: mode %v, want 0750", st.Mode().Perm())
	}
	for ln, want := range map[string]string{"ln": "a.txt", "link": "sub/b.sh"} {
		if target, err := os.Readlink(filepath.Join(dst, "back", ln)); err != nil || target != want {
			t.Errorf("symlink %s: %q %v, want %q", ln, target, err, want)
		}
	}
	// A single file to a new name, and into an existing local directory.
	c.ok("cp", "cp:/workspace/tree/a.txt", filepath.Join(dst, "single"))
	c.ok("cp", "cp:/workspace/tree/a.txt", dst)
	for _, p := range []string{"single", "a.txt"} {
		if b, err := os.ReadFile(filepath.Join(dst, p)); err != nil || string(b) != "content of a.txt" {
			t.Errorf("%s: %q %v", p, b, err)
		}
	}
}

func TestSplitJailPath(t *testing.T) {
	for _, tc := range []struct {
		in, ref, path string
		ok            bool
	}{
		{"j:/a", "j", "/a", true},
		{"my-jail.1:/a/b", "my-jail.1", "/a/b", true},
		{"./j:/a", "", "", false},
		{"j:a", "", "", false},
		{"/abs/path", "", "", false},
		{"dir/j:/x", "", "", false},
		{"plain", "", "", false},
	} {
		ref, p, ok := splitJailPath(tc.in)
		if ref != tc.ref || p != tc.path || ok != tc.ok {
			t.Errorf("%q: %q %q %v", tc.in, ref, p, ok)
		}
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"4096": 4096, "512m": 512 << 20, "1G": 1 << 30, "1.5g": 3 << 29, "2KiB": 2048, "3mb": 3 << 20, "1t": 1 << 40} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("%q: %d %v, want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "lots", "-1m", "1x", "1e30g"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}

func TestCheckE2BDomain(t *testing.T) {
	for _, ok := range []string{"", "localhost", "localhost:8082", "sandbox.example.com", "Sandbox.Example.com:443"} {
		if err := checkE2BDomain(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"http://x.example", "x.example/path", "bad host", "*.example.com", ":8082"} {
		if err := checkE2BDomain(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestDaemonAddrFile(t *testing.T) {
	c := newCLI(t)
	if err := os.WriteFile(filepath.Join(c.data, addrFile), []byte(c.addr+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	root := newRootCmd()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"--json", "ls"})
	if err := root.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("ls via DATA_DIR/daemon.addr: %v", err)
	}
	if strings.TrimSpace(out.String()) != "[]" {
		t.Fatalf("ls: %q", out.String())
	}
}

// lineWriter hands each written line to a channel.
type lineWriter struct{ lines chan string }

func (w lineWriter) Write(p []byte) (int, error) {
	w.lines <- string(p)
	return len(p), nil
}

func TestListenAndServe(t *testing.T) {
	svc := apitest.New()
	data := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lines := lineWriter{make(chan string, 4)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		done <- listenAndServe(ctx, api.NewServer(svc, "tok", nil), ln, data, slog.New(slog.DiscardHandler), lines, nil)
	}()
	var line string
	select {
	case line = <-lines.lines:
	case err := <-done:
		t.Fatalf("serve ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no listening line within 10s")
	}
	addr, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "agentjail: listening on http://")
	if !ok || strings.HasSuffix(addr, ":0") {
		t.Fatalf("listening line %q", line)
	}
	b, err := os.ReadFile(filepath.Join(data, addrFile))
	if err != nil || strings.TrimSpace(string(b)) != addr {
		t.Fatalf("daemon.addr %q %v, want %q", b, err, addr)
	}
	cl := client.New(addr, "tok")
	if h, err := cl.Health(ctx); err != nil || h.Status != "ok" {
		t.Fatalf("health %+v %v", h, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("shutdown: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no shutdown within 15s")
	}
	if _, err := os.Stat(filepath.Join(data, addrFile)); !os.IsNotExist(err) {
		t.Fatalf("daemon.addr left behind: %v", err)
	}
	if len(lines.lines) != 0 {
		t.Fatalf("more than one line on stderr: %q", <-lines.lines)
	}
}

// TestKeys: keys create prints a key once, ls shows it without the
// secret, rm removes it; unknown ids and roles are clear errors.
func TestKeys(t *testing.T) {
	c := newCLI(t)
	secret := strings.TrimSpace(c.ok("keys", "create", "--tenant", "team-a", "--role", "viewer", "--name", "ci"))
	if !strings.HasPrefix(secret, apikey.Prefix) {
		t.Fatalf("keys create printed %q", secret)
	}
	var list []client.APIKey
	if err := json.Unmarshal([]byte(c.ok("--json", "keys", "ls")), &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Tenant != "team-a" || list[0].Role != "viewer" || list[0].Name != "ci" || list[0].Secret != "" {
		t.Fatalf("keys ls: %+v", list)
	}
	if !strings.HasPrefix(secret, apikey.Prefix+list[0].ID+"_") {
		t.Fatalf("key %q does not carry its id %s", secret, list[0].ID)
	}
	if out := c.ok("keys", "ls"); !strings.Contains(out, list[0].ID) || strings.Contains(out, secret) {
		t.Fatalf("keys ls table:\n%s", out)
	}
	if code, _, errs := c.run("", "keys", "create", "--role", "root"); code == 0 || !strings.Contains(errs, "role") {
		t.Fatalf("a bad role: exit %d, %s", code, errs)
	}
	c.ok("keys", "rm", list[0].ID)
	if code, _, errs := c.run("", "keys", "rm", list[0].ID); code == 0 || !strings.Contains(errs, "no API key") {
		t.Fatalf("removing it again: exit %d, %s", code, errs)
	}
	if out := c.ok("--json", "keys", "ls"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("keys ls after rm: %s", out)
	}
}

// TestInfoVerb: info lists every level the daemon knows, what an
// available one does and why a missing one is missing.
func TestInfoVerb(t *testing.T) {
	c := newCLI(t)
	out := c.ok("info")
	for _, want := range []string{
		"agentjail test: ok", "container: available", "network modes:        isolated, none", "enforced limits:      memory, pids",
		"process snapshots:    no (no CRIU here)", "gvisor: unavailable: gvisor: runsc not built; run make gvisor",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("info lacks %q:\n%s", want, out)
		}
	}
	var h model.Health
	if err := json.Unmarshal([]byte(c.ok("--json", "info")), &h); err != nil || len(h.Levels) != 2 || h.Levels[1].Available {
		t.Errorf("info --json: %+v %v", h, err)
	}
}

func TestReachable(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:8082": "127.0.0.1:8082",
		"0.0.0.0:8082":   "127.0.0.1:8082",
		"[::]:8082":      "127.0.0.1:8082",
		"10.0.0.5:8082":  "10.0.0.5:8082",
		"[fd00::1]:8082": "[fd00::1]:8082",
	} {
		if got := reachable(in); got != want {
			t.Errorf("reachable(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestNoDaemon: a client whose daemon does not run says so, naming the
// address, and how to start one.
func TestNoDaemon(t *testing.T) {
	c := newCLI(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.addr = ln.Addr().String()
	ln.Close()
	code, _, errs := c.run("", "ls")
	if code != 1 || !strings.Contains(errs, "no daemon answers at "+c.addr) || !strings.Contains(errs, "agentjail serve") {
		t.Fatalf("ls without a daemon: exit %d, %q", code, errs)
	}
}
