package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// APIKey is an API key's record (GET /keys), without its secret.
type APIKey struct {
	ID        string    `json:"id"`
	Name      string    `json:"name,omitempty"`
	Tenant    string    `json:"tenant"`
	Role      string    `json:"role"`
	CreatedAt time.Time `json:"created_at"`
	// Secret is the key itself; set only in the answer to CreateKey.
	Secret string `json:"secret,omitempty"`
}

// CreateKey issues an API key for tenant ("": default) with role (admin,
// user or viewer; "": user). The answer's Secret is shown this once.
func (c *Client) CreateKey(ctx context.Context, name, tenant, role string) (*APIKey, error) {
	var k APIKey
	in := map[string]string{"name": name, "tenant": tenant, "role": role}
	if err := c.call(ctx, http.MethodPost, "/keys", in, &k); err != nil {
		return nil, err
	}
	return &k, nil
}

// Keys lists the API keys, oldest first.
func (c *Client) Keys(ctx context.Context) ([]APIKey, error) {
	var out struct {
		Keys []APIKey `json:"keys"`
	}
	if err := c.call(ctx, http.MethodGet, "/keys", nil, &out); err != nil {
		return nil, err
	}
	return out.Keys, nil
}

// DeleteKey removes an API key; it stops working at once.
func (c *Client) DeleteKey(ctx context.Context, id string) error {
	return c.call(ctx, http.MethodDelete, "/keys/"+url.PathEscape(id), nil, nil)
}

// Quota is a tenant's limits (0: no limit) or what it holds.
type Quota struct {
	Jails       int   `json:"jails,omitempty"`
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	DiskBytes   int64 `json:"disk_bytes,omitempty"`
	Snapshots   int   `json:"snapshots,omitempty"`
}

// TenantQuota is a tenant's quota and usage (GET /quotas/{tenant}).
type TenantQuota struct {
	Tenant string `json:"tenant"`
	Limits Quota  `json:"limits"`
	Usage  Quota  `json:"usage"`
}

// GetQuota returns tenant's quota and what it holds.
func (c *Client) GetQuota(ctx context.Context, tenant string) (*TenantQuota, error) {
	var q TenantQuota
	if err := c.call(ctx, http.MethodGet, "/quotas/"+url.PathEscape(tenant), nil, &q); err != nil {
		return nil, err
	}
	return &q, nil
}

// SetQuota replaces tenant's limits (admin).
func (c *Client) SetQuota(ctx context.Context, tenant string, limits Quota) (*TenantQuota, error) {
	var q TenantQuota
	if err := c.call(ctx, http.MethodPut, "/quotas/"+url.PathEscape(tenant), limits, &q); err != nil {
		return nil, err
	}
	return &q, nil
}

// AuditEntry is one line of the audit log (GET /audit).
type AuditEntry struct {
	Time       time.Time `json:"ts"`
	Surface    string    `json:"surface"`
	Who        string    `json:"who"`
	KeyName    string    `json:"key_name,omitempty"`
	Tenant     string    `json:"tenant,omitempty"`
	Role       string    `json:"role,omitempty"`
	Action     string    `json:"action"`
	Target     string    `json:"target,omitempty"`
	Status     int       `json:"status"`
	Result     string    `json:"result"`
	Error      string    `json:"error,omitempty"`
	DurationMs float64   `json:"duration_ms"`
	Remote     string    `json:"remote,omitempty"`
}

// Audit returns the newest audit lines (at most limit; 0: the daemon's
// default) the credential may see, of tenant only when not "".
func (c *Client) Audit(ctx context.Context, limit int, tenant string) ([]AuditEntry, error) {
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if tenant != "" {
		q.Set("tenant", tenant)
	}
	resp, err := c.do(ctx, request{method: http.MethodGet, path: "/audit", query: q})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out struct {
		Entries []AuditEntry `json:"entries"`
	}
	if err := decodeJSON(resp, &out); err != nil {
		return nil, err
	}
	return out.Entries, nil
}
