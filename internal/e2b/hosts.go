package e2b

import (
	"crypto/subtle"
	"net"
	"net/http"
	"strconv"

	"github.com/agentjail/agentjail/internal/preview"
)

// With Options.Domain set, the daemon answers E2B's sandbox host names
// itself, as E2B's edge does: PORT-ID.DOMAIN (what the SDK's
// getHost(PORT) returns) is port PORT of sandbox ID, and
// 49983-ID.DOMAIN its sandbox plane (the SDK's sandbox URL when
// E2B_SANDBOX_URL is not set). A wildcard DNS name (or *.localhost, which
// browsers resolve to this machine) must lead to the daemon.
//
// As on E2B, a sandbox's ports are public by default: anyone who reaches
// the daemon and knows the sandbox's id may use them. A sandbox created
// with network.allowPublicTraffic false gets a traffic access token
// (trafficAccessToken) that each request must carry in
// E2b-Traffic-Access-Token.

// trafficTokenHeader carries a private sandbox's traffic access token.
const trafficTokenHeader = "E2b-Traffic-Access-Token"

// hostTarget parses PORT-ID.DOMAIN (any :port after it, and the
// domain's own port, are ignored).
func (s *Service) hostTarget(hostport string) (port int, id string, ok bool) {
	domain := s.opts.Domain
	if domain == "" {
		return 0, "", false
	}
	if h, _, err := net.SplitHostPort(domain); err == nil {
		domain = h
	}
	t, ok := preview.ParseHostIn(hostport, "."+domain)
	return t.Port, t.Jail, ok
}

// WrapHosts returns a handler that serves the sandbox host names of
// Options.Domain and passes every other request to next: a host that
// names no sandbox goes to next too when Options.OtherHosts claims it
// (the jails' previews share *.localhost).
func (s *Service) WrapHosts(next http.Handler) http.Handler {
	if s.opts.Domain == "" {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		port, id, ok := s.hostTarget(r.Host)
		if !ok || s.sandboxByID(id) == nil && s.opts.OtherHosts != nil && s.opts.OtherHosts(r.Host) {
			next.ServeHTTP(w, r)
			return
		}
		sb := s.runningSandbox(w, r, id)
		if sb == nil {
			return
		}
		if strconv.Itoa(port) == envdPort {
			r.Header.Set("E2b-Sandbox-Id", id)
			r.Header.Del("E2b-Sandbox-Port")
			s.envd.ServeHTTP(w, r)
			return
		}
		if want := sb.snapshot().TrafficToken; want != "" {
			got := r.Header.Get(trafficTokenHeader)
			if subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
				writeAPIError(w, http.StatusForbidden, "sandbox "+id+" is private (allowPublicTraffic: false): send its trafficAccessToken in "+trafficTokenHeader)
				return
			}
		}
		s.toPort(w, r, sb, port)
	})
}
