package jail

import (
	"context"

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
