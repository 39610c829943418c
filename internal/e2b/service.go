// Package e2b is agentjail's E2B-compatible surface: the official e2b SDK
// (JS e2b@2.51.0, unchanged) works against the daemon once E2B_API_KEY,
// E2B_API_URL and E2B_SANDBOX_URL are set (docs/e2b.md).
//
// One handler serves both planes under a path prefix (default /e2b):
//
//   - the control plane (E2B_API_URL = http://HOST/e2b): sandboxes as REST
//     resources (create, connect, list, get, kill, timeout, pause,
//     metrics, fork, snapshots, network), authenticated with an API key
//     the daemon issued (internal/apikey) in X-API-KEY; a sandbox's
//     network options become its jail's network policy (network.go);
//   - the sandbox plane (E2B_SANDBOX_URL = http://HOST/e2b/envd): the
//     connect-go services process.Process and filesystem.Filesystem,
//     /files, /health and /metrics, routed by the E2b-Sandbox-Id header
//     and authenticated by the sandbox's access token; a request whose
//     E2b-Sandbox-Port names another port goes to that port of the
//     sandbox (Options.Ports).
//
// A sandbox is a jail: every operation goes through the jail manager's
// public operations (exec, terminal and file operations of the jail's
// init), so what the SDK does is observed and recorded like anything else.
// Pausing snapshots the jail (processes included) and destroys it;
// resuming restores the snapshot as the sandbox's next jail.
package e2b

import (
	"context"
	"crypto/subtle"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"

	"github.com/agentjail/agentjail/internal/apikey"
	"github.com/agentjail/agentjail/internal/audit"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/observe"
	"github.com/agentjail/agentjail/internal/tenant"
)

// Jails is what the E2B surface needs of the jail manager (*jail.Manager
// implements it). A ref is a jail's id or name; errors carry errdefs kinds.
type Jails interface {
	Create(ctx context.Context, req model.CreateRequest) (*model.Jail, error)
	Get(ctx context.Context, ref string) (*model.Jail, error)
	Destroy(ctx context.Context, ref string) error
	UpdateNetwork(ctx context.Context, ref string, n config.Network) (*model.Jail, error)
	Snapshot(ctx context.Context, ref string, req model.SnapshotRequest) (*model.Snapshot, error)
	ListSnapshots(ctx context.Context, ref string) ([]*model.Snapshot, error)
	Restore(ctx context.Context, sid, name string) (*model.Jail, error)
	Branch(ctx context.Context, sid string, req model.BranchRequest) ([]*model.Jail, error)
	DeleteSnapshot(ctx context.Context, sid string) error
	Report(ctx context.Context, ref string) (*model.Report, error)
	Events(ctx context.Context, ref string, after uint64, types []string) (*observe.Subscription, uint64, error)
	Exec(ctx context.Context, ref string, req model.ExecRequest, out model.ExecOutput) (*model.ExecResult, error)

	Stat(ctx context.Context, ref, path string) (*model.FileInfo, error)
	ReadDir(ctx context.Context, ref, path string) (*model.DirListing, error)
	ReadFile(ctx context.Context, ref, path string) (*model.FileInfo, io.ReadCloser, error)
	WriteFile(ctx context.Context, ref, path string, r io.Reader, opts model.WriteOptions) (*model.FileInfo, error)
	Mkdir(ctx context.Context, ref, path string, opts model.WriteOptions) (*model.FileInfo, error)
	Remove(ctx context.Context, ref, path string, recursive bool) error
	Rename(ctx context.Context, ref, from, to string) (*model.FileInfo, error)
	WatchDir(ctx context.Context, ref, path string, recursive bool) (*initclient.Watch, error)

	StartProcess(ctx context.Context, ref string, req model.ExecRequest, stdin bool, pty *model.TerminalRequest) (*initclient.Process, error)
	AttachProcess(ctx context.Context, ref string, pid int) (*initclient.Process, error)
	ProcessInput(ctx context.Context, ref string, pid int, data []byte, close bool) error
	ResizeProcess(ctx context.Context, ref string, pid, rows, cols int) error
	SignalProcess(ctx context.Context, ref string, pid int, sig string) error
	Commands(ctx context.Context, ref string) ([]initproto.ProcessInfo, error)
}

// Options configures a Service.
type Options struct {
	// DataDir holds the sandbox records (DATA_DIR/e2b).
	DataDir string
	// Keys verifies X-API-KEY.
	Keys *apikey.Store
	// AdminToken, sent as X-API-KEY, acts as an admin key.
	AdminToken string
	// Prefix is the path the surface is served under (default "/e2b").
	Prefix string
	// Log receives diagnostics (default: discard).
	Log *slog.Logger
	// Audit records the control plane's state changes (nil: none).
	Audit *audit.Log
	// Ports serves requests for a sandbox's own ports (E2b-Sandbox-Port
	// other than envd's); nil answers them 501.
	Ports Ports
	// Domain, when set, is the domain of the sandbox host names the daemon
	// answers (WrapHosts), returned to the SDK as the sandboxes' domain.
	Domain string
	// Images builds templates (nil: template builds answer 501).
	Images Images
	// OtherHosts reports whether another handler answers a host name of
	// the same shape (PORT-NAME.localhost previews); WrapHosts leaves it
	// such a host that names no sandbox.
	OtherHosts func(hostport string) bool
}

// Ports forwards requests to ports of jails.
type Ports interface {
	// Forward serves r from port of jail j, HTTP and WebSocket alike,
	// answering an error page when the jail is not running or nothing
	// answers on the port. r's credentials have been checked and removed.
	Forward(w http.ResponseWriter, r *http.Request, j *model.Jail, port int)
}

// Service serves the E2B-compatible API over a jail manager.
type Service struct {
	jails Jails
	opts  Options
	log   *slog.Logger
	store *store
	// templates are the built templates and their builds.
	templates *templates
	// volumes are the volumes sandboxes mount.
	volumes *volumes
	mux     *http.ServeMux
	envd    http.Handler
	closed  chan struct{}

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	watchers  map[string]*pollWatcher
}

// New opens the sandbox records of opts.DataDir and re-arms their
// timeouts; sandboxes whose jail is gone are dropped.
func New(ctx context.Context, jails Jails, opts Options) (*Service, error) {
	if opts.Prefix == "" {
		opts.Prefix = "/e2b"
	}
	opts.Prefix = strings.TrimSuffix(opts.Prefix, "/")
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	st, err := openStore(opts.DataDir)
	if err != nil {
		return nil, err
	}
	tpl, orphans, err := openTemplates(opts.DataDir)
	if err != nil {
		return nil, err
	}
	for _, j := range orphans {
		if err := jails.Destroy(ctx, j); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			opts.Log.Warn("destroying the jail of an interrupted template build", "jail", j, "err", err)
		}
	}
	vols, err := openVolumes(opts.DataDir)
	if err != nil {
		return nil, err
	}
	s := &Service{jails: jails, opts: opts, log: opts.Log, store: st, templates: tpl, volumes: vols, sandboxes: map[string]*sandbox{},
		watchers: map[string]*pollWatcher{}, closed: make(chan struct{})}
	recs, err := st.load()
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		sb := newSandbox(r)
		if r.State == stateRunning {
			if _, err := jails.Get(ctx, r.JailID); errors.Is(err, errdefs.ErrNotFound) {
				s.log.Warn("e2b sandbox lost its jail; forgetting it", "sandbox", r.ID, "jail", r.JailID)
				st.remove(r.ID)
				continue
			}
		}
		s.sandboxes[r.ID] = sb
		s.arm(sb)
	}
	s.routes()
	return s, nil
}

// Close stops the timeout timers (sandboxes keep running and are picked up
// by the next Service on the same data dir).
func (s *Service) Close() {
	close(s.closed)
	// Builds under way are stopped (their jails removed); they are
	// recorded as failed.
	s.templates.mu.Lock()
	for _, rb := range s.templates.running {
		rb.cancel()
	}
	s.templates.mu.Unlock()
	s.templates.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sb := range s.sandboxes {
		sb.stopTimer()
	}
	for _, w := range s.watchers {
		w.close()
	}
}

// Prefix is the path the surface is served under.
func (s *Service) Prefix() string { return s.opts.Prefix }

// ServeHTTP serves the control plane under Prefix, the sandbox plane under
// Prefix/envd, and the presigned /files URLs the SDK builds at the root.
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	switch {
	case p == "/files":
		s.envdFiles(w, r)
	case p == s.opts.Prefix+"/envd" || strings.HasPrefix(p, s.opts.Prefix+"/envd/"):
		http.StripPrefix(s.opts.Prefix+"/envd", s.envd).ServeHTTP(w, r)
	case strings.HasPrefix(p, s.opts.Prefix+"/"):
		http.StripPrefix(s.opts.Prefix, s.mux).ServeHTTP(w, r)
	default:
		writeAPIError(w, http.StatusNotFound, "no route for "+r.Method+" "+p)
	}
}

// withCaller is ctx as the jail manager sees c's requests.
func withCaller(ctx context.Context, c caller) context.Context {
	return tenant.NewContext(ctx, c.principal())
}

// caller is who sent a control-plane request.
type caller struct {
	key apikey.Key
}

// principal is the caller as the jail manager knows it.
func (c caller) principal() tenant.Principal {
	if c.key.ID == adminTokenID {
		return tenant.Token
	}
	return tenant.FromKey(c.key)
}

// adminTokenID stands for the daemon's token sent as X-API-KEY.
const adminTokenID = "admin-token"

func (c caller) sees(sb *sandbox) bool {
	return c.key.Role == apikey.RoleAdmin || c.key.Tenant == sb.rec.Tenant
}

// authenticate checks X-API-KEY: a key of the store, or the admin token.
func (s *Service) authenticate(r *http.Request) (caller, error) {
	k := r.Header.Get("X-Api-Key")
	if k == "" {
		return caller{}, errdefs.New(errdefs.ErrUnauthorized, "missing X-API-KEY (an API key from `agentjail keys create`)")
	}
	if s.opts.AdminToken != "" && subtle.ConstantTimeCompare([]byte(k), []byte(s.opts.AdminToken)) == 1 {
		return caller{key: apikey.Key{ID: adminTokenID, Tenant: apikey.DefaultTenant, Role: apikey.RoleAdmin}}, nil
	}
	if s.opts.Keys == nil {
		return caller{}, errdefs.New(errdefs.ErrUnauthorized, "invalid API key")
	}
	key, err := s.opts.Keys.Verify(k)
	if err != nil {
		return caller{}, err
	}
	return caller{key: key}, nil
}

// lookup returns the sandbox id as c may see it (ErrNotFound otherwise).
func (s *Service) lookup(c caller, id string) (*sandbox, error) {
	s.mu.Lock()
	sb := s.sandboxes[id]
	s.mu.Unlock()
	if sb == nil || !c.sees(sb) {
		return nil, errdefs.NotFoundf("sandbox %q not found", id)
	}
	return sb, nil
}

// sandboxByID returns the sandbox id whatever its tenant, or nil.
func (s *Service) sandboxByID(id string) *sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sandboxes[id]
}

// templateConfig turns a template name into a jail config: "base" (or
// none) is the daemon's default; other names are image references.
func templateConfig(template string) config.Config {
	var cfg config.Config
	if template != "" && template != defaultTemplate {
		cfg.Isolation.Filesystem.Rootfs = "image:" + template
	}
	return cfg
}

// defaultTemplate is the template of the daemon's default jail.
const defaultTemplate = "base"
