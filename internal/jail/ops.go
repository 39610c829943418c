package jail

import (
	"bytes"
	"context"
	"fmt"
	"github.com/agentjail/agentjail/internal/model"
	"io"
	"path"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/tracing"
)

// blocked refuses a path under one of the jail's blocked paths, judged on
// the path as asked (init judges the resolved path as well).
func blocked(inst backend.Instance, p string) error {
	clean := path.Clean(p)
	for _, b := range inst.Config.Isolation.Filesystem.BlockedPaths {
		if clean == b || strings.HasPrefix(clean, b+"/") {
			return errdefs.Forbiddenf("path %q is blocked by the jail's policy", p)
		}
	}
	return nil
}

// runningPath is running plus the blocked-path check of p.
func (m *Manager) runningPath(ctx context.Context, ref, p string) (backend.Instance, *initclient.Client, error) {
	inst, c, err := m.running(ctx, ref)
	if err != nil {
		return inst, nil, err
	}
	if err := blocked(inst, p); err != nil {
		return inst, nil, err
	}
	return inst, c, nil
}

// running returns the jail's instance and init client, or ErrConflict when
// it does not run.
func (m *Manager) running(ctx context.Context, ref string) (backend.Instance, *initclient.Client, error) {
	e, err := m.lookup(ctx, ref)
	if err != nil {
		return backend.Instance{}, nil, err
	}
	j := e.snapshot()
	if j.Status != model.StateRunning {
		return backend.Instance{}, nil, errdefs.Conflictf("jail %s is %s; it must be running", j.Name, j.Status)
	}
	b, err := m.backendOf(e)
	if err != nil {
		return backend.Instance{}, nil, err
	}
	inst := m.instance(e)
	c, err := m.client(e, b, inst)
	if err != nil {
		return backend.Instance{}, nil, err
	}
	return inst, c, nil
}

// cappedBuffer keeps the first max bytes written to it.
type cappedBuffer struct {
	buf       bytes.Buffer
	max       int
	truncated bool
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	room := c.max - c.buf.Len()
	if room < len(p) {
		c.truncated = true
		if room > 0 {
			c.buf.Write(p[:room])
		}
		return len(p), nil
	}
	return c.buf.Write(p)
}

// streamWriter forwards writes to an ExecOutput.
type streamWriter struct {
	name string
	out  model.ExecOutput
}

func (s streamWriter) Write(p []byte) (int, error) {
	if err := s.out(s.name, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// envList is env as sorted "K=V" entries.
func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

func validateExec(req *model.ExecRequest) error {
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return errdefs.Invalidf("cmd: at least the program name is required")
	}
	for i, a := range req.Cmd {
		if strings.ContainsRune(a, 0) {
			return errdefs.Invalidf("cmd[%d]: NUL byte in argument", i)
		}
	}
	for k, v := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return errdefs.Invalidf("env: invalid variable %q", k)
		}
	}
	if req.Cwd != "" && !path.IsAbs(req.Cwd) {
		return errdefs.Invalidf("cwd: %q must be an absolute path in the jail", req.Cwd)
	}
	if req.TimeoutMs < 0 {
		return errdefs.Invalidf("timeout_ms: %d must not be negative", req.TimeoutMs)
	}
	return nil
}

// Exec runs a command in a running jail. With out == nil the output is
// buffered (each stream capped at MaxExecOutput); otherwise it is streamed
// to out as it happens. Cancelling ctx kills the command and its
// descendants.
func (m *Manager) Exec(ctx context.Context, ref string, req model.ExecRequest, out model.ExecOutput) (res *model.ExecResult, err error) {
	ctx, span := tracing.Start(ctx, "jail.exec", tracing.JailID.String(ref))
	defer func() { tracing.End(span, err) }()
	if err := validateExec(&req); err != nil {
		return nil, err
	}
	inst, client, err := m.running(ctx, ref)
	if err != nil {
		return nil, err
	}
	env := envList(req.Env)
	var stdout, stderr io.Writer
	var bout, berr *cappedBuffer
	if out == nil {
		bout = &cappedBuffer{max: model.MaxExecOutput}
		berr = &cappedBuffer{max: model.MaxExecOutput}
		stdout, stderr = bout, berr
	} else {
		stdout, stderr = streamWriter{"stdout", out}, streamWriter{"stderr", out}
	}
	var stdin io.Reader
	if req.Stdin != "" {
		stdin = strings.NewReader(req.Stdin)
	}
	user, err := m.userFor(inst, req.User)
	if err != nil {
		return nil, err
	}
	oomBefore := m.oomKills(inst)
	start := time.Now()
	st, err := client.Exec(ctx, initproto.ExecRequest{
		Argv: req.Cmd, Env: env, Cwd: req.Cwd, User: user, TimeoutMs: req.TimeoutMs,
	}, stdin, stdout, stderr)
	if err != nil {
		return nil, err
	}
	res = &model.ExecResult{
		ExitCode:   st.Code,
		Signal:     st.Signal,
		TimedOut:   st.TimedOut,
		DurationMs: float64(time.Since(start).Microseconds()) / 1000,
	}
	if st.Signal != "" {
		if n := unix.SignalNum(st.Signal); n != 0 {
			res.ExitCode = 128 + int(n)
		}
		if st.Signal == "SIGKILL" && !st.TimedOut && m.oomKills(inst) > oomBefore {
			res.OOMKilled = true
		}
	}
	if bout != nil {
		res.Stdout, res.Stderr = bout.buf.String(), berr.buf.String()
		res.Truncated = bout.truncated || berr.truncated
	}
	return res, nil
}

// oomKills counts the jail's processes killed for exceeding its memory
// limit (0 when its level cannot tell).
func (m *Manager) oomKills(inst backend.Instance) uint64 {
	b, err := m.levels.Get(inst.Config.Isolation.Level)
	if err != nil {
		return 0
	}
	r, ok := b.(backend.OOMReporter)
	if !ok {
		return 0
	}
	n, err := r.OOMKills(inst)
	if err != nil {
		return 0
	}
	return n
}

func fileInfo(fi initproto.FileInfo) model.FileInfo {
	return model.FileInfo{
		Name:       fi.Name,
		Path:       fi.Path,
		Type:       fi.Type,
		Size:       fi.Size,
		Mode:       fmt.Sprintf("%04o", fi.Mode),
		ModTime:    fi.ModTime,
		UID:        fi.UID,
		GID:        fi.GID,
		LinkTarget: fi.LinkTarget,
	}
}

func checkPath(p string) error {
	if !path.IsAbs(p) {
		return errdefs.Invalidf("path %q must be absolute in the jail", p)
	}
	if strings.ContainsRune(p, 0) {
		return errdefs.Invalidf("path: NUL byte")
	}
	return nil
}

// Stat describes a path in a running jail (without following a final symlink).
func (m *Manager) Stat(ctx context.Context, ref, p string) (*model.FileInfo, error) {
	if err := checkPath(p); err != nil {
		return nil, err
	}
	_, c, err := m.runningPath(ctx, ref, p)
	if err != nil {
		return nil, err
	}
	fi, err := c.Stat(ctx, p)
	if err != nil {
		return nil, err
	}
	out := fileInfo(fi)
	return &out, nil
}

// maxDirEntries bounds the entries of one directory listing: the daemon
// holds them all until it answers, and a jail can make a directory of
// millions.
const maxDirEntries = 100_000

// ReadDir lists a directory of a running jail: at most maxDirEntries
// entries, sorted by name (Truncated when there are more).
func (m *Manager) ReadDir(ctx context.Context, ref, p string) (*model.DirListing, error) {
	if err := checkPath(p); err != nil {
		return nil, err
	}
	_, c, err := m.runningPath(ctx, ref, p)
	if err != nil {
		return nil, err
	}
	list, truncated, err := c.ListDir(ctx, p, maxDirEntries)
	if err != nil {
		return nil, err
	}
	out := &model.DirListing{Path: p, Entries: make([]model.FileInfo, len(list)), Truncated: truncated}
	for i, fi := range list {
		out.Entries[i] = fileInfo(fi)
	}
	return out, nil
}

// ReadFile opens a file of a running jail; the caller closes the reader.
func (m *Manager) ReadFile(ctx context.Context, ref, p string) (*model.FileInfo, io.ReadCloser, error) {
	if err := checkPath(p); err != nil {
		return nil, nil, err
	}
	_, c, err := m.runningPath(ctx, ref, p)
	if err != nil {
		return nil, nil, err
	}
	fi, rc, err := c.ReadFile(ctx, p)
	if err != nil {
		return nil, nil, err
	}
	out := fileInfo(fi)
	return &out, rc, nil
}

// WriteFile writes r to a file of a running jail, creating parents.
func (m *Manager) WriteFile(ctx context.Context, ref, p string, r io.Reader, opts model.WriteOptions) (*model.FileInfo, error) {
	return m.createPath(ctx, ref, p, opts.User, func(c *initclient.Client, user string) (initproto.FileInfo, error) {
		return c.WriteFile(ctx, p, r, initproto.WriteOptions{Mode: opts.Mode, User: user, MkdirParents: true})
	})
}

// Mkdir creates a directory (and its parents) in a running jail.
func (m *Manager) Mkdir(ctx context.Context, ref, p string, opts model.WriteOptions) (*model.FileInfo, error) {
	return m.createPath(ctx, ref, p, opts.User, func(c *initclient.Client, user string) (initproto.FileInfo, error) {
		return c.Mkdir(ctx, p, initproto.WriteOptions{Mode: opts.Mode, User: user, MkdirParents: true})
	})
}

// Symlink creates the symbolic link p → target in a running jail, owned
// by opts.User (default: the jail's user); opts.Mode does not apply.
func (m *Manager) Symlink(ctx context.Context, ref, p, target string, opts model.WriteOptions) (*model.FileInfo, error) {
	return m.createPath(ctx, ref, p, opts.User, func(c *initclient.Client, user string) (initproto.FileInfo, error) {
		return c.Symlink(ctx, p, target, user)
	})
}

// createPath runs do, which creates path p of the running jail ref as the
// jail user user resolves to (default: the jail's), and describes what it
// made.
func (m *Manager) createPath(ctx context.Context, ref, p, user string, do func(c *initclient.Client, user string) (initproto.FileInfo, error)) (*model.FileInfo, error) {
	if err := checkPath(p); err != nil {
		return nil, err
	}
	inst, c, err := m.runningPath(ctx, ref, p)
	if err != nil {
		return nil, err
	}
	if user, err = m.userFor(inst, user); err != nil {
		return nil, err
	}
	fi, err := do(c, user)
	if err != nil {
		return nil, err
	}
	out := fileInfo(fi)
	return &out, nil
}

// Remove deletes a path of a running jail (a directory only when recursive
// or empty).
func (m *Manager) Remove(ctx context.Context, ref, p string, recursive bool) error {
	if err := checkPath(p); err != nil {
		return err
	}
	if p == "/" {
		return errdefs.Forbiddenf("refusing to remove the jail's root")
	}
	_, c, err := m.runningPath(ctx, ref, p)
	if err != nil {
		return err
	}
	return c.Remove(ctx, p, recursive)
}

// Access tells whether user (default: the jail's) may read or write path.
func (m *Manager) Access(ctx context.Context, ref, p, mode, user string) (*model.AccessResult, error) {
	if err := checkPath(p); err != nil {
		return nil, err
	}
	if mode != "read" && mode != "write" {
		return nil, errdefs.Invalidf("access: mode %q must be read or write", mode)
	}
	inst, c, err := m.running(ctx, ref)
	if err != nil {
		return nil, err
	}
	send, err := m.userFor(inst, user)
	if err != nil {
		return nil, err
	}
	if user == "" {
		user = inst.Config.Isolation.Process.User
	}
	if err := blocked(inst, p); err != nil {
		return &model.AccessResult{Path: p, Mode: mode, User: user, Accessible: false, Reason: err.Error()}, nil
	}
	ok, reason, err := c.Access(ctx, p, mode == "write", send)
	if err != nil {
		return nil, err
	}
	return &model.AccessResult{Path: p, Mode: mode, User: user, Accessible: ok, Reason: reason}, nil
}
