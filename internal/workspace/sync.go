package workspace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentjail/agentjail/internal/atomicfile"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
)

// MaxBundle caps the bundle a sync carries out of a jail.
const MaxBundle = 2 << 30

// syncTimeout bounds the jail's side of a sync.
const syncTimeout = 5 * time.Minute

// Jail is what a sync needs of the jail manager.
type Jail interface {
	// Exec runs a command in the running jail (see api.Service.Exec).
	Exec(ctx context.Context, ref string, req model.ExecRequest, out model.ExecOutput) (*model.ExecResult, error)
	// ReadFile opens a regular file of the jail.
	ReadFile(ctx context.Context, ref, path string) (*model.FileInfo, io.ReadCloser, error)
	// Remove deletes a path of the jail.
	Remove(ctx context.Context, ref, path string, recursive bool) error
}

// Syncer takes jails' work back into their host repositories. Its state
// (the last commit synced per jail) lives in DIR/<jail id>.json.
type Syncer struct {
	dir  string
	jail Jail
	// locks serialises syncs of one jail.
	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

// NewSyncer keeps its state in dir.
func NewSyncer(dir string, j Jail) (*Syncer, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("sync state: %w", err)
	}
	return &Syncer{dir: dir, jail: j, locks: map[string]*sync.Mutex{}}, nil
}

// state is what a syncer remembers of one jail.
type state struct {
	// Last is the commit last written to the host branch.
	Last string `json:"last"`
	// At is when.
	At time.Time `json:"at"`
}

func (s *Syncer) lock(id string) func() {
	s.mu.Lock()
	l := s.locks[id]
	if l == nil {
		l = &sync.Mutex{}
		s.locks[id] = l
	}
	s.mu.Unlock()
	l.Lock()
	return l.Unlock
}

func (s *Syncer) load(id string) (state, error) {
	var st state
	data, err := os.ReadFile(filepath.Join(s.dir, id+".json"))
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(data, &st)
}

func (s *Syncer) save(id string, st state) error {
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(s.dir, id+".json"), data, 0o600)
}

// Forget drops a destroyed jail's state.
func (s *Syncer) Forget(id string) { os.Remove(filepath.Join(s.dir, id+".json")) }

// Sync takes the work of jail j (running, with a workspace from a host
// repository) back: the jail commits what its workspace changed and
// writes a bundle of its branch since the last sync (or the commit it was
// filled from); the daemon fetches it into the host repository and moves
// branch agentjail/<jail> there. Errors, each leaving the host repository
// as it was: ErrConflict when that branch moved on the host since the last
// sync (or is checked out there), or when there is nothing new to sync;
// ErrUnprocessable when the jail's workspace is no git repository or the
// jail has no host repository.
func (s *Syncer) Sync(ctx context.Context, j *model.Jail) (*model.SyncResult, error) {
	ws := j.Config.Workspace
	if ws == nil || !filepath.IsAbs(ws.Repo) {
		return nil, errdefs.Unprocessablef("jail %s has no workspace from a host repository to sync to (create it with a workspace.repo path)", j.Name)
	}
	if j.Status != model.StateRunning {
		return nil, errdefs.Conflictf("jail %s is %s; it must be running to sync", j.Name, j.Status)
	}
	defer s.lock(j.ID)()
	st, err := s.load(j.ID)
	if err != nil {
		return nil, fmt.Errorf("sync state of %s: %w", j.Name, err)
	}
	host := ws.Repo
	owner, err := repoOwner(host)
	if err != nil {
		return nil, errdefs.Unprocessablef("sync: host repository %s: %v", host, err)
	}
	hctx := context.WithValue(ctx, runAsKey{}, &owner)
	if _, err := git(hctx, host, "rev-parse", "--git-dir"); err != nil {
		return nil, errdefs.Unprocessablef("sync: %s is no longer a git repository: %v", host, err)
	}
	branch := BranchPrefix + j.Name
	refName := "refs/heads/" + branch
	cur, _ := git(hctx, host, "rev-parse", "--verify", "--quiet", refName)
	if cur != st.Last {
		if st.Last == "" {
			return nil, errdefs.Conflictf("sync: branch %s already exists in %s (at %s) and was not made by this jail; nothing was written (delete or rename it on the host)", branch, host, short(cur))
		}
		what := "was deleted"
		if cur != "" {
			what = "moved to " + short(cur)
		}
		return nil, errdefs.Conflictf("sync: branch %s in %s %s on the host since the last sync (%s); nothing was written", branch, host, what, short(st.Last))
	}
	if head, _ := git(hctx, host, "symbolic-ref", "--quiet", "HEAD"); head == refName {
		return nil, errdefs.Conflictf("sync: branch %s is checked out in %s; nothing was written (check out another branch there first)", branch, host)
	}
	base := st.Last
	if base == "" {
		base = ws.Commit
	}

	// The jail's side: commit, then bundle what the host lacks.
	bundle := "/tmp/.agentjail-sync-" + strconv.FormatInt(time.Now().UnixNano(), 36) + ".bundle"
	script := `set -e
cd "$1"
if ! git rev-parse --git-dir >/dev/null 2>&1; then echo "agentjail-sync: not a git repository" >&2; exit 64; fi
git add -A
if ! git diff --cached --quiet; then
  git -c user.name=agentjail -c user.email="$3@agentjail.invalid" commit --quiet --no-verify -m "agentjail: work of jail $3"
fi
head=$(git rev-parse HEAD)
echo "$head"
if [ "$head" = "$2" ]; then exit 65; fi
git bundle create --quiet "$4" HEAD "^$2" 2>&1
`
	jctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	res, err := s.jail.Exec(jctx, j.ID, model.ExecRequest{
		Cmd: []string{"sh", "-c", script, "agentjail-sync", j.Config.Isolation.Filesystem.WorkspaceRoot, base, j.Name, bundle},
		Env: map[string]string{"GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1"},
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("sync: in jail %s: %w", j.Name, err)
	}
	defer s.jail.Remove(context.WithoutCancel(ctx), j.ID, bundle, false)
	head := strings.TrimSpace(firstLine(res.Stdout))
	switch {
	case res.ExitCode == 64:
		return nil, errdefs.Unprocessablef("sync: the workspace %s of jail %s is not a git repository", j.Config.Isolation.Filesystem.WorkspaceRoot, j.Name)
	case res.ExitCode == 65:
		return nil, errdefs.Conflictf("sync: nothing to sync: jail %s's workspace has no changes since %s", j.Name, short(base))
	case res.ExitCode == 127:
		return nil, errdefs.Unprocessablef("sync: jail %s has no git (its root filesystem must provide it)", j.Name)
	case res.ExitCode != 0 || len(head) != 40:
		return nil, errdefs.Unprocessablef("sync: committing in jail %s failed (exit %d): %s", j.Name, res.ExitCode, strings.TrimSpace(res.Stderr+res.Stdout))
	}

	// The host's side: fetch the bundle, then move the branch, expecting it
	// where the last sync left it.
	tmp, err := os.CreateTemp("", "agentjail-sync-*.bundle")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	info, rc, err := s.jail.ReadFile(ctx, j.ID, bundle)
	if err != nil {
		tmp.Close()
		return nil, fmt.Errorf("sync: reading the bundle: %w", err)
	}
	if info.Size > MaxBundle {
		rc.Close()
		tmp.Close()
		return nil, errdefs.New(errdefs.ErrTooLarge, "sync: the jail's bundle is %d bytes, over the %d limit", info.Size, int64(MaxBundle))
	}
	_, err = io.Copy(tmp, io.LimitReader(rc, MaxBundle))
	rc.Close()
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("sync: copying the bundle: %w", err)
	}
	if err := os.Chown(tmp.Name(), owner.UID, owner.GID); err != nil {
		return nil, err
	}
	if _, err := git(hctx, host, "bundle", "verify", "--quiet", tmp.Name()); err != nil {
		return nil, errdefs.Unprocessablef("sync: the jail's bundle does not apply to %s: %v", host, err)
	}
	if _, err := git(hctx, host, "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", tmp.Name(), "HEAD"); err != nil {
		return nil, fmt.Errorf("sync: fetching into %s: %w", host, err)
	}
	old := cur
	if old == "" {
		old = strings.Repeat("0", 40)
	}
	if _, err := git(hctx, host, "update-ref", "-m", "agentjail sync of jail "+j.Name, refName, head, old); err != nil {
		return nil, errdefs.Conflictf("sync: branch %s in %s changed while syncing; nothing was written: %v", branch, host, err)
	}
	now := time.Now().UTC()
	if err := s.save(j.ID, state{Last: head, At: now}); err != nil {
		return nil, fmt.Errorf("sync: remembering the sync: %w", err)
	}
	count, _ := git(hctx, host, "rev-list", "--count", head, "^"+base)
	n, _ := strconv.Atoi(count)
	files, _ := git(hctx, host, "diff", "--name-only", base, head)
	return &model.SyncResult{Jail: j.Name, Repo: host, Branch: branch, Commit: head, Base: base,
		Commits: n, Files: splitLines(files), SyncedAt: now}, nil
}

// Dirty reports whether the jail's workspace has changes since the last
// sync (uncommitted ones or new commits); auto-commit asks it first.
func (s *Syncer) Dirty(ctx context.Context, j *model.Jail) (bool, error) {
	ws := j.Config.Workspace
	st, err := s.load(j.ID)
	if err != nil {
		return false, err
	}
	base := st.Last
	if base == "" {
		base = ws.Commit
	}
	res, err := s.jail.Exec(ctx, j.ID, model.ExecRequest{
		Cmd: []string{"sh", "-c", `cd "$1" && test -z "$(git status --porcelain)" && test "$(git rev-parse HEAD)" = "$2"`, "agentjail-dirty",
			j.Config.Isolation.Filesystem.WorkspaceRoot, base},
		TimeoutMs: 60000,
	}, nil)
	if err != nil {
		return false, err
	}
	return res.ExitCode != 0, nil
}

func repoOwner(dir string) (Owner, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return Owner{}, err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return Owner{}, nil
	}
	return Owner{UID: int(sys.Uid), GID: int(sys.Gid)}, nil
}

func short(c string) string {
	if len(c) > 12 {
		return c[:12]
	}
	return c
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

func splitLines(s string) []string {
	if s == "" {
		return []string{}
	}
	return strings.Split(s, "\n")
}

// NeedsSync reports whether a jail's config has a workspace whose sync
// mode is automatic.
func NeedsSync(cfg *config.Config) bool {
	return cfg.Workspace != nil && cfg.Workspace.Sync.Mode != "" && cfg.Workspace.Sync.Mode != config.SyncManual
}
