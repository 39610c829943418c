package agent

import (
	"net/url"
	"strconv"
	"strings"

	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
)

// ToolRoot is where tool trees are mounted in a jail: ToolRoot/<agent>,
// with ToolRoot/<agent>/bin first on the jail's PATH.
const ToolRoot = "/opt/agentjail"

// jailPath is the PATH of an agent jail without the tool's bin/.
const jailPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Agent jails' resource defaults, where the request sets none: the CLIs
// are large binaries or Node programs with many threads.
const (
	agentMemory = 2 * config.GiB
	agentPids   = 512
)

// providerEnv are the variables that point each provider's SDK at the
// proxy's plain-HTTP endpoint and give it the dummy key.
var providerEnv = map[string]struct{ base, key string }{
	"anthropic": {"ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"},
	"openai":    {"OPENAI_BASE_URL", "OPENAI_API_KEY"},
	"gemini":    {"GOOGLE_GEMINI_BASE_URL", "GEMINI_API_KEY"},
}

// ValidateSpec checks an agent section's form (the agent's existence and
// installation are checked by Expand).
func ValidateSpec(a *config.Agent) error {
	if a.Name == "" {
		return errdefs.Unprocessablef("agent.name: required (one of %s)", joinNames())
	}
	if a.Version != "" && !versionRE().MatchString(a.Version) {
		return errdefs.Unprocessablef("agent.version: %q is not a version", a.Version)
	}
	if a.Endpoint != "" {
		if _, err := parseEndpoint(a.Endpoint); err != nil {
			return err
		}
	}
	if strings.ContainsAny(a.Model, "\x00\n\"") {
		return errdefs.Unprocessablef("agent.model: %q is not a model name", a.Model)
	}
	for i, s := range a.Args {
		if strings.ContainsRune(s, 0) {
			return errdefs.Unprocessablef("agent.args[%d]: NUL byte", i)
		}
	}
	if a.HomeTemplate != "" && !strings.HasPrefix(a.HomeTemplate, "/") {
		return errdefs.Unprocessablef("agent.home_template: %q must be an absolute host path", a.HomeTemplate)
	}
	return nil
}

func parseEndpoint(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, errdefs.Unprocessablef("agent.endpoint: %q must be an http:// or https:// origin (with an optional path), without credentials", s)
	}
	return u, nil
}

// Expand turns cfg's agent section into what runs the agent: the tool
// tree m mounted read-only at ToolRoot/<agent> with its bin/ first on
// PATH, the agent's unattended-run variables, the model host allowed and
// routed (to the endpoint override or the real API) with the daemon's key
// added by the proxy, and roomier memory and pids defaults. keys tells whether
// the daemon holds the provider's key: without one, only an endpoint
// override (a local model server may need none) is accepted.
func Expand(cfg *config.Config, def *Definition, m *Manifest, keys *Keys) error {
	a := cfg.Agent
	a.Version = m.Version
	iso := &cfg.Isolation
	if iso.Network.Mode == config.NetNone {
		return errdefs.Unprocessablef("isolation.network.mode: an agent needs the network to reach its model API (isolated or bridge, not none)")
	}
	p := def.Provider
	upstream := p.Upstream
	n := &iso.Network
	if a.Endpoint != "" {
		u, err := parseEndpoint(a.Endpoint)
		if err != nil {
			return err
		}
		upstream = strings.TrimSuffix(u.String(), "/")
		port := 80
		if u.Scheme == "https" {
			port = 443
		}
		if s := u.Port(); s != "" {
			port, _ = strconv.Atoi(s)
		}
		n.AlwaysAllow = append(n.AlwaysAllow, config.EgressRule{Destination: u.Hostname(), Ports: []int{port}, Protocol: "tcp"})
	}
	n.AlwaysAllow = append(n.AlwaysAllow, config.EgressRule{Destination: p.Host})
	n.Routes = append(n.Routes, config.Route{Host: p.Host, URL: upstream})
	if _, ok := keys.Lookup(p.Secret); ok {
		n.Credentials = append(n.Credentials, config.Credential{Host: p.Host, Header: p.Header, Value: p.Prefix, Secret: p.Secret})
	} else if a.Endpoint == "" {
		hint := ""
		if err := keys.Check(); err != nil {
			hint = " (" + err.Error() + ")"
		}
		return errdefs.Unprocessablef("agent: the daemon holds no %s for %s; set it in the daemon's environment or its secrets file%s, or name an agent.endpoint", p.Secret, def.Name, hint)
	}

	target := ToolRoot + "/" + def.Name
	iso.Filesystem.ReadOnlyMounts = append(iso.Filesystem.ReadOnlyMounts, config.Mount{Source: m.Dir, Target: target})
	if cfg.Env == nil {
		cfg.Env = map[string]string{}
	}
	set := func(k, v string) {
		if _, user := cfg.Env[k]; !user {
			cfg.Env[k] = v
		}
	}
	path := jailPath
	if v, ok := cfg.Env["PATH"]; ok {
		path = v
	}
	cfg.Env["PATH"] = target + "/bin:" + path
	for k, v := range def.Env {
		set(k, v)
	}
	pe := providerEnv[p.Name]
	set(pe.base, "http://"+p.Host)
	set(pe.key, DummyKey)

	r := &iso.Resources
	if r.MemoryBytes == 0 {
		r.MemoryBytes = agentMemory
	}
	if r.PidsLimit == 0 {
		r.PidsLimit = agentPids
	}
	return nil
}

// HomeFiles returns the agent's home template for cfg (after Expand).
func HomeFiles(cfg *config.Config, def *Definition) (map[string][]byte, error) {
	return def.Home(HomeOptions{
		Version:   cfg.Agent.Version,
		Workspace: cfg.Isolation.Filesystem.WorkspaceRoot,
		Model:     cfg.Agent.Model,
		BaseURL:   "http://" + def.Provider.Host,
		ToolDir:   ToolRoot + "/" + def.Name,
	})
}
