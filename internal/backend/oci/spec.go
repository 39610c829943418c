// Package oci turns a jail's effective configuration into an OCI runtime
// bundle (config.json, runtime-spec v1.3.0 types) and drives an OCI
// runtime binary (runc or runsc) through a container's lifecycle:
// create, start with a readiness handshake on init's stdout, kill, delete,
// state, list, pause and resume.
//
// The spec it writes is the container level's isolation contract: new pid,
// mount, ipc, uts and cgroup namespaces, the daemon's network namespace
// joined by path, an optional user namespace, masked and read-only kernel
// paths, a deny-all device cgroup with a small allow list, cgroup limits,
// rlimits, a minimal capability set, no_new_privs and a seccomp filter that
// denies the calls that reach beyond the jail (see DefaultSeccomp).
package oci

import (
	"encoding/json"
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/atomicfile"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initproto"
)

// Jail-side paths of the daemon's files.
const (
	// InitPath is where the init binary is bind-mounted inside the jail.
	InitPath = "/.agentjail/agentjail"
	// ControlPath is where the jail's control directory is bind-mounted.
	ControlPath = "/.agentjail/run"
	// controlRoot is the directory holding InitPath and ControlPath; config
	// mounts may not reach into it.
	controlRoot = "/.agentjail"
)

// DefaultPath is the PATH the spec gives the jail's init (runc adds HOME,
// read from the rootfs's /etc/passwd, when it is missing).
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// initEnv keeps the init's and its shims' Go runtimes small: one P means
// fewer threads (each counts against the pids limit) and less memory.
// Commands do not inherit it: init builds their environment itself.
var initEnv = []string{DefaultPath, "GOMAXPROCS=1", "GOGC=50"}

// IDMapSize is the number of uids and gids mapped into a jail that has a
// user namespace: jail ids 0..IDMapSize-1.
const IDMapSize = 65536

// Mount is a bind mount of a host path into the jail.
type Mount struct {
	// Source is the absolute host path.
	Source string
	// Target is the absolute jail-side path.
	Target string
	// ReadOnly makes the mount read-only.
	ReadOnly bool
}

// SpecOptions are the inputs of Spec.
type SpecOptions struct {
	// ID is the container id (the jail's id).
	ID string
	// Config is the jail's effective config: defaults applied, validated.
	Config *config.Config
	// Rootfs is the absolute host path of the jail's root (the overlay's
	// merged directory).
	Rootfs string
	// NetnsPath is the network namespace made by the daemon, joined by path.
	NetnsPath string
	// HostNetwork makes the jail share the host's network namespace
	// (network mode "host", a daemon opt-in); NetnsPath is then unused.
	HostNetwork bool
	// CgroupsPath is the absolute cgroup path, e.g. "/agentjail-<id>" (a
	// relative one would nest the memory cgroup under the caller's).
	CgroupsPath string
	// InitBinary is the host path of the init binary, bind-mounted
	// read-only at InitPath.
	InitBinary string
	// ControlDir is the host path of the jail's control directory,
	// bind-mounted at ControlPath.
	ControlDir string
	// Mounts are the rootfs provider's mounts (e.g. host /usr read-only).
	// The config's read_only_mounts and read_write_mounts are added by Spec.
	Mounts []Mount
	// Hostname of the jail's UTS namespace; empty means Config.Hostname,
	// then ID.
	Hostname string
	// UIDMapBase is the first host uid (and gid) of the jail's ids when the
	// config asks for a user namespace: jail ids 0..IDMapSize-1 map to
	// UIDMapBase.. on the host. Unused otherwise.
	UIDMapBase uint32
	// SwapAccounting reports that the host accounts swap (cgroup v1
	// memory.memsw.*). Without it no swap limit is written, and a config
	// whose memory_swap_bytes exceeds memory_bytes is refused.
	SwapAccounting bool
}

// Spec builds the OCI runtime spec of a jail whose init is InitPath with
// the argument "init". It fails with errdefs.ErrInvalid when an option is
// malformed (empty ID, relative paths, missing netns) and with
// errdefs.ErrUnprocessable, naming the config field, when the config asks
// for something this host or level cannot give (swap without swap
// accounting, a mount over a kernel or control path, a user namespace
// without an id range, a capability the daemon itself lacks).
func Spec(o SpecOptions) (*specs.Spec, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	c := o.Config
	iso := &c.Isolation
	proc := &iso.Process

	hostname := o.Hostname
	if hostname == "" {
		hostname = c.Hostname
	}
	if hostname == "" {
		hostname = o.ID
	}

	mounts, err := o.mounts()
	if err != nil {
		return nil, err
	}
	resources, err := o.resources()
	if err != nil {
		return nil, err
	}
	seccomp := DefaultSeccomp()
	if proc.SeccompProfile != nil {
		seccomp = SeccompFromProfile(proc.SeccompProfile)
	}

	caps := proc.EffectiveCapabilities()
	if err := heldCapabilities(caps); err != nil {
		return nil, err
	}
	oom := initproto.InitOOMScoreAdj
	s := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			Terminal: false,
			User:     specs.User{UID: 0, GID: 0},
			Args:     []string{InitPath, "init"},
			Env:      initEnv,
			Cwd:      "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding:  caps,
				Effective: caps,
				Permitted: caps,
			},
			Rlimits:         o.rlimits(),
			NoNewPrivileges: true,
			OOMScoreAdj:     &oom,
		},
		Root:     &specs.Root{Path: o.Rootfs},
		Hostname: hostname,
		Mounts:   mounts,
		Linux: &specs.Linux{
			Resources:     resources,
			CgroupsPath:   o.CgroupsPath,
			Namespaces:    o.namespaces(),
			Seccomp:       seccomp,
			MaskedPaths:   append(append([]string{}, maskedPaths...), iso.Filesystem.BlockedPaths...),
			ReadonlyPaths: append([]string{}, readonlyPaths...),
		},
	}
	if userns(c) {
		m := []specs.LinuxIDMapping{{ContainerID: 0, HostID: o.UIDMapBase, Size: IDMapSize}}
		s.Linux.UIDMappings = m
		s.Linux.GIDMappings = append([]specs.LinuxIDMapping{}, m...)
	}
	return s, nil
}

// maskedPaths hide kernel interfaces that leak host information or accept
// dangerous writes; the runtime covers them with /dev/null or an empty
// read-only tmpfs.
var maskedPaths = []string{
	"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
	"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
	"/sys/firmware", "/sys/devices/virtual/powercap",
}

// readonlyPaths are host-wide kernel knobs the jail may read but not write.
var readonlyPaths = []string{
	"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
}

// reservedTargets are jail paths config mounts may not cover: covering them
// would undo the masks, the read-only kernel paths or the control binds.
var reservedTargets = []string{"/proc", "/sys", "/dev", controlRoot}

// heldCapabilities checks that the daemon's bounding set holds every
// capability of caps: the runtime cannot grant one it lacks (root on some
// hosts lacks CAP_SYS_RESOURCE) and would fail at create.
func heldCapabilities(caps []string) error {
	for _, c := range caps {
		n := slices.Index(config.AllCapabilities, c)
		held, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(n), 0, 0, 0)
		if err != nil {
			// A capability newer than the kernel: the kernel does not know it.
			return errdefs.Unprocessablef("isolation.process.capabilities: %s is not supported by this host's kernel", c)
		}
		if held != 1 {
			return errdefs.Unprocessablef("isolation.process.capabilities: %s is not held by the daemon, so it cannot be granted to a jail", c)
		}
	}
	return nil
}

func userns(c *config.Config) bool {
	ns := c.Isolation.Process.Namespaces
	return ns != nil && ns.User != nil && *ns.User
}

func (o *SpecOptions) check() error {
	if o.ID == "" {
		return errdefs.Invalidf("spec: ID is required")
	}
	if o.Config == nil {
		return errdefs.Invalidf("spec %s: Config is required", o.ID)
	}
	paths := []struct{ name, v string }{
		{"Rootfs", o.Rootfs}, {"CgroupsPath", o.CgroupsPath},
		{"InitBinary", o.InitBinary}, {"ControlDir", o.ControlDir},
	}
	if !o.HostNetwork {
		paths = append(paths, struct{ name, v string }{"NetnsPath", o.NetnsPath})
	}
	for _, p := range paths {
		if !filepath.IsAbs(p.v) {
			return errdefs.Invalidf("spec %s: %s %q must be an absolute path", o.ID, p.name, p.v)
		}
	}
	for i, m := range o.Mounts {
		if !filepath.IsAbs(m.Source) || !path.IsAbs(m.Target) {
			return errdefs.Invalidf("spec %s: Mounts[%d] %q -> %q: source and target must be absolute paths", o.ID, i, m.Source, m.Target)
		}
	}
	if userns(o.Config) {
		if o.UIDMapBase == 0 {
			return errdefs.Unprocessablef("isolation.process.namespaces.user: no host id range is assigned to jail %s (UIDMapBase is 0)", o.ID)
		}
		if uint64(o.UIDMapBase)+IDMapSize > 1<<32-1 {
			return errdefs.Unprocessablef("isolation.process.namespaces.user: host id range %d+%d of jail %s overflows 32 bits", o.UIDMapBase, IDMapSize, o.ID)
		}
	}
	return nil
}

func (o *SpecOptions) namespaces() []specs.LinuxNamespace {
	ns := []specs.LinuxNamespace{
		{Type: specs.PIDNamespace},
		{Type: specs.MountNamespace},
		{Type: specs.IPCNamespace},
		{Type: specs.UTSNamespace},
		{Type: specs.CgroupNamespace},
	}
	if !o.HostNetwork {
		ns = append(ns, specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: o.NetnsPath})
	}
	if userns(o.Config) {
		ns = append(ns, specs.LinuxNamespace{Type: specs.UserNamespace})
	}
	return ns
}

func (o *SpecOptions) mounts() ([]specs.Mount, error) {
	sysfs := specs.Mount{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}}
	if userns(o.Config) {
		// Mounting sysfs needs CAP_SYS_ADMIN over the network namespace's
		// owner, the host's user namespace for a daemon-made netns: bind
		// the host's /sys instead, recursively read-only.
		sysfs = specs.Mount{Destination: "/sys", Type: "bind", Source: "/sys", Options: []string{"rbind", "rro", "nosuid", "noexec", "nodev", "ro"}}
	}
	ms := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		sysfs,
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
	}
	for _, m := range o.Mounts {
		ms = append(ms, bindMount(m.Source, m.Target, m.ReadOnly, nil))
	}
	fs := &o.Config.Isolation.Filesystem
	for _, set := range []struct {
		field    string
		mounts   []config.Mount
		readOnly bool
	}{
		{"read_only_mounts", fs.ReadOnlyMounts, true},
		{"read_write_mounts", fs.ReadWriteMounts, false},
	} {
		for i, m := range set.mounts {
			field := fmt.Sprintf("isolation.filesystem.%s[%d]", set.field, i)
			for _, r := range reservedTargets {
				if m.Target == r || strings.HasPrefix(m.Target, r+"/") {
					return nil, errdefs.Unprocessablef("%s.target: %q may not be at or under %s", field, m.Target, r)
				}
			}
			ro := set.readOnly
			for _, opt := range m.Options {
				if opt == "ro" {
					ro = true
				}
			}
			ms = append(ms, bindMount(m.Source, m.Target, ro, m.Options))
		}
	}
	ms = append(ms,
		specs.Mount{Destination: InitPath, Type: "bind", Source: o.InitBinary, Options: []string{"bind", "ro", "nosuid", "nodev"}},
		specs.Mount{Destination: ControlPath, Type: "bind", Source: o.ControlDir, Options: []string{"bind", "rw", "nosuid", "nodev", "noexec"}},
	)
	return ms, nil
}

// bindMount builds a nosuid, nodev bind mount. Among the config's options
// (already validated), "rbind" makes it recursive, with the read-only and
// nosuid/nodev flags applied recursively too (a plain "ro" on an rbind
// leaves submounts writable); "noexec" is kept; "ro"/"rw" are decided by
// readOnly.
func bindMount(src, dst string, readOnly bool, opts []string) specs.Mount {
	recursive, noexec := false, false
	for _, o := range opts {
		switch o {
		case "rbind":
			recursive = true
		case "noexec":
			noexec = true
		}
	}
	var out []string
	if recursive {
		out = append(out, "rbind", "rnosuid", "rnodev")
		if readOnly {
			out = append(out, "rro")
		}
	} else {
		out = append(out, "bind")
	}
	if readOnly {
		out = append(out, "ro")
	} else {
		out = append(out, "rw")
	}
	out = append(out, "nosuid", "nodev")
	if noexec {
		out = append(out, "noexec")
	}
	return specs.Mount{Destination: dst, Type: "bind", Source: src, Options: out}
}

// allowedDevices are the only devices the jail may open or create: the
// harmless character devices and its own terminals.
var allowedDevices = []struct {
	major, minor int64 // minor -1: every minor
}{
	{1, 3}, {1, 5}, {1, 7}, {1, 8}, {1, 9}, // null, zero, full, random, urandom
	{5, 0}, {5, 2}, // tty, ptmx
	{136, -1}, // pts/*
}

func (o *SpecOptions) resources() (*specs.LinuxResources, error) {
	r := &o.Config.Isolation.Resources
	limit := r.MemoryBytes
	mem := &specs.LinuxMemory{Limit: &limit}
	if o.SwapAccounting {
		swap := r.MemorySwapBytes // validated >= memory_bytes; equal means no swap
		mem.Swap = &swap
	} else if r.MemorySwapBytes > r.MemoryBytes {
		return nil, errdefs.Unprocessablef("isolation.resources.memory_swap_bytes: %d exceeds memory_bytes %d, but this host does not account swap (no memory.memsw); set it equal to memory_bytes", r.MemorySwapBytes, r.MemoryBytes)
	}

	shares, period := r.CPUShares, r.CPUPeriod
	cpu := &specs.LinuxCPU{Shares: &shares, Period: &period}
	if r.CPUQuota > 0 {
		quota := r.CPUQuota
		cpu.Quota = &quota
	}
	pids := r.PidsLimit

	devs := []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}
	for _, d := range allowedDevices {
		major := d.major
		rule := specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: &major, Access: "rwm"}
		if d.minor >= 0 {
			minor := d.minor
			rule.Minor = &minor
		}
		devs = append(devs, rule)
	}
	return &specs.LinuxResources{
		Devices: devs,
		Memory:  mem,
		CPU:     cpu,
		Pids:    &specs.LinuxPids{Limit: &pids},
	}, nil
}

func (o *SpecOptions) rlimits() []specs.POSIXRlimit {
	r := &o.Config.Isolation.Resources
	rl := []specs.POSIXRlimit{
		{Type: "RLIMIT_NOFILE", Hard: r.NofileLimit, Soft: r.NofileLimit},
		{Type: "RLIMIT_CORE", Hard: r.CoreLimit, Soft: r.CoreLimit},
	}
	if r.AsLimit > 0 {
		rl = append(rl, specs.POSIXRlimit{Type: "RLIMIT_AS", Hard: r.AsLimit, Soft: r.AsLimit})
	}
	return rl
}

// WriteBundle writes s as dir/config.json atomically (atomicfile.Refresh:
// a reader never sees a partial spec; a spec the file holds already is not
// written again), but not durably: the spec is derived from the jail's
// record and written before each start. dir must exist. On error no
// temporary file is left.
func WriteBundle(dir string, s *specs.Spec) error {
	data, err := json.MarshalIndent(s, "", "\t")
	if err != nil {
		return fmt.Errorf("bundle %s: encode config.json: %w", dir, err)
	}
	if err := atomicfile.Refresh(filepath.Join(dir, "config.json"), data, 0o600); err != nil {
		return fmt.Errorf("bundle %s: %w", dir, err)
	}
	return nil
}
