package config

import (
	"fmt"
	"net"
	"path"
	"strings"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/lazyre"
)

// Host describes what the daemon's host allows; it bounds some limits.
type Host struct {
	// NofileMax is the daemon's own RLIMIT_NOFILE hard limit: the daemon
	// lacks CAP_SYS_RESOURCE on some hosts and cannot raise a jail above it.
	NofileMax uint64
	// CPUs is the number of CPUs (bounds cpu_quota).
	CPUs int
	// Levels are the isolation levels this daemon's backends provide.
	Levels []string
	// NetworkModes are the network modes this daemon provides.
	NetworkModes []string
}

var nameRE = lazyre.New(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)

// ValidName reports whether s is an acceptable jail or snapshot name.
func ValidName(s string) error {
	if !nameRE().MatchString(s) {
		return errdefs.Unprocessablef("name %q: must be 1-63 characters of letters, digits, '_', '.', '-', starting with a letter or digit", s)
	}
	return nil
}

// Validate checks a config whose defaults were applied. Errors are
// errdefs.ErrUnprocessable and name the field (e.g.
// "isolation.resources.memory_bytes").
func (c *Config) Validate(h Host) error {
	iso := &c.Isolation
	if !contains(h.Levels, iso.Level) {
		return errdefs.Unprocessablef("isolation.level: %q is not available on this daemon (available: %s)", iso.Level, strings.Join(h.Levels, ", "))
	}
	if c.Hostname != "" && !nameRE().MatchString(c.Hostname) {
		return errdefs.Unprocessablef("hostname: %q is not a valid host name", c.Hostname)
	}
	for k := range c.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return errdefs.Unprocessablef("env: invalid variable name %q", k)
		}
	}
	for _, v := range c.Env {
		if strings.ContainsRune(v, 0) {
			return errdefs.Unprocessablef("env: values may not contain NUL bytes")
		}
	}
	switch c.Tracing.Mode {
	case TraceFull, TraceNoSyscalls, TraceOff:
	default:
		return errdefs.Unprocessablef("tracing.mode: %q (expected full, no-syscalls or off)", c.Tracing.Mode)
	}
	if b := c.Tracing.MaxFileBytes; b != 0 && (b < MinEventFileBytes || b > MaxEventFileBytes) {
		return errdefs.Unprocessablef("tracing.max_file_bytes: %d is not 0 (the default, %d) or between %d and %d",
			b, int64(DefaultEventFileBytes), int64(MinEventFileBytes), int64(MaxEventFileBytes))
	}
	if err := iso.Filesystem.validate(); err != nil {
		return err
	}
	if err := iso.Network.validate(h); err != nil {
		return err
	}
	if err := iso.Resources.validate(h); err != nil {
		return err
	}
	return iso.Process.validate()
}

func (f *Filesystem) validate() error {
	const p = "isolation.filesystem."
	switch {
	case f.Rootfs == RootfsHost:
	case strings.HasPrefix(f.Rootfs, RootfsDirPrefix):
		dir := strings.TrimPrefix(f.Rootfs, RootfsDirPrefix)
		if !path.IsAbs(dir) || path.Clean(dir) != dir {
			return errdefs.Unprocessablef(p+"rootfs: %q: the dir provider needs a clean absolute path (dir:/path/to/tree)", f.Rootfs)
		}
	case strings.HasPrefix(f.Rootfs, RootfsImagePrefix), strings.HasPrefix(f.Rootfs, RootfsProfilePrefix), strings.HasPrefix(f.Rootfs, RootfsNixPrefix):
		_, ref, _ := strings.Cut(f.Rootfs, ":")
		if ref == "" || strings.ContainsAny(ref, " \t\n") {
			return errdefs.Unprocessablef(p+"rootfs: %q: name an image (image:python:3.12-slim), a profile (profile:python) or a flake (nix:nixpkgs#python3)", f.Rootfs)
		}
	default:
		return errdefs.Unprocessablef(p+"rootfs: %q: expected \"host\", \"dir:/absolute/path\", \"image:REF\", \"profile:NAME\" or \"nix:FLAKE\"", f.Rootfs)
	}
	if err := jailPath(p+"workspace_root", f.WorkspaceRoot); err != nil {
		return err
	}
	for i, m := range append(append([]Mount{}, f.ReadOnlyMounts...), f.ReadWriteMounts...) {
		field := fmt.Sprintf(p+"mounts[%d]", i)
		if !path.IsAbs(m.Source) {
			return errdefs.Unprocessablef("%s.source: %q must be an absolute host path", field, m.Source)
		}
		if err := jailPath(field+".target", m.Target); err != nil {
			return err
		}
		for _, o := range m.Options {
			switch o {
			case "ro", "rw", "nosuid", "nodev", "noexec", "rbind", "bind":
			default:
				return errdefs.Unprocessablef("%s.options: unsupported option %q (allowed: ro, rw, nosuid, nodev, noexec)", field, o)
			}
		}
	}
	for i, b := range f.BlockedPaths {
		if err := jailPath(fmt.Sprintf(p+"blocked_paths[%d]", i), b); err != nil {
			return err
		}
	}
	return nil
}

// jailPath checks that s is a clean absolute path other than "/".
func jailPath(field, s string) error {
	if !path.IsAbs(s) || path.Clean(s) != s || s == "/" {
		return errdefs.Unprocessablef("%s: %q must be a clean absolute path inside the jail (not \"/\")", field, s)
	}
	if strings.ContainsRune(s, 0) {
		return errdefs.Unprocessablef("%s: NUL byte in path", field)
	}
	return nil
}

func (n *Network) validate(h Host) error {
	const p = "isolation.network."
	if !contains(h.NetworkModes, n.Mode) {
		hint := ""
		if n.Mode == NetHost {
			hint = "; the daemon allows it when started with --allow-host-network"
		}
		return errdefs.Unprocessablef(p+"mode: %q is not available on this daemon (available: %s)%s", n.Mode, strings.Join(h.NetworkModes, ", "), hint)
	}
	for i, d := range n.DNSServers {
		if net.ParseIP(d) == nil {
			return errdefs.Unprocessablef(p+"dns_servers[%d]: %q is not an IP address", i, d)
		}
	}
	for i, r := range n.AllowedEgress {
		if err := checkRule(fmt.Sprintf(p+"allowed_egress[%d]", i), "destination", r.Destination, r.Ports, r.Protocol); err != nil {
			return err
		}
	}
	for i, r := range n.AllowedIngress {
		field := fmt.Sprintf(p+"allowed_ingress[%d]", i)
		if err := checkRule(field, "source", r.Source, r.Ports, r.Protocol); err != nil {
			return err
		}
		if pre, _, _ := ParseDestination(r.Source); !pre.IsValid() {
			return errdefs.Unprocessablef("%s.source: %q must be an IP address or CIDR", field, r.Source)
		}
	}
	for i, r := range n.InterAgentRules {
		field := fmt.Sprintf(p+"inter_agent_rules[%d]", i)
		if r.From == "" || r.To == "" {
			return errdefs.Unprocessablef("%s: from and to are required", field)
		}
		for _, pat := range []string{r.From, r.To} {
			if err := CheckNamePattern(pat); err != nil {
				return errdefs.Unprocessablef("%s: %v", field, err)
			}
		}
		if err := checkPorts(field, r.Ports); err != nil {
			return err
		}
	}
	for i, r := range n.AlwaysAllow {
		if err := checkRule(fmt.Sprintf(p+"always_allow[%d]", i), "destination", r.Destination, r.Ports, r.Protocol); err != nil {
			return err
		}
	}
	for i, r := range n.BlockedEgress {
		if err := checkRule(fmt.Sprintf(p+"blocked_egress[%d]", i), "destination", r.Destination, r.Ports, r.Protocol); err != nil {
			return err
		}
	}
	if l := n.Limits; l != nil && l.RequestsPerMinute < 0 {
		return errdefs.Unprocessablef(p+"limits.requests_per_minute: %d must not be negative", l.RequestsPerMinute)
	}
	if l := n.Limits; l != nil && l.BytesPerHour < 0 {
		return errdefs.Unprocessablef(p+"limits.bytes_per_hour: %d must not be negative", l.BytesPerHour)
	}
	if l := n.Limits; l != nil && (l.DNSQueriesPerSecond < 0 || l.DNSQueriesPerSecond > MaxDNSQueriesPerSecond) {
		return errdefs.Unprocessablef(p+"limits.dns_queries_per_second: %d is not between 0 (the default, %d) and %d",
			l.DNSQueriesPerSecond, DefaultDNSQueriesPerSecond, MaxDNSQueriesPerSecond)
	}
	if l := n.Limits; l != nil && (l.Connections < 0 || l.Connections > MaxConnections) {
		return errdefs.Unprocessablef(p+"limits.connections: %d is not between 0 (the default, %d) and %d",
			l.Connections, DefaultConnections, MaxConnections)
	}
	for i, c := range n.Credentials {
		field := fmt.Sprintf(p+"credentials[%d]", i)
		if _, err := NormalizeHost(c.Host); err != nil {
			return errdefs.Unprocessablef("%s.host: %q must be a host name", field, c.Host)
		}
		if c.Header == "" || strings.ContainsAny(c.Header, ": \r\n") {
			return errdefs.Unprocessablef("%s.header: %q is not a header name", field, c.Header)
		}
		if c.Secret != "" {
			if !validSecretName(c.Secret) {
				return errdefs.Unprocessablef("%s.secret: %q is not a secret name (letters, digits and _)", field, c.Secret)
			}
			if strings.ContainsAny(c.Value, "\r\n") {
				return errdefs.Unprocessablef("%s.value: must not contain line breaks", field)
			}
		} else if c.Value == "" || c.Value == Redacted || strings.ContainsAny(c.Value, "\r\n") {
			return errdefs.Unprocessablef("%s.value: a header value is required (not the redaction marker), or a secret", field)
		}
	}
	for i, r := range n.Routes {
		field := fmt.Sprintf(p+"routes[%d]", i)
		if _, err := NormalizeHost(r.Host); err != nil {
			return errdefs.Unprocessablef("%s.host: %q must be a host name", field, r.Host)
		}
		if _, err := ParseRouteURL(r.URL); err != nil {
			return errdefs.Unprocessablef("%s.url: must be an http:// or https:// URL without credentials, query or fragment: %v", field, err)
		}
	}
	if n.Mode == NetNone && (len(n.AllowedEgress)+len(n.AlwaysAllow)+len(n.InterAgentRules)+len(n.AllowedIngress) > 0 || n.AllowInterAgent) {
		return errdefs.Unprocessablef(p + "mode: \"none\" has no network beyond loopback; its rules would never apply")
	}
	return nil
}

// validSecretName accepts names like ANTHROPIC_API_KEY.
func validSecretName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, r := range s {
		if !(r == '_' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// checkRule checks an egress rule (key "destination") or an ingress rule
// (key "source").
func checkRule(field, key, target string, ports []int, proto string) error {
	if target == "" {
		return errdefs.Unprocessablef("%s.%s: required", field, key)
	}
	if _, _, err := ParseDestination(target); err != nil {
		return errdefs.Unprocessablef("%s.%s: %v (expected a host name, *.domain, * for every name, an IP address or a CIDR)", field, key, err)
	}
	switch proto {
	case "", "tcp", "udp", "any":
	default:
		return errdefs.Unprocessablef("%s.protocol: %q (expected tcp, udp or any)", field, proto)
	}
	return checkPorts(field, ports)
}

func checkPorts(field string, ports []int) error {
	for j, port := range ports {
		if port < 1 || port > 65535 {
			return errdefs.Unprocessablef("%s.ports[%d]: %d is not a port (1-65535)", field, j, port)
		}
	}
	return nil
}

func (r *Resources) validate(h Host) error {
	const p = "isolation.resources."
	type bound struct {
		field    string
		v        int64
		min, max int64
		unit     string
	}
	bounds := []bound{
		{"cpu_shares", int64(r.CPUShares), 2, MaxCPUShares, ""},
		{"memory_bytes", r.MemoryBytes, MinMemory, MaxMemory, "bytes"},
		{"disk_bytes", r.DiskBytes, MinDisk, MaxDisk, "bytes"},
		{"pids_limit", r.PidsLimit, MinPids, MaxPids, "(agentjail's init and a running command's shim use about 23 of them)"},
		{"cpu_period", int64(r.CPUPeriod), 1000, 1000000, "µs"},
	}
	for _, b := range bounds {
		if b.v < b.min || b.v > b.max {
			return errdefs.Unprocessablef("%s%s: %d is outside the allowed range %d..%d %s", p, b.field, b.v, b.min, b.max, b.unit)
		}
	}
	if r.CPUQuota < 0 {
		return errdefs.Unprocessablef(p+"cpu_quota: %d must not be negative", r.CPUQuota)
	}
	if r.CPUQuota > 0 {
		maxQ := int64(r.CPUPeriod) * int64(max(h.CPUs, 1))
		if r.CPUQuota < 1000 || r.CPUQuota > maxQ {
			return errdefs.Unprocessablef(p+"cpu_quota: %d is outside 1000..%d µs (cpu_period × %d CPUs)", r.CPUQuota, maxQ, h.CPUs)
		}
	}
	if r.MemorySwapBytes < r.MemoryBytes {
		return errdefs.Unprocessablef(p+"memory_swap_bytes: %d is below memory_bytes %d", r.MemorySwapBytes, r.MemoryBytes)
	}
	if r.MemorySwapBytes > 2*MaxMemory {
		return errdefs.Unprocessablef(p+"memory_swap_bytes: %d is above the maximum %d", r.MemorySwapBytes, 2*MaxMemory)
	}
	if h.NofileMax > 0 && r.NofileLimit > h.NofileMax {
		return errdefs.Unprocessablef(p+"nofile_limit: %d exceeds the daemon's own hard limit %d (raising it needs CAP_SYS_RESOURCE, which the daemon lacks)", r.NofileLimit, h.NofileMax)
	}
	if r.NofileLimit < 16 {
		return errdefs.Unprocessablef(p+"nofile_limit: %d is below the minimum 16", r.NofileLimit)
	}
	if r.AsLimit != 0 && r.AsLimit < uint64(64*MiB) {
		return errdefs.Unprocessablef(p+"as_limit: %d is below the minimum %d bytes", r.AsLimit, 64*MiB)
	}
	return nil
}

func (p *Process) validate() error {
	const f = "isolation.process."
	if p.ApparmorProfile != "" {
		return errdefs.Unprocessablef(f + "apparmor_profile: AppArmor is not available on this daemon's hosts")
	}
	if p.SelinuxContext != "" {
		return errdefs.Unprocessablef(f + "selinux_context: SELinux is not available on this daemon's hosts")
	}
	if !userRE().MatchString(p.User) {
		return errdefs.Unprocessablef(f+"user: %q is not a user name or numeric uid", p.User)
	}
	if p.Group != "" && !userRE().MatchString(p.Group) {
		return errdefs.Unprocessablef(f+"group: %q is not a group name or numeric gid", p.Group)
	}
	for i, c := range p.Capabilities {
		if _, ok := CapabilityName(c); !ok {
			return errdefs.Unprocessablef(f+"capabilities[%d]: unknown capability %q", i, c)
		}
	}
	for i, c := range p.DropCapabilities {
		if strings.EqualFold(c, "ALL") {
			continue
		}
		if _, ok := CapabilityName(c); !ok {
			return errdefs.Unprocessablef(f+"drop_capabilities[%d]: unknown capability %q", i, c)
		}
	}
	ns := p.Namespaces
	for _, n := range []struct {
		name string
		v    *bool
	}{{"pid", ns.PID}, {"mount", ns.Mount}, {"network", ns.Network}, {"uts", ns.UTS}, {"ipc", ns.IPC}, {"cgroup", ns.Cgroup}} {
		if n.v != nil && !*n.v {
			return errdefs.Unprocessablef(f+"namespaces.%s: the container level always uses a new %s namespace", n.name, n.name)
		}
	}
	if sp := p.SeccompProfile; sp != nil {
		if err := sp.validate(); err != nil {
			return err
		}
	}
	return nil
}

var userRE = lazyre.New(`^[a-z_][a-z0-9_-]{0,31}$|^[0-9]{1,10}$`)

func (s *SeccompProfile) validate() error {
	const f = "isolation.process.seccomp_profile."
	if !validAction(s.DefaultAction) {
		return errdefs.Unprocessablef(f+"default_action: %q (expected SCMP_ACT_ALLOW, SCMP_ACT_ERRNO or SCMP_ACT_KILL)", s.DefaultAction)
	}
	for i, sc := range s.Syscalls {
		if len(sc.Names) == 0 {
			return errdefs.Unprocessablef(f+"syscalls[%d].names: at least one name is required", i)
		}
		if !validAction(sc.Action) {
			return errdefs.Unprocessablef(f+"syscalls[%d].action: %q (expected SCMP_ACT_ALLOW, SCMP_ACT_ERRNO or SCMP_ACT_KILL)", i, sc.Action)
		}
		for j, a := range sc.Args {
			if a.Index > 5 {
				return errdefs.Unprocessablef(f+"syscalls[%d].args[%d].index: %d (0-5)", i, j, a.Index)
			}
			switch a.Op {
			case "SCMP_CMP_EQ", "SCMP_CMP_NE", "SCMP_CMP_LT", "SCMP_CMP_LE", "SCMP_CMP_GT", "SCMP_CMP_GE", "SCMP_CMP_MASKED_EQ":
			default:
				return errdefs.Unprocessablef(f+"syscalls[%d].args[%d].op: unknown operator %q", i, j, a.Op)
			}
		}
	}
	return nil
}

func validAction(a string) bool { return a == ActAllow || a == ActErrno || a == ActKill }

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
