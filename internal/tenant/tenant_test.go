package tenant

import (
	"context"
	"errors"
	"testing"

	"github.com/agentjail/agentjail/internal/apikey"
	"github.com/agentjail/agentjail/internal/errdefs"
)

func TestVisible(t *testing.T) {
	user := NewContext(context.Background(), Principal{Kind: "key", Tenant: "a", Role: apikey.RoleUser})
	admin := NewContext(context.Background(), Principal{Kind: "key", Tenant: "b", Role: apikey.RoleAdmin})
	viewer := NewContext(context.Background(), Principal{Kind: "key", KeyID: "k1", Tenant: "a", Role: apikey.RoleViewer})
	for _, c := range []struct {
		ctx   context.Context
		owner string
		want  bool
	}{
		{user, "a", true}, {user, "b", false}, {user, "", false},
		{viewer, "a", true}, {viewer, "b", false},
		{admin, "a", true}, {admin, "", true},
		{context.Background(), "a", true},
		{NewContext(context.Background(), Token), "", true},
	} {
		if got := Visible(c.ctx, c.owner); got != c.want {
			p, _ := FromContext(c.ctx)
			t.Errorf("%+v sees a resource of %q: %v, want %v", p, c.owner, got, c.want)
		}
	}
	if Owner(user) != "a" || Owner(context.Background()) != apikey.DefaultTenant {
		t.Errorf("owners: %q %q", Owner(user), Owner(context.Background()))
	}
	if err := CanWrite(viewer); !errors.Is(err, errdefs.ErrForbidden) {
		t.Errorf("a viewer writes: %v", err)
	}
	if err := CanWrite(user); err != nil {
		t.Errorf("a user writes: %v", err)
	}
}

func TestQuotaAdmit(t *testing.T) {
	q := Quota{Jails: 2, MemoryBytes: 1000, Snapshots: 1}
	for _, c := range []struct {
		used, more Usage
		want       error
	}{
		{Usage{}, Usage{Jails: 1, MemoryBytes: 500}, nil},
		{Usage{Jails: 1, MemoryBytes: 500}, Usage{Jails: 1, MemoryBytes: 500}, nil},
		{Usage{Jails: 2, MemoryBytes: 500}, Usage{Jails: 1, MemoryBytes: 100}, errdefs.ErrQuota},
		{Usage{Jails: 1, MemoryBytes: 900}, Usage{Jails: 1, MemoryBytes: 200}, errdefs.ErrQuota},
		{Usage{}, Usage{Jails: 1, MemoryBytes: 2000}, errdefs.ErrForbidden},
		{Usage{Snapshots: 1}, Usage{Snapshots: 1}, errdefs.ErrQuota},
		{Usage{Jails: 5, DiskBytes: 1 << 40}, Usage{Snapshots: 1}, nil},
	} {
		err := q.Admit("t", c.used, c.more)
		if (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("admit %+v to %+v: %v, want %v", c.more, c.used, err, c.want)
		}
	}
}

func TestQuotasPersist(t *testing.T) {
	dir := t.TempDir()
	q, err := OpenQuotas(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Set("a", Quota{Jails: 3}); err != nil {
		t.Fatal(err)
	}
	if err := q.Set("b", Quota{Jails: -1}); !errors.Is(err, errdefs.ErrUnprocessable) {
		t.Errorf("a negative limit: %v", err)
	}
	q2, err := OpenQuotas(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := q2.Get("a"); got.Jails != 3 {
		t.Errorf("reopened: %+v", got)
	}
	if err := q2.Set("a", Quota{}); err != nil || len(q2.List()) != 0 {
		t.Errorf("a zero quota is removed: %v %v", err, q2.List())
	}
}
