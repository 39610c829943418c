package jail

import (
	"context"

	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/tenant"
)

// jailUsage is what a jail of config cfg counts against its tenant's
// quota: itself, its memory limit and its disk size (whatever its state).
func jailUsage(cfg *config.Config) tenant.Usage {
	r := cfg.Isolation.Resources
	return tenant.Usage{Jails: 1, MemoryBytes: r.MemoryBytes, DiskBytes: r.DiskBytes}
}

// admit checks that tenant t may add more to what it holds.
func (m *Manager) admit(t string, more tenant.Usage) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.admitLocked(t, more)
}

// admitLocked is admit with m.mu held.
func (m *Manager) admitLocked(t string, more tenant.Usage) error {
	q := m.opts.Quotas.Get(t)
	if q == (tenant.Quota{}) {
		return nil
	}
	return q.Admit(tenant.Of(t), m.usageLocked(t), more)
}

// usageLocked is what tenant t's jails hold (m.mu held).
func (m *Manager) usageLocked(t string) tenant.Usage {
	t = tenant.Of(t)
	var u tenant.Usage
	for _, e := range m.jails {
		if j := e.snapshot(); tenant.Of(j.Tenant) == t {
			u = u.Add(jailUsage(&j.Config))
		}
	}
	return u
}

// Quota returns tenant t's quota and what it holds now. A caller that
// is not an admin may ask only about its own tenant (ErrNotFound).
func (m *Manager) Quota(ctx context.Context, t string) (tenant.Status, error) {
	if !tenant.Visible(ctx, t) {
		return tenant.Status{}, errdefs.NotFoundf("no tenant %q", t)
	}
	t = tenant.Of(t)
	m.mu.Lock()
	u := m.usageLocked(t)
	m.mu.Unlock()
	n, err := m.snapshotCount(t)
	if err != nil {
		return tenant.Status{}, err
	}
	u.Snapshots = n
	return tenant.Status{Tenant: t, Limits: m.opts.Quotas.Get(t), Usage: u}, nil
}

// SetQuota replaces tenant t's quota (errdefs.ErrNotImplemented when the
// daemon keeps none).
func (m *Manager) SetQuota(ctx context.Context, t string, q tenant.Quota) (tenant.Status, error) {
	if m.opts.Quotas == nil {
		return tenant.Status{}, errdefs.NotImplementedf("this daemon keeps no quotas")
	}
	if err := m.opts.Quotas.Set(t, q); err != nil {
		return tenant.Status{}, err
	}
	return m.Quota(ctx, t)
}

// snapshotCount is the number of snapshots of tenant t, those being
// taken included.
func (m *Manager) snapshotCount(t string) (int, error) {
	list, err := m.snaps.store.List()
	if err != nil {
		return 0, err
	}
	m.snaps.mu.Lock()
	n := m.snaps.pending[t]
	m.snaps.mu.Unlock()
	for _, s := range list {
		if tenant.Of(s.Tenant) == t {
			n++
		}
	}
	return n, nil
}

// reserveSnapshot counts a snapshot being taken for tenant t against its
// quota until the returned function is called.
func (m *Manager) reserveSnapshot(t string) (func(), error) {
	t = tenant.Of(t)
	q := m.opts.Quotas.Get(t)
	m.snaps.admit.Lock()
	defer m.snaps.admit.Unlock()
	if q.Snapshots > 0 {
		n, err := m.snapshotCount(t)
		if err != nil {
			return nil, err
		}
		if err := q.Admit(t, tenant.Usage{Snapshots: n}, tenant.Usage{Snapshots: 1}); err != nil {
			return nil, err
		}
	}
	m.snaps.mu.Lock()
	m.snaps.pending[t]++
	m.snaps.mu.Unlock()
	return func() {
		m.snaps.mu.Lock()
		if m.snaps.pending[t]--; m.snaps.pending[t] <= 0 {
			delete(m.snaps.pending, t)
		}
		m.snaps.mu.Unlock()
	}, nil
}
