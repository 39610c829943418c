// Package gvisor is the gvisor isolation level: each jail is the same OCI
// bundle as a container jail (internal/backend/oci: overlay root on a disk
// of its own, the daemon-made network namespace, the agentjail binary as
// PID 1), run by runsc, gVisor's runtime, on its systrap platform. The
// jail's processes never make a system call to the host kernel: gVisor's
// user-space kernel (the sentry) serves them, and its own network stack
// sends the jail's packets out through the daemon's veth, where the
// daemon's egress policy, proxy and DNS apply as for a container.
//
// The host kernel cannot see inside the sentry, so observation comes from
// gVisor's runtime monitoring: its syscall and process points, streamed
// to the daemon over a seqpacket socket (events.go). Process checkpoints
// are runsc's own (checkpoint.go).
//
// runsc is built from the gVisor Go module by scripts/build-runsc.sh
// (make gvisor) and installed at DefaultRunsc.
package gvisor

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/backend/container"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/model"
)

// DefaultRunsc is where scripts/build-runsc.sh installs runsc.
const DefaultRunsc = "/usr/local/sbin/runsc"

// runtimeArgs are runsc's global flags for every jail:
//   - systrap: the platform that needs neither KVM nor ptrace;
//   - overlay2=none: the root's writes go through the gofer to the jail's
//     own overlay on its disk (not to sentry memory), so the disk limit,
//     snapshots and diffs see them;
//   - host-uds=create: init's control socket, made inside the jail in its
//     control directory, is a host socket the daemon connects to;
//   - oci-seccomp: the bundle's seccomp filter applies to the jail's
//     system calls inside the sentry, as it does in a container;
//   - gofer-network-namespace=new: each jail's gofer gets an empty network
//     namespace of its own (runsc's default pins a shared one with a mount
//     in its state directory that would outlive the daemon).
var runtimeArgs = []string{
	"--platform=systrap", "--overlay2=none", "--host-uds=create", "--oci-seccomp",
	"--gofer-network-namespace=new",
}

// Factory returns the factory of the gvisor level, run by the runsc at
// path (empty: DefaultRunsc).
func Factory(path string) backend.Factory {
	return backend.Factory{Level: config.LevelGVisor, New: func(h backend.Host) (backend.Backend, error) {
		return New(h, path)
	}}
}

// Backend is the gvisor level. It runs jails through the container
// level's bundle and lifecycle code with runsc as the runtime, and adds
// what differs: observation from gVisor's monitoring, runsc's own
// checkpoints, and no host-side view of the jail's processes.
type Backend struct {
	c     *container.Backend
	runsc string
	root  string // runsc's state directory
	host  backend.Host
	caps  backend.Capabilities
}

var (
	_ backend.Backend      = (*Backend)(nil)
	_ backend.EventSource  = (*Backend)(nil)
	_ backend.Layered      = (*Backend)(nil)
	_ backend.Checkpointer = (*Backend)(nil)
)

// New returns the gvisor backend running runsc at path (empty:
// DefaultRunsc). A missing runsc is the reason the level is unavailable.
func New(h backend.Host, path string) (*Backend, error) {
	if path == "" {
		path = DefaultRunsc
	}
	if _, err := os.Stat(path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, errdefs.Unavailablef("runsc not built; run make gvisor (%s is missing)", path)
		}
		return nil, errdefs.Wrap(errdefs.ErrUnavailable, err, "runsc")
	}
	out, err := exec.Command(path, "--version").Output()
	if err != nil {
		return nil, errdefs.Wrap(errdefs.ErrUnavailable, err, "runsc %s --version", path)
	}
	version := strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	c, err := container.New(container.Options{
		Host: h, RuntimeBinary: path, RuntimeArgs: runtimeArgs, StateDir: "runsc", NoCheckpoint: true,
		AdjustSpec: adjustSpec, KeepCommandOOMScore: true, OrdinarySlack: true,
	})
	if err != nil {
		return nil, err
	}
	b := &Backend{c: c, runsc: path, host: h, root: h.DataDir + "/run/runsc"}
	cc := c.Capabilities()
	b.caps = backend.Capabilities{
		Level:        config.LevelGVisor,
		Runtime:      version + " (systrap)",
		NetworkModes: cc.NetworkModes,
		RootfsKinds:  cc.RootfsKinds,
		// The memory limit bounds the sandbox as a whole (the sentry holds
		// the jail's memory): the host kills the sandbox, not the process
		// that went over, so it is not declared as the per-process limit
		// the other levels enforce.
		Limits:    []string{model.LimitPids, model.LimitCPU, model.LimitDisk},
		PTY:       true,
		Observers: []string{model.ObserverBackend},
		// Flows come from the network policy's log, not from the sentry.
		BackendEvents: []string{"proc", "file", "syscall"},
		Users:         true,
		FSSnapshot:    true,
		Guarantees: "the container level's bundle (its own namespaces, overlay root on a disk of its own, cgroup limits, " +
			"seccomp, minimal capabilities) run by gVisor: the jail's system calls are served by a user-space kernel " +
			"(the sentry, itself confined by seccomp), never by the host's",
	}
	// runsc checkpoint refuses a sandbox holding a bound host socket, and
	// init's control socket is one (--host-uds=create).
	b.caps.CheckpointReason = "runsc checkpoint fails here: \"encoding error: Cannot save endpoint with bound host socket\" " +
		"(init's control socket is a host socket bound by the sentry); filesystem snapshots work"
	return b, nil
}

// adjustSpec fits the container level's spec to runsc. runsc's seccomp
// answers every errno rule with EPERM whatever its errnoRet, so the rule
// that makes clone3 fail with ENOSYS (for the C library to fall back to
// clone, whose flags the filter reads) would make every new thread fail:
// clone3 is left to the sentry, whose namespaces are its own objects,
// never the host's.
//
// runsc ignores the spec's masked and read-only paths, and its cgroup
// mount's read-only flag: /proc is mounted read-only as a whole (the
// sentry's /proc/sys and /proc/sysrq-trigger are its own, yet a jail's
// root must not change them), and the sentry's cgroup hierarchy is not
// mounted at all (the host's cgroup bounds the whole sandbox).
//
// The pids limit: the sandbox's host threads (the sentry's, the gofer's,
// one systrap stub per address space) are not the jail's tasks, and a
// sentry that cannot make a thread dies with every process of the jail.
// gVisor's own pids controller cannot be set from outside, so the jail's
// tasks are bounded inside the sentry by RLIMIT_NPROC (per user of the
// jail, root included: it holds neither CAP_SYS_ADMIN nor
// CAP_SYS_RESOURCE), and the host cgroup keeps a bound with room for the
// sandbox's own threads, as a backstop.
func adjustSpec(s *specs.Spec) {
	// The sandbox is one process to the host's OOM killer: it ranks with
	// the other levels' commands, and the sentry picks inside it.
	oom := initproto.CommandOOMScoreAdj
	s.Process.OOMScoreAdj = &oom
	s.Mounts = slices.DeleteFunc(s.Mounts, func(m specs.Mount) bool { return m.Type == "cgroup" })
	for i := range s.Mounts {
		if m := &s.Mounts[i]; m.Destination == "/proc" && m.Type == "proc" {
			m.Options = append(m.Options, "ro")
		}
	}
	if r := s.Linux.Resources; r != nil && r.Pids != nil && r.Pids.Limit != nil && *r.Pids.Limit > 0 {
		// Init is one of the jail's tasks, outside the users' counts.
		n := uint64(*r.Pids.Limit) - 1
		s.Process.Rlimits = append(s.Process.Rlimits, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: n, Soft: n})
		host := sandboxPids(*r.Pids.Limit)
		r.Pids.Limit = &host
	}
	if sc := s.Linux.Seccomp; sc != nil {
		sc.Syscalls = slices.DeleteFunc(sc.Syscalls, func(r specs.LinuxSyscall) bool {
			return slices.Equal(r.Names, []string{"clone3"})
		})
	}
}

// sandboxPids is the host pids limit of a sandbox whose jail may have
// limit tasks: the sentry's and gofer's threads (about 30 while idle),
// and a stub process with its threads for each of the jail's processes.
func sandboxPids(limit int64) int64 { return 3*limit + 128 }

// Capabilities implements backend.Backend.
func (b *Backend) Capabilities() backend.Capabilities { return b.caps }

// Configure implements backend.Backend: the container level's checks,
// and no user namespace (the sentry has its own users).
func (b *Backend) Configure(inst backend.Instance) error {
	if ns := inst.Config.Isolation.Process.Namespaces; ns != nil && ns.User != nil && *ns.User {
		return errdefs.Unprocessablef("isolation.process.namespaces.user: the gvisor level has no user namespace option: its jails' users are the sentry's, never the host's")
	}
	return b.c.Configure(inst)
}

// Prepare implements backend.Backend.
func (b *Backend) Prepare(ctx context.Context, inst backend.Instance) error {
	return b.c.Prepare(ctx, inst)
}

// Start implements backend.Backend.
func (b *Backend) Start(ctx context.Context, inst backend.Instance) (backend.Status, error) {
	return b.c.Start(ctx, inst)
}

// Stop implements backend.Backend.
func (b *Backend) Stop(ctx context.Context, inst backend.Instance, grace time.Duration) error {
	return b.c.Stop(ctx, inst, grace)
}

// Destroy implements backend.Backend.
func (b *Backend) Destroy(ctx context.Context, inst backend.Instance) error {
	return b.c.Destroy(ctx, inst)
}

// Status implements backend.Backend.
func (b *Backend) Status(ctx context.Context, inst backend.Instance) (backend.Status, error) {
	return b.c.Status(ctx, inst)
}

// Reattach implements backend.Backend.
func (b *Backend) Reattach(ctx context.Context, inst backend.Instance) error {
	return b.c.Reattach(ctx, inst)
}

// UpdateNetwork implements backend.Backend.
func (b *Backend) UpdateNetwork(ctx context.Context, inst backend.Instance) error {
	return b.c.UpdateNetwork(ctx, inst)
}

// Rename implements backend.Backend: the jail's name on the network
// changes; its host name is the sentry's, which the host cannot set, so
// it keeps the one it started with.
func (b *Backend) Rename(ctx context.Context, inst backend.Instance, st backend.Status) error {
	return b.c.RenameNetwork(ctx, inst)
}

// Stats implements backend.Backend: the sandbox's cgroup (the sentry, the
// gofer and the jail's memory) and the jail's disk.
func (b *Backend) Stats(ctx context.Context, inst backend.Instance) (backend.Stats, error) {
	return b.c.Stats(ctx, inst)
}

// InitDialer implements backend.Backend: init's control socket, a host
// socket in the jail's control directory (runsc --host-uds=create).
func (b *Backend) InitDialer(inst backend.Instance) initclient.Dialer {
	return b.c.InitDialer(inst)
}

// Layers implements backend.Layered.
func (b *Backend) Layers(inst backend.Instance) (string, string, error) {
	return b.c.Layers(inst)
}

// IDShift implements backend.Layered: no user namespace.
func (b *Backend) IDShift(inst backend.Instance) int { return 0 }

// Checkpoint implements backend.Checkpointer: filesystem snapshots as the
// container level takes them (the sentry writes regular files straight
// through to the jail's disk, so freezing the disk catches them).
func (b *Backend) Checkpoint(ctx context.Context, inst backend.Instance, opts backend.CheckpointOptions) (backend.CheckpointResult, error) {
	if opts.Processes && !b.caps.Checkpoint {
		return backend.CheckpointResult{}, errdefs.NotImplementedf("process checkpoints are unavailable at the gvisor level: %s (mode fs still works)", b.caps.CheckpointReason)
	}
	return b.c.Checkpoint(ctx, inst, opts)
}

// Restore implements backend.Checkpointer: a new jail booted on a copy of
// a filesystem snapshot.
func (b *Backend) Restore(ctx context.Context, inst backend.Instance, src backend.RestoreSource) (backend.Status, error) {
	if src.Processes && !b.caps.Checkpoint {
		return backend.Status{}, errdefs.NotImplementedf("process restores are unavailable at the gvisor level: %s", b.caps.CheckpointReason)
	}
	return b.c.Restore(ctx, inst, src)
}

// Recover implements backend.Checkpointer.
func (b *Backend) Recover(ctx context.Context, inst backend.Instance) error {
	return b.c.Recover(ctx, inst)
}
