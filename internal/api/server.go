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
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/agentjail/agentjail/internal/apikey"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/observe"
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
	// ReadDir lists the directory at path (entries without "." and "..").
	ReadDir(ctx context.Context, ref, path string) ([]model.FileInfo, error)
	// ReadFile opens the regular file at path; the caller closes the
	// reader. The FileInfo describes the opened file.
	ReadFile(ctx context.Context, ref, path string) (*model.FileInfo, io.ReadCloser, error)
	// WriteFile creates or replaces the file at path with r's bytes; an
	// error reading r aborts the write and is returned wrapped.
	WriteFile(ctx context.Context, ref, path string, r io.Reader, opts model.WriteOptions) (*model.FileInfo, error)
	// Mkdir creates the directory at path and any missing parents.
	Mkdir(ctx context.Context, ref, path string, opts model.WriteOptions) (*model.FileInfo, error)
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
	auth    bool // requires the bearer token
}

// routes is the whole API: every route the server registers, in one place.
var routes = []route{
	{http.MethodGet, "/health", (*server).health, false},
	{http.MethodGet, "/whoami", (*server).whoami, true},
	{http.MethodGet, "/stats", (*server).stats, true},
	{http.MethodPost, "/jails", (*server).createJail, true},
	{http.MethodGet, "/jails", (*server).listJails, true},
	{http.MethodGet, "/jails/{id}", (*server).getJail, true},
	{http.MethodPost, "/jails/{id}/start", (*server).startJail, true},
	{http.MethodPost, "/jails/{id}/stop", (*server).stopJail, true},
	{http.MethodDelete, "/jails/{id}", (*server).destroyJail, true},
	{http.MethodPost, "/jails/{id}/exec", (*server).exec, true},
	{http.MethodPost, "/jails/{id}/exec/stream", (*server).execStream, true},
	{http.MethodGet, "/jails/{id}/files/{path...}", (*server).getFile, true},
	{http.MethodPut, "/jails/{id}/files/{path...}", (*server).putFile, true},
	{http.MethodDelete, "/jails/{id}/files/{path...}", (*server).deleteFile, true},
	{http.MethodPut, "/jails/{id}/network", (*server).putNetwork, true},
	{http.MethodGet, "/jails/{id}/network/log", (*server).networkLog, true},
	{http.MethodGet, "/jails/{id}/events", (*server).events, true},
	{http.MethodGet, "/jails/{id}/processes", (*server).processes, true},
	{http.MethodGet, "/jails/{id}/fs/diff", (*server).fsDiff, true},
	{http.MethodGet, "/jails/{id}/report", (*server).report, true},
	{http.MethodGet, "/jails/{id}/terminal", (*server).terminal, true},
	{http.MethodGet, "/jails/{id}/commands/ws", (*server).commandSocket, true},
	{http.MethodPost, "/jails/{id}/terminal/ticket", (*server).terminalTicket, true},
	{http.MethodGet, "/jails/{id}/terminals", (*server).listTerminals, true},
	{http.MethodGet, "/jails/{id}/recordings", (*server).listRecordings, true},
	{http.MethodGet, "/recordings/{rid}", (*server).getRecording, true},
	{http.MethodPost, "/jails/{id}/snapshot", (*server).createSnapshot, true},
	{http.MethodGet, "/jails/{id}/snapshots", (*server).jailSnapshots, true},
	{http.MethodGet, "/snapshots", (*server).listSnapshots, true},
	{http.MethodGet, "/snapshots/{sid}", (*server).getSnapshot, true},
	{http.MethodDelete, "/snapshots/{sid}", (*server).deleteSnapshot, true},
	{http.MethodPost, "/snapshots/{sid}/restore", (*server).restoreSnapshot, true},
	{http.MethodPost, "/snapshots/{sid}/branch", (*server).branchSnapshot, true},
	{http.MethodGet, "/snapshots/{sid}/diff", (*server).snapshotDiff, true},
	{http.MethodGet, "/diff", (*server).diff, true},
	{http.MethodGet, "/images", (*server).listImages, true},
	{http.MethodPost, "/images/pull", (*server).pullImage, true},
	{http.MethodPost, "/images/load", (*server).loadImages, true},
	{http.MethodPost, "/images/prune", (*server).pruneImages, true},
	{http.MethodGet, "/images/{ref...}", (*server).getImage, true},
	{http.MethodDelete, "/images/{ref...}", (*server).deleteImage, true},
	{http.MethodPost, "/jails/{id}/commit", (*server).commitJail, true},
	{http.MethodGet, "/profiles", (*server).listProfiles, true},
	{http.MethodPut, "/profiles/{name}", (*server).putProfile, true},
	{http.MethodDelete, "/profiles/{name}", (*server).deleteProfile, true},
	{http.MethodPost, "/profiles/{name}/build", (*server).buildProfile, true},
	{http.MethodPost, "/keys", (*server).createKey, true},
	{http.MethodGet, "/keys", (*server).listKeys, true},
	{http.MethodDelete, "/keys/{kid}", (*server).deleteKey, true},
	{http.MethodGet, "/agents", (*server).listAgents, true},
	{http.MethodPost, "/agents/{name}/install", (*server).installAgent, true},
	{http.MethodPost, "/jails/{id}/agent/run", (*server).runAgent, true},
	{http.MethodPost, "/jails/{id}/agent/session", (*server).agentSession, true},
	{http.MethodPost, "/jails/{id}/sync", (*server).syncJail, true},
	{http.MethodPost, "/jails/{id}/previews", (*server).createPreview, true},
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

// wrap adds authentication and error writing to a route's handler.
func (s *server) wrap(rt route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rt.auth && !s.authorized(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="agentjail"`)
			writeErrorBody(w, http.StatusUnauthorized, "unauthorized", "missing or invalid bearer token (Authorization: Bearer <token>: the token in DATA_DIR/api-token, or an admin API key)")
			return
		}
		if err := rt.handler(s, w, r); err != nil {
			s.writeError(w, r, err)
		}
	})
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
