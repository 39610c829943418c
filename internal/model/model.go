// Package model defines the objects agentjail exchanges over its API:
// jails, their stats, exec requests and results, file information and
// health. It imports nothing heavy so that the public client can use it.
package model

import (
	"time"

	"github.com/agentjail/agentjail/internal/config"
)

// State is a jail's lifecycle state.
type State string

// The lifecycle states: created → starting → running → stopping → stopped,
// with error (a start failed or init died) and destroyed. A running jail
// whose init does not answer is shown as unresponsive until it answers
// again (it can be stopped and destroyed as a running one).
const (
	StateCreated      State = "created"
	StateStarting     State = "starting"
	StateRunning      State = "running"
	StateStopping     State = "stopping"
	StateStopped      State = "stopped"
	StateError        State = "error"
	StateDestroyed    State = "destroyed"
	StateUnresponsive State = "unresponsive"
)

// CreateRequest is the body of POST /jails: a name, whether to start, and
// the jail's config (its keys at the top level).
type CreateRequest struct {
	Name  string `json:"name,omitempty"`
	Start *bool  `json:"start,omitempty"`
	config.Config
}

// Jail is a jail as the API reports it.
type Jail struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Tenant is the tenant the jail belongs to (internal/tenant).
	Tenant    string        `json:"tenant,omitempty"`
	Status    State         `json:"status"`
	CreatedAt time.Time     `json:"created_at"`
	StartedAt *time.Time    `json:"started_at,omitempty"`
	StoppedAt *time.Time    `json:"stopped_at,omitempty"`
	Error     string        `json:"error,omitempty"`
	Config    config.Config `json:"config"`
	// Pid is init's pid on the host while the jail runs.
	Pid int `json:"pid,omitempty"`
	// Stats is live usage read from the jail's cgroup (GET /jails/{id} only).
	Stats *Stats `json:"stats,omitempty"`
	// Parent is the snapshot the jail was restored or branched from (nil
	// for a jail made by create).
	Parent *Lineage `json:"parent,omitempty"`
}

// Stats is a jail's live resource usage.
type Stats struct {
	MemoryBytes      uint64 `json:"memory_bytes"`
	MemoryLimitBytes uint64 `json:"memory_limit_bytes"`
	CPUTimeNs        uint64 `json:"cpu_time_ns"`
	Pids             uint64 `json:"pids"`
	PidsLimit        uint64 `json:"pids_limit"`
	OOMKills         uint64 `json:"oom_kills"`
	DiskUsedBytes    uint64 `json:"disk_used_bytes"`
	DiskLimitBytes   uint64 `json:"disk_limit_bytes"`
}

// ExecRequest is the body of POST /jails/{id}/exec.
type ExecRequest struct {
	// Cmd is the argv; Cmd[0] is looked up in the jail's PATH.
	Cmd []string `json:"cmd"`
	// Env is added to the jail's environment.
	Env map[string]string `json:"env,omitempty"`
	// Cwd defaults to the workspace.
	Cwd string `json:"cwd,omitempty"`
	// Stdin is fed to the command, then closed.
	Stdin string `json:"stdin,omitempty"`
	// TimeoutMs kills the command and all its descendants when it expires
	// (0: no timeout).
	TimeoutMs int64 `json:"timeout_ms,omitempty"`
	// User is a name or uid in the jail (default: the jail's user).
	User string `json:"user,omitempty"`
	// Encoding of stdin/stdout/stderr in JSON: "utf8" (default) or "base64".
	Encoding string `json:"encoding,omitempty"`
}

// MaxExecOutput caps each of stdout and stderr in a buffered exec result;
// the rest is dropped and Truncated is set. Streaming exec has no cap.
const MaxExecOutput = 1 << 20

// ExecResult is the answer of a buffered exec, and the last event of a
// streamed one.
type ExecResult struct {
	ExitCode   int     `json:"exit_code"`
	Signal     string  `json:"signal,omitempty"`
	Stdout     string  `json:"stdout"`
	Stderr     string  `json:"stderr"`
	Truncated  bool    `json:"truncated"`
	TimedOut   bool    `json:"timed_out"`
	OOMKilled  bool    `json:"oom_killed"`
	DurationMs float64 `json:"duration_ms"`
}

// ExecOutput receives output chunks of a streamed exec as they happen;
// stream is "stdout" or "stderr". Returning an error cancels the command.
type ExecOutput func(stream string, data []byte) error

// FileInfo describes a path in a jail.
type FileInfo struct {
	Name       string    `json:"name"`
	Path       string    `json:"path"`
	Type       string    `json:"type"` // file, dir, symlink, other
	Size       int64     `json:"size"`
	Mode       string    `json:"mode"` // octal permission bits, e.g. "0644"
	ModTime    time.Time `json:"mtime"`
	UID        int       `json:"uid"`
	GID        int       `json:"gid"`
	LinkTarget string    `json:"link_target,omitempty"`
}

// DirListing is a directory of a jail: its entries sorted by name.
type DirListing struct {
	Path    string     `json:"path"`
	Entries []FileInfo `json:"entries"`
	// Truncated is set when the directory has more entries than one
	// listing gives (100 000): Entries are some of them.
	Truncated bool `json:"truncated,omitempty"`
}

// WriteOptions controls a file write.
type WriteOptions struct {
	// Mode of a created file (default 0644).
	Mode uint32
	// User owning a created file (default: the jail's user).
	User string
}

// AccessResult answers whether a path is accessible (seed 002's isPathAccessible).
type AccessResult struct {
	Path       string `json:"path"`
	Mode       string `json:"mode"` // read or write
	User       string `json:"user"`
	Accessible bool   `json:"accessible"`
	Reason     string `json:"reason,omitempty"`
}

// Health is the daemon's health report.
type Health struct {
	Status  string           `json:"status"` // ok or degraded
	Version string           `json:"version"`
	Jails   int              `json:"jails"`
	Running int              `json:"running"`
	Checks  map[string]Check `json:"checks"`
	// Host describes the host the jails run on (cgroup layout).
	Host map[string]string `json:"host,omitempty"`
	// Levels are the isolation levels this daemon knows, available or
	// not, with what each can do.
	Levels []Level `json:"levels"`
	// Warm is the pool of ready jails (absent when the daemon keeps none).
	Warm *WarmPool `json:"warm,omitempty"`
}

// WarmPool is the state of the daemon's pool of ready jails: started jails
// of the default configuration that a create asking for that configuration
// takes at once instead of starting a new container.
type WarmPool struct {
	// Size is how many ready jails the daemon keeps at least (serve
	// --warm-jails).
	Size int `json:"size"`
	// Max is how many it keeps at most, after bursts of creates (serve
	// --warm-max).
	Max int `json:"max"`
	// Target is how many it keeps now: Size, or the largest burst of
	// creates of the last minutes, up to Max.
	Target int `json:"target"`
	// Ready is how many are ready now.
	Ready int `json:"ready"`
	// Taken counts the creates served from the pool since the daemon
	// started.
	Taken uint64 `json:"taken"`
	// Error is why the last refill failed ("" when it succeeded).
	Error string `json:"error,omitempty"`
}

// Check is the outcome of one health check.
type Check struct {
	OK      bool   `json:"ok"`
	Message string `json:"message,omitempty"`
}
