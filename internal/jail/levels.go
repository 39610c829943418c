package jail

import (
	"context"
	"slices"
	"strings"

	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initclient"
)

// backendOf returns the backend of the level of e's config; a level
// this daemon cannot run (any more) is ErrUnprocessable naming it.
func (m *Manager) backendOf(e *entry) (backend.Backend, error) {
	e.mu.RLock()
	level := e.rec.Config.Isolation.Level
	e.mu.RUnlock()
	return m.levels.Get(level)
}

// control returns a client of the init of the jail inst, which runs on b.
func (m *Manager) control(b backend.Backend, inst backend.Instance) *initclient.Client {
	return initclient.New(b.InitDialer(inst))
}

// checkConfig validates cfg (defaults applied) for the host and for the
// backend of its level, which it returns. What the level lacks is
// ErrUnprocessable naming the field and the level.
func (m *Manager) checkConfig(cfg *config.Config) (backend.Backend, error) {
	b, err := m.levels.Get(cfg.Isolation.Level)
	if err != nil {
		return nil, err
	}
	caps := b.Capabilities()
	h := m.host
	h.NetworkModes = caps.NetworkModes
	if err := cfg.Validate(h); err != nil {
		return nil, err
	}
	fs := cfg.Isolation.Filesystem
	if kind, _, _ := strings.Cut(fs.Rootfs, ":"); !slices.Contains(caps.RootfsKinds, kind) {
		return nil, errdefs.Unprocessablef("isolation.filesystem.rootfs: the %s level cannot mount a %q root (it mounts: %s)",
			caps.Level, kind, strings.Join(caps.RootfsKinds, ", "))
	}
	if ns := cfg.Isolation.Process.Namespaces; ns != nil && ns.User != nil && *ns.User && !caps.UserNamespaces {
		return nil, errdefs.Unprocessablef("isolation.process.namespaces.user: the %s level has no user namespaces", caps.Level)
	}
	return b, nil
}

// stats reads the live usage of the running jail e.
func (m *Manager) stats(ctx context.Context, e *entry) (backend.Stats, error) {
	b, err := m.backendOf(e)
	if err != nil {
		return backend.Stats{}, err
	}
	return b.Stats(ctx, m.instance(e))
}

// layered returns the backend of e as a Layered one, or ErrNotImplemented
// naming the level when its jails have no layered root to diff.
func (m *Manager) layered(e *entry) (backend.Layered, error) {
	b, err := m.backendOf(e)
	if err != nil {
		return nil, err
	}
	lb, ok := b.(backend.Layered)
	if !ok {
		return nil, backend.Unsupported(b.Capabilities().Level, "diff a jail's files", "its jails have no layered root filesystem")
	}
	return lb, nil
}

// userFor returns the user to ask the jail's init for, for a request
// naming user: as is where the level runs commands as any user; where it
// runs them all as the jail's own user, "" (init's default) for no user or
// the configured one, and ErrNotImplemented naming the level for another.
func (m *Manager) userFor(inst backend.Instance, user string) (string, error) {
	b, err := m.levels.Get(inst.Config.Isolation.Level)
	if err != nil {
		return "", err
	}
	caps := b.Capabilities()
	switch {
	case caps.Users:
		return user, nil
	case user == "" || user == inst.Config.Isolation.Process.User:
		return "", nil
	}
	return "", backend.Unsupported(caps.Level, "run commands as another user ("+user+")", "every command runs as the jail's own host user")
}
