// Package preview serves the dev servers running in jails to the host: a
// request for http://<port>-<jail>.localhost:<daemon port>/ (or
// <port>-<jail>.sandbox.local with serve --mdns) goes through the daemon's
// reverse proxy to that port of the jail, HTTP and WebSocket alike. The
// jail's init makes the proxy's connections, from inside the jail, so a
// server bound to the jail's loopback answers too, at every isolation
// level, and no ingress rule is needed.
// Access needs the API token (header, or once as ?agentjail_token= which
// becomes a cookie) or a signed preview link (?agentjail_preview=, made by
// POST /jails/{id}/previews); the token never reaches the jail.
package preview

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"html"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
)

// Domains are the host name suffixes previews answer to.
var Domains = []string{".localhost", ".sandbox.local"}

// Query parameters and the cookie of preview access.
const (
	TokenParam  = "agentjail_token"
	SignedParam = "agentjail_preview"
	CookieName  = "agentjail_preview"
)

// Link limits.
const (
	DefaultLinkTTL = time.Hour
	MaxLinkTTL     = 30 * 24 * time.Hour
)

// Jails is what previews need of the jail manager.
type Jails interface {
	// Get returns a jail by id or name.
	Get(ctx context.Context, ref string) (*model.Jail, error)
	// DialPort connects to a TCP port of the running jail's loopback from
	// inside the jail. Nothing listening there is errdefs.ErrNotFound.
	DialPort(ctx context.Context, ref string, port int) (net.Conn, error)
}

// Handler serves preview hosts (Wrap routes everything else to the API).
type Handler struct {
	jails Jails
	token string
	key   []byte

	mu         sync.Mutex
	transports map[string]*http.Transport // by jail id and init pid
}

// New returns the preview handler of jails, accepting the API token and
// links signed with the key kept in dataDir/preview-key (made on first
// use, 0600).
func New(jails Jails, token, dataDir string) (*Handler, error) {
	key, err := loadKey(filepath.Join(dataDir, "preview-key"))
	if err != nil {
		return nil, err
	}
	return &Handler{jails: jails, token: token, key: key, transports: map[string]*http.Transport{}}, nil
}

// Wrap returns a handler that serves preview hosts and passes every other
// request to next.
func (h *Handler) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := ParseHost(r.Host); ok {
			h.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func loadKey(path string) ([]byte, error) {
	if b, err := os.ReadFile(path); err == nil && len(b) == 64 {
		return hex.DecodeString(string(b))
	}
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return nil, err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(hex.EncodeToString(k)), 0o600); err != nil {
		return nil, fmt.Errorf("preview key: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("preview key: %w", err)
	}
	return k, nil
}

// Target is a preview host's jail and port.
type Target struct {
	Port int
	Jail string
}

// ParseHost recognises <port>-<jail>.localhost and
// <port>-<jail>.sandbox.local (with any :port after it).
func ParseHost(hostport string) (Target, bool) {
	return ParseHostIn(hostport, Domains...)
}

// ParseHostIn recognises <port>-<name>.<domain> for one of domains (each
// with its leading dot): a port in 1-65535, a name without dots. Case, a
// trailing dot and any :port after the host are ignored.
func ParseHostIn(hostport string, domains ...string) (Target, bool) {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	for _, d := range domains {
		label, ok := strings.CutSuffix(host, strings.ToLower(d))
		if !ok || strings.Contains(label, ".") {
			continue
		}
		p, name, ok := strings.Cut(label, "-")
		port, err := strconv.Atoi(p)
		if !ok || err != nil || port < 1 || port > 65535 || name == "" {
			return Target{}, false
		}
		return Target{Port: port, Jail: name}, true
	}
	return Target{}, false
}

// sign is the signature of access to a jail's port until exp.
func (h *Handler) sign(jailID string, port int, exp int64) string {
	m := hmac.New(sha256.New, h.key)
	fmt.Fprintf(m, "%s\x00%d\x00%d", jailID, port, exp)
	return strconv.FormatInt(exp, 10) + "." + hex.EncodeToString(m.Sum(nil))
}

func (h *Handler) verify(jailID string, port int, v string) bool {
	e, _, ok := strings.Cut(v, ".")
	exp, err := strconv.ParseInt(e, 10, 64)
	if !ok || err != nil || time.Now().Unix() > exp {
		return false
	}
	return hmac.Equal([]byte(v), []byte(h.sign(jailID, port, exp)))
}

// Link returns a signed preview URL of a jail's port, valid for ttl; base
// is the daemon's address as the client reached it (host:port).
func (h *Handler) Link(ctx context.Context, ref string, port int, ttl time.Duration, base string) (*model.PreviewLink, error) {
	if port < 1 || port > 65535 {
		return nil, errdefs.Unprocessablef("port: %d is not a port", port)
	}
	if ttl == 0 {
		ttl = DefaultLinkTTL
	}
	if ttl < time.Second || ttl > MaxLinkTTL {
		return nil, errdefs.Unprocessablef("ttl_s: %v is outside 1 s .. %v", ttl, MaxLinkTTL)
	}
	j, err := h.jails.Get(ctx, ref)
	if err != nil {
		return nil, err
	}
	_, dport, err := net.SplitHostPort(base)
	if err != nil {
		dport = "80"
	}
	exp := time.Now().Add(ttl)
	// A host name's case is not kept (and the host is read in lower
	// case): a name that is not a plain lower-case label is linked by id.
	ref = j.Name
	if !hostLabel(ref) {
		ref = j.ID
	}
	host := fmt.Sprintf("%d-%s.localhost:%s", port, ref, dport)
	u := url.URL{Scheme: "http", Host: host, Path: "/", RawQuery: url.Values{SignedParam: {h.sign(j.ID, port, exp.Unix())}}.Encode()}
	return &model.PreviewLink{Jail: j.Name, Port: port, URL: u.String(), ExpiresAt: exp.UTC()}, nil
}

// hostLabel reports whether s can stand in a host name as it is: lower-case
// letters, digits and '-'.
func hostLabel(s string) bool {
	return s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyz0123456789-") == ""
}

// ServeHTTP serves a request for a preview host.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	t, ok := ParseHost(r.Host)
	if !ok {
		page(w, http.StatusNotFound, "Not a preview", "Preview hosts look like <port>-<jail>.localhost.")
		return
	}
	j, err := h.jails.Get(r.Context(), t.Jail)
	if err != nil {
		page(w, http.StatusNotFound, "No such jail", fmt.Sprintf("No jail is called %q on this daemon.", t.Jail))
		return
	}
	q := r.URL.Query()
	switch {
	case q.Get(TokenParam) != "" || q.Get(SignedParam) != "":
		// Trade the query credential for a cookie, and drop it from the URL.
		good := q.Get(SignedParam) != "" && h.verify(j.ID, t.Port, q.Get(SignedParam)) ||
			q.Get(TokenParam) != "" && subtle.ConstantTimeCompare([]byte(q.Get(TokenParam)), []byte(h.token)) == 1
		if !good {
			page(w, http.StatusUnauthorized, "Preview refused", "The token or preview link is wrong or expired.")
			return
		}
		exp := time.Now().Add(12 * time.Hour)
		if s := q.Get(SignedParam); s != "" {
			e, _, _ := strings.Cut(s, ".")
			if n, err := strconv.ParseInt(e, 10, 64); err == nil {
				exp = time.Unix(n, 0)
			}
		}
		http.SetCookie(w, &http.Cookie{Name: CookieName, Value: h.sign(j.ID, t.Port, exp.Unix()), Path: "/", Expires: exp,
			HttpOnly: true, SameSite: http.SameSiteLaxMode})
		q.Del(TokenParam)
		q.Del(SignedParam)
		u := *r.URL
		u.RawQuery = q.Encode()
		http.Redirect(w, r, u.RequestURI(), http.StatusSeeOther)
		return
	case h.bearer(r):
	case h.cookie(r, j.ID, t.Port):
	default:
		w.Header().Set("WWW-Authenticate", `Bearer realm="agentjail preview"`)
		page(w, http.StatusUnauthorized, "Preview refused",
			"This preview needs the daemon's API token (Authorization: Bearer, or ?"+TokenParam+"= once) or a signed preview link (agentjail preview JAIL PORT).")
		return
	}
	h.Forward(w, r, j, t.Port)
}

func (h *Handler) bearer(r *http.Request) bool {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	return ok && strings.EqualFold(scheme, "Bearer") && subtle.ConstantTimeCompare([]byte(strings.TrimSpace(tok)), []byte(h.token)) == 1
}

func (h *Handler) cookie(r *http.Request, jailID string, port int) bool {
	c, err := r.Cookie(CookieName)
	return err == nil && h.verify(jailID, port, c.Value)
}

// Forward serves r from port of jail j as a preview does (HTTP and
// WebSocket; a page saying so when the jail is not running or nothing
// answers on the port), for a caller that has checked the request's
// credentials itself and removed them from r.
func (h *Handler) Forward(w http.ResponseWriter, r *http.Request, j *model.Jail, port int) {
	if j.Status != model.StateRunning || j.Pid == 0 {
		page(w, http.StatusConflict, "Jail not running", fmt.Sprintf("Jail %s is %s.", j.Name, j.Status))
		return
	}
	h.proxy(w, r, j, Target{Port: port, Jail: j.Name})
}

// proxy forwards r to the jail's port.
func (h *Handler) proxy(w http.ResponseWriter, r *http.Request, j *model.Jail, t Target) {
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(t.Port))
			// The dev server sees the host the browser used (its hot-reload
			// client builds URLs from it), never the daemon's credentials.
			pr.Out.Host = r.Host
			pr.Out.Header.Del("Authorization")
			removeCookie(pr.Out, CookieName)
			pr.SetXForwarded()
		},
		Transport: h.transport(j),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			msg := err.Error()
			if errors.Is(err, errdefs.ErrNotFound) {
				msg = fmt.Sprintf("Nothing answers on port %d in jail %s. Start the dev server on that port (on the jail's loopback or on all its addresses).", t.Port, j.Name)
			}
			page(w, http.StatusBadGateway, "Bad gateway", msg)
		},
	}
	// A dev server may answer (an upload's progress, a stream) before the
	// request body has ended: the server must not drain and close that body
	// when the answer's head is written (HTTP/1 does unless told).
	_ = http.NewResponseController(w).EnableFullDuplex()
	rp.ServeHTTP(w, r)
}

// maxTransports bounds the jails whose preview transport is kept.
const maxTransports = 256

// transport returns the jail's transport: connections are made from inside
// the jail to its loopback, by its init (so at every isolation level, a
// virtual machine's or a user-space kernel's loopback too). It is made
// again for each run of the jail (a restore starts a new init).
func (h *Handler) transport(j *model.Jail) *http.Transport {
	key := j.ID + "/" + strconv.Itoa(j.Pid)
	h.mu.Lock()
	defer h.mu.Unlock()
	if tr := h.transports[key]; tr != nil {
		return tr
	}
	for k, tr := range h.transports {
		// An earlier run's, or, past the bound, any other jail's (the
		// next request for it makes a new one; requests under way keep
		// their connections).
		if strings.HasPrefix(k, j.ID+"/") || len(h.transports) >= maxTransports {
			tr.CloseIdleConnections()
			delete(h.transports, k)
		}
	}
	id := j.ID
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			_, p, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			port, err := strconv.Atoi(p)
			if err != nil {
				return nil, fmt.Errorf("port %q: %w", p, err)
			}
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			return h.jails.DialPort(ctx, id, port)
		},
		MaxIdleConnsPerHost:   32,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute,
	}
	h.transports[key] = tr
	return tr
}

func removeCookie(r *http.Request, name string) {
	cs := r.Cookies()
	r.Header.Del("Cookie")
	for _, c := range cs {
		if c.Name != name {
			r.AddCookie(c)
		}
	}
}

// page answers with a small HTML page.
func page(w http.ResponseWriter, status int, title, msg string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	fmt.Fprintf(w, "<!doctype html><title>%s</title><h1>%d %s</h1><p>%s</p><p><small>agentjail preview</small></p>\n",
		html.EscapeString(title), status, html.EscapeString(title), html.EscapeString(msg))
}
