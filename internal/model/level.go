package model

// Observer kinds a level can offer (Capabilities.Observers).
const (
	// ObserverKernel: the host kernel sees the jail's processes, and the
	// daemon's eBPF programs, keyed by the jail's cgroup id, record its
	// syscalls, processes, files and network flows.
	ObserverKernel = "kernel"
	// ObserverBackend: the backend has an event source of its own (the
	// host kernel cannot see inside the jail, e.g. a user-space kernel or
	// a virtual machine) whose events map to the same types.
	ObserverBackend = "backend"
)

// Rootfs kinds a level can mount (Capabilities.RootfsKinds): the prefix
// of isolation.filesystem.rootfs before its first ':'.
const (
	RootfsKindHost  = "host"
	RootfsKindDir   = "dir"
	RootfsKindImage = "image"
)

// Limits a level can enforce (Capabilities.Limits).
const (
	LimitMemory = "memory"
	LimitPids   = "pids"
	LimitCPU    = "cpu"
	LimitDisk   = "disk"
)

// Capabilities declares what the backend of one isolation level does. It
// is the backend's promise: the conformance harness tests every
// capability declared (and a capability that is declared but fails the
// harness fails CI), and the daemon refuses a request needing one that is
// absent with an error naming the level and the verb.
type Capabilities struct {
	// Level is the isolation level the backend provides.
	Level string `json:"level"`
	// Runtime names the runtime and its version, e.g. "runc 1.1.5".
	Runtime string `json:"runtime"`
	// Unsafe is true for a level that isolates nothing (none): for
	// development only, and marked as such wherever it shows.
	Unsafe bool `json:"unsafe,omitempty"`
	// NetworkModes are the isolation.network.mode values the level runs.
	NetworkModes []string `json:"network_modes"`
	// RootfsKinds are the root filesystems the level mounts
	// (RootfsKindHost, RootfsKindDir, RootfsKindImage).
	RootfsKinds []string `json:"rootfs_kinds"`
	// Limits are the resource limits the level enforces (LimitMemory,
	// LimitPids, LimitCPU, LimitDisk); others are not enforced.
	Limits []string `json:"limits"`
	// PTY is true when the level runs interactive terminals.
	PTY bool `json:"pty"`
	// Users is true when commands may run as another user than the
	// jail's default one (root included).
	Users bool `json:"users"`
	// UserNamespaces is true when process.namespaces.user is supported.
	UserNamespaces bool `json:"user_namespaces"`
	// Observers are the kinds of observation that can attach to the
	// level's jails (ObserverKernel, ObserverBackend); empty: none.
	Observers []string `json:"observers"`
	// BackendEvents, when Observers has ObserverBackend, are the event
	// types its source records ("proc", "file", "syscall", "net") if not
	// all of them (empty: all, as ObserverKernel records).
	BackendEvents []string `json:"backend_events,omitempty"`
	// Checkpoint is true when a running jail's processes can be
	// checkpointed and restored (snapshot mode full, restore, branch).
	Checkpoint bool `json:"checkpoint"`
	// CheckpointReason explains why Checkpoint is false.
	CheckpointReason string `json:"checkpoint_reason,omitempty"`
	// FSSnapshot is true when a running jail's filesystem can be
	// snapshotted (snapshot mode fs) and diffed.
	FSSnapshot bool `json:"fs_snapshot"`
	// Exposes are what of the host the level's jails can see though not
	// change (ExposesHostProcesses); the conformance harness lets through
	// exactly these of its escape probes' findings. Empty for a level
	// that hides them all.
	Exposes []string `json:"exposes,omitempty"`
	// Guarantees says in one sentence what the level isolates and what it
	// does not.
	Guarantees string `json:"guarantees"`
}

// What a level's jails may see of the host (Capabilities.Exposes).
const (
	// ExposesHostProcesses: the host's process list (/proc) is visible;
	// other processes cannot be traced, signalled or read.
	ExposesHostProcesses = "host_processes"
	// ExposesGuestKernel: the jail runs on a kernel of its own (a virtual
	// machine's), which its root may reconfigure at will (mounts, modules,
	// raw sockets, the clock): what that changes stays in the machine.
	ExposesGuestKernel = "guest_kernel"
)

// Level is one isolation level as GET /health and `agentjail info`
// report it.
type Level struct {
	// Name is the level (none, process, container, gvisor, vm).
	Name string `json:"name"`
	// Available is true when the daemon runs jails at this level.
	Available bool `json:"available"`
	// Reason says why an unavailable level is missing and how to get it
	// ("gvisor: runsc not built; run make gvisor").
	Reason string `json:"reason,omitempty"`
	// Capabilities of an available level.
	Capabilities *Capabilities `json:"capabilities,omitempty"`
}
