// Package workspace fills a jail's workspace from a git repository and
// takes its work back. Filling: the daemon resolves the repository's ref
// (a host repository or a git URL) before the jail exists, clones it into
// a staging directory inside the new jail's writable layer while the jail
// has not started, checks out branch agentjail/<jail> at that commit and
// renames the tree into the workspace, so no process of the jail ever
// sees a half clone; the host repository itself is never mounted. Taking
// back (sync.go): the jail commits its work and writes a git bundle, which
// the daemon fetches into the host repository as branch agentjail/<jail>
// without touching the host's checked-out branch or working tree.
package workspace

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/lazyre"
)

// gitTimeout bounds every git command the daemon runs.
const gitTimeout = 5 * time.Minute

// refRE accepts branch, tag and commit names (no options, no ranges).
var refRE = lazyre.New(`^[A-Za-z0-9_][A-Za-z0-9._/+-]{0,254}$`)

// Source is a resolved workspace repository.
type Source struct {
	// Repo is the repository as given: an absolute host path or a URL.
	Repo string
	// HostRepo is the host repository work syncs back to ("" for a URL).
	HostRepo string
	// Commit is what the ref resolved to.
	Commit string
}

// Validate checks a workspace section's form.
func Validate(ws *config.Workspace) error {
	if ws.Repo == "" {
		return errdefs.Unprocessablef("workspace.repo: required (a host repository path or a git URL)")
	}
	if strings.HasPrefix(ws.Repo, "-") || strings.ContainsAny(ws.Repo, "\x00\n") {
		return errdefs.Unprocessablef("workspace.repo: %q is not a repository path or URL", ws.Repo)
	}
	if !filepath.IsAbs(ws.Repo) && !isURL(ws.Repo) {
		return errdefs.Unprocessablef("workspace.repo: %q must be an absolute host path or a git URL (https://, ssh://, git://, file://)", ws.Repo)
	}
	if ws.Ref != "" && (!refRE().MatchString(ws.Ref) || strings.Contains(ws.Ref, "..")) {
		return errdefs.Unprocessablef("workspace.ref: %q is not a branch, tag or commit name", ws.Ref)
	}
	switch ws.Sync.Mode {
	case "", config.SyncManual, config.SyncAutoCommit, config.SyncAutoIdle:
	default:
		return errdefs.Unprocessablef("workspace.sync.mode: %q (expected manual, auto-commit or auto-idle)", ws.Sync.Mode)
	}
	if ws.Sync.IntervalS < 0 || ws.Sync.IntervalS > 86400 {
		return errdefs.Unprocessablef("workspace.sync.interval_s: %d is outside 1..86400", ws.Sync.IntervalS)
	}
	if ws.Sync.IdleS < 0 || ws.Sync.IdleS > 86400 {
		return errdefs.Unprocessablef("workspace.sync.idle_s: %d is outside 1..86400", ws.Sync.IdleS)
	}
	if ws.Commit != "" {
		return errdefs.Unprocessablef("workspace.commit: set by the daemon; name a ref instead")
	}
	return nil
}

// ApplyDefaults fills the sync mode and periods.
func ApplyDefaults(ws *config.Workspace) {
	if ws.Sync.Mode == "" {
		ws.Sync.Mode = config.SyncManual
	}
	if ws.Sync.Mode == config.SyncAutoCommit && ws.Sync.IntervalS == 0 {
		ws.Sync.IntervalS = 60
	}
	if ws.Sync.Mode == config.SyncAutoIdle && ws.Sync.IdleS == 0 {
		ws.Sync.IdleS = 30
	}
	if ws.Caches == nil {
		t := true
		ws.Caches = &t
	}
}

func isURL(s string) bool {
	if strings.HasPrefix(s, "git@") { // scp-like ssh
		return true
	}
	u, err := url.Parse(s)
	if err != nil {
		return false
	}
	switch u.Scheme {
	case "https", "http", "ssh", "git", "file":
		return true
	}
	return false
}

// Resolve checks the repository and resolves ws.Ref (default HEAD) to a
// commit, before anything is made: a host path that is no git repository,
// a URL that cannot be read and an unknown ref are each a precise error.
func Resolve(ctx context.Context, ws *config.Workspace) (*Source, error) {
	ref := ws.Ref
	if ref == "" {
		ref = "HEAD"
	}
	if filepath.IsAbs(ws.Repo) {
		st, err := os.Stat(ws.Repo)
		if err != nil {
			return nil, errdefs.Unprocessablef("workspace.repo: %v", err)
		}
		if !st.IsDir() {
			return nil, errdefs.Unprocessablef("workspace.repo: %s is not a directory", ws.Repo)
		}
		if _, err := git(ctx, ws.Repo, "rev-parse", "--git-dir"); err != nil {
			return nil, errdefs.Unprocessablef("workspace.repo: %s is not a git repository (git init it, or name a repository)", ws.Repo)
		}
		// One git for both: the top-level directory, then the commit.
		out, err := git(ctx, ws.Repo, "rev-parse", "--show-toplevel", "--verify", "--quiet", ref+"^{commit}")
		top, commit, _ := strings.Cut(out, "\n")
		if err != nil || commit == "" {
			if ws.Ref == "" {
				return nil, errdefs.Unprocessablef("workspace.repo: %s has no commit yet (commit something first)", ws.Repo)
			}
			return nil, errdefs.Unprocessablef("workspace.ref: %q names no commit in %s", ws.Ref, ws.Repo)
		}
		return &Source{Repo: ws.Repo, HostRepo: top, Commit: commit}, nil
	}
	out, err := git(ctx, "", "ls-remote", "--", ws.Repo, ref)
	if err != nil {
		return nil, errdefs.Unprocessablef("workspace.repo: cannot read %s: %v", redactURL(ws.Repo), err)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && (f[1] == ref || f[1] == "refs/heads/"+ref || f[1] == "refs/tags/"+ref || f[1] == "refs/tags/"+ref+"^{}") {
			return &Source{Repo: ws.Repo, Commit: f[0]}, nil
		}
	}
	if regexp.MustCompile(`^[0-9a-f]{40}$`).MatchString(ref) {
		return &Source{Repo: ws.Repo, Commit: ref}, nil
	}
	return nil, errdefs.Unprocessablef("workspace.ref: %s has no branch or tag %q", redactURL(ws.Repo), ref)
}

// Owner is who the jail's user is on the host, for the files the daemon
// puts in the jail's writable layer.
type Owner struct{ UID, GID int }

// Fill clones src into the jail's writable layer upper: into a staging
// directory beside the workspace, at branch agentjail/<jail> on src's
// commit, owned by o, then renamed onto the workspace (workspaceRoot, the
// jail-side path). The jail must not be running. On error nothing stays.
func Fill(ctx context.Context, src *Source, jailName, upper, workspaceRoot string, o Owner) (err error) {
	target := filepath.Join(upper, filepath.FromSlash(strings.TrimPrefix(workspaceRoot, "/")))
	parent := filepath.Dir(target)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	staging, err := os.MkdirTemp(parent, ".agentjail-workspace-")
	if err != nil {
		return fmt.Errorf("workspace staging: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(staging)
		}
	}()
	from := src.Repo
	if src.HostRepo != "" {
		// Objects are copied, never hard-linked into the host repository.
		from = "file://" + src.HostRepo
	}
	// The clone's own config names who commits in the jail.
	if _, err := git(ctx, "", "clone", "--quiet", "--no-checkout", "--no-hardlinks", "--config", "user.name=agentjail",
		"--config", "user.email="+jailName+"@agentjail.invalid", "--", from, staging); err != nil {
		return errdefs.Unprocessablef("workspace: cloning %s: %v", redactURL(src.Repo), err)
	}
	branch := BranchPrefix + jailName
	steps := [][]string{{"checkout", "--quiet", "-B", branch, src.Commit}}
	if src.HostRepo == "" {
		steps = append(steps, []string{"remote", "set-url", "origin", redactURL(src.Repo)})
	} else {
		steps = append(steps, []string{"remote", "remove", "origin"})
	}
	for _, s := range steps {
		if _, err := git(ctx, staging, s...); err != nil {
			return fmt.Errorf("workspace: git %s: %w", s[0], err)
		}
	}
	if err := chownTree(staging, o); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	// The workspace the jail would otherwise get is an empty directory:
	// rename(2) replaces it in one step (os.Rename refuses directories).
	if err := unix.Rename(staging, target); err != nil {
		return fmt.Errorf("workspace: moving the clone into place: %w", err)
	}
	return nil
}

// BranchPrefix names the branches of jails: in the jail's clone and in
// the host repository.
const BranchPrefix = "agentjail/"

func chownTree(root string, o Owner) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, o.UID, o.GID)
	})
}

// CacheDirs are the per-project package caches: directory name → path
// under the jail user's home.
var CacheDirs = map[string]string{
	"npm":   ".npm",
	"pip":   ".cache/pip",
	"go":    "go/pkg/mod",
	"cargo": ".cargo/registry",
}

// CacheKey names the package caches of the project repo.
func CacheKey(repo string) string {
	sum := sha256.Sum256([]byte(strings.TrimSuffix(repo, "/")))
	return hex.EncodeToString(sum[:8])
}

// Caches makes (once) the package cache directories of the project repo
// in dir (the project's, named by CacheKey: DIR/<name>), owned by o, and
// returns them as read-write mounts at the jail user's home. Every jail of
// the project shares them.
func Caches(dir, repo, home string, o Owner) ([]config.Mount, error) {
	var out []config.Mount
	for _, name := range []string{"cargo", "go", "npm", "pip"} {
		d := filepath.Join(dir, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("project cache: %w", err)
		}
		if err := os.Chown(d, o.UID, o.GID); err != nil {
			return nil, fmt.Errorf("project cache: %w", err)
		}
		out = append(out, config.Mount{Source: d, Target: filepath.Join(home, CacheDirs[name])})
	}
	if err := os.WriteFile(filepath.Join(dir, "project"), []byte(redactURL(repo)+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("project cache: %w", err)
	}
	return out, nil
}

// redactURL drops a URL's password (it must reach neither the jail nor
// an error message).
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	u.User = nil
	return u.String()
}

// runAsKey carries the Owner a git command runs as.
type runAsKey struct{}

// git runs git in dir ("" for none) with no prompts, no system or user
// configuration and a deadline; it returns the trimmed stdout, or an error
// carrying git's message.
func git(ctx context.Context, dir string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, gitTimeout)
	defer cancel()
	if dir != "" {
		args = append([]string{"-C", dir}, args...)
	}
	cmd := exec.CommandContext(ctx, "git", args...)
	// safe.directory: the daemon (root) reads and writes repositories
	// that belong to the host's users.
	cmd.Env = append(os.Environ(), "GIT_TERMINAL_PROMPT=0", "GIT_CONFIG_NOSYSTEM=1", "GIT_ASKPASS=/bin/false",
		"GIT_SSH_COMMAND=ssh -o BatchMode=yes -o ConnectTimeout=20", "LC_ALL=C",
		"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=safe.directory", "GIT_CONFIG_VALUE_0=*")
	if o, ok := ctx.Value(runAsKey{}).(*Owner); ok && o.UID != 0 {
		// Writes to a user's repository are made as that user, so that
		// every object and ref stays theirs.
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(o.UID), Gid: uint32(o.GID)}}
		cmd.Env = append(cmd.Env, "HOME=/nonexistent", "GIT_CONFIG_GLOBAL=/dev/null")
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if i := strings.LastIndex(msg, "\n"); i >= 0 && len(msg) > 400 {
			msg = msg[i+1:]
		}
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			msg = "timed out after " + gitTimeout.String()
		}
		if msg == "" {
			msg = err.Error()
		}
		return "", errors.New(msg)
	}
	return strings.TrimSpace(stdout.String()), nil
}
