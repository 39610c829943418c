package config

import (
	"net/netip"
	"net/url"
	"path"
	"strconv"
	"strings"

	"github.com/agentjail/agentjail/internal/errdefs"
)

// The syntax of the network section's values, shared by the config's
// validation and the network policy that enforces them (internal/netpolicy),
// so that what a create accepts is what the policy compiles. Errors are
// errdefs.ErrInvalid; their messages quote the value but not the field.

// NormalizeHost lower-cases a host name, drops a trailing dot and checks
// its syntax: dot-separated labels of letters, digits, '-' and '_', each
// 1-63 bytes, 253 in all.
func NormalizeHost(s string) (string, error) {
	s = strings.TrimSuffix(strings.ToLower(s), ".")
	if s == "" || len(s) > 253 {
		return "", errdefs.Invalidf("%q is not a host name", s)
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 {
			return "", errdefs.Invalidf("%q is not a host name", s)
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return "", errdefs.Invalidf("%q is not a host name", s)
			}
		}
	}
	return s, nil
}

// AnyHost is the destination that names every host name (not addresses:
// a rule for those is 0.0.0.0/0 or ::/0).
const AnyHost = "*"

// ParseDestination parses a rule's destination (or source): an IP
// address or CIDR gives prefix (masked; an IPv4-mapped address unmapped),
// a host name gives domain (normalized), "*." and a domain gives domain
// with a leading dot (every name below it, not the domain itself), and
// "*" alone gives domain AnyHost (every name).
func ParseDestination(d string) (prefix netip.Prefix, domain string, err error) {
	d = strings.TrimSpace(d)
	switch d {
	case "":
		return prefix, "", errdefs.Invalidf("empty")
	case AnyHost:
		return prefix, AnyHost, nil
	}
	if strings.Contains(d, "/") {
		p, err := netip.ParsePrefix(d)
		if err != nil {
			return prefix, "", errdefs.Invalidf("%q: %v", d, err)
		}
		return p.Masked(), "", nil
	}
	if a, err := netip.ParseAddr(d); err == nil {
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), "", nil
	}
	wild := strings.HasPrefix(d, "*.")
	name, err := NormalizeHost(strings.TrimPrefix(d, "*."))
	if err != nil {
		return prefix, "", err
	}
	if wild {
		name = "." + name
	}
	return prefix, name, nil
}

// ParseRouteURL checks a route's upstream: an absolute http or https URL
// with a host, without credentials, query or fragment.
func ParseRouteURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return nil, errdefs.Invalidf("%q is not a URL: %v", s, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, errdefs.Invalidf("%q: the scheme must be http or https", s)
	case u.Hostname() == "":
		return nil, errdefs.Invalidf("%q: a host is required", s)
	case u.User != nil:
		return nil, errdefs.Invalidf("%q: credentials belong in a credentials entry, not the URL", s)
	case u.RawQuery != "" || u.Fragment != "":
		return nil, errdefs.Invalidf("%q: no query or fragment", s)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, errdefs.Invalidf("%q: bad port", s)
		}
	}
	return u, nil
}

// CheckNamePattern checks a jail name pattern of an inter-agent rule: a
// non-empty path.Match pattern.
func CheckNamePattern(pat string) error {
	if _, err := path.Match(pat, ""); err != nil || pat == "" {
		return errdefs.Invalidf("bad name pattern %q", pat)
	}
	return nil
}
