package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentjail/agentjail/internal/accounts"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/observe"
	"github.com/agentjail/agentjail/internal/workspace"
)

// Jails is what the agent service needs of the jail manager
// (*jail.Manager implements it).
type Jails interface {
	Create(ctx context.Context, req model.CreateRequest) (*model.Jail, error)
	Start(ctx context.Context, ref string) (*model.Jail, error)
	Get(ctx context.Context, ref string) (*model.Jail, error)
	List(ctx context.Context) ([]*model.Jail, error)
	Destroy(ctx context.Context, ref string) error
	Exec(ctx context.Context, ref string, req model.ExecRequest, out model.ExecOutput) (*model.ExecResult, error)
	ReadFile(ctx context.Context, ref, path string) (*model.FileInfo, io.ReadCloser, error)
	Remove(ctx context.Context, ref, path string, recursive bool) error
	OpenTerminal(ctx context.Context, ref string, req model.TerminalRequest) (model.Terminal, error)
	Events(ctx context.Context, ref string, after uint64, types []string) (*observe.Subscription, uint64, error)
	// WritableLayer returns a created, not yet started jail's lower tree
	// and writable layer on the host.
	WritableLayer(ctx context.Context, ref string) (lower, upper string, err error)
	// ProjectCache returns the host directory, on a bounded disk of its
	// own, of the package caches of the project named key
	// (workspace.CacheKey).
	ProjectCache(key string) (string, error)
}

// Options configure a Service.
type Options struct {
	// DataDir is the daemon's data dir: sync state goes to
	// DataDir/sync, and the daemon-wide home
	// templates are read from DataDir/agent-home/<agent>/.
	DataDir string
	// ToolsDir holds the installed tools (default DataDir/tools).
	ToolsDir string
	// Keys holds the model API keys.
	Keys *Keys
	// Log receives diagnostics (default: discard).
	Log *slog.Logger
}

// Service creates agent jails, installs agents, runs them, and syncs
// their work back.
type Service struct {
	jails Jails
	tools *Tools
	keys  *Keys
	sync  *workspace.Syncer
	opts  Options
	log   *slog.Logger

	mu sync.Mutex
	// autos stop the automatic sync of a jail, by jail id.
	autos map[string]context.CancelFunc
	// closed is set by Close: no new automatic syncs start.
	closed bool
	wg     sync.WaitGroup
}

// NewService opens the tool store and the sync state, and resumes the
// automatic syncs of running jails.
func NewService(ctx context.Context, jails Jails, opts Options) (*Service, error) {
	if opts.ToolsDir == "" {
		opts.ToolsDir = filepath.Join(opts.DataDir, "tools")
	}
	if opts.Keys == nil {
		opts.Keys = NewKeys("", nil)
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	tools, err := NewTools(opts.ToolsDir)
	if err != nil {
		return nil, err
	}
	syncer, err := workspace.NewSyncer(filepath.Join(opts.DataDir, "sync"), jails)
	if err != nil {
		return nil, err
	}
	s := &Service{jails: jails, tools: tools, keys: opts.Keys, sync: syncer, opts: opts, log: opts.Log, autos: map[string]context.CancelFunc{}}
	list, err := jails.List(ctx)
	if err != nil {
		return nil, err
	}
	for _, j := range list {
		if j.Status == model.StateRunning && workspace.NeedsSync(&j.Config) {
			s.startAuto(j)
		}
	}
	return s, nil
}

// Close stops the automatic syncs.
func (s *Service) Close() {
	s.mu.Lock()
	s.closed = true
	for id, cancel := range s.autos {
		cancel()
		delete(s.autos, id)
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// Tools is the tool store.
func (s *Service) Tools() *Tools { return s.tools }

// Agents lists the known agents with their installed versions.
func (s *Service) Agents(ctx context.Context) ([]model.AgentInfo, error) {
	list, err := s.tools.List()
	if err != nil {
		return nil, err
	}
	out := []model.AgentInfo{}
	for _, name := range Names() {
		d := Definitions[name]
		_, key := s.keys.Lookup(d.Provider.Secret)
		info := model.AgentInfo{Name: name, Package: d.Package, DefaultVersion: d.DefaultVersion, Provider: d.Provider.Name,
			ModelHost: d.Provider.Host, KeyName: d.Provider.Secret, KeyPresent: key, Installed: []model.AgentTool{}}
		for _, m := range list {
			if m.Name == name {
				info.Installed = append(info.Installed, m)
			}
		}
		out = append(out, info)
	}
	return out, nil
}

// InstallAgent installs an agent CLI (see Tools.Install).
func (s *Service) InstallAgent(ctx context.Context, name, version string, progress func(string)) (*model.AgentTool, bool, error) {
	return s.tools.Install(ctx, name, version, progress)
}

// Create makes a jail. Without agent and workspace sections it is the
// manager's create. With them: the agent must be known and installed and
// the repository readable at its ref before anything is made; the jail is
// created stopped, its workspace filled and the agent's home written into
// its writable layer, then it is started (unless req.Start is false). A
// failure destroys the jail: nothing stays half-made.
func (s *Service) Create(ctx context.Context, req model.CreateRequest) (*model.Jail, error) {
	if req.Agent == nil && req.Workspace == nil {
		return s.jails.Create(ctx, req)
	}
	cfg := req.Config
	var def *Definition
	if req.Agent != nil {
		a := *req.Agent
		cfg.Agent = &a
		if err := ValidateSpec(cfg.Agent); err != nil {
			return nil, err
		}
		var err error
		if def, err = Lookup(a.Name); err != nil {
			return nil, errdefs.Unprocessablef("agent.name: %v", err)
		}
		m, err := s.tools.Resolve(a.Name, a.Version)
		if err != nil {
			return nil, errdefs.Unprocessablef("agent: %v", err)
		}
		if err := Expand(&cfg, def, m, s.keys); err != nil {
			return nil, err
		}
	}
	var src *workspace.Source
	if req.Workspace != nil {
		ws := *req.Workspace
		cfg.Workspace = &ws
		if err := workspace.Validate(&ws); err != nil {
			return nil, err
		}
		workspace.ApplyDefaults(&ws)
		var err error
		if src, err = workspace.Resolve(ctx, &ws); err != nil {
			return nil, err
		}
		ws.Commit = src.Commit
		if *ws.Caches {
			o, home := jailUser(&cfg)
			dir, err := s.jails.ProjectCache(workspace.CacheKey(ws.Repo))
			if err != nil {
				return nil, err
			}
			mounts, err := workspace.Caches(dir, ws.Repo, home, workspace.Owner{UID: o.UID, GID: o.GID})
			if err != nil {
				return nil, err
			}
			cfg.Isolation.Filesystem.ReadWriteMounts = append(cfg.Isolation.Filesystem.ReadWriteMounts, mounts...)
		}
	}
	start := req.Start == nil || *req.Start
	stopped := false
	j, err := s.jails.Create(ctx, model.CreateRequest{Name: req.Name, Start: &stopped, Config: cfg})
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*model.Jail, error) {
		if derr := s.jails.Destroy(context.WithoutCancel(ctx), j.ID); derr != nil {
			s.log.Error("destroying a jail whose creation failed", "jail", j.Name, "err", derr)
		}
		return nil, err
	}
	lower, upper, err := s.jails.WritableLayer(ctx, j.ID)
	if err != nil {
		return fail(err)
	}
	o, home := passwdUser(lower, &j.Config)
	if src != nil {
		if err := workspace.Fill(ctx, src, j.Name, upper, j.Config.Isolation.Filesystem.WorkspaceRoot, o); err != nil {
			return fail(err)
		}
	}
	if def != nil {
		if err := s.writeHome(&j.Config, def, lower, upper, home, o); err != nil {
			return fail(fmt.Errorf("agent home: %w", err))
		}
	}
	if src != nil && *j.Config.Workspace.Caches {
		for _, rel := range workspace.CacheDirs {
			if err := mkdirs(lower, upper, filepath.Join(strings.TrimPrefix(home, "/"), rel), o); err != nil {
				return fail(fmt.Errorf("project caches: %w", err))
			}
		}
	}
	if !start {
		return s.jails.Get(ctx, j.ID)
	}
	if j, err = s.jails.Start(ctx, j.ID); err != nil {
		return fail(err)
	}
	if workspace.NeedsSync(&j.Config) {
		s.startAuto(j)
	}
	return j, nil
}

// Destroy stops a jail's automatic sync and forgets its sync state after
// the manager destroyed it.
func (s *Service) Destroy(ctx context.Context, ref string) error {
	j, err := s.jails.Get(ctx, ref)
	if err != nil {
		return err
	}
	s.stopAuto(j.ID)
	if err := s.jails.Destroy(ctx, ref); err != nil {
		return err
	}
	s.sync.Forget(j.ID)
	return nil
}

// agentOf returns the jail and its agent's definition (ErrConflict when
// the jail runs no agent).
func (s *Service) agentOf(ctx context.Context, ref string) (*model.Jail, *Definition, error) {
	j, err := s.jails.Get(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	if j.Config.Agent == nil {
		return nil, nil, errdefs.Conflictf("jail %s has no agent (create it with an agent section)", j.Name)
	}
	def, err := Lookup(j.Config.Agent.Name)
	if err != nil {
		return nil, nil, err
	}
	return j, def, nil
}

// Run runs the jail's agent headless on prompt, streaming its output to
// out (or buffering it when out is nil), and returns its exit. In
// auto-commit mode the work is synced when the run ends.
func (s *Service) Run(ctx context.Context, ref string, req model.AgentRunRequest, out model.ExecOutput) (*model.ExecResult, error) {
	if strings.TrimSpace(req.Prompt) == "" {
		return nil, errdefs.Invalidf("prompt: required")
	}
	j, def, err := s.agentOf(ctx, ref)
	if err != nil {
		return nil, err
	}
	o := RunOptions{Model: j.Config.Agent.Model, Args: append(append([]string{}, j.Config.Agent.Args...), req.Args...)}
	res, err := s.jails.Exec(ctx, j.ID, model.ExecRequest{Cmd: def.Headless(o, req.Prompt), TimeoutMs: req.TimeoutMs,
		Cwd: j.Config.Isolation.Filesystem.WorkspaceRoot}, out)
	if err == nil && j.Config.Workspace != nil && j.Config.Workspace.Sync.Mode == config.SyncAutoCommit {
		s.autoSync(context.WithoutCancel(ctx), j, "the agent's run ended")
	}
	return res, err
}

// Session starts the jail's agent in a terminal session (recorded, with
// any number of viewers) and returns it; clients attach to it by id.
func (s *Service) Session(ctx context.Context, ref string, req model.AgentSessionRequest) (*model.TerminalSession, error) {
	j, def, err := s.agentOf(ctx, ref)
	if err != nil {
		return nil, err
	}
	o := RunOptions{Model: j.Config.Agent.Model, Args: append(append([]string{}, j.Config.Agent.Args...), req.Args...)}
	t, err := s.jails.OpenTerminal(ctx, j.ID, model.TerminalRequest{Cmd: def.Interactive(o), Rows: req.Rows, Cols: req.Cols,
		Term: req.Term, Cwd: j.Config.Isolation.Filesystem.WorkspaceRoot})
	if err != nil {
		return nil, err
	}
	info := t.Session()
	// Detach: the session keeps running for whoever attaches.
	t.Close()
	return &info, nil
}

// Sync takes the jail's work back into its host repository.
func (s *Service) Sync(ctx context.Context, ref string) (*model.SyncResult, error) {
	j, err := s.jails.Get(ctx, ref)
	if err != nil {
		return nil, err
	}
	return s.sync.Sync(ctx, j)
}

// writeHome puts the agent's home template, the daemon's template dir for
// the agent and the request's template dir (in that order, later files
// win) into the jail's home in its writable layer.
func (s *Service) writeHome(cfg *config.Config, def *Definition, lower, upper, home string, o workspace.Owner) error {
	files, err := HomeFiles(cfg, def)
	if err != nil {
		return err
	}
	for _, dir := range []string{filepath.Join(s.opts.DataDir, "agent-home", def.Name), cfg.Agent.HomeTemplate} {
		if dir == "" {
			continue
		}
		if err := readTemplate(dir, files); err != nil {
			if errors.Is(err, fs.ErrNotExist) && dir != cfg.Agent.HomeTemplate {
				continue
			}
			return errdefs.Unprocessablef("agent.home_template: %v", err)
		}
	}
	homeRel := strings.TrimPrefix(home, "/")
	if err := mkdirs(lower, upper, homeRel, o); err != nil {
		return err
	}
	for rel, data := range files {
		p := filepath.Join(upper, homeRel, rel)
		if err := mkdirs(lower, upper, filepath.Dir(filepath.Join(homeRel, rel)), o); err != nil {
			return err
		}
		if target, ok := strings.CutPrefix(string(data), SymlinkPrefix); ok {
			if err := os.Symlink(target, p); err != nil {
				return err
			}
			if err := os.Lchown(p, o.UID, o.GID); err != nil {
				return err
			}
			continue
		}
		if err := os.WriteFile(p, data, 0o600); err != nil {
			return err
		}
		if err := os.Chown(p, o.UID, o.GID); err != nil {
			return err
		}
	}
	return nil
}

// Template limits: a home template is settings, not a file store.
const (
	maxTemplateFiles = 10000
	maxTemplateBytes = 64 << 20
)

// readTemplate adds the regular files and symbolic links under dir to
// files (relative paths).
func readTemplate(dir string, files map[string][]byte) error {
	st, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	var n int
	var size int64
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." || d.IsDir() {
			return nil
		}
		if n++; n > maxTemplateFiles {
			return fmt.Errorf("%s has more than %d files", dir, maxTemplateFiles)
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			files[rel] = []byte(SymlinkPrefix + t)
		case d.Type().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if size += int64(len(data)); size > maxTemplateBytes {
				return fmt.Errorf("%s holds more than %d MiB", dir, maxTemplateBytes>>20)
			}
			files[rel] = data
		}
		return nil
	})
}

// mkdirs makes rel (relative to the root) in the writable layer upper,
// each missing directory with the mode and owner it has in the lower tree,
// or 0755 and owner o when the lower tree lacks it too.
func mkdirs(lower, upper, rel string, o workspace.Owner) error {
	cur := ""
	for _, part := range strings.Split(filepath.Clean(rel), "/") {
		if part == "" || part == "." {
			continue
		}
		cur = filepath.Join(cur, part)
		p := filepath.Join(upper, cur)
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		mode, uid, gid := os.FileMode(0o755), o.UID, o.GID
		if st, err := os.Stat(filepath.Join(lower, cur)); err == nil {
			mode = st.Mode().Perm()
			uid, gid = ownerOf(st)
		}
		if err := os.Mkdir(p, mode); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if err := os.Chmod(p, mode); err != nil {
			return err
		}
		if err := os.Chown(p, uid, gid); err != nil {
			return err
		}
	}
	return nil
}

// jailUser guesses the jail user's ids and home before the jail exists
// (for the project caches' owner): the default user agent is uid 1000.
func jailUser(cfg *config.Config) (workspace.Owner, string) {
	u := cfg.Isolation.Process.User
	switch u {
	case "", config.DefaultUser:
		return workspace.Owner{UID: 1000, GID: 1000}, "/home/agent"
	case "root", "0":
		return workspace.Owner{}, "/root"
	}
	if n, err := strconv.Atoi(u); err == nil {
		return workspace.Owner{UID: n, GID: n}, "/home/" + u
	}
	return workspace.Owner{UID: 1000, GID: 1000}, "/home/" + u
}

// passwdUser resolves the jail's user in the lower tree's /etc/passwd
// (its ids and home); jailUser's guess when the tree has no entry.
func passwdUser(lower string, cfg *config.Config) (workspace.Owner, string) {
	o, home := jailUser(cfg)
	user := cfg.Isolation.Process.User
	if u, ok := accounts.Find(lower, user); ok {
		return workspace.Owner{UID: u.Uid, GID: u.Gid}, u.Home
	}
	return o, home
}

// startAuto starts the automatic sync of a running jail.
func (s *Service) startAuto(j *model.Jail) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.autos[j.ID] != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.autos[j.ID] = cancel
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if j.Config.Workspace.Sync.Mode == config.SyncAutoIdle {
			s.idleLoop(ctx, j)
		} else {
			s.commitLoop(ctx, j)
		}
	}()
}

func (s *Service) stopAuto(id string) {
	s.mu.Lock()
	cancel := s.autos[id]
	delete(s.autos, id)
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// autoSync syncs when the workspace changed; errors are logged (a
// conflict waits for the user).
func (s *Service) autoSync(ctx context.Context, j *model.Jail, why string) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	dirty, err := s.sync.Dirty(ctx, j)
	if err != nil || !dirty {
		return
	}
	res, err := s.sync.Sync(ctx, j)
	if err != nil {
		s.log.Warn("automatic sync", "jail", j.Name, "why", why, "err", err)
		return
	}
	s.log.Info("synced", "jail", j.Name, "why", why, "branch", res.Branch, "commit", res.Commit)
}

// gone reports (and forgets) a jail destroyed behind the service's back.
func (s *Service) gone(ctx context.Context, j *model.Jail) bool {
	if _, err := s.jails.Get(ctx, j.ID); errors.Is(err, errdefs.ErrNotFound) {
		s.stopAuto(j.ID)
		s.sync.Forget(j.ID)
		return true
	}
	return false
}

// commitLoop: auto-commit, every interval.
func (s *Service) commitLoop(ctx context.Context, j *model.Jail) {
	t := time.NewTicker(time.Duration(j.Config.Workspace.Sync.IntervalS) * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if s.gone(ctx, j) {
				return
			}
			s.autoSync(ctx, j, "interval")
		}
	}
}

// idleLoop: auto-idle, once the workspace has been quiet for IdleS after
// a write the observer saw.
func (s *Service) idleLoop(ctx context.Context, j *model.Jail) {
	sub, _, err := s.jails.Events(ctx, j.ID, 0, []string{"file"})
	if err != nil {
		s.log.Warn("automatic sync: watching the workspace", "jail", j.Name, "err", err)
		return
	}
	idle := time.Duration(j.Config.Workspace.Sync.IdleS) * time.Second
	ws := j.Config.Isolation.Filesystem.WorkspaceRoot
	writes := make(chan struct{}, 1)
	go func() {
		var buf []observe.Event
		for {
			evs, err := sub.Next(ctx, buf[:0])
			if err != nil {
				return
			}
			for _, ev := range evs {
				if ev.Type == observe.TypeFile && ev.Op != "open" && ev.Op != "read" && strings.HasPrefix(ev.Path, ws+"/") &&
					!strings.HasPrefix(ev.Path, ws+"/.git/") {
					select {
					case writes <- struct{}{}:
					default:
					}
				}
			}
			buf = evs
		}
	}()
	timer := time.NewTimer(idle)
	timer.Stop()
	for {
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-writes:
			timer.Reset(idle)
		case <-timer.C:
			if s.gone(ctx, j) {
				return
			}
			s.autoSync(ctx, j, "idle")
		}
	}
}

func ownerOf(st fs.FileInfo) (uid, gid int) {
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return int(sys.Uid), int(sys.Gid)
	}
	return 0, 0
}
