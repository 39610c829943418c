package api

import (
	"context"
	"net/http"
	"strconv"

	"github.com/agentjail/agentjail/internal/audit"
	"github.com/agentjail/agentjail/internal/errdefs"
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
