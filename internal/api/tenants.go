package api

import (
	"context"
	"net/http"
	"strconv"

	"github.com/agentjail/agentjail/internal/audit"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/metrics"
	"github.com/agentjail/agentjail/internal/tenant"
)

// QuotaService serves the quota routes; *jail.Manager implements it.
type QuotaService interface {
	// Quota returns tenant t's limits and what it holds (ErrNotFound for
	// another tenant than the caller's, unless the caller is an admin).
	Quota(ctx context.Context, t string) (tenant.Status, error)
	// SetQuota replaces tenant t's limits (zero fields: no limit).
	SetQuota(ctx context.Context, t string, q tenant.Quota) (tenant.Status, error)
}

// WithQuotas serves the quota routes (/quotas/{tenant}) over q.
func WithQuotas(q QuotaService) Option { return func(s *server) { s.quotas = q } }

// WithAudit writes an audit line for every request that changes state.
func WithAudit(l *audit.Log) Option { return func(s *server) { s.audit = l } }

func (s *server) quotaService() (QuotaService, error) {
	if s.quotas == nil {
		return nil, errdefs.NotImplementedf("this daemon keeps no quotas")
	}
	return s.quotas, nil
}

func (s *server) getQuota(w http.ResponseWriter, r *http.Request) error {
	q, err := s.quotaService()
	if err != nil {
		return err
	}
	st, err := q.Quota(r.Context(), r.PathValue("tenant"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

func (s *server) putQuota(w http.ResponseWriter, r *http.Request) error {
	q, err := s.quotaService()
	if err != nil {
		return err
	}
	var req tenant.Quota
	if err := decodeBody(w, r, &req, false, true); err != nil {
		return err
	}
	st, err := q.SetQuota(r.Context(), r.PathValue("tenant"), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

// AuditList is the body of GET /audit.
type AuditList struct {
	Entries []audit.Entry `json:"entries"`
}

// maxAuditLimit bounds GET /audit?limit=.
const maxAuditLimit = 10000

// getAudit serves the newest audit lines the caller may see: an admin's
// every line (of one tenant with ?tenant=), anyone else's those of its
// own tenant.
func (s *server) getAudit(w http.ResponseWriter, r *http.Request) error {
	if s.audit == nil {
		return errdefs.NotImplementedf("this daemon keeps no audit log")
	}
	limit := 100
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxAuditLimit {
			return errdefs.Invalidf("limit: %q must be 1 to %d", v, maxAuditLimit)
		}
		limit = n
	}
	who, _ := tenant.FromContext(r.Context())
	only := r.URL.Query().Get("tenant")
	list, err := s.audit.Tail(limit, func(e *audit.Entry) bool {
		return tenant.Visible(r.Context(), e.Tenant) && e.Tenant != "" && (only == "" || e.Tenant == only) ||
			who.Admin() && only == "" && e.Tenant == ""
	})
	if err != nil {
		return err
	}
	if list == nil {
		list = []audit.Entry{}
	}
	writeJSON(w, http.StatusOK, AuditList{Entries: list})
	return nil
}

// WithMetrics records requests and operation latencies in m and serves
// GET /metrics from it.
func WithMetrics(m *metrics.Metrics) Option { return func(s *server) { s.metrics = m } }

// timedOps maps the routes whose latency is an operation's to the
// operation (metrics.Ops).
var timedOps = map[string]string{
	"POST /jails":                   "create",
	"POST /jails/{id}/exec":         "exec",
	"POST /jails/{id}/exec/stream":  "exec",
	"POST /jails/{id}/snapshot":     "snapshot",
	"POST /snapshots/{sid}/restore": "restore",
	"POST /snapshots/{sid}/branch":  "branch",
	"DELETE /jails/{id}":            "destroy",
}

// getMetrics serves the Prometheus metrics (to an admin: they name every
// tenant's jails).
func (s *server) getMetrics(w http.ResponseWriter, r *http.Request) error {
	if s.metrics == nil {
		return errdefs.NotImplementedf("this daemon keeps no metrics")
	}
	s.metrics.Handler().ServeHTTP(w, r)
	return nil
}

type surfaceKey struct{}

// WithSurface marks ctx as that of a request made in process on behalf of
// another surface ("mcp"): the audit log names it instead of "api".
func WithSurface(ctx context.Context, surface string) context.Context {
	return context.WithValue(ctx, surfaceKey{}, surface)
}

// surfaceOf is the surface a request came in through.
func surfaceOf(ctx context.Context) string {
	if s, ok := ctx.Value(surfaceKey{}).(string); ok {
		return s
	}
	return "api"
}

// WithMCP serves the MCP tools at POST /mcp with the handler mk makes,
// given the API's own handler: the tools call the API in process with
// the caller's credential, so they reach what that credential may.
func WithMCP(mk func(api http.Handler) http.Handler) Option {
	return func(s *server) { s.makeMCP = mk }
}

// serveMCP hands an MCP request (streamable HTTP, stateless) to the MCP
// server. Any valid credential may call it; each tool is then an API
// request with that credential, checked (tenant, role) and audited as
// one.
func (s *server) serveMCP(w http.ResponseWriter, r *http.Request) error {
	if s.mcp == nil {
		return errdefs.NotImplementedf("this daemon does not serve MCP")
	}
	s.mcp.ServeHTTP(w, r)
	return nil
}
