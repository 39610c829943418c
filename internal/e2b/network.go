package e2b

import (
	"encoding/json"
	"maps"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"

	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
)

// E2B's network options map onto the jail's network policy, which the
// daemon enforces (DNS, its proxies, the kernel) and records:
//
//   - allowOut (addresses, CIDRs, names, *.wildcards) becomes always_allow,
//     since E2B's allow list wins over its deny list;
//   - denyOut (addresses and CIDRs only, as on E2B) becomes blocked_egress;
//   - allowInternetAccess: true allows every other destination (every name,
//     0.0.0.0/0 and ::/0); cloud metadata and the host's own addresses stay
//     refused, as for every jail.
//
// 0.0.0.0/0 (the SDK's ALL_TRAFFIC) in either list stands for all traffic:
// IPv6 and, in allowOut, every name too. A sandbox that asks for none of
// this has the daemon's default policy: no egress (E2B's default is open).
// Per-host header transforms (rules) become the proxy's credentials: the
// values never enter the sandbox.

// allTraffic is the SDK's ALL_TRAFFIC.
const allTraffic = "0.0.0.0/0"

// netSettings are a sandbox's E2B network options, as given.
type netSettings struct {
	Internet bool     `json:"internet,omitempty"`
	AllowOut []string `json:"allow_out,omitempty"`
	DenyOut  []string `json:"deny_out,omitempty"`
	// Rules are the headers each host's requests get, by name (their
	// values are in the jail's config only).
	Rules              map[string][]string `json:"rules,omitempty"`
	AllowPublicTraffic *bool               `json:"allow_public_traffic,omitempty"`
	// MaskRequestHost is the Host header requests to the sandbox's ports
	// carry, ${PORT} replaced by the port.
	MaskRequestHost string `json:"mask_request_host,omitempty"`
}

// networkBody is the network object of a create, and (with
// allow_internet_access) the body of PUT /sandboxes/{id}/network.
type networkBody struct {
	AllowOut           []string                 `json:"allowOut"`
	DenyOut            []string                 `json:"denyOut"`
	Rules              map[string][]networkRule `json:"rules"`
	EgressProxy        json.RawMessage          `json:"egressProxy"`
	AllowPublicTraffic *bool                    `json:"allowPublicTraffic"`
	MaskRequestHost    *string                  `json:"maskRequestHost"`
	HTTPSPorts         []int                    `json:"httpsPorts"`
	// AllowInternetAccess is only in the update's body (a create has it
	// beside network).
	AllowInternetAccess *bool `json:"allow_internet_access"`
}

// networkRule is one transform of a host's requests.
type networkRule struct {
	Transform *transform `json:"transform"`
}

// transform is what a rule does to a request: headers to set.
type transform struct {
	Headers map[string]string `json:"headers"`
}

// maxNetworkEntries bounds each list of a network body.
const maxNetworkEntries = 256

// given reports whether raw holds a value (not absent or null).
func given(raw json.RawMessage) bool {
	return len(raw) > 0 && string(raw) != "null"
}

// parseNetwork checks E2B's network options and returns the settings to
// keep and the credentials of the rules. internet is allow_internet_access
// (nil: not given, which denies what no allowOut entry names).
func parseNetwork(internet *bool, b *networkBody) (*netSettings, []config.Credential, error) {
	n := &netSettings{Internet: internet != nil && *internet}
	if b == nil {
		return n, nil, nil
	}
	switch {
	case given(b.EgressProxy):
		return nil, nil, errdefs.NotImplementedf("network.egressProxy: agentjail does not tunnel a sandbox's egress through a proxy of yours (its own proxies police and record it)")
	case len(b.HTTPSPorts) > 0:
		return nil, nil, errdefs.NotImplementedf("network.httpsPorts: agentjail forwards a sandbox's ports over plain HTTP only")
	case len(b.AllowOut) > maxNetworkEntries || len(b.DenyOut) > maxNetworkEntries || len(b.Rules) > maxNetworkEntries:
		return nil, nil, errdefs.Invalidf("network: at most %d entries in allowOut, denyOut and rules each", maxNetworkEntries)
	}
	for i, d := range b.AllowOut {
		if _, _, err := config.ParseDestination(d); err != nil || d == config.AnyHost {
			return nil, nil, errdefs.Invalidf("network.allowOut[%d]: %q is not an IP address, CIDR, host name or *.domain", i, d)
		}
	}
	for i, d := range b.DenyOut {
		if p, _, err := config.ParseDestination(d); err != nil || !p.IsValid() {
			return nil, nil, errdefs.Invalidf("network.denyOut[%d]: %q is not an IP address or CIDR (domains can only be allowed)", i, d)
		}
	}
	n.AllowOut, n.DenyOut = b.AllowOut, b.DenyOut
	var creds []config.Credential
	for _, host := range slices.Sorted(maps.Keys(b.Rules)) {
		if _, err := config.NormalizeHost(strings.TrimPrefix(host, "*.")); err != nil {
			return nil, nil, errdefs.Invalidf("network.rules: %q is not a host name or *.domain (rules apply to HTTP requests by host)", host)
		}
		for _, r := range b.Rules[host] {
			if r.Transform == nil {
				continue
			}
			for _, name := range slices.Sorted(maps.Keys(r.Transform.Headers)) {
				v := r.Transform.Headers[name]
				if strings.Contains(v, "${e2b.") {
					return nil, nil, errdefs.NotImplementedf("network.rules[%q]: workload identity tokens (iam) are not supported by agentjail", host)
				}
				if !httpguts.ValidHeaderFieldName(name) || !httpguts.ValidHeaderFieldValue(v) {
					return nil, nil, errdefs.Invalidf("network.rules[%q]: %q is not a header name with a valid value", host, name)
				}
				creds = append(creds, config.Credential{Host: host, Header: name, Value: v})
				if n.Rules == nil {
					n.Rules = map[string][]string{}
				}
				n.Rules[host] = append(n.Rules[host], name)
			}
		}
	}
	n.AllowPublicTraffic = b.AllowPublicTraffic
	if b.MaskRequestHost != nil {
		m := *b.MaskRequestHost
		if m == "" || len(m) > 253 || strings.ContainsAny(m, " \t\r\n/\\@") {
			return nil, nil, errdefs.Invalidf("network.maskRequestHost: %q is not a host (${PORT} stands for the port)", m)
		}
		n.MaskRequestHost = m
	}
	return n, creds, nil
}

// policy is the jail network section of n, in mode (bridge, so that
// allowed addresses are reached directly too).
func (n *netSettings) policy(mode string, creds []config.Credential) config.Network {
	rule := func(d string) config.EgressRule { return config.EgressRule{Destination: d} }
	net := config.Network{Mode: mode, Credentials: creds}
	for _, d := range n.AllowOut {
		net.AlwaysAllow = append(net.AlwaysAllow, rule(d))
		if isAllTraffic(d) {
			net.AlwaysAllow = append(net.AlwaysAllow, rule("::/0"), rule(config.AnyHost))
		}
	}
	for _, d := range n.DenyOut {
		net.BlockedEgress = append(net.BlockedEgress, rule(d))
		if isAllTraffic(d) {
			net.BlockedEgress = append(net.BlockedEgress, rule("::/0"))
		}
	}
	if n.Internet {
		net.AllowedEgress = []config.EgressRule{rule(config.AnyHost), rule(allTraffic), rule("::/0")}
	}
	return net
}

// isAllTraffic reports whether d is 0.0.0.0/0.
func isAllTraffic(d string) bool {
	p, err := netip.ParsePrefix(strings.TrimSpace(d))
	return err == nil && p.Bits() == 0 && p.Addr().Is4()
}

// infoJSON is n as the SDK's SandboxInfo.network: rules with their header
// values redacted.
func (n *netSettings) infoJSON() map[string]any {
	out := map[string]any{"allowOut": nonNil(n.AllowOut), "denyOut": nonNil(n.DenyOut)}
	if n.AllowPublicTraffic != nil {
		out["allowPublicTraffic"] = *n.AllowPublicTraffic
	}
	if n.MaskRequestHost != "" {
		out["maskRequestHost"] = n.MaskRequestHost
	}
	if len(n.Rules) > 0 {
		rules := map[string]any{}
		for host, names := range n.Rules {
			h := map[string]string{}
			for _, name := range names {
				h[name] = config.Redacted
			}
			rules[host] = []any{map[string]any{"transform": map[string]any{"headers": h}}}
		}
		out["rules"] = rules
	}
	return out
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// private reports whether the sandbox's ports need its traffic access
// token (allowPublicTraffic: false).
func (n *netSettings) private() bool {
	return n != nil && n.AllowPublicTraffic != nil && !*n.AllowPublicTraffic
}

// requestHost is the Host header a request for port of a sandbox with
// settings n carries ("" leaves the client's).
func (n *netSettings) requestHost(port int) string {
	if n == nil || n.MaskRequestHost == "" {
		return ""
	}
	return strings.ReplaceAll(n.MaskRequestHost, "${PORT}", strconv.Itoa(port))
}

// putNetwork serves PUT /sandboxes/{id}/network: the sandbox's egress
// options are replaced whole (what the body leaves out is cleared, as on
// E2B); new connections obey them at once.
func (s *Service) putNetwork(c caller, w http.ResponseWriter, r *http.Request) error {
	sb, err := s.lookup(c, r.PathValue("id"))
	if err != nil {
		return err
	}
	var b networkBody
	if err := decode(r, &b); err != nil {
		return err
	}
	if b.AllowPublicTraffic != nil || b.MaskRequestHost != nil {
		return errdefs.Invalidf("allowPublicTraffic and maskRequestHost are set when a sandbox is created")
	}
	n, creds, err := parseNetwork(b.AllowInternetAccess, &b)
	if err != nil {
		return err
	}
	rec, err := sb.lockRunning("have its network updated")
	if err != nil {
		return err
	}
	defer sb.op.Unlock()
	if old := rec.Network; old != nil {
		n.AllowPublicTraffic, n.MaskRequestHost = old.AllowPublicTraffic, old.MaskRequestHost
	}
	if _, err := s.jails.UpdateNetwork(r.Context(), rec.JailID, n.policy(config.NetBridge, creds)); err != nil {
		return err
	}
	sb.mu.Lock()
	sb.rec.Network = n
	sb.mu.Unlock()
	s.persist(sb)
	w.WriteHeader(http.StatusNoContent)
	return nil
}
