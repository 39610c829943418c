// Package process is the process isolation level, and the unsafe none
// level beside it.
//
// A process-level jail is a tree of host processes: no mount, pid or user
// namespace. Its init (agentjail init, started through agentjail confine)
// runs as a host user of the jail's own (a uid no other jail has), in a
// cgroup of its own with the jail's limits, in a network namespace made by
// the daemon (the jail's network is the daemon's policed network, as at
// the container level), under Landlock (the jail reads the host's system
// directories, reads and writes its workspace, home and temporary
// directory on a disk of the jail's size, and reaches nothing else;
// signals, ptrace and abstract sockets stay inside the jail) and a seccomp
// filter refusing the escape syscalls, with no way to gain privileges.
// Every command of the jail is a child of that init. The host kernel's
// observers watch it by its cgroup, as they watch a container.
//
// What it does not hide: the host's process list, its system files (read
// only), its host name; docs/levels.md says precisely.
//
// A none-level jail is the same tree without any of it: init runs as the
// daemon's user, on the host's network, in a plain directory. It is for
// development only: the daemon refuses it unless started with
// --unsafe-none-level, and it is marked unsafe wherever it shows.
package process

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/backend/hostjail"
	"github.com/agentjail/agentjail/internal/cgroups"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/confine"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/netns"
	"github.com/agentjail/agentjail/internal/netpolicy"
	"github.com/agentjail/agentjail/internal/procwait"
)

// The host uids of process-level jails: UIDBase up, one per jail.
const (
	UIDBase  = 1100000
	UIDCount = 65536
)

// startTimeout bounds how long init may take to become ready.
const startTimeout = 30 * time.Second

// defaultPath is the PATH of every jail process.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// systemDirs are the host trees a process-level jail reads (those that
// exist here).
var systemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/proc"}

// devices are the device files a process-level jail reads and writes.
var devices = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx", "/dev/pts"}

// Backend runs jails as host processes: the process level, or (unsafe)
// the none level.
type Backend struct {
	host   backend.Host
	unsafe bool
	caps   backend.Capabilities
	// mu serialises uid allocation.
	mu sync.Mutex
	// net attaches jails to the daemon's policed network.
	net *hostjail.Network
}

var (
	_ backend.Backend     = (*Backend)(nil)
	_ backend.Observable  = (*Backend)(nil)
	_ backend.OOMReporter = (*Backend)(nil)
)

// Factory returns the factory of the process level. It is unavailable
// where the kernel lacks Landlock ABI 6 (signal and socket scoping).
func Factory() backend.Factory {
	return backend.Factory{Level: config.LevelProcess, New: func(h backend.Host) (backend.Backend, error) {
		abi, err := landlockABI()
		if err != nil {
			return nil, err
		}
		if abi < 6 {
			return nil, fmt.Errorf("process: the kernel's Landlock is ABI %d; the process level needs 6 (Linux 6.12)", abi)
		}
		return &Backend{host: h, net: &hostjail.Network{Net: h.Net, Log: h.Log}, caps: backend.Capabilities{
			Level:        config.LevelProcess,
			Runtime:      fmt.Sprintf("host processes under Landlock ABI %d and seccomp", abi),
			NetworkModes: []string{config.NetIsolated, config.NetNone},
			RootfsKinds:  []string{model.RootfsKindHost},
			Limits:       []string{model.LimitMemory, model.LimitPids, model.LimitCPU, model.LimitDisk},
			PTY:          true,
			Observers:    []string{model.ObserverKernel},
			CheckpointReason: "a process-level jail shares the host's pid and mount namespaces, " +
				"in which CRIU cannot restore its processes beside the host's",
			Exposes: []string{model.ExposesHostProcesses},
			Guarantees: "host processes of a user of the jail's own under Landlock (the host's system directories read-only, " +
				"its workspace read-write, nothing else), seccomp, cgroup limits and a network namespace on the policed network; " +
				"it sees the host's process list and host name, and shares the host's kernel",
		}}, nil
	}}
}

// NoneFactory returns the factory of the none level: available only when
// allowed (serve --unsafe-none-level).
func NoneFactory(allowed bool) backend.Factory {
	return backend.Factory{Level: config.LevelNone, New: func(h backend.Host) (backend.Backend, error) {
		if !allowed {
			return nil, errors.New("none: it isolates nothing; the daemon offers it only when started with --unsafe-none-level (development only)")
		}
		return none{&Backend{host: h, unsafe: true, caps: backend.Capabilities{
			Level:            config.LevelNone,
			Runtime:          "host processes, unconfined",
			Unsafe:           true,
			NetworkModes:     []string{config.NetHost},
			RootfsKinds:      []string{model.RootfsKindHost},
			PTY:              true,
			Users:            true,
			CheckpointReason: "the none level has nothing to checkpoint with",
			Exposes:          []string{model.ExposesHostProcesses},
			Guarantees:       "UNSAFE, development only: commands run as the daemon's user on the host, with its files, network and privileges",
		}}}, nil
	}}
}

// none is the none level: the backend's verbs only (its jails cannot be
// observed).
type none struct{ backend.Backend }

// landlockABI asks the kernel which Landlock ABI it has.
func landlockABI() (int, error) {
	r, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if errno != 0 {
		return 0, fmt.Errorf("process: the kernel has no Landlock (%v); the process level needs it", errno)
	}
	return int(r), nil
}

// Capabilities implements backend.Backend.
func (b *Backend) Capabilities() backend.Capabilities { return b.caps }

// paths of one jail.
type paths struct {
	disk, workspace, home, tmp, control, netns, uidFile, pidFile string
}

func (b *Backend) paths(inst backend.Instance) paths {
	disk := filepath.Join(inst.Dir, "disk")
	if b.unsafe {
		disk = filepath.Join(inst.Dir, "files")
	}
	return paths{
		disk:      disk,
		workspace: filepath.Join(disk, "workspace"),
		home:      filepath.Join(disk, "home"),
		tmp:       filepath.Join(disk, "tmp"),
		control:   filepath.Join(inst.Dir, "run"),
		netns:     filepath.Join(b.host.DataDir, "run", "netns", inst.ID),
		uidFile:   filepath.Join(inst.Dir, "uid"),
		pidFile:   filepath.Join(inst.Dir, "init.pid"),
	}
}

// Configure implements backend.Backend: the jail's workspace is a host
// directory, which becomes workspace_root; what needs a mount namespace
// (mounts at other paths, masked paths, a trust store of its own, other
// users) is refused.
func (b *Backend) Configure(inst backend.Instance) error {
	cfg := inst.Config
	fs := &cfg.Isolation.Filesystem
	level := b.caps.Level
	ws := b.paths(inst).workspace
	if fs.WorkspaceRoot != config.DefaultWorkspace && fs.WorkspaceRoot != ws {
		return errdefs.Unprocessablef("isolation.filesystem.workspace_root: the %s level has no mount namespace; its workspace is the host directory %s (leave the field unset)", level, ws)
	}
	fs.WorkspaceRoot = ws
	if b.unsafe {
		// Commands run as the daemon's user unless the config names one.
		if p := &cfg.Isolation.Process; p.User == config.DefaultUser {
			p.User = strconv.Itoa(os.Getuid())
		}
		return nil
	}
	for field, mounts := range map[string][]config.Mount{"read_only_mounts": fs.ReadOnlyMounts, "read_write_mounts": fs.ReadWriteMounts} {
		for i, m := range mounts {
			if m.Target != m.Source {
				return errdefs.Unprocessablef("isolation.filesystem.%s[%d]: the %s level has no mount namespace; the jail reaches %s at its own path (set target to the source)", field, i, level, m.Source)
			}
			if _, err := os.Stat(m.Source); err != nil {
				return errdefs.Unprocessablef("isolation.filesystem.%s[%d].source: %v", field, i, err)
			}
		}
	}
	if len(fs.BlockedPaths) > 0 {
		return errdefs.Unprocessablef("isolation.filesystem.blocked_paths: the %s level cannot mask paths; it reaches only the host's system directories and its own", level)
	}
	if cfg.Isolation.Network.TLSInspection {
		return errdefs.Unprocessablef("isolation.network.tls_inspection: the %s level shares the host's trust store, which the daemon's CA must not enter", level)
	}
	p := cfg.Isolation.Process
	if p.User != config.DefaultUser || p.Group != "" {
		return errdefs.Unprocessablef("isolation.process.user: the %s level runs every command as the jail's own host user; leave user and group unset", level)
	}
	if len(p.Capabilities) > 0 || p.SeccompProfile != nil || p.ApparmorProfile != "" || p.SelinuxContext != "" {
		return errdefs.Unprocessablef("isolation.process: the %s level grants no capabilities and has its own seccomp filter; capabilities, seccomp_profile, apparmor_profile and selinux_context are not supported", level)
	}
	return nil
}

// Prepare implements backend.Backend: the jail's uid, disk (workspace,
// home, temporary directory) and network namespace.
func (b *Backend) Prepare(ctx context.Context, inst backend.Instance) (err error) {
	p := b.paths(inst)
	defer func() {
		if err != nil {
			if derr := b.Destroy(context.WithoutCancel(ctx), inst); derr != nil {
				b.host.Log.Error("releasing a half-prepared jail", "jail", inst.ID, "err", derr)
			}
		}
	}()
	owner := -1
	if b.unsafe {
		if err := os.MkdirAll(p.disk, 0o755); err != nil {
			return fmt.Errorf("jail files: %w", err)
		}
	} else {
		if owner, err = b.allocUID(inst); err != nil {
			return err
		}
		if err := b.host.Pool.CreateDisk(inst.ID, inst.Config.Isolation.Resources.DiskBytes, p.disk); err != nil {
			return fmt.Errorf("jail disk: %w", err)
		}
		if err := netns.Create(p.netns); err != nil {
			return fmt.Errorf("network namespace: %w", err)
		}
	}
	for _, d := range []string{p.workspace, p.home, p.tmp} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("jail files: %w", err)
		}
		if owner >= 0 {
			if err := os.Chown(d, owner, owner); err != nil {
				return fmt.Errorf("jail files: %w", err)
			}
		}
	}
	return nil
}

// allocUID gives the jail the lowest host uid of the range that no other
// process-level jail has, recorded in its directory.
func (b *Backend) allocUID(inst backend.Instance) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if uid, err := readInt(b.paths(inst).uidFile); err == nil {
		return uid, nil
	}
	used := map[int]bool{}
	dirs, _ := filepath.Glob(filepath.Join(b.host.DataDir, "jails", "*", "uid"))
	for _, f := range dirs {
		if uid, err := readInt(f); err == nil {
			used[uid] = true
		}
	}
	for uid := UIDBase; uid < UIDBase+UIDCount; uid++ {
		if !used[uid] {
			if err := os.WriteFile(b.paths(inst).uidFile, []byte(strconv.Itoa(uid)), 0o600); err != nil {
				return 0, fmt.Errorf("jail uid: %w", err)
			}
			return uid, nil
		}
	}
	return 0, errdefs.Unavailablef("all %d host uids of the process level are in use", UIDCount)
}

func readInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// Start implements backend.Backend.
func (b *Backend) Start(ctx context.Context, inst backend.Instance) (st backend.Status, err error) {
	p := b.paths(inst)
	if pid := b.initPid(inst); pid > 0 {
		return backend.Status{}, errdefs.Conflictf("jail %s: its init (pid %d) still runs", inst.Name, pid)
	}
	uid := -1
	var att netpolicy.Attachment
	if !b.unsafe {
		if uid, err = readInt(p.uidFile); err != nil {
			return backend.Status{}, fmt.Errorf("jail uid: %w", err)
		}
		if err := b.host.Pool.MountDisk(inst.ID, p.disk); err != nil {
			return backend.Status{}, fmt.Errorf("jail disk: %w", err)
		}
		if !netns.Exists(p.netns) {
			if err := netns.Create(p.netns); err != nil {
				return backend.Status{}, fmt.Errorf("network namespace: %w", err)
			}
		}
		if att, err = b.attach(ctx, inst); err != nil {
			return backend.Status{}, err
		}
		defer func() {
			if err != nil {
				b.detach(context.WithoutCancel(ctx), inst)
			}
		}()
	}
	if err := b.writeControl(inst, uid, att.Env); err != nil {
		return backend.Status{}, err
	}
	var cg *cgroup
	if !b.unsafe {
		if cg, err = newCgroup(string(hostjail.CgroupOf(inst.ID)), inst.Config.Isolation.Resources); err != nil {
			return backend.Status{}, err
		}
	}
	pid, err := b.spawn(ctx, inst, uid, cg)
	if err != nil {
		return backend.Status{}, err
	}
	return backend.Status{Running: true, Pid: pid}, nil
}

// writeControl writes init's control directory, which init (as the
// jail's user) owns.
func (b *Backend) writeControl(inst backend.Instance, uid int, netEnv map[string]string) error {
	p := b.paths(inst)
	if err := os.MkdirAll(p.control, 0o700); err != nil {
		return fmt.Errorf("control dir: %w", err)
	}
	_ = os.Remove(filepath.Join(p.control, initproto.SocketName))
	cfg := inst.Config
	env := []string{"PATH=" + defaultPath, "LANG=C.UTF-8", "TMPDIR=" + p.tmp}
	for _, m := range []map[string]string{cfg.Env, netEnv} {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			env = append(env, k+"="+m[k])
		}
	}
	user := cfg.Isolation.Process.User
	if uid >= 0 {
		user = strconv.Itoa(uid)
	}
	ic := initproto.InitConfig{
		JailID:      inst.ID,
		DefaultUser: user,
		Workspace:   p.workspace,
		Env:         env,
		Home:        p.home,
		IdleShims:   idleShims(cfg.Isolation.Resources.PidsLimit),
	}
	if !b.unsafe {
		ic.CommandLandlock = b.landlock(inst, false)
	}
	data, err := json.MarshalIndent(ic, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(p.control, initproto.ConfigName)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("control dir: %w", err)
	}
	if uid >= 0 {
		for _, f := range []string{p.control, path} {
			if err := os.Chown(f, uid, uid); err != nil {
				return fmt.Errorf("control dir: %w", err)
			}
		}
	}
	return nil
}

// idleShims sizes init's pool of ready shims (each holds a few tasks of
// the pids limit).
func idleShims(pidsLimit int64) int {
	if pidsLimit >= 96 {
		return 2
	}
	return 0
}

// spawn starts the jail's init (through agentjail confine, unless the
// level is none), places it in cg, calls OnCreated, lets it go and waits
// for it to serve. On error nothing of it runs.
func (b *Backend) spawn(ctx context.Context, inst backend.Instance, uid int, cg *cgroup) (pid int, err error) {
	p := b.paths(inst)
	initArgs := []string{"agentjail", "init", "--control-dir", p.control}
	var cmd *exec.Cmd
	var release *os.File
	if b.unsafe {
		cmd = exec.Command(b.host.InitBinary, initArgs[1:]...)
		cmd.Dir = p.workspace
	} else {
		spec, err := json.Marshal(b.confineSpec(inst, uid, initArgs))
		if err != nil {
			return 0, err
		}
		r, w, err := os.Pipe()
		if err != nil {
			return 0, err
		}
		defer r.Close()
		release = w
		defer func() {
			if release != nil {
				release.Close()
			}
		}()
		cmd = exec.Command(b.host.InitBinary, "confine", string(spec))
		cmd.ExtraFiles = []*os.File{r}
		cmd.Dir = "/"
	}
	cmd.Env = []string{"PATH=" + defaultPath}
	// A session of its own: the jail outlives the daemon.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	var stderr strings.Builder
	cmd.Stderr = &limitedWriter{w: &stderr, n: 64 << 10}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start jail init: %w", err)
	}
	pid = cmd.Process.Pid
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	defer func() {
		if err != nil {
			b.kill(context.WithoutCancel(ctx), inst, pid)
			if cg != nil {
				if derr := cg.destroy(); derr != nil {
					b.host.Log.Error("removing the cgroup of a jail whose start failed", "jail", inst.ID, "err", derr)
				}
			}
		}
	}()
	if err := os.WriteFile(p.pidFile, []byte(strconv.Itoa(pid)), 0o600); err != nil {
		return pid, fmt.Errorf("init pid file: %w", err)
	}
	if cg != nil {
		if err := cg.apply(pid); err != nil {
			return pid, err
		}
	}
	if inst.OnCreated != nil {
		if err := inst.OnCreated(backend.Status{Running: true, Pid: pid}); err != nil {
			return pid, err
		}
	}
	if release != nil {
		_, err := release.Write([]byte{1})
		release.Close()
		release = nil
		if err != nil {
			return pid, fmt.Errorf("release jail init: %w", err)
		}
	}
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err == nil && line != initproto.ReadyLine {
			err = fmt.Errorf("unexpected %q", line)
		}
		ready <- err
	}()
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	select {
	case err := <-ready:
		if err != nil {
			<-exited
			return pid, fmt.Errorf("jail init did not start: %v: %s", err, strings.TrimSpace(stderr.String()))
		}
	case <-ctx.Done():
		return pid, fmt.Errorf("jail init did not become ready within %v: %w", startTimeout, ctx.Err())
	}
	return pid, nil
}

// confineSpec is what agentjail confine applies to the jail's init.
func (b *Backend) confineSpec(inst backend.Instance, uid int, initArgs []string) confine.Spec {
	p := b.paths(inst)
	res := inst.Config.Isolation.Resources
	spec := confine.Spec{
		Path: b.host.InitBinary, Argv: initArgs, Env: []string{"PATH=" + defaultPath}, Dir: p.workspace,
		Netns: p.netns, UID: uid, GID: uid, Landlock: b.landlock(inst, true), Seccomp: true,
		Rlimits: []confine.Rlimit{{Resource: unix.RLIMIT_NOFILE, Cur: res.NofileLimit, Max: res.NofileLimit}},
	}
	if res.AsLimit > 0 {
		spec.Rlimits = append(spec.Rlimits, confine.Rlimit{Resource: unix.RLIMIT_AS, Cur: res.AsLimit, Max: res.AsLimit})
	}
	if res.CoreLimit > 0 {
		spec.Rlimits = append(spec.Rlimits, confine.Rlimit{Resource: unix.RLIMIT_CORE, Cur: res.CoreLimit, Max: res.CoreLimit})
	}
	return spec
}

// landlock is the Landlock domain of the jail's init (forInit: with its
// control directory and its binary, to re-execute as shims) or of its
// commands (without: they cannot reach init's config, log or the
// terminal recordings).
func (b *Backend) landlock(inst backend.Instance, forInit bool) *confine.Landlock {
	p := b.paths(inst)
	fs := inst.Config.Isolation.Filesystem
	ll := &confine.Landlock{
		ReadOnly:  existing(systemDirs),
		ReadWrite: []string{p.workspace, p.home, p.tmp},
		Devices:   existing(devices),
	}
	if forInit {
		ll.ReadWrite = append(ll.ReadWrite, p.control)
		ll.ReadOnlyFiles = []string{b.host.InitBinary}
	}
	for _, m := range fs.ReadOnlyMounts {
		ll.ReadOnly = append(ll.ReadOnly, m.Source)
	}
	for _, m := range fs.ReadWriteMounts {
		ll.ReadWrite = append(ll.ReadWrite, m.Source)
	}
	return ll
}

// existing keeps the paths that exist on this host.
func existing(paths []string) []string {
	var out []string
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// limitedWriter keeps the first n bytes written to w.
type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if l.n > 0 {
		k := min(len(p), l.n)
		l.w.Write(p[:k])
		l.n -= k
	}
	return len(p), nil
}

// attach connects the jail's network namespace to the daemon's policed
// network (mode none: loopback only).
func (b *Backend) attach(ctx context.Context, inst backend.Instance) (netpolicy.Attachment, error) {
	return b.net.Attach(ctx, inst, b.paths(inst).netns)
}

func (b *Backend) detach(ctx context.Context, inst backend.Instance) {
	if !b.unsafe {
		b.net.DetachLogged(ctx, inst.ID)
	}
}

// initPid returns the host pid of the jail's running init, 0 when none:
// the recorded pid, if that process is still the jail's (in its cgroup,
// or, at the none level, running the init binary).
func (b *Backend) initPid(inst backend.Instance) int {
	p := b.paths(inst)
	pid, err := readInt(p.pidFile)
	if err != nil || pid <= 0 {
		return 0
	}
	if b.unsafe {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !strings.Contains(string(cmdline), p.control) {
			return 0
		}
		return pid
	}
	pids, err := cgroups.Pids(string(hostjail.CgroupOf(inst.ID)))
	if err != nil || !slices.Contains(pids, pid) {
		return 0
	}
	return pid
}

// Stop implements backend.Backend: SIGTERM to init (which forwards it to
// the commands), then, after grace, SIGKILL to every process of the jail.
func (b *Backend) Stop(ctx context.Context, inst backend.Instance, grace time.Duration) error {
	if pid := b.initPid(inst); pid > 0 && grace > 0 {
		if err := unix.Kill(pid, unix.SIGTERM); err == nil {
			wctx, cancel := context.WithTimeout(ctx, grace)
			_ = procwait.WaitPid(wctx, pid)
			cancel()
		}
	}
	err := b.kill(ctx, inst, b.initPid(inst))
	b.detach(ctx, inst)
	return err
}

// kill SIGKILLs every process of the jail (its cgroup's, or at the none
// level init's process group) and waits for init.
func (b *Backend) kill(ctx context.Context, inst backend.Instance, pid int) error {
	p := b.paths(inst)
	if b.unsafe {
		if pid > 0 {
			_ = unix.Kill(-pid, unix.SIGKILL)
		}
	} else {
		kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := cgroups.Kill(kctx, string(hostjail.CgroupOf(inst.ID)))
		cancel()
		if err != nil {
			return fmt.Errorf("jail %s: %w", inst.ID, err)
		}
	}
	if pid > 0 {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := procwait.WaitPid(wctx, pid)
		cancel()
		if err != nil {
			return fmt.Errorf("jail %s: init (pid %d) did not exit after SIGKILL: %w", inst.ID, pid, err)
		}
	}
	_ = os.Remove(p.pidFile)
	return nil
}

// Destroy implements backend.Backend.
func (b *Backend) Destroy(ctx context.Context, inst backend.Instance) error {
	p := b.paths(inst)
	var errs []error
	if err := b.kill(ctx, inst, b.initPid(inst)); err != nil {
		errs = append(errs, err)
	}
	if !b.unsafe {
		errs = append(errs, hostjail.Release(ctx, b.net, b.host.Pool, inst.ID, nil, p.disk, p.netns)...)
	}
	return errors.Join(errs...)
}

// Status implements backend.Backend.
func (b *Backend) Status(ctx context.Context, inst backend.Instance) (backend.Status, error) {
	if pid := b.initPid(inst); pid > 0 {
		return backend.Status{Running: true, Pid: pid}, nil
	}
	return backend.Status{}, nil
}

// Reattach implements backend.Backend.
func (b *Backend) Reattach(ctx context.Context, inst backend.Instance) error {
	if b.unsafe {
		return nil
	}
	_, err := b.attach(ctx, inst)
	return err
}

// UpdateNetwork implements backend.Backend.
func (b *Backend) UpdateNetwork(ctx context.Context, inst backend.Instance) error {
	if b.unsafe {
		return backend.Unsupported(b.caps.Level, "apply a network policy", "its jails use the host's network")
	}
	return b.net.Update(ctx, inst)
}

// Rename implements backend.Backend: the jail's name on the jail
// network (it has no host name of its own).
func (b *Backend) Rename(ctx context.Context, inst backend.Instance, st backend.Status) error {
	if b.unsafe {
		return nil
	}
	return b.net.Rename(ctx, inst)
}

// Stats implements backend.Backend.
func (b *Backend) Stats(ctx context.Context, inst backend.Instance) (backend.Stats, error) {
	if b.unsafe {
		return backend.Stats{}, nil
	}
	return hostjail.CgroupOf(inst.ID).Stats(b.paths(inst).disk)
}

// InitDialer implements backend.Backend: init listens on a unix socket in
// its control directory, accepting root (the daemon) only.
func (b *Backend) InitDialer(inst backend.Instance) initclient.Dialer {
	return initclient.UnixSocket(filepath.Join(b.paths(inst).control, initproto.SocketName))
}

// Observe implements backend.Observable: the jail's root is the host's.
func (b *Backend) Observe(inst backend.Instance, st backend.Status) (backend.Observed, error) {
	ob, err := hostjail.CgroupOf(inst.ID).Observed("", b.net.Interface(inst.ID))
	if err != nil {
		return backend.Observed{}, fmt.Errorf("jail %s: %w", inst.Name, err)
	}
	return ob, nil
}

// Pids implements backend.Observable.
func (b *Backend) Pids(inst backend.Instance) ([]int, error) {
	return hostjail.CgroupOf(inst.ID).Pids()
}

// OOMKills implements backend.OOMReporter.
func (b *Backend) OOMKills(inst backend.Instance) (uint64, error) {
	return hostjail.CgroupOf(inst.ID).OOMKills()
}
