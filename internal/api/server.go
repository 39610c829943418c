// Package api is agentjail's REST API: the HTTP handlers in front of the
// jail manager, bearer-token authentication, request logging, and the one
// function that maps error kinds (internal/errdefs) to HTTP statuses.
//
// Bodies are decoded strictly here (unknown keys are a 400 naming the field);
// the Service validates the decoded values (422) and the jail's state (409).
// The contract is documented in api/openapi.yaml, which a test keeps in step
// with the route table below.
package api

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentjail/agentjail/internal/apikey"
	"github.com/agentjail/agentjail/internal/audit"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/metrics"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/observe"
	"github.com/agentjail/agentjail/internal/tenant"
	"github.com/agentjail/agentjail/internal/tracing"
)

// Service is what the API serves; *jail.Manager implements it. A ref is a
// jail's id or its unique name. Errors carry an errdefs kind, which decides
// the HTTP status.
type Service interface {
	// Create makes a jail from req (and starts it unless req.Start is
	// false). It validates the config (ErrUnprocessable naming the field)
	// and the name's uniqueness (ErrConflict).
	Create(ctx context.Context, req model.CreateRequest) (*model.Jail, error)
	// List returns every jail, without live stats.
	List(ctx context.Context) ([]*model.Jail, error)
	// Get returns one jail with its live Stats (ErrNotFound if ref names none).
	Get(ctx context.Context, ref string) (*model.Jail, error)
	// Start starts a created or stopped jail (ErrConflict from other states).
	Start(ctx context.Context, ref string) (*model.Jail, error)
	// Stop asks the jail's processes to exit, kills them after grace, and
	// returns the stopped jail (ErrConflict if it is not running).
	Stop(ctx context.Context, ref string, grace time.Duration) (*model.Jail, error)
	// Destroy removes the jail and everything it owns.
	Destroy(ctx context.Context, ref string) error
	// Exec runs req.Cmd in the running jail. With out == nil the output is
	// buffered: the result carries stdout and stderr, each capped at
	// model.MaxExecOutput (Truncated set when bytes were dropped). With
	// out != nil every chunk goes to out as it happens and the result's
	// Stdout and Stderr are empty; an error from out cancels the command.
	// Cancelling ctx kills the command and its descendants. Stdin and the
	// outputs are raw bytes held in Go strings: the API does any base64
	// conversion (ExecRequest.Encoding).
	Exec(ctx context.Context, ref string, req model.ExecRequest, out model.ExecOutput) (*model.ExecResult, error)
	// Stat describes the absolute jail path without following a final
	// symlink.
	Stat(ctx context.Context, ref, path string) (*model.FileInfo, error)
	// ReadDir lists the directory at path (entries without "." and "..",
	// sorted by name; at most 100 000 of them, see DirListing.Truncated).
	ReadDir(ctx context.Context, ref, path string) (*model.DirListing, error)
	// ReadFile opens the regular file at path; the caller closes the
	// reader. The FileInfo describes the opened file.
	ReadFile(ctx context.Context, ref, path string) (*model.FileInfo, io.ReadCloser, error)
	// WriteFile creates or replaces the file at path with r's bytes; an
	// error reading r aborts the write and is returned wrapped.
	WriteFile(ctx context.Context, ref, path string, r io.Reader, opts model.WriteOptions) (*model.FileInfo, error)
	// Mkdir creates the directory at path and any missing parents.
	Mkdir(ctx context.Context, ref, path string, opts model.WriteOptions) (*model.FileInfo, error)
	// Symlink creates the symbolic link path → target (ErrConflict when
	// path exists); opts.Mode does not apply.
	Symlink(ctx context.Context, ref, path, target string, opts model.WriteOptions) (*model.FileInfo, error)
	// Remove deletes path; a non-empty directory needs recursive.
	Remove(ctx context.Context, ref, path string, recursive bool) error
	// Access reports whether user (default: the jail's user) may read or
	// write (mode "read" or "write") path.
	Access(ctx context.Context, ref, path, mode, user string) (*model.AccessResult, error)
	// UpdateNetwork replaces the jail's network policy; a running jail
	// obeys it for new connections at once (ErrConflict when the mode
	// would change while it runs).
	UpdateNetwork(ctx context.Context, ref string, n config.Network) (*model.Jail, error)
	// EventLog opens one of the jail's JSONL event files ("network",
	// "syscalls", "filesystem", "processes"); an empty reader when none was
	// written yet. The caller closes it.
	EventLog(ctx context.Context, ref, stream string) (io.ReadCloser, error)
	// Events subscribes to the jail's live event stream from sequence
	// number after (0: the oldest event the ring still holds) for the given
	// types ("syscall", "file", "net", "proc", "lost"; none: all). It also
	// returns the newest sequence number at the time of subscribing.
	Events(ctx context.Context, ref string, after uint64, types []string) (*observe.Subscription, uint64, error)
	// Processes returns the jail's observed process tree.
	Processes(ctx context.Context, ref string) (*model.ProcessTree, error)
	// FsDiff lists what the jail changed in its root filesystem; text adds
	// unified diffs of changed text files.
	FsDiff(ctx context.Context, ref string, text bool) (*model.FsDiff, error)
	// Report returns the whole observation of the jail as one document.
	Report(ctx context.Context, ref string) (*model.Report, error)
	// Health reports the daemon's state; it never fails.
	Health(ctx context.Context) model.Health
	// TerminalService serves the terminal and recording routes.
	TerminalService
	// SnapshotService serves the snapshot, restore, branch and diff routes.
	SnapshotService
}

// Body limits.
const (
	// MaxJSONBody caps every JSON or YAML request body.
	MaxJSONBody = 4 << 20
	// MaxUpload caps a file uploaded with PUT /jails/{id}/files/{path}.
	MaxUpload = 1 << 30
)

// DefaultStopTimeout is the grace period of POST /jails/{id}/stop without
// a timeout_s.
const DefaultStopTimeout = 10 * time.Second

// handlerFunc is a route's handler. It returns an error instead of writing
// one, so that every error goes through writeError.
type handlerFunc func(s *server, w http.ResponseWriter, r *http.Request) error

// route is one entry of the route table.
type route struct {
	method  string
	pattern string // a net/http ServeMux path pattern, without the method
	handler handlerFunc
	// access says which credentials may call the route; every route
	// states one, and what it reaches belongs to the caller's tenant
	// (internal/tenant: the jail manager's look-ups check it).
	access access
}

// access is who may call a route.
type access int

// The access classes of routes.
const (
	// public routes need no credential.
	public access = iota + 1
	// read routes take any credential (viewer, user, admin, the token);
	// they show only the caller's tenant's resources.
	read
	// write routes change state: a user or admin key, or the token. They
	// are written to the audit log.
	write
	// adminOnly routes change what every tenant shares (the image
	// store's prune, profiles, installed agents, quotas): an admin key or
	// the token.
	adminOnly
	// tokenOnly routes manage the API keys: the token alone.
	tokenOnly
)

// audited reports whether requests to rt are written to the audit log:
// those that change state, or could (a terminal or command socket), and
// the admin and token routes but their plain reads.
func (rt route) audited() bool {
	return rt.access == write || rt.access >= adminOnly && rt.method != http.MethodGet
}

// routes is the whole API: every route the server registers, in one place.
var routes = []route{
	{http.MethodGet, "/health", (*server).health, public},
	{http.MethodGet, "/whoami", (*server).whoami, read},
	{http.MethodGet, "/stats", (*server).stats, read},
	{http.MethodPost, "/jails", (*server).createJail, write},
	{http.MethodGet, "/jails", (*server).listJails, read},
	{http.MethodGet, "/jails/{id}", (*server).getJail, read},
	{http.MethodPost, "/jails/{id}/start", (*server).startJail, write},
	{http.MethodPost, "/jails/{id}/stop", (*server).stopJail, write},
	{http.MethodDelete, "/jails/{id}", (*server).destroyJail, write},
	{http.MethodPost, "/jails/{id}/exec", (*server).exec, write},
	{http.MethodPost, "/jails/{id}/exec/stream", (*server).execStream, write},
	{http.MethodGet, "/jails/{id}/files/{path...}", (*server).getFile, read},
	{http.MethodPut, "/jails/{id}/files/{path...}", (*server).putFile, write},
	{http.MethodDelete, "/jails/{id}/files/{path...}", (*server).deleteFile, write},
	{http.MethodPut, "/jails/{id}/network", (*server).putNetwork, write},
	{http.MethodGet, "/jails/{id}/network/log", (*server).networkLog, read},
	{http.MethodGet, "/jails/{id}/events", (*server).events, read},
	{http.MethodGet, "/jails/{id}/processes", (*server).processes, read},
	{http.MethodGet, "/jails/{id}/fs/diff", (*server).fsDiff, read},
	{http.MethodGet, "/jails/{id}/report", (*server).report, read},
	{http.MethodGet, "/jails/{id}/terminal", (*server).terminal, write},
	{http.MethodGet, "/jails/{id}/commands/ws", (*server).commandSocket, write},
	{http.MethodPost, "/jails/{id}/terminal/ticket", (*server).terminalTicket, write},
	{http.MethodGet, "/jails/{id}/terminals", (*server).listTerminals, read},
	{http.MethodGet, "/jails/{id}/recordings", (*server).listRecordings, read},
	{http.MethodGet, "/recordings/{rid}", (*server).getRecording, read},
	{http.MethodPost, "/jails/{id}/snapshot", (*server).createSnapshot, write},
	{http.MethodGet, "/jails/{id}/snapshots", (*server).jailSnapshots, read},
	{http.MethodGet, "/snapshots", (*server).listSnapshots, read},
	{http.MethodGet, "/snapshots/{sid}", (*server).getSnapshot, read},
	{http.MethodDelete, "/snapshots/{sid}", (*server).deleteSnapshot, write},
	{http.MethodPost, "/snapshots/{sid}/restore", (*server).restoreSnapshot, write},
	{http.MethodPost, "/snapshots/{sid}/branch", (*server).branchSnapshot, write},
	{http.MethodGet, "/snapshots/{sid}/diff", (*server).snapshotDiff, read},
	{http.MethodPost, "/snapshots/{sid}/push", (*server).pushSnapshot, write},
	{http.MethodPost, "/snapshots/pull", (*server).pullSnapshot, write},
	{http.MethodGet, "/diff", (*server).diff, read},
	{http.MethodGet, "/images", (*server).listImages, read},
	{http.MethodPost, "/images/pull", (*server).pullImage, write},
	{http.MethodPost, "/images/load", (*server).loadImages, write},
	{http.MethodPost, "/images/prune", (*server).pruneImages, adminOnly},
	{http.MethodGet, "/images/{ref...}", (*server).getImage, read},
	{http.MethodDelete, "/images/{ref...}", (*server).deleteImage, write},
	{http.MethodPost, "/jails/{id}/commit", (*server).commitJail, write},
	{http.MethodGet, "/profiles", (*server).listProfiles, read},
	{http.MethodPut, "/profiles/{name}", (*server).putProfile, adminOnly},
	{http.MethodDelete, "/profiles/{name}", (*server).deleteProfile, adminOnly},
	{http.MethodPost, "/profiles/{name}/build", (*server).buildProfile, write},
	{http.MethodPost, "/keys", (*server).createKey, tokenOnly},
	{http.MethodGet, "/keys", (*server).listKeys, tokenOnly},
	{http.MethodDelete, "/keys/{kid}", (*server).deleteKey, tokenOnly},
	{http.MethodGet, "/agents", (*server).listAgents, read},
	{http.MethodPost, "/agents/{name}/install", (*server).installAgent, adminOnly},
	{http.MethodPost, "/jails/{id}/agent/run", (*server).runAgent, write},
	{http.MethodPost, "/jails/{id}/agent/session", (*server).agentSession, write},
	{http.MethodPost, "/jails/{id}/sync", (*server).syncJail, write},
	{http.MethodPost, "/jails/{id}/previews", (*server).createPreview, write},
	{http.MethodGet, "/quotas/{tenant}", (*server).getQuota, read},
	{http.MethodPut, "/quotas/{tenant}", (*server).putQuota, adminOnly},
	{http.MethodGet, "/audit", (*server).getAudit, read},
	{http.MethodGet, "/metrics", (*server).getMetrics, adminOnly},
	{http.MethodPost, "/mcp", (*server).serveMCP, read},
}

type server struct {
	svc   Service
	token string
	log   *slog.Logger
	mux   *http.ServeMux
	// tickets are the unused terminal tickets.
	tickets ticketStore
	// keys is the API key store (nil: the /keys routes answer 501).
	keys *apikey.Store
	// images serves the image routes (nil: they answer 501).
	images ImageService
	// mounts are handlers served below a path prefix (WithMount).
	mounts []mount
	// agents serves the agent routes (nil: 501).
	agents AgentService
	// previews makes signed preview links (nil: 501).
	previews PreviewService
	// commands serves the background command WebSocket (nil: 501).
	commands CommandService
	// audit records every request that changes state (nil: none).
	audit *audit.Log
	// quotas serves the quota routes (nil: 501).
	quotas QuotaService
	// metrics records requests and operation latencies, and serves
	// GET /metrics (nil: 501).
	metrics *metrics.Metrics
	// makeMCP makes the MCP handler from the API's own (nil: 501); mcp
	// is what it made.
	makeMCP func(api http.Handler) http.Handler
	mcp     http.Handler
}

// NewServer returns the API's handler: the routes of the route table over
// svc, every route but GET /health guarded by the bearer token, with
// request logging and panic recovery. token must not be empty. A nil log
// discards logs.
func NewServer(svc Service, token string, log *slog.Logger, opts ...Option) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &server{svc: svc, token: token, log: log, mux: http.NewServeMux()}
	for _, o := range opts {
		o(s)
	}
	for _, rt := range routes {
		s.mux.Handle(rt.method+" "+rt.pattern, s.wrap(rt))
	}
	for _, m := range s.mounts {
		s.mux.Handle(m.prefix, m.h)
	}
	if s.makeMCP != nil {
		s.mcp = s.makeMCP(http.HandlerFunc(s.serveHTTP))
	}
	return http.HandlerFunc(s.serveHTTP)
}

// serveHTTP logs the request, recovers panics, and answers requests that
// match no route (404) or no method of a route (405) with JSON errors.
func (s *server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := &recorder{ResponseWriter: w}
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			s.log.Error("handler panicked", "method", r.Method, "path", r.URL.EscapedPath(), "panic", p)
			if !rec.wroteHeader {
				writeErrorBody(rec, http.StatusInternalServerError, "internal", "internal error")
			}
		}
		s.log.Info("request", "method", r.Method, "path", r.URL.EscapedPath(),
			"status", rec.status(), "bytes", rec.bytes, "duration_ms", float64(time.Since(start).Microseconds())/1000)
	}()
	h, pattern := s.mux.Handler(r)
	if pattern == "" {
		s.noRoute(rec, r, h)
		return
	}
	s.mux.ServeHTTP(rec, r)
}

// noRoute answers a request the mux has no route for, turning the mux's
// plain-text answer (404, 405 with Allow, or a redirect to the clean path)
// into the API's JSON error body.
func (s *server) noRoute(w http.ResponseWriter, r *http.Request, h http.Handler) {
	probe := &headerProbe{header: http.Header{}}
	h.ServeHTTP(probe, r)
	switch probe.code {
	case http.StatusMethodNotAllowed:
		w.Header().Set("Allow", probe.header.Get("Allow"))
		writeErrorBody(w, probe.code, "method_not_allowed", r.Method+" is not allowed on "+r.URL.EscapedPath())
	case http.StatusMovedPermanently, http.StatusPermanentRedirect, http.StatusTemporaryRedirect:
		w.Header().Set("Location", probe.header.Get("Location"))
		writeErrorBody(w, probe.code, "redirect", "the path is not clean; use "+probe.header.Get("Location"))
	default:
		writeErrorBody(w, http.StatusNotFound, "not_found", "no route for "+r.Method+" "+r.URL.EscapedPath())
	}
}

// wrap adds authentication, the route's access check, the caller's
// principal in the request's context (which the jail manager's look-ups
// check against each resource's tenant), error writing, and the audit
// line of a route that changes state.
func (s *server) wrap(rt route) http.Handler {
	name := rt.method + " " + rt.pattern
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ctx := otel.GetTextMapPropagator().Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := tracing.Tracer().Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.route", rt.pattern), attribute.String("http.request.method", rt.method)))
		if id := r.PathValue("id"); id != "" {
			span.SetAttributes(tracing.JailID.String(id))
		}
		r = r.WithContext(ctx)
		var who tenant.Principal
		var err error
		defer func() {
			if who.Kind != "" {
				span.SetAttributes(tracing.JailTenant.String(who.Tenant))
			}
			if rec, ok := w.(*recorder); ok {
				span.SetAttributes(attribute.Int("http.response.status_code", rec.status()))
			}
			tracing.End(span, err)
		}()
		if rt.access != public {
			who, err = s.authenticate(r)
			if err == nil {
				err = rt.access.allows(who)
			}
			if err == nil {
				r = r.WithContext(tenant.NewContext(r.Context(), who))
			}
		}
		if err == nil {
			err = rt.handler(s, w, r)
		} else if errors.Is(err, errdefs.ErrUnauthorized) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="agentjail"`)
		}
		if err != nil {
			s.writeError(w, r, err)
		}
		if rt.audited() {
			s.auditRequest(w, r, rt, who, err, start)
		}
		if s.metrics != nil {
			status := http.StatusOK
			if rec, ok := w.(*recorder); ok {
				status = rec.status()
			}
			s.metrics.Request(rt.method+" "+rt.pattern, status)
			if op := timedOps[rt.method+" "+rt.pattern]; op != "" {
				s.metrics.Observe(op, time.Since(start), err != nil || status >= 400)
			}
		}
	})
}

// auditRequest writes the audit line of a request to a route that
// changes state.
func (s *server) auditRequest(w http.ResponseWriter, r *http.Request, rt route, who tenant.Principal, err error, start time.Time) {
	if s.audit == nil {
		return
	}
	status := http.StatusOK
	if rec, ok := w.(*recorder); ok {
		status = rec.status()
	}
	e := audit.Entry{
		Surface: surfaceOf(r.Context()), Who: "anonymous", Action: rt.method + " " + rt.pattern, Target: r.URL.EscapedPath(),
		Status: status, Result: audit.ResultOf(status), Remote: r.RemoteAddr,
		DurationMs: float64(time.Since(start).Microseconds()) / 1000,
	}
	if who.Kind != "" {
		e.Who, e.KeyName, e.Tenant, e.Role = who.Who(), who.KeyName, who.Tenant, string(who.Role)
	}
	if err != nil {
		e.Error = err.Error()
		if e.Result == "ok" {
			e.Result = "error"
		}
	}
	if werr := s.audit.Write(e); werr != nil {
		s.log.Error("writing the audit log", "err", werr)
	}
}

// recorder remembers the status and byte count of a response for logging.
type recorder struct {
	http.ResponseWriter
	code        int
	bytes       int64
	wroteHeader bool
}

func (r *recorder) WriteHeader(code int) {
	if !r.wroteHeader {
		r.code, r.wroteHeader = code, true
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if !r.wroteHeader {
		r.WriteHeader(http.StatusOK)
	}
	n, err := r.ResponseWriter.Write(b)
	r.bytes += int64(n)
	return n, err
}

// Unwrap lets http.ResponseController reach the connection's Flush.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// Flush sends what is buffered to the client, for handlers that assert
// http.Flusher (connect-go's streams do).
func (r *recorder) Flush() {
	if !r.wroteHeader {
		r.WriteHeader(http.StatusOK)
	}
	_ = http.NewResponseController(r.ResponseWriter).Flush()
}

func (r *recorder) status() int {
	if !r.wroteHeader {
		return http.StatusOK
	}
	return r.code
}

// headerProbe captures the status and headers a mux fallback handler
// writes, discarding its body.
type headerProbe struct {
	header http.Header
	code   int
}

func (p *headerProbe) Header() http.Header { return p.header }

func (p *headerProbe) WriteHeader(code int) {
	if p.code == 0 {
		p.code = code
	}
}

func (p *headerProbe) Write(b []byte) (int, error) {
	p.WriteHeader(http.StatusOK)
	return len(b), nil
}
