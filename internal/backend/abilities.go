package backend

import (
	"github.com/agentjail/agentjail/internal/observe"
)

// Observable is implemented by backends whose jails' processes are host
// processes gathered in a cgroup v2 directory of their own, which the
// daemon's host-kernel observers (eBPF programs keyed by the cgroup id,
// cgroup_skb accounting, fanotify) can watch. Such a backend declares
// model.ObserverKernel.
type Observable interface {
	// Observe says where host-side observers attach to the run st of
	// inst. It is called from OnCreated (before any process of the run
	// executes) and for a running jail re-adopted after a daemon restart.
	// It makes and changes nothing.
	Observe(inst Instance, st Status) (Observed, error)
	// Pids returns the host pids of every process of the running jail at
	// this moment (nil when it has none).
	Pids(inst Instance) ([]int, error)
}

// Observed is where host-side observers attach to one run of a jail.
type Observed struct {
	// CgroupID is the id (the directory's inode) of the jail's cgroup v2
	// directory, which keys kernel-side observation.
	CgroupID uint64
	// CgroupDir is that directory's host path (cgroup programs attach to
	// it).
	CgroupDir string
	// Root is the host path of the jail's root filesystem as its
	// processes see it ("" when the host cannot see it), for fanotify and
	// for /proc links read from the host.
	Root string
	// NetInterface is the host side of the jail's network link ("" when
	// it has none), for packet capture.
	NetInterface string
}

// EventSource is implemented by backends with an event source of their
// own, for jails the host kernel cannot see into (a user-space kernel, a
// virtual machine). Such a backend declares model.ObserverBackend.
type EventSource interface {
	// Events delivers the events of the run st of inst to sink, mapped to
	// observe's event types and field names (Event.HostPID 0 when there is
	// no host process), from the call (made from OnCreated, before any
	// process of the run executes, or for a re-adopted jail) until stop is
	// called or the run ends. It calls sink from one goroutine at a time.
	// stop returns once no more calls to sink will happen.
	Events(inst Instance, st Status, sink observe.Sink) (stop func() error, err error)
}

// OOMReporter is implemented by backends that can tell when the kernel
// killed a jail's process for exceeding its memory limit.
type OOMReporter interface {
	// OOMKills returns how many of the running jail's processes were
	// killed for exceeding its memory limit since it started.
	OOMKills(inst Instance) (uint64, error)
}

// Layered is implemented by backends whose jails have an overlay root
// whose changes can be diffed (model.Capabilities.FSSnapshot).
type Layered interface {
	// Layers returns the host paths of a jail's lower tree and of its
	// upper (writable) layer, where the jail's changes are. The upper
	// exists while the jail's disk is mounted (after Prepare, until
	// Destroy).
	Layers(inst Instance) (lower, upper string, err error)
	// IDShift returns the host uid (and gid) that uid 0 of the jail is
	// in its upper layer: 0 unless the jail maps its users (a user
	// namespace), when a file of the jail's uid u is owned by shift+u.
	IDShift(inst Instance) int
}

// InitKeepAlive is implemented by backends whose jails' init control
// channel may stay open between calls: the daemon then keeps a few idle
// connections to each running jail's init (initclient.NewKeepAlive)
// instead of connecting once per call. A checkpoint that saves init's
// sockets must ready init first (initclient.ReadyForCheckpoint), which
// closes them on init's side.
type InitKeepAlive interface {
	// KeepInitConnections reports whether connections to the init of the
	// running jail inst may stay open between calls.
	KeepInitConnections(inst Instance) bool
}
