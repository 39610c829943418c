package jail

import (
	"context"
	"sort"
	"strings"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/tenant"
)

// nameKey is a jail's name within its tenant: names are unique per
// tenant, so that a tenant cannot learn another's jail names by trying
// them.
type nameKey struct{ tenant, name string }

func keyOf(j *model.Jail) nameKey { return nameKey{tenant.Of(j.Tenant), j.Name} }

// byNameLocked finds the jail named name for the caller of ctx (m.mu
// held): one of the caller's tenant; for an admin or the daemon's own
// call, failing that, the one jail of any tenant with that name
// (ErrConflict when several tenants have one). nil when none.
func (m *Manager) byNameLocked(ctx context.Context, name string) (*entry, error) {
	if id, ok := m.names[nameKey{tenant.Owner(ctx), name}]; ok {
		return m.jails[id], nil
	}
	if p, ok := tenant.FromContext(ctx); ok && !p.Admin() {
		return nil, nil
	}
	var found *entry
	var tenants []string
	for k, id := range m.names {
		if k.name == name {
			found = m.jails[id]
			tenants = append(tenants, k.tenant)
		}
	}
	if len(tenants) > 1 {
		sort.Strings(tenants)
		return nil, errdefs.Conflictf("tenants %s each have a jail named %q: name it by its id", strings.Join(tenants, ", "), name)
	}
	return found, nil
}
