package netpolicy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
)

// Protocols a Rule may name. The empty string matches both.
const (
	ProtoTCP = "tcp"
	ProtoUDP = "udp"
)

// Policy is what one jail may reach. The evaluation order, for a
// destination (a host name, an address, or both) and a port, is:
//
//  1. a protected address (cloud metadata, link-local, loopback, the jail
//     network itself, the host's own addresses) is refused unless an
//     AlwaysAllow or Allow rule names it: its exact address, or a CIDR no
//     wider than the protected range (0.0.0.0/0 does not name anything);
//  2. a matching AlwaysAllow rule allows (always_allow beats block);
//  3. a matching Block rule refuses (block beats allow);
//  4. a matching Allow rule allows;
//  5. anything else is refused (default deny).
//
// Domain rules are decided by the daemon (DNS, the Host header, TLS SNI,
// proxy requests); IP/CIDR rules are also enforced in the kernel, where a
// jail in bridge mode may connect directly to what they allow.
type Policy struct {
	// AlwaysAllow rules win over Block.
	AlwaysAllow []Rule `json:"always_allow,omitempty"`
	// Allow rules (config: network.allowed_egress).
	Allow []Rule `json:"allow,omitempty"`
	// Block rules win over Allow.
	Block []Rule `json:"block,omitempty"`
	// Ingress rules allow connections from outside (a source IP/CIDR) to
	// the jail's ports; everything else inbound is refused. Connections
	// made by the host itself (the daemon) are always allowed.
	Ingress []Rule `json:"ingress,omitempty"`
	// InterJail rules allow or deny traffic between jails by name pattern.
	InterJail []InterJailRule `json:"inter_jail,omitempty"`
	// RequestsPerMinute caps new connections and HTTP requests (0: no cap).
	RequestsPerMinute int `json:"requests_per_minute,omitempty"`
	// BytesPerHour caps bytes through the daemon's proxies (0: no cap).
	BytesPerHour int64 `json:"bytes_per_hour,omitempty"`
	// DNSQueriesPerSecond caps the jail's queries to the daemon's DNS
	// (0: config.DefaultDNSQueriesPerSecond; at most
	// config.MaxDNSQueriesPerSecond);
	// queries over it are dropped and counted.
	DNSQueriesPerSecond int `json:"dns_queries_per_second,omitempty"`
	// Connections caps the jail's connections to the daemon's proxies and
	// DNS open at once (0: config.DefaultConnections; at most
	// config.MaxConnections); one past it is reset and recorded.
	Connections int `json:"connections,omitempty"`
	// TLSInspection makes the proxy terminate TLS with a certificate of the
	// daemon's CA, so HTTPS requests are recorded with method, path and
	// status (the jail must trust the CA; Attachment says how).
	TLSInspection bool `json:"tls_inspection,omitempty"`
	// Credentials are headers the proxy adds to requests to one host. Their
	// values never enter the jail and are never recorded or logged.
	Credentials []Credential `json:"credentials,omitempty"`
	// Routes send the jail's HTTP requests for a host to another origin
	// (a model API's real https endpoint, a local model server, a company
	// gateway): the jail speaks plain HTTP to the proxy, which re-originates
	// the request, adding the host's credentials on the way.
	Routes []Route `json:"routes,omitempty"`
}

// Route sends the requests a jail makes to Host (plain HTTP, or inspected
// HTTPS) to the origin of URL instead, URL's path prefixed to theirs. The
// upstream's address obeys the policy like any other destination.
type Route struct {
	Host string `json:"host"`
	URL  string `json:"url"`
}

// Rule names destinations (or, in Policy.Ingress, sources).
type Rule struct {
	// Destination is a host name ("api.example.com"), a wildcard
	// ("*.example.com": every name below example.com, not example.com
	// itself; "*": every name), an IP address or a CIDR. In Ingress rules it is the source
	// and must be an IP address or CIDR.
	Destination string `json:"destination"`
	// Ports the rule covers (empty: all).
	Ports []int `json:"ports,omitempty"`
	// Protocol is "tcp", "udp" or empty (both).
	Protocol string `json:"protocol,omitempty"`
}

// InterJailRule allows (or denies) connections from jails whose name
// matches From to jails whose name matches To (path.Match patterns) on
// Ports (empty: all). A pair is allowed when a rule in the policy of the
// source jail or of the destination jail allows it and no rule in either
// denies it.
type InterJailRule struct {
	From  string `json:"from"`
	To    string `json:"to"`
	Ports []int  `json:"ports,omitempty"`
	Allow bool   `json:"allow"`
}

// Credential is a header added by the proxy to every request to Host
// (exact name, or a "*." wildcard). With HTTPS it needs the connection to
// be inspected, so a credential turns inspection on for its host.
//
// The header's value is Value, or, when Secret is set, Value followed by
// the daemon's secret of that name (Options.Secrets), looked up at each
// request: the secret itself is never part of the policy.
type Credential struct {
	Host   string `json:"host"`
	Header string `json:"header"`
	Value  string `json:"value"`
	Secret string `json:"secret,omitempty"`
}

// Target is one destination a decision is asked about.
type Target struct {
	Host  string     // host name as the client named it ("" if none)
	IP    netip.Addr // address (zero if not known yet)
	Port  int        // 0: any port (DNS)
	Proto string     // ProtoTCP or ProtoUDP
}

// Decision is the outcome of evaluating a Policy.
type Decision struct {
	Allow bool
	// Rule names what decided: "always_allow:<dest>", "allow:<dest>",
	// "block:<dest>", "protected:<range>" or "default".
	Rule string
}

// compiled is a validated rule.
type compiled struct {
	Rule
	kind   string       // "always_allow", "allow", "block"
	domain string       // lower-case name, or suffix with leading "." for wildcards
	prefix netip.Prefix // valid for IP/CIDR rules
}

func (c compiled) label() string { return c.kind + ":" + c.Destination }

func (c compiled) matchPort(port int, proto string) bool {
	if c.Protocol != "" && proto != "" && c.Protocol != proto {
		return false
	}
	return port == 0 || len(c.Ports) == 0 || slices.Contains(c.Ports, port)
}

func (c compiled) matchName(host string) bool {
	if c.domain == "" || host == "" {
		return false
	}
	if c.domain == config.AnyHost {
		return true
	}
	if strings.HasPrefix(c.domain, ".") {
		return strings.HasSuffix(host, c.domain)
	}
	return host == c.domain
}

func (c compiled) match(t Target, host string) bool {
	if !c.matchPort(t.Port, t.Proto) {
		return false
	}
	if c.prefix.IsValid() {
		return t.IP.IsValid() && c.prefix.Contains(t.IP)
	}
	return c.matchName(host)
}

// compiledPolicy is a Policy ready for evaluation.
type compiledPolicy struct {
	src         Policy
	alwaysAllow []compiled
	allow       []compiled
	block       []compiled
	ingress     []compiled
}

// protectedRanges are refused unless a rule names them; the jail subnet
// and the host's own addresses are added at evaluation time. No range
// contains another, so "the protected range containing an address" is
// unique.
var protectedRanges = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),     // link-local: AWS, GCP, Azure, OpenStack, ECS metadata
	netip.MustParsePrefix("100.100.100.200/32"), // Alibaba Cloud metadata
	netip.MustParsePrefix("192.0.0.192/32"),     // Oracle Cloud metadata (legacy)
	netip.MustParsePrefix("fd00:ec2::/112"),     // AWS metadata, DNS and NTP over IPv6
	netip.MustParsePrefix("fd20:ce::254/128"),   // GCP metadata over IPv6
	netip.MustParsePrefix("fe80::/10"),          // IPv6 link-local
	netip.MustParsePrefix("127.0.0.0/8"),        // loopback
	netip.MustParsePrefix("::1/128"),            // loopback
	netip.MustParsePrefix("0.0.0.0/8"),          // "this host"
	netip.MustParsePrefix("::/128"),             // unspecified
	netip.MustParsePrefix("224.0.0.0/4"),        // multicast
	netip.MustParsePrefix("ff00::/8"),           // multicast
	netip.MustParsePrefix("255.255.255.255/32"), // broadcast
}

// compile validates p. Messages name the offending field.
func compile(p Policy) (*compiledPolicy, error) {
	cp := &compiledPolicy{src: p}
	lists := []struct {
		kind  string // in the record's rule labels
		field string // in the jail config (FromConfig), for messages
		rules []Rule
		dst   *[]compiled
	}{
		{"always_allow", "always_allow", p.AlwaysAllow, &cp.alwaysAllow},
		{"allow", "allowed_egress", p.Allow, &cp.allow},
		{"block", "blocked_egress", p.Block, &cp.block},
		{"ingress", "allowed_ingress", p.Ingress, &cp.ingress},
	}
	for _, l := range lists {
		for i, r := range l.rules {
			c, err := compileRule(l.kind, r)
			if err != nil {
				return nil, fmt.Errorf("%s[%d].%w", l.field, i, err)
			}
			if l.kind == "ingress" && !c.prefix.IsValid() {
				return nil, errdefs.Invalidf("%s[%d].source %q: must be an IP address or CIDR", l.field, i, r.Destination)
			}
			*l.dst = append(*l.dst, c)
		}
	}
	for i, r := range p.InterJail {
		for _, pat := range []string{r.From, r.To} {
			if err := config.CheckNamePattern(pat); err != nil {
				return nil, fmt.Errorf("inter_agent_rules[%d]: %w", i, err)
			}
		}
		if err := checkPorts(r.Ports); err != nil {
			return nil, fmt.Errorf("inter_agent_rules[%d]: %w", i, err)
		}
	}
	if p.RequestsPerMinute < 0 {
		return nil, errdefs.Invalidf("limits.requests_per_minute: must not be negative")
	}
	if p.BytesPerHour < 0 {
		return nil, errdefs.Invalidf("limits.bytes_per_hour: must not be negative")
	}
	if p.DNSQueriesPerSecond < 0 || p.DNSQueriesPerSecond > config.MaxDNSQueriesPerSecond {
		return nil, errdefs.Invalidf("limits.dns_queries_per_second: %d is not between 0 (the default, %d) and %d",
			p.DNSQueriesPerSecond, config.DefaultDNSQueriesPerSecond, config.MaxDNSQueriesPerSecond)
	}
	if p.Connections < 0 || p.Connections > config.MaxConnections {
		return nil, errdefs.Invalidf("limits.connections: %d is not between 0 (the default, %d) and %d",
			p.Connections, config.DefaultConnections, config.MaxConnections)
	}
	for i, c := range p.Credentials {
		if _, err := config.NormalizeHost(strings.TrimPrefix(c.Host, "*.")); err != nil {
			return nil, fmt.Errorf("credentials[%d].host: %w", i, err)
		}
		if c.Header == "" || strings.ContainsAny(c.Header, " :\r\n") {
			return nil, errdefs.Invalidf("credentials[%d].header: %q is not a header name", i, c.Header)
		}
		if strings.ContainsAny(c.Value, "\r\n") {
			return nil, errdefs.Invalidf("credentials[%d].value: must not contain line breaks", i)
		}
	}
	for i, r := range p.Routes {
		if _, err := config.NormalizeHost(r.Host); err != nil {
			return nil, fmt.Errorf("routes[%d].host: %w", i, err)
		}
		if _, err := config.ParseRouteURL(r.URL); err != nil {
			return nil, fmt.Errorf("routes[%d].url: %w", i, err)
		}
	}
	return cp, nil
}

func checkPorts(ports []int) error {
	for _, p := range ports {
		if p < 1 || p > 65535 {
			return errdefs.Invalidf("ports: %d is not a port", p)
		}
	}
	return nil
}

func compileRule(kind string, r Rule) (compiled, error) {
	c := compiled{Rule: r, kind: kind}
	if err := checkPorts(r.Ports); err != nil {
		return c, err
	}
	switch r.Protocol {
	case "", ProtoTCP, ProtoUDP:
	case "any":
		c.Protocol = ""
	default:
		return c, errdefs.Invalidf("protocol: %q is not tcp, udp or any", r.Protocol)
	}
	prefix, domain, err := config.ParseDestination(r.Destination)
	if err != nil {
		return c, fmt.Errorf("destination: %w", err)
	}
	c.prefix, c.domain = prefix, domain
	return c, nil
}

// protectedRange returns the protected range containing ip, if any.
// extra holds the ranges added at evaluation time (the jail subnet and
// the host's own addresses).
func protectedRange(ip netip.Addr, extra []netip.Prefix) (netip.Prefix, bool) {
	for _, lists := range [][]netip.Prefix{protectedRanges, extra} {
		for _, p := range lists {
			if p.Contains(ip) {
				return p, true
			}
		}
	}
	return netip.Prefix{}, false
}

// names reports whether c names ip inside the protected range pr.
func (c compiled) names(ip netip.Addr, pr netip.Prefix) bool {
	return c.prefix.IsValid() && c.prefix.Contains(ip) && c.prefix.Bits() >= pr.Bits()
}

// decide evaluates the policy for t; extra are the protected ranges known
// at run time (see protectedRange).
func (cp *compiledPolicy) decide(t Target, extra []netip.Prefix) Decision {
	host := strings.TrimSuffix(strings.ToLower(t.Host), ".")
	if a, err := netip.ParseAddr(host); err == nil {
		if !t.IP.IsValid() {
			t.IP = a
		}
		host = ""
	}
	t.IP = t.IP.Unmap()
	if t.IP.IsValid() {
		if pr, ok := protectedRange(t.IP, extra); ok {
			named := false
			for _, list := range [][]compiled{cp.alwaysAllow, cp.allow} {
				for _, c := range list {
					if c.matchPort(t.Port, t.Proto) && c.names(t.IP, pr) {
						named = true
					}
				}
			}
			if !named {
				return Decision{Rule: "protected:" + pr.String()}
			}
		}
	}
	for _, c := range cp.alwaysAllow {
		if c.match(t, host) {
			return Decision{Allow: true, Rule: c.label()}
		}
	}
	for _, c := range cp.block {
		if c.match(t, host) {
			return Decision{Rule: c.label()}
		}
	}
	for _, c := range cp.allow {
		if c.match(t, host) {
			return Decision{Allow: true, Rule: c.label()}
		}
	}
	return Decision{Rule: "default"}
}

// credentialsFor returns the credentials bound to host.
func (cp *compiledPolicy) credentialsFor(host string) []Credential {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	var out []Credential
	for _, c := range cp.src.Credentials {
		h := strings.ToLower(c.Host)
		if h == host || strings.HasPrefix(h, "*.") && strings.HasSuffix(host, h[1:]) {
			out = append(out, c)
		}
	}
	return out
}

// routeFor returns the route of host, if any.
func (cp *compiledPolicy) routeFor(host string) (Route, bool) {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	for _, r := range cp.src.Routes {
		if strings.ToLower(r.Host) == host {
			return r, true
		}
	}
	return Route{}, false
}

// inspect reports whether TLS to host is terminated by the proxy.
func (cp *compiledPolicy) inspect(host string) bool {
	return cp.src.TLSInspection || len(cp.credentialsFor(host)) > 0
}
