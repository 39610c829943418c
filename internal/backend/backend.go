// Package backend defines the interface every isolation level implements
// (container now; process, gvisor, vm later) and the capabilities a backend
// declares, which the API reports so that an unsupported verb is a clear
// 501/422 rather than a silent no-op.
package backend

import (
	"context"
	"time"

	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/initclient"
)

// Capabilities declares what a backend can do.
type Capabilities struct {
	// Level is the isolation level the backend provides.
	Level string `json:"level"`
	// Runtime names the runtime and its version, e.g. "runc 1.1.5".
	Runtime string `json:"runtime"`
	// NetworkModes are the network modes the backend supports.
	NetworkModes []string `json:"network_modes"`
	// DiskLimit is true when disk_bytes is enforced.
	DiskLimit bool `json:"disk_limit"`
	// UserNamespaces is true when process.namespaces.user is supported.
	UserNamespaces bool `json:"user_namespaces"`
	// Checkpoint is true when running processes can be checkpointed.
	Checkpoint bool `json:"checkpoint"`
	// CheckpointReason explains why Checkpoint is false.
	CheckpointReason string `json:"checkpoint_reason,omitempty"`
}

// Instance identifies one jail to its backend.
type Instance struct {
	// ID is the jail's id; it names every resource the backend makes.
	ID string
	// Name is the jail's unique name (inter-jail rules match it).
	Name string
	// Dir is the jail's directory, DATA_DIR/jails/{id}.
	Dir string
	// Config is the jail's effective config (defaults applied, validated).
	Config *config.Config
	// Hostname of the jail.
	Hostname string
	// OnCreated, when set, is called by Start once the jail's processes
	// and cgroup exist and before its init executes anything, and by a
	// process restore once the processes are restored and before they
	// resume (so that observation covers the jail from its first
	// instruction). An error aborts the start or restore.
	OnCreated func(st Status) error
}

// Status is what a backend knows of a jail's processes.
type Status struct {
	// Running is true while the jail's init runs.
	Running bool
	// Pid is init's host pid while Running.
	Pid int
	// CgroupPath is the jail's cgroup (as given to the runtime).
	CgroupPath string
	// NetInterface is the host side of the jail's network link ("" when
	// it has none: mode none or host).
	NetInterface string
	// Root is the host path of the jail's root filesystem ("" when the
	// host cannot see it).
	Root string
	// Foreign, given to OnCreated, are host pids of the backend's own
	// processes in the jail's cgroup at that moment (CRIU finishing a
	// restore): what they do is not the jail's doing.
	Foreign []int
}

// Stats is a jail's live resource usage.
type Stats struct {
	MemoryBytes, MemoryLimitBytes, CPUTimeNs, Pids, PidsLimit, OOMKills uint64
	DiskUsedBytes, DiskLimitBytes                                       uint64
}

// Layered is implemented by backends whose jails have an overlay root:
// Layers returns the host paths of a jail's lower tree and upper layer.
type Layered interface {
	Layers(inst Instance) (lower, upper string, err error)
}

// Backend runs jails at one isolation level. Methods may be called
// concurrently for different instances; the manager serialises lifecycle
// calls for one instance.
type Backend interface {
	// Capabilities declares what the backend can do.
	Capabilities() Capabilities
	// Prepare allocates every resource a new jail needs to start (disk,
	// root filesystem, network namespace, runtime bundle) without starting
	// any process. On error it releases everything it allocated.
	Prepare(ctx context.Context, inst Instance) error
	// Start starts the jail's init and returns once init serves its control
	// socket. It first re-establishes any resource Prepare made that is
	// missing (e.g. mounts after a host reboot). On error no process of the
	// jail is left running.
	Start(ctx context.Context, inst Instance) (Status, error)
	// Stop asks init to shut down gracefully, waits up to grace, then kills
	// every process of the jail. Resources stay for a later Start. Stopping
	// a jail that does not run is not an error.
	Stop(ctx context.Context, inst Instance, grace time.Duration) error
	// Destroy kills every process of the jail and releases every resource
	// it has (mounts, disk, cgroup, network namespace, runtime state). It is
	// idempotent and works from any state, including a half-prepared jail.
	Destroy(ctx context.Context, inst Instance) error
	// Status reports whether the jail's init runs (used to re-adopt jails
	// after a daemon restart).
	Status(ctx context.Context, inst Instance) (Status, error)
	// Reattach re-establishes the daemon-side services of a jail found
	// running after a daemon restart (its network attachment) and returns
	// the host side of its network link ("" when it has none).
	Reattach(ctx context.Context, inst Instance) (string, error)
	// UpdateNetwork applies inst.Config's network policy to the running
	// jail; new connections obey it at once.
	UpdateNetwork(ctx context.Context, inst Instance) error
	// Rename gives a running jail (whose init is pid) a new identity:
	// inst.Name and inst.Hostname become its name on the jail network and
	// its UTS host name. Processes already running keep their environment;
	// commands started afterwards see the new HOSTNAME.
	Rename(ctx context.Context, inst Instance, pid int) error
	// Stats reads the jail's live resource usage.
	Stats(ctx context.Context, inst Instance) (Stats, error)
	// Control returns a client of the jail's init control socket.
	Control(inst Instance) *initclient.Client
}
