package integration

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/agent"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/test/fakemodel"
)

// BenchmarkAgentStart: `agentjail agent start --prompt` (a jail, a clone of
// the project, Claude Code headless) to Claude Code's first model request,
// vs the same Claude Code started on the host outside any jail against
// the same fake model server, with the same home template (target 1.3x).
// The floor beside it is that reference plus the making of the same jail
// (the clone of the project, the home, the tool mount) through the API,
// without the agent: what the jail adds before the agent can start.
// It also reports what the tool tree costs each jail: the bytes of it
// copied into the jail's writable layer (target 0) beside the tree's size.
func BenchmarkAgentStart(b *testing.B) {
	requireEnv(b)
	dir, err := os.MkdirTemp("", "agentjail-it-")
	if err != nil {
		b.Fatal(err)
	}
	const key = "bench-anthropic-key"
	os.WriteFile(filepath.Join(dir, "secrets.env"), []byte("ANTHROPIC_API_KEY="+key+"\n"), 0o600)
	d, err := startDaemon(dir, "--tools-dir", agentToolsDir())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.shutdown() })
	env := []string{"AGENTJAIL_ADDR=" + d.addr, "AGENTJAIL_TOKEN=" + d.token}
	if _, stderr, code := runBinTimeout(b, 15*time.Minute, env, "", "agent", "install", "claude"); code != 0 {
		b.Fatalf("agent install claude: %s", stderr)
	}
	// The tool call is harmless on the host too (the reference runs there).
	fake := fakemodel.New(fakemodel.Config{Command: "true"})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: fake}
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Close() })
	fakeURL := "http://" + ln.Addr().String()
	repo := b.TempDir()
	gitIn(b, repo, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(repo, "README.md"), []byte("# bench\n"), 0o644)
	gitIn(b, repo, "add", ".")
	gitIn(b, repo, "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "one")

	// firstRequest runs cmd and returns how long it took the fake to see
	// the first model request; cmd is killed then.
	firstRequest := func(cmd *exec.Cmd) time.Duration {
		fake.Reset()
		first, at := fake.First()
		start := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
		select {
		case <-first:
			return at().Sub(start)
		case <-time.After(2 * time.Minute):
			b.Fatalf("no model request within 2 minutes:\n%s", fake.LogJSON())
			return 0
		}
	}

	def := agent.Definitions["claude"]
	m, err := agent.NewTools(agentToolsDir())
	if err != nil {
		b.Fatal(err)
	}
	tool, err := m.Get("claude", def.DefaultVersion)
	if err != nil {
		b.Fatal(err)
	}
	var ours, ref, making []time.Duration
	var copied int64
	for i := 0; i < b.N; i++ {
		name := fmt.Sprintf("bench-agent-%s-%d", randHex(2), i)
		cmd := exec.Command(binPath, "agent", "start", name, "--agent", "claude", "--project", repo, "--endpoint", fakeURL,
			"--prompt", "List the files")
		cmd.Env = append(os.Environ(), env...)
		ours = append(ours, firstRequest(cmd))
		j := d.getJail(b, name)
		// The tool's mount point is all the jail's layer holds of it.
		n, err := treeBytes(filepath.Join(d.dir, "jails", j.ID, "rootfs", "upper", strings.TrimPrefix(agent.ToolRoot, "/")))
		if err != nil && !os.IsNotExist(err) {
			b.Fatal(err)
		}
		copied += n
		d.destroy(b, j.ID)

		t0 := time.Now()
		var fj jailInfo
		d.api.want(b, http.StatusCreated, "POST", "/jails", map[string]any{"name": name + "-floor",
			"agent": map[string]any{"name": "claude", "endpoint": fakeURL}, "workspace": map[string]any{"repo": repo}}, &fj)
		making = append(making, time.Since(t0))
		d.destroy(b, fj.ID)

		// The reference: the same binary and home, on the host, in a clone
		// of the same repository (Claude Code inspects the repository at
		// start, as it does in the jail).
		home, cwd := b.TempDir(), filepath.Join(b.TempDir(), "clone")
		if out, err := exec.Command("git", "clone", "-q", repo, cwd).CombinedOutput(); err != nil {
			b.Fatalf("git clone: %v %s", err, out)
		}
		cfg := config.Config{Agent: &config.Agent{Name: "claude", Version: tool.Version}}
		cfg.Isolation.Filesystem.WorkspaceRoot = cwd
		files, err := agent.HomeFiles(&cfg, def)
		if err != nil {
			b.Fatal(err)
		}
		for rel, data := range files {
			os.MkdirAll(filepath.Dir(filepath.Join(home, rel)), 0o755)
			os.WriteFile(filepath.Join(home, rel), data, 0o600)
		}
		rc := exec.Command(filepath.Join(tool.Dir, "bin", "claude"), def.Headless(agent.RunOptions{}, "List the files")[1:]...)
		rc.Dir = cwd
		rc.Env = []string{"PATH=" + filepath.Join(tool.Dir, "bin") + ":/usr/local/bin:/usr/bin:/bin", "HOME=" + home, "LANG=C.UTF-8",
			"ANTHROPIC_BASE_URL=" + fakeURL, "ANTHROPIC_API_KEY=" + key}
		for k, v := range def.Env {
			rc.Env = append(rc.Env, k+"="+v)
		}
		ref = append(ref, firstRequest(rc))
	}
	mo, mr := median(ours), median(ref)
	b.ReportMetric(ms(mo), "ms")
	b.ReportMetric(ms(mr), "ref-ms")
	b.ReportMetric(float64(mo)/float64(mr), "x-ref")
	b.ReportMetric(1.3, "target-x")
	floor := mr + median(making)
	b.ReportMetric(ms(floor), "floor-ms")
	b.ReportMetric(float64(mo)/float64(floor), "x-floor")
	b.ReportMetric(float64(copied)/float64(b.N), "tool-bytes-copied/jail")
	b.ReportMetric(float64(tool.SizeBytes)/(1<<20), "tool-tree-MiB")
}
