// Package apitest is an in-memory implementation of api.Service for tests
// of the HTTP layer, the client and the CLI: jails are records with a
// state, files live in a map, and exec understands a few commands. It
// runs no processes and touches no disk.
package apitest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/observe"
)

// Service is an in-memory api.Service. Its zero value is not usable; use
// New. Hooks, when set, replace the built-in behaviour of a method.
type Service struct {
	// ExecHook, when set, runs instead of the built-in commands.
	ExecHook func(ctx context.Context, ref string, req model.ExecRequest, out model.ExecOutput) (*model.ExecResult, error)
	// WriteHook, when set, runs instead of the built-in WriteFile.
	WriteHook func(ctx context.Context, ref, p string, r io.Reader, opts model.WriteOptions) (*model.FileInfo, error)

	mu    sync.Mutex
	jails map[string]*fakeJail
	logs  map[string]string
	buses map[string]*observe.Bus
	next  int
	// Stops records the grace of every Stop call, in order.
	Stops []time.Duration
	// snaps holds the snapshots (snapshots.go), by id.
	snaps map[string]*fakeSnapshot
	// pushed holds the snapshots pushed to registries, by reference.
	pushed map[string]*fakeSnapshot
	// recordings are those added with AddRecording, by id.
	recordings map[string]fakeRecording
}

type fakeJail struct {
	j     model.Jail
	files map[string]*node
}

type node struct {
	dir   bool
	data  []byte
	mode  uint32
	mtime time.Time
	link  string
}

// New returns an empty Service.
func New() *Service { return &Service{jails: map[string]*fakeJail{}} }

func (s *Service) lookup(ref string) (*fakeJail, error) {
	if fj, ok := s.jails[ref]; ok {
		return fj, nil
	}
	for _, fj := range s.jails {
		if fj.j.Name == ref {
			return fj, nil
		}
	}
	return nil, errdefs.NotFoundf("no jail with id or name %q", ref)
}

func (s *Service) running(ref string) (*fakeJail, error) {
	fj, err := s.lookup(ref)
	if err != nil {
		return nil, err
	}
	if fj.j.Status != model.StateRunning {
		return nil, errdefs.Conflictf("jail %s is %s, not running", fj.j.Name, fj.j.Status)
	}
	return fj, nil
}

// Create makes a jail record, running unless req.Start is false.
func (s *Service) Create(_ context.Context, req model.CreateRequest) (*model.Jail, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	id := fmt.Sprintf("%012x", s.next)
	name := req.Name
	if name == "" {
		name = id
	}
	if err := config.ValidName(name); err != nil {
		return nil, err
	}
	if _, err := s.lookup(name); err == nil {
		return nil, errdefs.Conflictf("name %q: taken", name)
	}
	cfg := req.Config
	cfg.ApplyDefaults()
	now := time.Now().UTC()
	fj := &fakeJail{
		j:     model.Jail{ID: id, Name: name, Status: model.StateCreated, CreatedAt: now, Config: cfg},
		files: map[string]*node{"/": {dir: true, mode: 0o755, mtime: now}, "/workspace": {dir: true, mode: 0o755, mtime: now}},
	}
	if req.Start == nil || *req.Start {
		fj.j.Status, fj.j.StartedAt, fj.j.Pid = model.StateRunning, &now, 4242
	}
	s.jails[id] = fj
	out := fj.j
	return &out, nil
}

// List returns every jail.
func (s *Service) List(context.Context) ([]*model.Jail, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*model.Jail
	for _, fj := range s.jails {
		j := fj.j
		out = append(out, &j)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].ID < out[b].ID })
	return out, nil
}

// Get returns one jail with made-up stats while it runs.
func (s *Service) Get(_ context.Context, ref string) (*model.Jail, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fj, err := s.lookup(ref)
	if err != nil {
		return nil, err
	}
	j := fj.j
	if j.Status == model.StateRunning {
		r := j.Config.Isolation.Resources
		j.Stats = &model.Stats{MemoryBytes: 1 << 20, MemoryLimitBytes: uint64(r.MemoryBytes), Pids: 1, PidsLimit: uint64(r.PidsLimit), DiskLimitBytes: uint64(r.DiskBytes)}
	}
	return &j, nil
}

// Start moves a created or stopped jail to running.
func (s *Service) Start(_ context.Context, ref string) (*model.Jail, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fj, err := s.lookup(ref)
	if err != nil {
		return nil, err
	}
	if fj.j.Status != model.StateCreated && fj.j.Status != model.StateStopped {
		return nil, errdefs.Conflictf("jail %s is %s", fj.j.Name, fj.j.Status)
	}
	now := time.Now().UTC()
	fj.j.Status, fj.j.StartedAt, fj.j.Pid = model.StateRunning, &now, 4242
	out := fj.j
	return &out, nil
}

// Stop moves a running jail to stopped and records grace in Stops.
func (s *Service) Stop(_ context.Context, ref string, grace time.Duration) (*model.Jail, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fj, err := s.running(ref)
	if err != nil {
		return nil, err
	}
	s.Stops = append(s.Stops, grace)
	now := time.Now().UTC()
	fj.j.Status, fj.j.StoppedAt, fj.j.Pid = model.StateStopped, &now, 0
	out := fj.j
	return &out, nil
}

// Destroy forgets a jail.
func (s *Service) Destroy(_ context.Context, ref string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	fj, err := s.lookup(ref)
	if err != nil {
		return err
	}
	delete(s.jails, fj.j.ID)
	return nil
}

// Exec runs ExecHook if set, else one of the built-in commands:
// "echo ARGS..." (stdout), "cat" (stdin to stdout), "fail CODE MSG" (MSG
// to stderr, exit CODE), "kill SIGNAME" (killed by the signal).
func (s *Service) Exec(ctx context.Context, ref string, req model.ExecRequest, out model.ExecOutput) (*model.ExecResult, error) {
	s.mu.Lock()
	_, err := s.running(ref)
	hook := s.ExecHook
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if len(req.Cmd) == 0 {
		return nil, errdefs.Invalidf("cmd: at least the program is required")
	}
	if hook != nil {
		return hook(ctx, ref, req, out)
	}
	var stdout, stderr bytes.Buffer
	res := &model.ExecResult{}
	switch req.Cmd[0] {
	case "echo":
		stdout.WriteString(strings.Join(req.Cmd[1:], " ") + "\n")
	case "cat":
		stdout.WriteString(req.Stdin)
	case "fail":
		if len(req.Cmd) != 3 {
			return nil, errdefs.Invalidf("fail: usage fail CODE MSG")
		}
		res.ExitCode, _ = strconv.Atoi(req.Cmd[1])
		stderr.WriteString(req.Cmd[2])
	case "kill":
		if len(req.Cmd) != 2 {
			return nil, errdefs.Invalidf("kill: usage kill SIGNAL")
		}
		res.Signal, res.ExitCode = req.Cmd[1], 137
	default:
		return nil, errdefs.NotFoundf("cmd[0]: %q: executable not found", req.Cmd[0])
	}
	if out == nil {
		res.Stdout, res.Stderr = stdout.String(), stderr.String()
		return res, nil
	}
	for _, c := range []struct {
		name string
		b    []byte
	}{{"stdout", stdout.Bytes()}, {"stderr", stderr.Bytes()}} {
		if len(c.b) > 0 {
			if err := out(c.name, c.b); err != nil {
				return nil, err
			}
		}
	}
	return res, nil
}

func (fj *fakeJail) info(p string) (*model.FileInfo, error) {
	n, ok := fj.files[p]
	if !ok {
		return nil, errdefs.NotFoundf("%s: no such file or directory", p)
	}
	fi := &model.FileInfo{Name: path.Base(p), Path: p, Type: "file", Size: int64(len(n.data)), Mode: fmt.Sprintf("%04o", n.mode), ModTime: n.mtime, UID: 1000, GID: 1000}
	switch {
	case n.dir:
		fi.Type, fi.Size = "dir", 0
	case n.link != "":
		fi.Type, fi.LinkTarget = "symlink", n.link
	}
	return fi, nil
}

// AddSymlink adds a symlink to a jail's file tree.
func (s *Service) AddSymlink(ref, p, target string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	fj, err := s.lookup(ref)
	if err != nil {
		return err
	}
	fj.files[p] = &node{link: target, mode: 0o777, mtime: time.Now()}
	return nil
}

// Stat describes a path.
func (s *Service) Stat(_ context.Context, ref, p string) (*model.FileInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fj, err := s.running(ref)
	if err != nil {
		return nil, err
	}
	return fj.info(p)
}

// ReadDir lists a directory, sorted by name.
func (s *Service) ReadDir(_ context.Context, ref, p string) (*model.DirListing, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fj, err := s.running(ref)
	if err != nil {
		return nil, err
	}
	if n, ok := fj.files[p]; !ok || !n.dir {
		return nil, errdefs.Invalidf("%s: not a directory", p)
	}
	var out []model.FileInfo
	for q := range fj.files {
		if q != "/" && path.Dir(q) == p {
			fi, _ := fj.info(q)
			out = append(out, *fi)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return &model.DirListing{Path: p, Entries: out}, nil
}

// ReadFile opens a regular file.
func (s *Service) ReadFile(_ context.Context, ref, p string) (*model.FileInfo, io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fj, err := s.running(ref)
	if err != nil {
		return nil, nil, err
	}
	fi, err := fj.info(p)
	if err != nil {
		return nil, nil, err
	}
	if fi.Type != "file" {
		return nil, nil, errdefs.Invalidf("%s: not a regular file", p)
	}
	return fi, io.NopCloser(bytes.NewReader(fj.files[p].data)), nil
}

func (fj *fakeJail) mkdirAll(p string, mode uint32) {
	for d := p; d != "/"; d = path.Dir(d) {
		if _, ok := fj.files[d]; !ok {
			fj.files[d] = &node{dir: true, mode: mode, mtime: time.Now()}
		}
	}
}

// WriteFile runs WriteHook if set, else stores r's bytes (creating parents).
func (s *Service) WriteFile(ctx context.Context, ref, p string, r io.Reader, opts model.WriteOptions) (*model.FileInfo, error) {
	if s.WriteHook != nil {
		return s.WriteHook(ctx, ref, p, r, opts)
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("writing %s: %w", p, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fj, err := s.running(ref)
	if err != nil {
		return nil, err
	}
	if n, ok := fj.files[p]; ok && n.dir {
		return nil, errdefs.Conflictf("%s: is a directory", p)
	}
	mode := opts.Mode
	if mode == 0 {
		mode = 0o644
	}
	fj.mkdirAll(path.Dir(p), 0o755)
	fj.files[p] = &node{data: data, mode: mode, mtime: time.Now()}
	return fj.info(p)
}

// Mkdir creates a directory and its parents.
func (s *Service) Mkdir(_ context.Context, ref, p string, opts model.WriteOptions) (*model.FileInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fj, err := s.running(ref)
	if err != nil {
		return nil, err
	}
	mode := opts.Mode
	if mode == 0 {
		mode = 0o755
	}
	fj.mkdirAll(path.Dir(p), 0o755)
	if n, ok := fj.files[p]; ok {
		if !n.dir {
			return nil, errdefs.Conflictf("%s: exists and is not a directory", p)
		}
		n.mode = mode
	} else {
		fj.files[p] = &node{dir: true, mode: mode, mtime: time.Now()}
	}
	return fj.info(p)
}

// Symlink adds the symbolic link p → target.
func (s *Service) Symlink(_ context.Context, ref, p, target string, _ model.WriteOptions) (*model.FileInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fj, err := s.running(ref)
	if err != nil {
		return nil, err
	}
	if _, ok := fj.files[p]; ok {
		return nil, errdefs.Conflictf("%s: exists", p)
	}
	if n, ok := fj.files[path.Dir(p)]; !ok || !n.dir {
		return nil, errdefs.NotFoundf("%s: no such directory", path.Dir(p))
	}
	fj.files[p] = &node{link: target, mode: 0o777, mtime: time.Now()}
	return fj.info(p)
}

// Remove deletes a path; a non-empty directory needs recursive.
func (s *Service) Remove(_ context.Context, ref, p string, recursive bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	fj, err := s.running(ref)
	if err != nil {
		return err
	}
	if _, ok := fj.files[p]; !ok {
		return errdefs.NotFoundf("%s: no such file or directory", p)
	}
	for q := range fj.files {
		if strings.HasPrefix(q, p+"/") {
			if !recursive {
				return errdefs.Conflictf("%s: directory not empty", p)
			}
			delete(fj.files, q)
		}
	}
	delete(fj.files, p)
	return nil
}

// Access answers that every existing path is accessible.
func (s *Service) Access(_ context.Context, ref, p, mode, user string) (*model.AccessResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fj, err := s.running(ref)
	if err != nil {
		return nil, err
	}
	if user == "" {
		user = fj.j.Config.Isolation.Process.User
	}
	_, ok := fj.files[p]
	res := &model.AccessResult{Path: p, Mode: mode, User: user, Accessible: ok}
	if !ok {
		res.Reason = "no such file or directory"
	}
	return res, nil
}

// Health reports ok with the number of jails, a container level and a
// gvisor level that is not built.
func (s *Service) Health(context.Context) model.Health {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := model.Health{Status: "ok", Version: "test", Jails: len(s.jails), Checks: map[string]model.Check{"memory": {OK: true}},
		Levels: []model.Level{
			{Name: "container", Available: true, Capabilities: &model.Capabilities{
				Level: "container", Runtime: "fake runc", NetworkModes: []string{"isolated", "none"}, RootfsKinds: []string{"host"},
				Limits: []string{"memory", "pids"}, PTY: true, Users: true, Observers: []string{"kernel"},
				CheckpointReason: "no CRIU here", FSSnapshot: true, Guarantees: "a test double",
			}},
			{Name: "gvisor", Reason: "gvisor: runsc not built; run make gvisor"},
		}}
	for _, fj := range s.jails {
		if fj.j.Status == model.StateRunning {
			h.Running++
		}
	}
	return h
}

// UpdateNetwork replaces the jail's network config.
func (s *Service) UpdateNetwork(_ context.Context, ref string, n config.Network) (*model.Jail, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fj, err := s.lookup(ref)
	if err != nil {
		return nil, err
	}
	fj.j.Config.Isolation.Network = n
	j := fj.j
	return &j, nil
}

// EventLog returns the lines stored with SetEventLog (empty otherwise).
func (s *Service) EventLog(_ context.Context, ref, stream string) (io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.lookup(ref); err != nil {
		return nil, err
	}
	return io.NopCloser(strings.NewReader(s.logs[ref+"/"+stream])), nil
}

// SetEventLog stores the content EventLog serves for ref's stream.
func (s *Service) SetEventLog(ref, stream, content string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.logs == nil {
		s.logs = map[string]string{}
	}
	s.logs[ref+"/"+stream] = content
}

// Bus returns the event stream of ref (created on first use) so tests can
// publish events.
func (s *Service) Bus(ref string) *observe.Bus {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.buses == nil {
		s.buses = map[string]*observe.Bus{}
	}
	b := s.buses[ref]
	if b == nil {
		b = observe.NewBus(64)
		s.buses[ref] = b
	}
	return b
}

// Events subscribes to the stream Bus(ref) returns.
func (s *Service) Events(_ context.Context, ref string, after uint64, types []string) (*observe.Subscription, uint64, error) {
	s.mu.Lock()
	_, err := s.lookup(ref)
	s.mu.Unlock()
	if err != nil {
		return nil, 0, err
	}
	var mask observe.TypeMask
	for _, t := range types {
		typ, err := observe.ParseType(t)
		if err != nil {
			return nil, 0, err
		}
		mask |= observe.MaskOf(typ)
	}
	b := s.Bus(ref)
	return b.Subscribe(after, mask), b.Last(), nil
}

// Processes returns a tree holding one process per running jail.
func (s *Service) Processes(_ context.Context, ref string) (*model.ProcessTree, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fj, err := s.lookup(ref)
	if err != nil {
		return nil, err
	}
	t := &model.ProcessTree{Roots: []*model.Process{}}
	if fj.j.Status == model.StateRunning {
		t.Roots = append(t.Roots, &model.Process{Pid: 1, Exe: "/.agentjail/agentjail", Argv: []string{"agentjail", "init"}})
		t.Running, t.Total = 1, 1
	}
	return t, nil
}

// FsDiff lists the files written through WriteFile as added (with text,
// each with a diff adding its lines).
func (s *Service) FsDiff(_ context.Context, ref string, text bool) (*model.FsDiff, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fj, err := s.lookup(ref)
	if err != nil {
		return nil, err
	}
	d := &model.FsDiff{Changes: []model.Change{}}
	paths := make([]string, 0, len(fj.files))
	for p := range fj.files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		c := model.Change{Path: p, Kind: "added", Type: "file", Size: int64(len(fj.files[p].data))}
		if text {
			c.Diff = "--- /dev/null\n+++ b" + p + "\n@@ -0,0 +1 @@\n+" + strings.TrimSuffix(string(fj.files[p].data), "\n") + "\n"
		}
		d.Changes = append(d.Changes, c)
		d.Added++
	}
	return d, nil
}

// Report returns an empty report of the jail.
func (s *Service) Report(_ context.Context, ref string) (*model.Report, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fj, err := s.lookup(ref)
	if err != nil {
		return nil, err
	}
	return &model.Report{JailID: fj.j.ID, Name: fj.j.Name, Status: fj.j.Status, Tracing: "full",
		Events: map[string]uint64{}, Lost: map[string]uint64{}, Syscalls: []model.SyscallStat{},
		Files: []model.FileStat{}, Network: []model.NetStat{}, Process: model.ProcessTree{Roots: []*model.Process{}}}, nil
}
