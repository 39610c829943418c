package config

import (
	"errors"
	"strings"
	"testing"

	"github.com/agentjail/agentjail/internal/errdefs"
)

var testHost = Host{NofileMax: 20000, CPUs: 2, Levels: []string{LevelContainer}, NetworkModes: []string{NetIsolated, NetNone, NetBridge}}

func TestDefaultsFollowSeed000(t *testing.T) {
	var c Config
	c.ApplyDefaults()
	r := c.Isolation.Resources
	if r.CPUShares != 256 || r.MemoryBytes != 512*MiB || r.DiskBytes != 1024*MiB || r.PidsLimit != 128 {
		t.Fatalf("defaults = %+v", r)
	}
	if c.Isolation.Level != LevelContainer || c.Isolation.Network.Mode != NetIsolated || c.Tracing.Mode != TraceFull {
		t.Fatalf("defaults: level %q, network %q, tracing %q", c.Isolation.Level, c.Isolation.Network.Mode, c.Tracing.Mode)
	}
	if err := c.Validate(testHost); err != nil {
		t.Fatalf("the default config is invalid: %v", err)
	}
}

func TestDecodeRejectsUnknownKeysNamingThem(t *testing.T) {
	for _, doc := range []string{
		`{"isolation":{"resources":{"memry_bytes":1}}}`,
		"isolation:\n  resources:\n    memry_bytes: 1\n",
	} {
		var c Config
		err := DecodeYAML([]byte(doc), &c)
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "memry_bytes") {
			t.Errorf("%q: %v, want ErrInvalid naming memry_bytes", doc, err)
		}
	}
	var c Config
	if err := DecodeJSON([]byte(`{"env":{}} {}`), &c); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("trailing data: %v", err)
	}
	if err := DecodeJSON([]byte(`{"isolation":{"resources":{"memory_bytes":"lots"}}}`), &c); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "memory_bytes") {
		t.Errorf("wrong type: %v", err)
	}
}

func TestValidateNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		field string
		set   func(c *Config)
	}{
		{"isolation.resources.memory_bytes", func(c *Config) { c.Isolation.Resources.MemoryBytes = 9000 * MiB }},
		{"isolation.resources.disk_bytes", func(c *Config) { c.Isolation.Resources.DiskBytes = 17000 * MiB }},
		{"isolation.resources.pids_limit", func(c *Config) { c.Isolation.Resources.PidsLimit = 5000 }},
		{"isolation.resources.pids_limit", func(c *Config) { c.Isolation.Resources.PidsLimit = 8 }},
		{"isolation.resources.cpu_shares", func(c *Config) { c.Isolation.Resources.CPUShares = 2048 }},
		{"isolation.resources.cpu_quota", func(c *Config) { c.Isolation.Resources.CPUQuota = 10_000_000 }},
		{"isolation.resources.nofile_limit", func(c *Config) { c.Isolation.Resources.NofileLimit = 1 << 20 }},
		{"isolation.resources.memory_swap_bytes", func(c *Config) { c.Isolation.Resources.MemorySwapBytes = MiB }},
		{"isolation.level", func(c *Config) { c.Isolation.Level = LevelVM }},
		{"tracing.max_file_bytes", func(c *Config) { c.Tracing.MaxFileBytes = 1000 }},
		{"tracing.max_file_bytes", func(c *Config) { c.Tracing.MaxFileBytes = MaxEventFileBytes + 1 }},
		{"isolation.network.mode", func(c *Config) { c.Isolation.Network.Mode = NetHost }},
		{"isolation.network.limits.connections", func(c *Config) {
			c.Isolation.Network.Limits = &NetworkLimits{Connections: MaxConnections + 1}
		}},
		{"isolation.network.allowed_egress[0].ports[0]", func(c *Config) {
			c.Isolation.Network.AllowedEgress = []EgressRule{{Destination: "example.com", Ports: []int{70000}}}
		}},
		// What the network policy would refuse when the jail is made is
		// refused here, before anything is made.
		{"isolation.network.allowed_egress[0].destination", func(c *Config) {
			c.Isolation.Network.AllowedEgress = []EgressRule{{Destination: "bad host!"}}
		}},
		{"isolation.network.blocked_egress[0].destination", func(c *Config) {
			c.Isolation.Network.BlockedEgress = []EgressRule{{Destination: "10.0.0.0/99"}}
		}},
		{"isolation.network.allowed_ingress[0].source", func(c *Config) {
			c.Isolation.Network.AllowedIngress = []IngressRule{{Source: "example.com"}}
		}},
		{"isolation.network.allowed_ingress[0].source", func(c *Config) {
			c.Isolation.Network.AllowedIngress = []IngressRule{{Source: "*"}}
		}},
		{"isolation.network.blocked_egress[0].destination", func(c *Config) {
			c.Isolation.Network.BlockedEgress = []EgressRule{{Destination: "*x"}}
		}},
		{"isolation.network.inter_agent_rules[0]", func(c *Config) {
			c.Isolation.Network.InterAgentRules = []InterAgentRule{{From: "[", To: "db"}}
		}},
		{"isolation.network.routes[0].url", func(c *Config) {
			c.Isolation.Network.Routes = []Route{{Host: "model.internal", URL: "http://127.0.0.1:99999/v1"}}
		}},
		{"isolation.network.credentials[0].host", func(c *Config) {
			c.Isolation.Network.Credentials = []Credential{{Host: "api example.com", Header: "Authorization", Value: "x"}}
		}},
		{"isolation.network.credentials[0].value", func(c *Config) {
			c.Isolation.Network.Credentials = []Credential{{Host: "api.example.com", Header: "Authorization", Value: Redacted}}
		}},
		{"isolation.filesystem.rootfs", func(c *Config) { c.Isolation.Filesystem.Rootfs = "docker://debian" }},
		{"isolation.filesystem.blocked_paths[0]", func(c *Config) { c.Isolation.Filesystem.BlockedPaths = []string{"../etc"} }},
		{"isolation.filesystem.mounts[0].target", func(c *Config) {
			c.Isolation.Filesystem.ReadOnlyMounts = []Mount{{Source: "/srv", Target: "relative"}}
		}},
		{"isolation.process.user", func(c *Config) { c.Isolation.Process.User = "Robert'); DROP" }},
		{"isolation.process.capabilities[0]", func(c *Config) { c.Isolation.Process.Capabilities = []string{"CAP_TIME_TRAVEL"} }},
		{"isolation.process.namespaces.pid", func(c *Config) {
			f := false
			c.Isolation.Process.Namespaces = &Namespaces{PID: &f}
		}},
		{"isolation.process.seccomp_profile.default_action", func(c *Config) {
			c.Isolation.Process.SeccompProfile = &SeccompProfile{DefaultAction: "SCMP_ACT_MAYBE"}
		}},
		{"tracing.mode", func(c *Config) { c.Tracing.Mode = "everything" }},
	} {
		var c Config
		tc.set(&c)
		c.ApplyDefaults()
		err := c.Validate(testHost)
		if !errors.Is(err, errdefs.ErrUnprocessable) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: %v, want ErrUnprocessable naming the field", tc.field, err)
		}
	}
}

func TestValidName(t *testing.T) {
	for _, n := range []string{"a", "agent-1", "A.b_c", strings.Repeat("x", 63)} {
		if err := ValidName(n); err != nil {
			t.Errorf("%q: %v", n, err)
		}
	}
	for _, n := range []string{"", "-x", "a b", "a/b", "../x", strings.Repeat("x", 64), "é"} {
		if err := ValidName(n); !errors.Is(err, errdefs.ErrUnprocessable) {
			t.Errorf("%q accepted", n)
		}
	}
}

func TestEffectiveCapabilitiesAndRedaction(t *testing.T) {
	p := Process{DropCapabilities: []string{"ALL"}, Capabilities: []string{"net_bind_service"}}
	if got := p.EffectiveCapabilities(); len(got) != 1 || got[0] != "CAP_NET_BIND_SERVICE" {
		t.Errorf("drop ALL + add one = %v", got)
	}
	c := Config{Isolation: Isolation{Network: Network{Credentials: []Credential{{Host: "h", Header: "X-Key", Value: "s3cret"}}}}}
	r := c.Redact()
	if r.Isolation.Network.Credentials[0].Value != Redacted || c.Isolation.Network.Credentials[0].Value != "s3cret" {
		t.Errorf("Redact must return a redacted copy and leave the original")
	}
}
