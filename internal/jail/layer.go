package jail

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
)

// WritableLayer returns the host paths of the lower tree and the writable
// layer of a jail that was created and has not started yet, for the daemon
// to put files there (an agent's workspace and home) that the jail's first
// process already finds: ErrConflict once it has started, ErrNotImplemented
// when its backend has no such layer or the jail maps its users.
func (m *Manager) WritableLayer(ctx context.Context, ref string) (lower, upper string, err error) {
	e, err := m.lookup(ctx, ref)
	if err != nil {
		return "", "", err
	}
	e.op.Lock()
	defer e.op.Unlock()
	j := e.snapshot()
	if j.Status != model.StateCreated {
		return "", "", errdefs.Conflictf("jail %s is %s; files go into its layer only before it first starts", j.Name, j.Status)
	}
	if ns := j.Config.Isolation.Process.Namespaces; ns != nil && ns.User != nil && *ns.User {
		return "", "", errdefs.NotImplementedf("a workspace or agent home for a jail with a user namespace is not supported")
	}
	lb, err := m.layered(e)
	if err != nil {
		return "", "", err
	}
	return lb.Layers(m.instance(e))
}

// ProjectCacheBytes is the size of each project's package cache disk.
const ProjectCacheBytes = 8 << 30

// cacheMu serialises the making of project cache disks.
var cacheMu sync.Mutex

// ProjectCache returns the host directory of the package caches of the
// project named key (a hex digest), mounted from a disk of its own in the
// storage pool (ProjectCacheBytes, made the first time): its jails write
// there read-write, so it must not be the data dir's own disk, which a jail
// could fill without bound. The disk stays mounted for the project's later
// jails (a daemon started again finds it mounted) until the data dir is torn
// down.
func (m *Manager) ProjectCache(key string) (string, error) {
	if len(key) == 0 || strings.Trim(key, "0123456789abcdef") != "" {
		return "", errdefs.Invalidf("project cache: key %q is not a hex digest", key)
	}
	dir := filepath.Join(m.opts.DataDir, "caches", key)
	id := "cache-" + key
	cacheMu.Lock()
	defer cacheMu.Unlock()
	err := m.pool.MountDisk(id, dir)
	if errors.Is(err, errdefs.ErrNotFound) {
		if err = m.pool.CreateDisk(id, ProjectCacheBytes, dir); err == nil {
			// The disk comes with a jail's layer directories.
			err = errors.Join(os.Remove(filepath.Join(dir, "upper")), os.Remove(filepath.Join(dir, "work")))
		}
	}
	if err != nil {
		return "", fmt.Errorf("project cache: %w", err)
	}
	return dir, nil
}
