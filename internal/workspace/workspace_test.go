package workspace

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/testenv"
)

func run(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

func TestValidate(t *testing.T) {
	for _, ws := range []config.Workspace{
		{}, {Repo: "relative/path"}, {Repo: "-upload-pack=x"}, {Repo: "/r", Ref: "--orphan"}, {Repo: "/r", Ref: "a..b"},
		{Repo: "/r", Sync: config.Sync{Mode: "sometimes"}}, {Repo: "/r", Sync: config.Sync{IdleS: -1}}, {Repo: "/r", Commit: "abc"},
	} {
		if err := Validate(&ws); !errors.Is(err, errdefs.ErrUnprocessable) {
			t.Errorf("Validate(%+v) = %v", ws, err)
		}
	}
	for _, ws := range []config.Workspace{{Repo: "/srv/repo", Ref: "main"}, {Repo: "https://example.com/x.git", Ref: "v1.2"},
		{Repo: "git@example.com:x/y.git"}, {Repo: "/r", Sync: config.Sync{Mode: config.SyncAutoIdle}}} {
		if err := Validate(&ws); err != nil {
			t.Errorf("Validate(%+v) = %v", ws, err)
		}
	}
	ws := config.Workspace{Repo: "/r", Sync: config.Sync{Mode: config.SyncAutoCommit}}
	ApplyDefaults(&ws)
	if ws.Sync.IntervalS != 60 || ws.Caches == nil || !*ws.Caches {
		t.Errorf("defaults: %+v", ws)
	}
}

// TestResolveAndFill: a host repository's ref resolves; a directory that
// is no repository and a URL that cannot be read do not; the clone lands
// on branch agentjail/<jail> at the commit, without the host's remote,
// and replaces the empty workspace in one rename.
func TestResolveAndFill(t *testing.T) {
	testenv.RequireTool(t, "git")
	ctx := context.Background()
	repo := t.TempDir()
	run(t, repo, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(repo, "a.txt"), []byte("a\n"), 0o644)
	run(t, repo, "add", ".")
	run(t, repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
	head := run(t, repo, "rev-parse", "HEAD")

	src, err := Resolve(ctx, &config.Workspace{Repo: repo})
	if err != nil || src.Commit != head || src.HostRepo != repo {
		t.Fatalf("Resolve: %+v %v", src, err)
	}
	if _, err := Resolve(ctx, &config.Workspace{Repo: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "is not a git repository") {
		t.Errorf("a plain directory: %v", err)
	}
	if _, err := Resolve(ctx, &config.Workspace{Repo: repo, Ref: "nope"}); err == nil || !strings.Contains(err.Error(), "names no commit") {
		t.Errorf("an unknown ref: %v", err)
	}
	if _, err := Resolve(ctx, &config.Workspace{Repo: "file:///nonexistent/x.git"}); err == nil || !strings.Contains(err.Error(), "cannot read") {
		t.Errorf("an unreadable URL: %v", err)
	}
	if s, err := Resolve(ctx, &config.Workspace{Repo: "file://" + repo, Ref: "main"}); err != nil || s.Commit != head || s.HostRepo != "" {
		t.Errorf("a file:// URL: %+v %v", s, err)
	}

	upper := t.TempDir()
	os.Mkdir(filepath.Join(upper, "workspace"), 0o755)
	o := Owner{UID: os.Getuid(), GID: os.Getgid()}
	if err := Fill(ctx, src, "j1", upper, "/workspace", o); err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(upper, "workspace")
	if b := run(t, ws, "rev-parse", "--abbrev-ref", "HEAD"); b != "agentjail/j1" {
		t.Errorf("branch %q", b)
	}
	if c := run(t, ws, "rev-parse", "HEAD"); c != head {
		t.Errorf("commit %q", c)
	}
	if r := run(t, ws, "remote"); r != "" {
		t.Errorf("the host repository is a remote of the jail's clone: %q", r)
	}
	if ents, _ := os.ReadDir(upper); len(ents) != 1 {
		t.Errorf("staging left behind: %v", ents)
	}
	// A failed clone leaves nothing.
	bad := &Source{Repo: "file:///nonexistent/x.git", Commit: head}
	if err := Fill(ctx, bad, "j2", upper, "/other", o); err == nil {
		t.Fatal("a clone of nothing succeeded")
	}
	if ents, _ := os.ReadDir(upper); len(ents) != 1 {
		t.Errorf("a failed clone left %v", ents)
	}
}
