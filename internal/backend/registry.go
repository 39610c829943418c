package backend

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/image"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/netpolicy"
	"github.com/agentjail/agentjail/internal/storage"
)

// Host is what the daemon shares with the backends it runs: made once by
// the manager, handed to every Factory.
type Host struct {
	// DataDir is the daemon's data dir.
	DataDir string
	// InitBinary is the host path of the agentjail binary that runs as
	// every jail's init (a content-addressed copy that outlives upgrades).
	InitBinary string
	// Pool is the storage pool that holds the jails' disks.
	Pool *storage.Pool
	// HostLower is the `host` rootfs provider's lower tree.
	HostLower string
	// Images is the image store of the `image:` rootfs provider (nil:
	// image jails are refused).
	Images *image.Store
	// Net attaches jails to the daemon's policed network.
	Net *netpolicy.Manager
	// AllowHostNetwork permits network mode "host".
	AllowHostNetwork bool
	// Log receives diagnostics.
	Log *slog.Logger
}

// Factory makes the backend of one isolation level on a host.
type Factory struct {
	// Level is the isolation level the backend provides.
	Level string
	// New makes the backend. An error says why the level is unavailable
	// on this host and how to get it ("runsc not built; run make gvisor"):
	// the daemon runs without the level and reports the reason.
	New func(h Host) (Backend, error)
}

// Registry holds the backend of each isolation level the daemon knows,
// or the reason a known level is unavailable. It is read-only once made
// and safe for concurrent use.
type Registry struct {
	levels   []string // in the order of the factories
	backends map[string]Backend
	missing  map[string]error
}

// NewRegistry makes the backends of fs on h. A factory that fails leaves
// its level unavailable with its error as the reason; a factory whose
// backend declares another level than its own is an error of the
// daemon's wiring.
func NewRegistry(h Host, fs []Factory) (*Registry, error) {
	r := &Registry{backends: map[string]Backend{}, missing: map[string]error{}}
	for _, f := range fs {
		if slices.Contains(r.levels, f.Level) {
			return nil, fmt.Errorf("backend registry: two backends for level %q", f.Level)
		}
		r.levels = append(r.levels, f.Level)
		b, err := f.New(h)
		if err != nil {
			r.missing[f.Level] = err
			if h.Log != nil {
				h.Log.Warn("isolation level unavailable", "level", f.Level, "reason", err)
			}
			continue
		}
		if lv := b.Capabilities().Level; lv != f.Level {
			return nil, fmt.Errorf("backend registry: the backend made for level %q declares level %q", f.Level, lv)
		}
		r.backends[f.Level] = b
	}
	return r, nil
}

// Get returns the backend of level. A level the daemon knows but cannot
// run here is errdefs.ErrUnprocessable naming the level and why; an
// unknown level likewise lists the available ones.
func (r *Registry) Get(level string) (Backend, error) {
	if b, ok := r.backends[level]; ok {
		return b, nil
	}
	if err, ok := r.missing[level]; ok {
		// The factory's error kind (often ErrUnavailable) is not the
		// request's: the request asks for what this host lacks.
		return nil, errdefs.Unprocessablef("isolation.level: %s is not available on this daemon: %v", level, err)
	}
	return nil, errdefs.Unprocessablef("isolation.level: %q is not available on this daemon (available: %s)", level, strings.Join(r.Available(), ", "))
}

// Available returns the levels whose backends run here, in the
// factories' order.
func (r *Registry) Available() []string {
	var out []string
	for _, l := range r.levels {
		if _, ok := r.backends[l]; ok {
			out = append(out, l)
		}
	}
	return out
}

// Backends returns the backends that run here, in the factories' order.
func (r *Registry) Backends() []Backend {
	var out []Backend
	for _, l := range r.levels {
		if b, ok := r.backends[l]; ok {
			out = append(out, b)
		}
	}
	return out
}

// Levels describes every level the registry knows, available or not, in
// the factories' order.
func (r *Registry) Levels() []model.Level {
	out := make([]model.Level, 0, len(r.levels))
	for _, l := range r.levels {
		if b, ok := r.backends[l]; ok {
			caps := b.Capabilities()
			out = append(out, model.Level{Name: l, Available: true, Capabilities: &caps})
			continue
		}
		out = append(out, model.Level{Name: l, Reason: r.missing[l].Error()})
	}
	return out
}
