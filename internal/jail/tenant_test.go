package jail

import (
	"context"
	"errors"
	"testing"

	"github.com/agentjail/agentjail/internal/apikey"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/tenant"
)

// TestManagerTenants: a jail belongs to the tenant that made it; another
// tenant's caller finds none of it through any look-up, an admin finds
// all, and the tenant's quota bounds what it may hold.
func TestManagerTenants(t *testing.T) {
	fake := newFake(config.LevelVM)
	td := newTestData(t, fake.factory())
	q, err := tenant.OpenQuotas(td.opts.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	td.opts.Quotas = q
	m := td.open(t)
	as := func(tn string, role apikey.Role) context.Context {
		return tenant.NewContext(context.Background(), tenant.Principal{Kind: "key", KeyID: tn + "-key", Tenant: tn, Role: role})
	}
	a, b, admin := as("a", apikey.RoleUser), as("b", apikey.RoleUser), as("c", apikey.RoleAdmin)

	ja, err := m.Create(a, req("ta", config.LevelVM, true))
	if err != nil {
		t.Fatal(err)
	}
	if ja.Tenant != "a" {
		t.Errorf("a's jail belongs to %q", ja.Tenant)
	}
	if _, err := m.Create(b, req("tb", config.LevelVM, false)); err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"ta", ja.ID} {
		if _, err := m.Get(b, ref); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("b gets a's jail %s: %v, want not found", ref, err)
		}
		if _, err := m.Stop(b, ref, 0); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("b stops a's jail %s: %v, want not found", ref, err)
		}
		if err := m.Destroy(b, ref); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("b destroys a's jail %s: %v, want not found", ref, err)
		}
		if _, err := m.Processes(b, ref); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("b reads a's process tree %s: %v, want not found", ref, err)
		}
	}
	names := func(ctx context.Context) map[string]bool {
		l, err := m.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, j := range l {
			out[j.Name] = true
		}
		return out
	}
	if got := names(b); got["ta"] || !got["tb"] {
		t.Errorf("b lists %v, want tb alone", got)
	}
	if got := names(admin); !got["ta"] || !got["tb"] {
		t.Errorf("an admin lists %v, want both", got)
	}
	if got := names(context.Background()); len(got) != 2 {
		t.Errorf("the daemon itself lists %v, want both", got)
	}
	if j, err := m.Get(a, "ta"); err != nil || !alive(j.Pid) {
		t.Fatalf("a's jail after b's attempts: %+v %v", j, err)
	}
	// Names are the tenant's own: b may use a's, each finds its own, and
	// an admin asking by the name of two tenants' jails is told to use
	// the id.
	jb, err := m.Create(b, req("ta", config.LevelVM, false))
	if err != nil {
		t.Fatalf("b names a jail as a's: %v", err)
	}
	if got, err := m.Get(b, "ta"); err != nil || got.ID != jb.ID {
		t.Errorf("b's jail ta: %+v %v", got, err)
	}
	if got, err := m.Get(a, "ta"); err != nil || got.ID != ja.ID {
		t.Errorf("a's jail ta: %+v %v", got, err)
	}
	if _, err := m.Get(admin, "ta"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("an admin asks for ta, which two tenants have: %v", err)
	}
	if err := m.Destroy(admin, jb.ID); err != nil {
		t.Fatal(err)
	}

	// Quotas: one more jail of the default size fits a's memory quota,
	// a second is refused until one is freed (429), and a jail bigger
	// than the whole quota can never fit (403).
	mem := int64(config.DefaultMemory)
	if err := q.Set("a", tenant.Quota{Jails: 3, MemoryBytes: 2 * mem}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(a, req("ta2", config.LevelVM, false)); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(a, req("ta3", config.LevelVM, false)); !errors.Is(err, errdefs.ErrQuota) {
		t.Errorf("a third jail over the memory quota: %v, want a quota error", err)
	}
	big := req("huge", config.LevelVM, false)
	big.Config.Isolation.Resources.MemoryBytes = 3 * mem
	if err := m.Destroy(a, "ta2"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(a, big); !errors.Is(err, errdefs.ErrForbidden) {
		t.Errorf("a jail bigger than the quota: %v, want forbidden", err)
	}
	if _, err := m.Create(b, req("tb2", config.LevelVM, false)); err != nil {
		t.Errorf("b is not bound by a's quota: %v", err)
	}
	st, err := m.Quota(a, "a")
	if err != nil || st.Usage.Jails != 1 || st.Usage.MemoryBytes != mem || st.Limits.Jails != 3 {
		t.Errorf("a's quota status: %+v %v", st, err)
	}
	if _, err := m.Quota(b, "a"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("b reads a's quota: %v, want not found", err)
	}
	for _, ref := range []string{"ta", "tb", "tb2"} {
		if err := m.Destroy(admin, ref); err != nil {
			t.Errorf("an admin destroys %s: %v", ref, err)
		}
	}
}
