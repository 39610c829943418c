// Package vmproto is the wire format between the daemon and the init of a
// vm-level jail, PID 1 of the guest kernel.
//
// The two talk over one virtio-serial port (PortName), which QEMU exposes
// on the host as a unix socket. A yamux session runs over it (after
// WakeLine and HelloLine): the daemon is the client and opens a stream
// per operation, the guest serves them.
// The first byte of each stream says what it carries:
//
//   - KindInit: a connection of init's control protocol
//     (internal/initproto), exactly as over a container's control socket.
//   - KindBoot: Boot (JSON, one line) from the daemon, once per boot; the
//     guest mounts the jail's root, configures its network and starts
//     init's server, then answers Reply (JSON, one line).
//   - KindResume: Resume (JSON line) after a snapshot was restored in a
//     new virtual machine: new clock, network and host name; Reply.
//   - KindHostname: Hostname (JSON line); Reply.
//   - KindStats: the guest answers Stats (JSON line).
//   - KindEvents: the guest sends the jail's process events (ProcEvent,
//     JSON lines) from its boot on, until the daemon closes the stream;
//     those no stream took yet wait (a bounded number, then counted lost).
//   - KindPark: an empty JSON object; the guest answers Reply and takes
//     nothing more from this session: the daemon hangs up, and the
//     machine may be saved with its guest parked (waiting for WakeLine).
//   - KindShutdown: an empty JSON object; the guest answers Reply and
//     asks init to shut down gracefully (as SIGTERM does), then powers
//     off.
package vmproto

import (
	"net/netip"

	"github.com/agentjail/agentjail/internal/initproto"
)

// WakeLine is what the daemon writes on the port to start a session; the
// guest answers HelloLine on a line of its own (after a newline), then
// both speak yamux. Parked (at boot, after the daemon hung up, after
// KindPark), the guest skips everything else.
const (
	WakeLine  = "\nAGENTJAIL-WAKE\n"
	HelloLine = "AGENTJAIL-HELLO"
)

// PortName is the name of the virtio-serial port of the control channel.
const PortName = "org.agentjail.control"

// Disk serial numbers: the guest finds its disks by them.
const (
	// DiskLower is the read-only root tree (erofs).
	DiskLower = "lower"
	// DiskUsr is the read-only /usr of a host-rootfs jail (erofs).
	DiskUsr = "usr"
	// DiskUpper is the jail's disk (XFS, from the storage pool): its
	// writable layer in upper/ and work/.
	DiskUpper = "upper"
)

// Stream kinds: the first byte of every stream.
const (
	KindInit     byte = 'I'
	KindBoot     byte = 'B'
	KindResume   byte = 'R'
	KindHostname byte = 'H'
	KindStats    byte = 'S'
	KindShutdown byte = 'X'
	KindPark     byte = 'P'
	KindEvents   byte = 'E'
)

// Boot is what the guest needs to become the jail.
type Boot struct {
	// Init is init's configuration, as at the container level.
	Init initproto.InitConfig `json:"init"`
	// Hostname is the jail's host name.
	Hostname string `json:"hostname"`
	// Usr is true when a DiskUsr disk is attached, mounted read-only on
	// /usr.
	Usr bool `json:"usr,omitempty"`
	// Resume carries the clock and network.
	Resume
	// PidsLimit caps the tasks of the jail's commands (guest cgroup).
	PidsLimit int64 `json:"pids_limit,omitempty"`
	// Limits are the jail's other limits, applied by the guest kernel.
	Limits Limits `json:"limits"`
}

// Resume is what changes when a guest continues on another host link:
// the wall clock, the network and the files that follow from it.
type Resume struct {
	// UnixNano is the host's wall clock when sent.
	UnixNano int64 `json:"unix_nano"`
	// Hostname, when not empty, replaces the host name.
	Hostname string `json:"hostname,omitempty"`
	// Net is the guest's link; nil: loopback only.
	Net *Net `json:"net,omitempty"`
	// ResolvConf, when not empty, is written to /etc/resolv.conf.
	ResolvConf string `json:"resolv_conf,omitempty"`
	// CAPEM, when not empty, is the daemon's CA: written to CAPath and
	// added to the system trust store.
	CAPEM  []byte `json:"ca_pem,omitempty"`
	CAPath string `json:"ca_path,omitempty"`
}

// Net is the guest's network link: its virtio-net interface takes the
// jail's address.
type Net struct {
	MAC     string       `json:"mac"`
	Addr    netip.Prefix `json:"addr"`
	Gateway netip.Addr   `json:"gateway"`
	MTU     int          `json:"mtu"`
}

// Hostname sets the guest's host name.
type Hostname struct {
	Name string `json:"name"`
}

// Reply answers a request: Error empty on success.
type Reply struct {
	Error string `json:"error,omitempty"`
}

// Stats is the guest's view of its usage.
type Stats struct {
	MemoryBytes, MemoryTotalBytes, Pids, PidsLimit uint64
	DiskUsedBytes, DiskTotalBytes                  uint64
	OOMKills                                       uint64
}

// Limits are the limits the guest applies to init and everything it
// starts (a cgroup of the guest's own, and init's rlimits).
type Limits struct {
	MemoryBytes int64  `json:"memory_bytes,omitempty"`
	CPUQuota    int64  `json:"cpu_quota,omitempty"`
	CPUPeriod   uint64 `json:"cpu_period,omitempty"`
	Nofile      uint64 `json:"nofile,omitempty"`
}

// OpLost is the Op of a ProcEvent that only counts events the guest
// dropped (Lost).
const OpLost = "lost"

// ProcEvent is a process of the jail starting (fork), running a program
// (exec) or ending (exit), as the guest kernel reports it.
type ProcEvent struct {
	TS       int64    `json:"ts"`
	Op       string   `json:"op"`
	PID      int32    `json:"pid,omitempty"`
	PPID     int32    `json:"ppid,omitempty"`
	Thread   bool     `json:"thread,omitempty"`
	Comm     string   `json:"comm,omitempty"`
	Exe      string   `json:"exe,omitempty"`
	Argv     []string `json:"argv,omitempty"`
	Cwd      string   `json:"cwd,omitempty"`
	UID      uint32   `json:"uid,omitempty"`
	GID      uint32   `json:"gid,omitempty"`
	ExitCode int32    `json:"exit_code,omitempty"`
	Signal   int32    `json:"signal,omitempty"`
	Lost     uint64   `json:"lost,omitempty"`
}
