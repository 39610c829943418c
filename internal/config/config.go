// Package config defines a jail's configuration: the isolation schema of
// seed 002 (isolation.level, filesystem, network, resources, process) with
// snake_case keys, its defaults and maxima (seed 000), strict decoding of
// JSON and YAML (unknown keys are rejected) and validation whose messages
// name the offending field.
package config

// Config is the whole configuration of one jail as the API accepts it and
// reports it back (with defaults filled in).
type Config struct {
	// Isolation is seed 002's IsolationConfig.
	Isolation Isolation `json:"isolation"`
	// Env is added to the environment of every command run in the jail.
	Env map[string]string `json:"env,omitempty"`
	// Hostname of the jail's UTS namespace (default: the jail's name).
	Hostname string `json:"hostname,omitempty"`
	// Tracing selects what the observation layer records.
	Tracing Tracing `json:"tracing"`
	// Recording selects what terminal session recordings hold.
	Recording Recording `json:"recording"`
	// Agent runs an AI agent CLI in the jail (internal/agent expands it
	// into mounts, environment and network rules at create).
	Agent *Agent `json:"agent,omitempty"`
	// Workspace fills the jail's workspace from a git repository and
	// says how its work goes back (internal/workspace).
	Workspace *Workspace `json:"workspace,omitempty"`
}

// Agent is the `agent` section of a jail's config.
type Agent struct {
	// Name is the agent CLI: claude, codex, gemini or opencode.
	Name string `json:"name"`
	// Version is an installed version of it (default: the newest installed).
	Version string `json:"version,omitempty"`
	// Endpoint replaces the model API's origin (a local model server, a
	// company gateway): http(s)://host[:port][/prefix].
	Endpoint string `json:"endpoint,omitempty"`
	// Model is the model the agent asks for (default: the CLI's own).
	Model string `json:"model,omitempty"`
	// HomeTemplate is a host directory copied into the agent's home over
	// the daemon's template (settings, MCP servers, skills).
	HomeTemplate string `json:"home_template,omitempty"`
	// Args are added to every run of the agent.
	Args []string `json:"args,omitempty"`
}

// Workspace is the `workspace` section of a jail's config.
type Workspace struct {
	// Repo is a host git repository (absolute path) or a git URL, cloned
	// into the jail's workspace. Work syncs back to a host repository only.
	Repo string `json:"repo"`
	// Ref is the branch, tag or commit checked out (default: the
	// repository's HEAD).
	Ref string `json:"ref,omitempty"`
	// Sync says when the jail's work goes back to the host repository.
	Sync Sync `json:"sync"`
	// Caches mounts the project's package caches (npm, pip, go, cargo),
	// shared by its jails (default true).
	Caches *bool `json:"caches,omitempty"`
	// Commit is the commit the workspace was filled from (set by the daemon).
	Commit string `json:"commit,omitempty"`
}

// Sync modes.
const (
	SyncManual     = "manual"
	SyncAutoCommit = "auto-commit"
	SyncAutoIdle   = "auto-idle"
)

// Sync configures how a jail's work goes back to the host repository, as
// branch agentjail/<jail>.
type Sync struct {
	// Mode is manual (default: agentjail sync), auto-commit (commit in the
	// jail every IntervalS seconds and when an agent run ends, then sync)
	// or auto-idle (sync once the workspace has been quiet for IdleS
	// seconds after a change).
	Mode string `json:"mode,omitempty"`
	// IntervalS is auto-commit's period (default 60).
	IntervalS int `json:"interval_s,omitempty"`
	// IdleS is auto-idle's quiet time (default 30).
	IdleS int `json:"idle_s,omitempty"`
}

// Tracing modes.
const (
	TraceFull       = "full"
	TraceNoSyscalls = "no-syscalls"
	TraceOff        = "off"
)

// Tracing selects what is recorded of a jail.
type Tracing struct {
	// Mode is full (default: syscalls, processes, files, network),
	// no-syscalls (processes, files and network only) or off.
	Mode string `json:"mode"`
	// Include limits recorded syscalls to these names (empty: all).
	Include []string `json:"include,omitempty"`
	// Exclude drops these syscall names from the record.
	Exclude []string `json:"exclude,omitempty"`
	// Pcap captures the jail's traffic on its host-side interface to
	// events/capture.pcap (readable by tshark and Wireshark).
	Pcap bool `json:"pcap,omitempty"`
	// MaxFileBytes bounds each of the jail's event files and its packet
	// capture (0: DefaultEventFileBytes; MinEventFileBytes to
	// MaxEventFileBytes).
	// Past it the file's events are counted lost instead of written (the
	// live stream still has them), so one jail's flood of events cannot
	// fill the data dir that every jail's record shares.
	MaxFileBytes int64 `json:"max_file_bytes,omitempty"`
}

// The bound of each of a jail's event files.
const (
	DefaultEventFileBytes = 2 << 30
	MinEventFileBytes     = 1 << 20
	MaxEventFileBytes     = 1 << 40
)

// Isolation levels.
const (
	LevelNone      = "none"
	LevelProcess   = "process"
	LevelContainer = "container"
	LevelGVisor    = "gvisor"
	LevelVM        = "vm"
)

// Isolation is seed 002's IsolationConfig.
type Isolation struct {
	Level      string     `json:"level"`
	Filesystem Filesystem `json:"filesystem"`
	Network    Network    `json:"network"`
	Resources  Resources  `json:"resources"`
	Process    Process    `json:"process"`
}

// Filesystem configures the jail's root filesystem and mounts.
type Filesystem struct {
	// Rootfs names the rootfs provider: "host" (default: a curated tree
	// over the host's read-only /usr), "dir:/abs/path" (any directory
	// tree) or "image:REF" (an image of the daemon's store, its layers
	// shared by every jail of it).
	Rootfs string `json:"rootfs,omitempty"`
	// WorkspaceRoot is the jail-side path of the writable workspace
	// (default /workspace), owned by the jail's default user.
	WorkspaceRoot string `json:"workspace_root,omitempty"`
	// ReadOnlyMounts are host directories bind-mounted read-only.
	ReadOnlyMounts []Mount `json:"read_only_mounts,omitempty"`
	// ReadWriteMounts are host directories bind-mounted read-write.
	ReadWriteMounts []Mount `json:"read_write_mounts,omitempty"`
	// BlockedPaths are jail-side paths that are masked inside the jail and
	// refused (403) by the file API.
	BlockedPaths []string `json:"blocked_paths,omitempty"`
	// UseOverlay must be true (or unset): the container level always uses
	// an overlay root.
	UseOverlay *bool `json:"use_overlay,omitempty"`
}

// Mount is a bind mount of a host path into the jail.
type Mount struct {
	Source  string   `json:"source"`
	Target  string   `json:"target"`
	Options []string `json:"options,omitempty"`
}

// Network modes.
const (
	NetNone     = "none"
	NetIsolated = "isolated"
	NetBridge   = "bridge"
	NetHost     = "host"
)

// Network configures the jail's network namespace and policy.
//
// Precedence for egress: always_allow beats blocked_egress, which beats
// allowed_egress; anything else is denied. Cloud metadata and the host's
// own addresses are refused unless a rule names them.
type Network struct {
	// Mode is none (loopback only), isolated (default: only the daemon's
	// DNS and proxies are reachable, allowed HTTP(S) goes through them),
	// bridge (also direct connections where an IP/CIDR rule allows, NATed)
	// or host (the host's network; only with the daemon's opt-in).
	Mode string `json:"mode"`
	// AllowedEgress allows destinations (seed 002 allowed_egress, seed 003 allow).
	AllowedEgress []EgressRule `json:"allowed_egress,omitempty"`
	// AlwaysAllow destinations win over BlockedEgress (seed 003 always_allow).
	AlwaysAllow []EgressRule `json:"always_allow,omitempty"`
	// BlockedEgress destinations win over AllowedEgress (seed 003 block).
	BlockedEgress []EgressRule `json:"blocked_egress,omitempty"`
	// AllowedIngress allows connections into the jail from sources.
	AllowedIngress []IngressRule `json:"allowed_ingress,omitempty"`
	// DNSServers is accepted for compatibility but the jail's resolver is
	// always the daemon's, which applies the policy.
	DNSServers []string `json:"dns_servers,omitempty"`
	// AllowInterAgent allows every jail to reach this one and back.
	AllowInterAgent bool `json:"allow_inter_agent,omitempty"`
	// InterAgentRules allow or deny traffic between jails by name pattern.
	InterAgentRules []InterAgentRule `json:"inter_agent_rules,omitempty"`
	// Limits are per-jail rate limits (seed 003).
	Limits *NetworkLimits `json:"limits,omitempty"`
	// TLSInspection terminates HTTPS at the daemon's proxy with a
	// certificate of the daemon's CA (installed in the jail's trust store)
	// so requests are recorded with method, path and status.
	TLSInspection bool `json:"tls_inspection,omitempty"`
	// Credentials are headers the proxy adds to requests to one host; the
	// values never enter the jail and are redacted in API answers.
	Credentials []Credential `json:"credentials,omitempty"`
	// Routes send the jail's HTTP requests for a host to another origin
	// through the daemon's proxy (an agent's model endpoint).
	Routes []Route `json:"routes,omitempty"`
	// RegistryCache lets the jail pull images through the daemon's
	// pull-through registry cache at http://registry.agentjail/v2/
	// (<registry>/<repository>/manifests|blobs/<reference>): the daemon
	// adds the route and its token (which never enters the jail).
	RegistryCache bool `json:"registry_cache,omitempty"`
}

// Route sends a jail's plain-HTTP requests for Host to the origin of URL
// (http or https, with an optional path prefix); the proxy re-originates
// them and adds Host's credentials.
type Route struct {
	Host string `json:"host"`
	URL  string `json:"url"`
}

// NetworkLimits caps a jail's traffic through the daemon.
type NetworkLimits struct {
	RequestsPerMinute int   `json:"requests_per_minute,omitempty"`
	BytesPerHour      int64 `json:"bytes_per_hour,omitempty"`
	// DNSQueriesPerSecond caps the jail's queries to the daemon's DNS
	// (0: DefaultDNSQueriesPerSecond; 1 to MaxDNSQueriesPerSecond); the
	// rest are dropped and counted.
	DNSQueriesPerSecond int `json:"dns_queries_per_second,omitempty"`
	// Connections caps the jail's connections to the daemon's proxies
	// and DNS open at once (0: DefaultConnections; 1 to MaxConnections);
	// one past it is reset and recorded.
	Connections int `json:"connections,omitempty"`
}

// The DNS rate limit of a jail, per second.
const (
	DefaultDNSQueriesPerSecond = 100
	MaxDNSQueriesPerSecond     = 10000
)

// The bound of a jail's connections to the daemon open at once.
const (
	DefaultConnections = 1024
	MaxConnections     = 16384
)

// Credential is a header added by the proxy to requests to Host. Its
// value is Value or, with Secret, Value followed by the daemon's secret of
// that name (from the daemon's environment or secrets file), which no
// config, record or answer ever holds.
type Credential struct {
	Host   string `json:"host"`
	Header string `json:"header"`
	Value  string `json:"value,omitempty"`
	Secret string `json:"secret,omitempty"`
}

// Redacted is what API answers show in place of a credential's value.
const Redacted = "<redacted>"

// Redact returns a copy of c whose credential values are replaced by Redacted.
func (c Config) Redact() Config {
	if len(c.Isolation.Network.Credentials) == 0 {
		return c
	}
	creds := make([]Credential, len(c.Isolation.Network.Credentials))
	for i, cr := range c.Isolation.Network.Credentials {
		if cr.Secret == "" {
			cr.Value = Redacted
		}
		creds[i] = cr
	}
	c.Isolation.Network.Credentials = creds
	return c
}

// EgressRule allows traffic to a destination (host name, *.wildcard, IP or CIDR).
type EgressRule struct {
	Destination string `json:"destination"`
	Ports       []int  `json:"ports,omitempty"`
	Protocol    string `json:"protocol,omitempty"`
}

// IngressRule allows traffic from a source (IP or CIDR).
type IngressRule struct {
	Source   string `json:"source"`
	Ports    []int  `json:"ports,omitempty"`
	Protocol string `json:"protocol,omitempty"`
}

// InterAgentRule allows or denies traffic between jails by name pattern.
type InterAgentRule struct {
	From  string `json:"from"`
	To    string `json:"to"`
	Ports []int  `json:"ports,omitempty"`
	Allow bool   `json:"allow"`
}

// Resources are the jail's limits. Zero means "the default".
type Resources struct {
	// CPUShares is the relative CPU weight (cgroup v1 cpu.shares; converted
	// to cpu.weight on cgroup v2).
	CPUShares uint64 `json:"cpu_shares,omitempty"`
	// CPUQuota is the CFS quota in microseconds per CPUPeriod (100000 = 1 CPU).
	CPUQuota int64 `json:"cpu_quota,omitempty"`
	// CPUPeriod is the CFS period in microseconds.
	CPUPeriod uint64 `json:"cpu_period,omitempty"`
	// MemoryBytes is the memory limit.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// MemorySwapBytes is the memory+swap limit; equal to MemoryBytes means no swap.
	MemorySwapBytes int64 `json:"memory_swap_bytes,omitempty"`
	// DiskBytes is the size of the jail's writable layer.
	DiskBytes int64 `json:"disk_bytes,omitempty"`
	// PidsLimit caps the number of tasks in the jail.
	PidsLimit int64 `json:"pids_limit,omitempty"`
	// NofileLimit is RLIMIT_NOFILE (soft and hard).
	NofileLimit uint64 `json:"nofile_limit,omitempty"`
	// AsLimit is RLIMIT_AS in bytes (0: unlimited).
	AsLimit uint64 `json:"as_limit,omitempty"`
	// CoreLimit is RLIMIT_CORE in bytes (default 0: no core dumps).
	CoreLimit uint64 `json:"core_limit,omitempty"`
}

// Process configures the identity and privileges of the jail's processes.
type Process struct {
	// User that commands run as unless a request names another (default "agent", uid 1000).
	User string `json:"user,omitempty"`
	// Group of that user (default: the user's primary group).
	Group string `json:"group,omitempty"`
	// Capabilities added to the default minimal set (names with or without CAP_).
	Capabilities []string `json:"capabilities,omitempty"`
	// DropCapabilities removed from the set ("ALL" drops everything first).
	DropCapabilities []string `json:"drop_capabilities,omitempty"`
	// SeccompProfile replaces the default profile.
	SeccompProfile *SeccompProfile `json:"seccomp_profile,omitempty"`
	// ApparmorProfile is not supported on this daemon's hosts (422 when set).
	ApparmorProfile string `json:"apparmor_profile,omitempty"`
	// SelinuxContext is not supported on this daemon's hosts (422 when set).
	SelinuxContext string `json:"selinux_context,omitempty"`
	// Namespaces selects namespaces; the container level requires all but
	// user, which maps the jail's root to an unprivileged host uid range.
	Namespaces *Namespaces `json:"namespaces,omitempty"`
}

// Namespaces selects the namespaces a jail gets.
type Namespaces struct {
	PID     *bool `json:"pid,omitempty"`
	Mount   *bool `json:"mount,omitempty"`
	Network *bool `json:"network,omitempty"`
	User    *bool `json:"user,omitempty"`
	UTS     *bool `json:"uts,omitempty"`
	IPC     *bool `json:"ipc,omitempty"`
	Cgroup  *bool `json:"cgroup,omitempty"`
}

// Seccomp actions.
const (
	ActAllow = "SCMP_ACT_ALLOW"
	ActErrno = "SCMP_ACT_ERRNO"
	ActKill  = "SCMP_ACT_KILL"
)

// SeccompProfile is seed 002's seccomp profile.
type SeccompProfile struct {
	DefaultAction string           `json:"default_action"`
	Syscalls      []SeccompSyscall `json:"syscalls"`
}

// SeccompSyscall is one rule of a SeccompProfile.
type SeccompSyscall struct {
	Names  []string     `json:"names"`
	Action string       `json:"action"`
	Args   []SeccompArg `json:"args,omitempty"`
}

// SeccompArg compares one syscall argument.
type SeccompArg struct {
	Index uint   `json:"index"`
	Value uint64 `json:"value"`
	Op    string `json:"op"`
}
