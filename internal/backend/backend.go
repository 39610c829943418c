// Package backend is the contract between the jail manager and the
// isolation levels (none, process, container, gvisor, vm): the verbs every
// backend implements (Backend), the optional abilities some have
// (Observable, Checkpointer, Layered, OOMReporter), the capabilities each
// declares, and the registry that gives the manager the backend of a
// jail's isolation.level.
//
// The manager knows backends only through this package: it never makes
// one (cmd/agentjail wires them in as Factories) and never reads a
// backend's directory layout, cgroup paths or runtime state. Whatever it
// needs of a jail (a connection to its init, where observers attach, a
// checkpoint) it asks for here.
//
// Every backend passes the conformance harness
// (internal/backend/conformance) for each capability it declares.
package backend

import (
	"context"
	"time"

	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/model"
)

// Capabilities declares what a backend can do (see model.Capabilities:
// the API reports them as they are).
type Capabilities = model.Capabilities

// Instance identifies one jail to its backend.
type Instance struct {
	// ID is the jail's id; it names every resource the backend makes.
	ID string
	// Name is the jail's unique name (inter-jail rules match it).
	Name string
	// Dir is the jail's directory, DATA_DIR/jails/{id}. It exists before
	// Prepare (or Restore) is called; the backend keeps what it needs of
	// the jail below it and the manager removes it after Destroy.
	Dir string
	// Config is the jail's effective config (defaults applied, validated,
	// then Configure'd by the backend).
	Config *config.Config
	// Hostname of the jail.
	Hostname string
	// OnCreated, when set, is called by Start once the jail's processes
	// exist and before its init executes anything, and by a process
	// restore once the processes are restored and before they resume, so
	// that observation covers the jail from its first instruction. st is
	// the run's status (st.Foreign set by a restore). An error aborts the
	// start or restore, which then releases what it made.
	OnCreated func(st Status) error
}

// Status is what a backend knows of a jail's run, in jail terms.
type Status struct {
	// Running is true from a successful Start (or Restore) until the
	// jail's init ends or Stop returns.
	Running bool
	// Pid is the host pid of the process whose exit ends the run (the
	// jail's init for the process and container levels; the sandbox or
	// the virtual machine monitor for gvisor and vm), 0 when not running.
	// The manager watches it to learn that a jail died, and shows it.
	Pid int
	// Foreign, only in the Status a restore gives OnCreated, are host
	// pids of the backend's own helper processes inside the jail at that
	// moment (CRIU finishing the restore): what they do is not the jail's
	// doing, and observers drop it.
	Foreign []int
}

// Stats is a jail's live resource usage. A figure the level cannot read
// is 0.
type Stats struct {
	MemoryBytes, MemoryLimitBytes, CPUTimeNs, Pids, PidsLimit, OOMKills uint64
	DiskUsedBytes, DiskLimitBytes                                       uint64
}

// Backend runs jails at one isolation level. Methods may be called
// concurrently for different instances; the manager serialises the calls
// for one instance (no two of Prepare, Start, Stop, Destroy, Restore,
// Rename, UpdateNetwork run at once for it). Every method taking a ctx
// honours its cancellation and deadline.
type Backend interface {
	// Capabilities declares what the backend can do. It does not change
	// while the daemon runs.
	Capabilities() Capabilities
	// Configure checks inst.Config (defaults applied, validated against
	// the host) against what the level can do, and sets the values the
	// level decides (for example where the workspace is). It makes
	// nothing. A config the level cannot run is errdefs.ErrUnprocessable
	// naming the field and the level.
	Configure(inst Instance) error
	// Prepare allocates every resource a new jail needs to start (disk,
	// root filesystem, network namespace, runtime bundle) without starting
	// any process. On error it releases everything it allocated.
	Prepare(ctx context.Context, inst Instance) error
	// Start starts the jail's init and returns once init serves its
	// control channel (InitDialer reaches it). It first re-establishes any
	// resource Prepare made that is missing (e.g. mounts after a host
	// reboot). It calls inst.OnCreated, when set, before init runs. On
	// error no process of the jail is left running.
	Start(ctx context.Context, inst Instance) (Status, error)
	// Stop asks init to shut down gracefully, waits up to grace, then
	// kills every process of the jail and detaches it from the network.
	// Resources stay for a later Start. Stopping a jail that does not run
	// is not an error.
	Stop(ctx context.Context, inst Instance, grace time.Duration) error
	// Destroy kills every process of the jail and releases every resource
	// it has (mounts, disk, cgroup, network namespace, runtime state)
	// except inst.Dir itself. It is idempotent and works from any state,
	// including a half-prepared jail, one a killed daemon was still
	// making (what it had started on the jail's behalf is ended first) and
	// one whose record was lost (then inst.Config holds only defaults).
	Destroy(ctx context.Context, inst Instance) error
	// Status reports whether the jail runs, from the backend's own state
	// (the manager calls it to re-adopt jails after a daemon restart).
	Status(ctx context.Context, inst Instance) (Status, error)
	// Reattach re-establishes the daemon-side services of a jail found
	// running after a daemon restart (its network attachment).
	Reattach(ctx context.Context, inst Instance) error
	// UpdateNetwork applies inst.Config's network policy to the running
	// jail; new connections obey it at once.
	UpdateNetwork(ctx context.Context, inst Instance) error
	// Rename gives the running jail st a new identity: inst.Name becomes
	// its name on the jail network and, where the level has a host name
	// of its own, inst.Hostname its host name. Processes already running
	// keep their environment; commands started afterwards see the new
	// HOSTNAME.
	Rename(ctx context.Context, inst Instance, st Status) error
	// Stats reads the jail's live resource usage.
	Stats(ctx context.Context, inst Instance) (Stats, error)
	// InitDialer returns the dialer of the jail's init control channel
	// (a unix socket, a virtio-serial port, a stream through another
	// node...). It connects nothing itself.
	InitDialer(inst Instance) initclient.Dialer
}

// Unsupported is the error of a verb that the level cannot do:
// errdefs.ErrNotImplemented naming the level and the verb (and why, when
// reason is not empty).
func Unsupported(level, verb, reason string) error {
	if reason != "" {
		return errdefs.NotImplementedf("the %s level cannot %s: %s", level, verb, reason)
	}
	return errdefs.NotImplementedf("the %s level cannot %s", level, verb)
}
