package netpolicy

import (
	"net/netip"
	"time"
)

// Verdicts of a ConnEvent.
const (
	VerdictAllow = "allow"
	VerdictBlock = "block"
	VerdictLimit = "limit" // refused by a rate limit
	VerdictError = "error" // allowed, but failed (upstream unreachable, TLS refused)
)

// How a connection reached the daemon (ConnEvent.Via).
const (
	ViaKernel      = "kernel"      // decided by nftables (direct connection)
	ViaDNS         = "dns"         // a DNS query
	ViaTransparent = "transparent" // TCP 80/443 redirected to the proxy
	ViaHTTPProxy   = "http_proxy"  // explicit HTTP proxy (absolute URI)
	ViaConnect     = "connect"     // explicit HTTP proxy, CONNECT
	ViaSOCKS       = "socks5"      // SOCKS5 CONNECT
	ViaPreview     = "preview"     // into the jail: a preview or an E2B sandbox port (dir ingress)
)

// ConnEvent is one entry of a jail's connection record: a connection
// attempt, a DNS answer or an HTTP request, allowed or refused. Field
// names follow the event format (type, ts, dir, proto, src, dst).
type ConnEvent struct {
	Type    string    `json:"type"` // "net"
	Time    time.Time `json:"ts"`
	Dir     string    `json:"dir"`   // "egress", "ingress" or "inter_jail"
	Proto   string    `json:"proto"` // "tcp", "udp", "dns", "http", "https", "tls"
	Via     string    `json:"via"`
	Src     string    `json:"src,omitempty"` // addr:port
	Dst     string    `json:"dst,omitempty"` // addr:port actually connected to (or asked for)
	Host    string    `json:"host,omitempty"`
	Port    int       `json:"port,omitempty"`
	Verdict string    `json:"verdict"`
	Rule    string    `json:"rule,omitempty"`
	Pid     int       `json:"pid,omitempty"`
	Comm    string    `json:"comm,omitempty"`
	// BytesOut were sent by the jail, BytesIn received by it (bodies for
	// HTTP requests, the stream for tunnels).
	BytesOut int64 `json:"bytes_out,omitempty"`
	BytesIn  int64 `json:"bytes_in,omitempty"`
	// HTTP(S) requests.
	Method    string `json:"method,omitempty"`
	Path      string `json:"path,omitempty"`
	Status    int    `json:"status,omitempty"`
	Inspected bool   `json:"inspected,omitempty"`
	// Upstream is the origin a route sent the request to.
	Upstream string `json:"upstream,omitempty"`
	// Credentials names the headers the proxy added (never their values).
	Credentials []string `json:"credentials,omitempty"`
	// DNS.
	QType   string   `json:"qtype,omitempty"`
	Answers []string `json:"answers,omitempty"`
	// DurNS is how long the connection or request lasted.
	DurNS int64  `json:"dur_ns,omitempty"`
	Error string `json:"error,omitempty"`
}

// record stamps and delivers ev.
func (m *Manager) record(jailID string, ev ConnEvent) {
	ev.Type = "net"
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	if ev.Dir == "" {
		ev.Dir = "egress"
	}
	if ev.Pid == 0 && m.o.Owner != nil && (ev.Dir == "egress" || ev.Dir == "inter_jail") {
		proto := ev.Proto
		if proto == "dns" {
			proto = "udp"
		}
		if src, err := netip.ParseAddrPort(ev.Src); err == nil && (proto == "tcp" || proto == "udp") {
			// A record without an owner names the destination the jail
			// addressed (the kernel's log of a direct connection, a
			// refusal); DNS without one went to the daemon's resolver.
			dst, _ := netip.ParseAddrPort(ev.Dst)
			if ev.Dst == "" && ev.Proto == "dns" {
				dst = netip.AddrPortFrom(m.daemon, 53)
			}
			ev.Pid, ev.Comm = m.o.Owner(jailID, proto, src, dst)
		}
	}
	if m.o.Record != nil {
		m.o.Record(jailID, ev)
	}
}
