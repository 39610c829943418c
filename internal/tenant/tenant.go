// Package tenant says who a request acts for and what it may touch.
//
// Every resource of the daemon (a jail, a snapshot, a recording, an image,
// an E2B sandbox) belongs to a tenant. A request's Principal — the API
// token, or an API key with its tenant and role — travels in its context;
// the jail manager's look-ups ask Visible before they hand out anything,
// so every route that reaches a jail, a snapshot or a recording is checked
// in that one place. A context without a principal is the daemon's own
// call (recovery, timers): it sees everything.
//
// Roles: admin sees and changes every tenant's resources; user sees and
// changes its own tenant's; viewer only reads its own tenant's.
package tenant

import (
	"context"

	"github.com/agentjail/agentjail/internal/apikey"
	"github.com/agentjail/agentjail/internal/errdefs"
)

// Principal is who a request acts for.
type Principal struct {
	// Kind is "token" for the daemon's bootstrap token, "key" for an API
	// key.
	Kind string `json:"kind"`
	// KeyID and KeyName describe an API key (empty for the token).
	KeyID   string `json:"key_id,omitempty"`
	KeyName string `json:"key_name,omitempty"`
	// Tenant is the tenant the principal acts for; new resources belong
	// to it.
	Tenant string `json:"tenant"`
	// Role is admin, user or viewer.
	Role apikey.Role `json:"role"`
}

// Token is the principal of the daemon's bootstrap token: an admin of
// the default tenant.
var Token = Principal{Kind: "token", Tenant: apikey.DefaultTenant, Role: apikey.RoleAdmin}

// FromKey is the principal of API key k.
func FromKey(k apikey.Key) Principal {
	return Principal{Kind: "key", KeyID: k.ID, KeyName: k.Name, Tenant: Of(k.Tenant), Role: k.Role}
}

// Who names the principal for logs and the audit log: "token" or
// "key:<id>".
func (p Principal) Who() string {
	if p.Kind == "key" {
		return "key:" + p.KeyID
	}
	return p.Kind
}

// Admin reports whether p may see and change every tenant's resources.
func (p Principal) Admin() bool { return p.Role == apikey.RoleAdmin }

// Sees reports whether p may see a resource of tenant owner.
func (p Principal) Sees(owner string) bool { return p.Admin() || p.Tenant == Of(owner) }

// Of is the tenant of a resource recorded with owner: resources made
// before tenants were recorded belong to the default tenant.
func Of(owner string) string {
	if owner == "" {
		return apikey.DefaultTenant
	}
	return owner
}

type ctxKey struct{}

// NewContext returns ctx carrying p.
func NewContext(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, ctxKey{}, p)
}

// FromContext returns the principal ctx carries.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(ctxKey{}).(Principal)
	return p, ok
}

// Visible reports whether the caller of ctx may see a resource of tenant
// owner. The daemon's own calls (no principal) see everything.
func Visible(ctx context.Context, owner string) bool {
	p, ok := FromContext(ctx)
	return !ok || p.Sees(owner)
}

// Owner is the tenant that resources made by the caller of ctx belong to
// (the default tenant for the daemon's own calls).
func Owner(ctx context.Context) string {
	if p, ok := FromContext(ctx); ok {
		return Of(p.Tenant)
	}
	return apikey.DefaultTenant
}

// CanWrite returns nil when the caller of ctx may change resources, else
// an errdefs.ErrForbidden naming the viewer key.
func CanWrite(ctx context.Context) error {
	if p, ok := FromContext(ctx); ok && !p.Role.CanWrite() {
		return errdefs.Forbiddenf("API key %s is a viewer's (tenant %s): it may only read", p.KeyID, p.Tenant)
	}
	return nil
}
