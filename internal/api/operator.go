package api

import (
	"context"
	"net/http"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/metrics"
)

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
