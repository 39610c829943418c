// Package console serves agentjail's web console: the pages embedded in the
// binary (package web) at /, a login that turns the API token or an API key
// into a browser session, and the REST API under /api/ for those pages.
//
// A session is an HttpOnly, SameSite=Strict cookie naming a server-side
// record that holds the credential the browser logged in with. A request
// under /api/ is handed to the API handler with that credential as its
// bearer token, so the API alone decides what a session may do. What a
// cookie cannot protect is checked here, on every request under /api/ and
// /console/: a request from another origin (Sec-Fetch-Site, Origin) is
// refused, state-changing calls must carry the session's CSRF token in
// X-CSRF-Token, and a WebSocket must come from the console's own origin.
// No response carries CORS headers, so nothing is readable by a page on
// another origin; pages may not be framed.
//
// Every other path goes to the API handler unchanged: clients with a
// bearer token use the API at the root as before.
package console

import (
	"encoding/json"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"time"

	"github.com/agentjail/agentjail/web"
)

// Cookie and header names.
const (
	// CookieName is the session cookie.
	CookieName = "agentjail_session"
	// CSRFHeader carries the session's CSRF token on state-changing calls.
	CSRFHeader = "X-CSRF-Token"
)

// Defaults of Options.
const (
	DefaultSessionTTL  = 12 * time.Hour
	DefaultMaxSessions = 1024
	// maxLoginBody bounds the body of POST /console/login.
	maxLoginBody = 16 << 10
)

// WhoamiPath is the API route a login checks its credential with: it needs
// authentication and describes who the credential belongs to.
const WhoamiPath = "/whoami"

// Options configure the console.
type Options struct {
	// API is the REST API's handler (api.NewServer). Required.
	API http.Handler
	// SessionTTL is how long a login lasts (default DefaultSessionTTL).
	SessionTTL time.Duration
	// MaxSessions bounds the live sessions; the oldest is ended when a new
	// login would exceed it (default DefaultMaxSessions).
	MaxSessions int
	// Log receives the console's own messages (nil: discarded).
	Log *slog.Logger
}

// Console is the daemon's root handler: the console's pages and session
// endpoints, the API for the pages under /api/, and the API itself at
// every other path.
type Console struct {
	api      http.Handler
	sessions *sessionStore
	log      *slog.Logger
	mux      *http.ServeMux
	assets   fs.FS
}

var _ http.Handler = (*Console)(nil)

// New returns the console in front of opts.API.
func New(opts Options) *Console {
	if opts.SessionTTL <= 0 {
		opts.SessionTTL = DefaultSessionTTL
	}
	if opts.MaxSessions <= 0 {
		opts.MaxSessions = DefaultMaxSessions
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	c := &Console{
		api:      opts.API,
		sessions: newSessionStore(opts.SessionTTL, opts.MaxSessions),
		log:      opts.Log,
		mux:      http.NewServeMux(),
		assets:   web.Static(),
	}
	c.mux.HandleFunc("GET /{$}", c.page("index.html"))
	c.mux.HandleFunc("GET /login", c.loginPage)
	c.mux.HandleFunc("GET /console/assets/{path...}", c.asset)
	c.mux.HandleFunc("POST /console/login", c.login)
	c.mux.HandleFunc("POST /console/logout", c.logout)
	c.mux.HandleFunc("GET /console/session", c.sessionInfo)
	c.mux.HandleFunc("/console/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "no console route for "+r.Method+" "+r.URL.EscapedPath())
	})
	c.mux.HandleFunc("/api/", c.proxy)
	c.mux.Handle("/", c.api)
	return c
}

// ServeHTTP routes the request.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mux.ServeHTTP(w, r)
}

// publicAssets are the assets the login page needs; every other asset
// needs a session.
var publicAssets = map[string]bool{"console.css": true, "login.js": true, "favicon.svg": true}

// contentSecurityPolicy allows the console's own scripts, styles (xterm.js
// and the player set inline styles), WebAssembly (the player's terminal
// emulator) and connections to its own origin only; no framing.
const contentSecurityPolicy = "default-src 'self'; script-src 'self' 'wasm-unsafe-eval'; " +
	"style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; " +
	"font-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'"

// secureHeaders sets the headers every console response carries.
func secureHeaders(h http.Header) {
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
}

// current returns the request's live session, or nil.
func (c *Console) current(r *http.Request) *session {
	ck, err := r.Cookie(CookieName)
	if err != nil {
		return nil
	}
	return c.sessions.get(ck.Value)
}

// page serves an HTML page of the console to a logged-in browser; others
// are sent to the login page.
func (c *Console) page(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		secureHeaders(w.Header())
		if c.current(r) == nil {
			w.Header().Set("Cache-Control", "no-store")
			http.Redirect(w, r, "/login", http.StatusSeeOther)
			return
		}
		c.serveFile(w, r, name, "no-store")
	}
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	secureHeaders(w.Header())
	c.serveFile(w, r, "login.html", "no-store")
}

func (c *Console) asset(w http.ResponseWriter, r *http.Request) {
	secureHeaders(w.Header())
	p := r.PathValue("path")
	if !fs.ValidPath(p) || p == "login.html" || p == "index.html" {
		writeError(w, http.StatusNotFound, "not_found", "no asset "+p)
		return
	}
	if !publicAssets[p] && c.current(r) == nil {
		writeError(w, http.StatusUnauthorized, "unauthorized", "log in first")
		return
	}
	c.serveFile(w, r, p, "no-cache")
}

// serveFile writes an embedded file.
func (c *Console) serveFile(w http.ResponseWriter, r *http.Request, name, cache string) {
	f, err := c.assets.Open(name)
	if err != nil {
		writeError(w, http.StatusNotFound, "not_found", "no asset "+name)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.IsDir() {
		writeError(w, http.StatusNotFound, "not_found", "no asset "+name)
		return
	}
	w.Header().Set("Cache-Control", cache)
	http.ServeContent(w, r, name, time.Time{}, f.(io.ReadSeeker))
}

// sameOrigin reports whether r comes from a page of the console's own
// origin, or from no page at all (a request the user typed). Browsers send
// Sec-Fetch-Site; older ones at least Origin on cross-origin requests.
func sameOrigin(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
	default:
		return false
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host) {
			return false
		}
	}
	return true
}

// isWebSocket reports whether r asks to upgrade to a WebSocket.
func isWebSocket(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

// loginRequest is the body of POST /console/login.
type loginRequest struct {
	// Credential is the API token or an API key.
	Credential string `json:"credential"`
}

// SessionInfo is the answer of POST /console/login and GET
// /console/session.
type SessionInfo struct {
	CSRFToken string          `json:"csrf_token"`
	ExpiresAt time.Time       `json:"expires_at"`
	Whoami    json.RawMessage `json:"whoami,omitempty"`
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	secureHeaders(w.Header())
	w.Header().Set("Cache-Control", "no-store")
	if !sameOrigin(r) {
		writeError(w, http.StatusForbidden, "forbidden", "cross-origin login refused")
		return
	}
	var req loginRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxLoginBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid", "login: the body must be {\"credential\": \"<API token or key>\"}: "+err.Error())
		return
	}
	cred := strings.TrimSpace(req.Credential)
	if cred == "" {
		writeError(w, http.StatusBadRequest, "invalid", "credential: required (the API token from DATA_DIR/api-token, or an API key)")
		return
	}
	who, status := c.whoami(r, cred)
	if status != http.StatusOK {
		c.log.Info("console login refused", "status", status, "remote", r.RemoteAddr)
		writeError(w, http.StatusUnauthorized, "unauthorized", "the token or key was not accepted")
		return
	}
	id, s := c.sessions.create(cred, who)
	http.SetCookie(w, &http.Cookie{
		Name: CookieName, Value: id, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: r.TLS != nil, Expires: s.expires, MaxAge: int(time.Until(s.expires).Seconds()),
	})
	c.log.Info("console login", "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, SessionInfo{CSRFToken: s.csrf, ExpiresAt: s.expires.UTC(), Whoami: who})
}

// whoami asks the API who cred belongs to; it returns the answer's body
// and status (200 when the credential is valid).
func (c *Console) whoami(r *http.Request, cred string) ([]byte, int) {
	req := httptest.NewRequestWithContext(r.Context(), http.MethodGet, WhoamiPath, nil)
	req.RemoteAddr = r.RemoteAddr
	req.Header.Set("Authorization", "Bearer "+cred)
	rec := httptest.NewRecorder()
	c.api.ServeHTTP(rec, req)
	body := rec.Body.Bytes()
	if rec.Code != http.StatusOK || !json.Valid(body) {
		return nil, rec.Code
	}
	return body, rec.Code
}

// guard answers a request under /console/ or /api/ that comes from
// another origin (403) or without a session (401), and otherwise returns
// the session. It sets the headers every such answer carries.
func (c *Console) guard(w http.ResponseWriter, r *http.Request, unauthorized string) *session {
	secureHeaders(w.Header())
	w.Header().Set("Cache-Control", "no-store")
	if !sameOrigin(r) {
		writeError(w, http.StatusForbidden, "forbidden", "cross-origin request refused")
		return nil
	}
	s := c.current(r)
	if s == nil {
		writeError(w, http.StatusUnauthorized, "unauthorized", unauthorized)
	}
	return s
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	s := c.guard(w, r, "not logged in")
	if s == nil {
		return
	}
	if !s.checkCSRF(r.Header.Get(CSRFHeader)) {
		writeError(w, http.StatusForbidden, "forbidden", "missing or wrong "+CSRFHeader)
		return
	}
	if ck, err := r.Cookie(CookieName); err == nil {
		c.sessions.end(ck.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, MaxAge: -1})
	w.WriteHeader(http.StatusNoContent)
}

func (c *Console) sessionInfo(w http.ResponseWriter, r *http.Request) {
	s := c.guard(w, r, "not logged in")
	if s == nil {
		return
	}
	writeJSON(w, http.StatusOK, SessionInfo{CSRFToken: s.csrf, ExpiresAt: s.expires.UTC(), Whoami: s.whoami})
}

// safeMethod reports whether m changes nothing.
func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// proxy hands a request under /api/ to the API with the session's
// credential, after the checks a cookie needs.
func (c *Console) proxy(w http.ResponseWriter, r *http.Request) {
	s := c.guard(w, r, "not logged in to the console (POST /console/login); API clients use the routes without /api and a bearer token")
	if s == nil {
		return
	}
	switch {
	case isWebSocket(r):
		// A WebSocket is not bound by the same-origin policy: only its
		// Origin says which page opened it, and a browser always sends it.
		if r.Header.Get("Origin") == "" {
			writeError(w, http.StatusForbidden, "forbidden", "a WebSocket from the console must carry its Origin")
			return
		}
	case !safeMethod(r.Method):
		if !s.checkCSRF(r.Header.Get(CSRFHeader)) {
			writeError(w, http.StatusForbidden, "forbidden", "missing or wrong "+CSRFHeader+" (GET /console/session gives it)")
			return
		}
	}
	r2 := r.Clone(r.Context())
	r2.URL.Path = strings.TrimPrefix(r.URL.Path, "/api")
	if r.URL.RawPath != "" {
		r2.URL.RawPath = strings.TrimPrefix(r.URL.RawPath, "/api")
	}
	r2.RequestURI = r2.URL.RequestURI()
	r2.Header.Del("Cookie")
	r2.Header.Del(CSRFHeader)
	r2.Header.Set("Authorization", "Bearer "+s.credential)
	c.api.ServeHTTP(w, r2)
}

// errorBody is the API's error shape.
type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	var b errorBody
	b.Error.Code, b.Error.Message = code, msg
	writeJSON(w, status, b)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // every type written here marshals
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
