// Package vm is the vm isolation level: each jail is a QEMU microvm with
// a kernel of its own (Debian's, installed by scripts/build-vm-kernel.sh)
// whose PID 1 is the daemon's own binary (package guest), which runs the
// same init and control protocol as every other level over a
// virtio-serial port.
//
// A jail's root is its lower tree as a read-only erofs image (the host's
// /usr a second one for host-rootfs jails; both shared by every jail and
// built once per content), and its disk from the storage pool (XFS of
// exactly disk_bytes, upper/ and work/ of an overlay the guest mounts) as
// the machine's writable disk. Its network is a tap device in the jail's
// network namespace spliced to the daemon's policed link there, so policy,
// proxy, DNS and the network log apply as for containers. Memory, pids
// and CPU are limited by the guest kernel's cgroups (the machine is sized
// from the same limits); the disk by its size.
package vm

import (
	"context"
	"errors"
	"fmt"
	"net"
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

	"github.com/agentjail/agentjail/internal/accounts"
	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/backend/hostjail"
	"github.com/agentjail/agentjail/internal/backend/vm/vmproto"
	"github.com/agentjail/agentjail/internal/cgroups"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/image"
	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/netns"
	"github.com/agentjail/agentjail/internal/netpolicy"
	"github.com/agentjail/agentjail/internal/procwait"
	"github.com/agentjail/agentjail/internal/rootfs"
	"github.com/agentjail/agentjail/internal/storage"
)

// DefaultKernelDir is where scripts/build-vm-kernel.sh installs the guest
// kernel and its modules.
const DefaultKernelDir = "/usr/local/lib/agentjail/vm"

// DefaultCacheDir holds the images machines boot from, shared by the
// host's daemons.
const DefaultCacheDir = "/var/cache/agentjail/vm"

// defaultPath is the PATH of every jail process.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Sizing of a machine beyond the jail's limits: the guest kernel, the
// initramfs (the daemon's binary) and init live outside the jail's
// cgroup.
const (
	overheadMiB = 192
	maxCPUs     = 8
)

// bootTimeout bounds a machine's boot to a serving init (TCG is slow).
const bootTimeout = 90 * time.Second

// Options configures the backend.
type Options struct {
	backend.Host
	// QEMU is the qemu-system-x86_64 binary ("" finds it on PATH).
	QEMU string
	// KernelDir holds vmlinux, modules/ and VERSION ("" is
	// DefaultKernelDir).
	KernelDir string
	// CacheDir holds the boot images ("" is DefaultCacheDir).
	CacheDir string
}

// Factory returns the factory of the vm level.
func Factory() backend.Factory {
	return backend.Factory{Level: config.LevelVM, New: func(h backend.Host) (backend.Backend, error) {
		return New(Options{Host: h})
	}}
}

// Backend is the vm level.
type Backend struct {
	opts   Options
	caps   backend.Capabilities
	accel  string
	tscKHz int
	images *images
	net    *hostjail.Network

	// usr is the image of the host's /usr as the daemon found it when
	// its first host-rootfs vm jail was made, once usrDone is closed
	// (usrErr when it could not be made); usrOnce starts making it.
	usrOnce sync.Once
	usrDone chan struct{}
	usr     string
	usrErr  error

	mu       sync.Mutex
	sessions map[string]*session // jail id → control session
}

var (
	_ backend.Backend     = (*Backend)(nil)
	_ backend.OOMReporter = (*Backend)(nil)
)

// New returns the vm backend, or errdefs.ErrUnavailable saying what this
// host lacks (QEMU, the guest kernel, mkfs.erofs) and how to get it.
func New(opts Options) (*Backend, error) {
	if opts.KernelDir == "" {
		opts.KernelDir = DefaultKernelDir
	}
	if opts.CacheDir == "" {
		opts.CacheDir = DefaultCacheDir
	}
	if opts.QEMU == "" {
		q, err := exec.LookPath("qemu-system-x86_64")
		if err != nil {
			return nil, errdefs.Unavailablef("qemu-system-x86_64 is not installed; run make setup")
		}
		opts.QEMU = q
	}
	for _, f := range []string{"vmlinux", "VERSION", "modules/order"} {
		if _, err := os.Stat(filepath.Join(opts.KernelDir, f)); err != nil {
			return nil, errdefs.Unavailablef("the guest kernel is not installed (%v); run make setup", err)
		}
	}
	if err := backend.StaticBinary(opts.InitBinary); err != nil {
		return nil, errdefs.Wrap(errdefs.ErrUnavailable, err, "the machine's init")
	}
	mkfs, err := exec.LookPath("mkfs.erofs")
	if err != nil {
		return nil, errdefs.Unavailablef("mkfs.erofs is not installed; run make setup")
	}
	out, err := exec.Command(opts.QEMU, "--version").Output()
	if err != nil {
		return nil, errdefs.Wrap(errdefs.ErrUnavailable, err, "%s --version", opts.QEMU)
	}
	version := strings.TrimPrefix(strings.SplitN(string(out), "\n", 2)[0], "QEMU emulator version ")
	if err := os.MkdirAll(opts.CacheDir, 0o700); err != nil {
		return nil, errdefs.Wrap(errdefs.ErrUnavailable, err, "vm image cache")
	}
	b := &Backend{
		opts:     opts,
		tscKHz:   tscKHz(),
		images:   &images{dir: opts.CacheDir, mkfs: mkfs, locks: map[string]*sync.Mutex{}, sums: map[string]string{}},
		net:      &hostjail.Network{Net: opts.Net, Log: opts.Log},
		sessions: map[string]*session{},
	}
	accel, why := b.detectAccel()
	b.accel = accel
	b.caps = backend.Capabilities{
		Level:         config.LevelVM,
		Runtime:       "qemu " + version + " microvm, " + accel + " (" + why + ")",
		NetworkModes:  []string{config.NetIsolated, config.NetNone, config.NetBridge},
		RootfsKinds:   []string{model.RootfsKindHost, model.RootfsKindDir, model.RootfsKindImage},
		Limits:        []string{model.LimitMemory, model.LimitPids, model.LimitCPU, model.LimitDisk},
		PTY:           true,
		Users:         true,
		Exposes:       []string{model.ExposesGuestKernel},
		Observers:     []string{model.ObserverBackend},
		BackendEvents: []string{"proc"},
		Checkpoint:    true,
		Guarantees: "a virtual machine (QEMU microvm) with a kernel of its own: the jail's processes, root included, " +
			"reach the host only through the machine's virtio devices (its disks, a policed network link and the control port); " +
			"the jail's own kernel is theirs to change",
	}
	if b.opts.Images == nil {
		b.caps.RootfsKinds = b.caps.RootfsKinds[:2]
	}
	b.usrDone = make(chan struct{})
	return b, nil
}

// makeUsr starts reading (and, the first time on this host, building:
// about a minute) the image of the host's /usr, once per daemon.
func (b *Backend) makeUsr() {
	b.usrOnce.Do(func() {
		go func() {
			defer close(b.usrDone)
			b.usr, b.usrErr = b.images.erofs(context.Background(), "usr", "/usr")
			if b.usrErr != nil {
				b.opts.Log.Warn("vm level: the image of the host's /usr", "err", b.usrErr)
			}
		}()
	})
}

// Capabilities implements backend.Backend.
func (b *Backend) Capabilities() backend.Capabilities { return b.caps }

// paths of one jail.
type paths struct {
	// run is the machine's run directory (sockets, pid file, console).
	run string
	// disk is where the jail's disk is mounted while the daemon seeds it.
	disk  string
	netns string
}

func (b *Backend) paths(inst backend.Instance) paths {
	return paths{
		run:   filepath.Join(inst.Dir, "vm"),
		disk:  filepath.Join(inst.Dir, "disk"),
		netns: filepath.Join(b.opts.DataDir, "run", "netns", inst.ID),
	}
}

// lower returns the tree the jail's root is made from, and whether the
// host's /usr goes on top of it.
func (b *Backend) lower(inst backend.Instance) (string, bool, error) {
	fs := inst.Config.Isolation.Filesystem
	if fs.Rootfs == config.RootfsHost {
		return b.opts.HostLower, true, nil
	}
	if strings.HasPrefix(fs.Rootfs, config.RootfsImagePrefix) {
		if b.opts.Images == nil {
			return "", false, errdefs.Unprocessablef("isolation.filesystem.rootfs: %q: this daemon has no image store", fs.Rootfs)
		}
		id := image.PinnedID(fs.Rootfs)
		if id == "" {
			return "", false, errdefs.Unprocessablef("isolation.filesystem.rootfs: %q: the image is not pinned by id", fs.Rootfs)
		}
		dir, err := b.opts.Images.View(id)
		return dir, false, err
	}
	dir := strings.TrimPrefix(fs.Rootfs, config.RootfsDirPrefix)
	if err := rootfs.CheckDir(dir, b.opts.DataDir); err != nil {
		return "", false, err
	}
	return dir, false, nil
}

// Configure implements backend.Backend.
func (b *Backend) Configure(inst backend.Instance) error {
	c := inst.Config
	fs := c.Isolation.Filesystem
	if o := fs.UseOverlay; o != nil && !*o {
		return errdefs.Unprocessablef("isolation.filesystem.use_overlay: the vm level always uses an overlay root; false is not supported")
	}
	if len(fs.ReadOnlyMounts) > 0 || len(fs.ReadWriteMounts) > 0 {
		return errdefs.Unprocessablef("isolation.filesystem: the vm level cannot mount host directories into a jail (they would block its snapshots); copy files in through the file API")
	}
	if ns := c.Isolation.Process.Namespaces; ns != nil && ns.User != nil && *ns.User {
		return errdefs.Unprocessablef("isolation.process.namespaces.user: the vm level runs its own kernel; a user namespace adds nothing and is not supported")
	}
	if c.Isolation.Network.Mode == config.NetHost {
		return errdefs.Unprocessablef("isolation.network.mode: the vm level has no host network mode")
	}
	return nil
}

// Prepare implements backend.Backend: the jail's disk, seeded with its
// workspace, and its network namespace.
func (b *Backend) Prepare(ctx context.Context, inst backend.Instance) (err error) {
	p := b.paths(inst)
	defer func() {
		if err != nil {
			if derr := b.Destroy(context.WithoutCancel(ctx), inst); derr != nil {
				b.opts.Log.Error("releasing a half-prepared jail", "jail", inst.ID, "err", derr)
			}
		}
	}()
	lower, hostUsr, err := b.lower(inst)
	if err != nil {
		return err
	}
	if hostUsr {
		b.makeUsr()
	}
	user := inst.Config.Isolation.Process.User
	if _, err := strconv.Atoi(user); err != nil {
		if _, ok := accounts.Find(lower, user); !ok {
			return errdefs.Unprocessablef("isolation.process.user: no user %q in the jail's /etc/passwd (use a name it has or a numeric uid)", user)
		}
	}
	if err := b.opts.Pool.CreateDisk(inst.ID, inst.Config.Isolation.Resources.DiskBytes, p.disk); err != nil {
		return fmt.Errorf("jail disk: %w", err)
	}
	if err := seedWorkspace(inst.Config, lower, filepath.Join(p.disk, "upper")); err != nil {
		return err
	}
	// The machine owns the disk from now on.
	if err := storage.UnmountDisk(p.disk); err != nil {
		return fmt.Errorf("jail disk: %w", err)
	}
	if err := os.MkdirAll(p.run, 0o700); err != nil {
		return err
	}
	if err := netns.Create(p.netns); err != nil {
		return fmt.Errorf("network namespace: %w", err)
	}
	return nil
}

// seedWorkspace creates the workspace (owned by the jail's user) in the
// upper layer when the lower tree lacks it.
func seedWorkspace(cfg *config.Config, lower, upper string) error {
	ws := cfg.Isolation.Filesystem.WorkspaceRoot
	if _, err := os.Lstat(filepath.Join(lower, ws)); err == nil {
		return nil
	}
	uid, gid := 1000, 1000
	if n, err := strconv.Atoi(cfg.Isolation.Process.User); err == nil {
		uid, gid = n, n
	} else if u, ok := accounts.Find(lower, cfg.Isolation.Process.User); ok {
		uid, gid = u.Uid, u.Gid
	}
	cur := upper
	for _, part := range strings.Split(strings.TrimPrefix(ws, "/"), "/") {
		cur = filepath.Join(cur, part)
		if err := os.Mkdir(cur, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("workspace %s: %w", ws, err)
		}
	}
	if err := os.Chown(cur, uid, gid); err != nil {
		return fmt.Errorf("workspace %s: %w", ws, err)
	}
	return nil
}

// initConfig is the init's configuration for inst, with the network's
// environment.
func initConfig(inst backend.Instance, netEnv map[string]string) initproto.InitConfig {
	cfg := inst.Config
	env := []string{"PATH=" + defaultPath, "LANG=C.UTF-8"}
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
	shims := 0
	if cfg.Isolation.Resources.PidsLimit >= 96 {
		shims = 2
	}
	return initproto.InitConfig{
		JailID:       inst.ID,
		DefaultUser:  cfg.Isolation.Process.User,
		DefaultGroup: cfg.Isolation.Process.Group,
		Workspace:    cfg.Isolation.Filesystem.WorkspaceRoot,
		Env:          env,
		BlockedPaths: cfg.Isolation.Filesystem.BlockedPaths,
		IdleShims:    shims,
		// The guest's OOM killer picks a command, not init.
		CommandOOMScoreAdj: initproto.CommandOOMScoreAdj,
	}
}

// machine is the QEMU machine of inst: its sizing and disks.
func (b *Backend) machine(ctx context.Context, inst backend.Instance) (machineSpec, error) {
	lower, hostUsr, err := b.lower(inst)
	if err != nil {
		return machineSpec{}, err
	}
	r := inst.Config.Isolation.Resources
	cpus := 1
	if r.CPUQuota > 0 && r.CPUPeriod > 0 {
		cpus = int((uint64(r.CPUQuota) + r.CPUPeriod - 1) / r.CPUPeriod)
	}
	cpus = min(max(cpus, 1), maxCPUs)
	s := machineSpec{
		dir:    b.paths(inst).run,
		accel:  b.accel,
		kernel: filepath.Join(b.opts.KernelDir, "vmlinux"),
		tscKHz: b.tscKHz,
		cpus:   cpus,
		memMiB: int(r.MemoryBytes>>20) + overheadMiB,
		upper:  b.opts.Pool.DiskPath(inst.ID),
	}
	if s.initrd, err = b.images.initramfs(b.opts.InitBinary, b.opts.KernelDir); err != nil {
		return machineSpec{}, err
	}
	if s.lower, err = b.images.erofs(ctx, "lower", lower); err != nil {
		return machineSpec{}, err
	}
	if hostUsr {
		b.makeUsr()
		select {
		case <-b.usrDone:
		case <-ctx.Done():
			return machineSpec{}, fmt.Errorf("waiting for the image of the host's /usr: %w", ctx.Err())
		}
		if b.usrErr != nil {
			return machineSpec{}, b.usrErr
		}
		s.usr = b.usr
	}
	return s, nil
}

// Start implements backend.Backend: it attaches the jail to the network,
// boots its machine and hands the guest the jail's configuration.
func (b *Backend) Start(ctx context.Context, inst backend.Instance) (backend.Status, error) {
	p := b.paths(inst)
	t0 := time.Now()
	spec, err := b.machine(ctx, inst)
	if err != nil {
		return backend.Status{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, bootTimeout)
	defer cancel()
	if !netns.Exists(p.netns) {
		if err := netns.Create(p.netns); err != nil {
			return backend.Status{}, fmt.Errorf("network namespace: %w", err)
		}
	}
	if err := os.MkdirAll(p.run, 0o700); err != nil {
		return backend.Status{}, err
	}
	att, err := b.net.Attach(ctx, inst, p.netns)
	if err != nil {
		return backend.Status{}, err
	}
	ok := false
	defer func() {
		if !ok {
			b.net.DetachLogged(context.WithoutCancel(ctx), inst.ID)
		}
	}()
	boot := vmproto.Boot{
		Init:      initConfig(inst, att.Env),
		Hostname:  inst.Hostname,
		Usr:       spec.usr != "",
		PidsLimit: inst.Config.Isolation.Resources.PidsLimit,
		Limits: vmproto.Limits{
			MemoryBytes: inst.Config.Isolation.Resources.MemoryBytes,
			CPUQuota:    inst.Config.Isolation.Resources.CPUQuota,
			CPUPeriod:   inst.Config.Isolation.Resources.CPUPeriod,
			Nofile:      inst.Config.Isolation.Resources.NofileLimit,
		},
		Resume: vmproto.Resume{
			UnixNano: time.Now().UnixNano(), ResolvConf: att.ResolvConf, CAPEM: att.CAPEM, CAPath: att.CAPath,
		},
	}
	tNet := time.Now()
	pid, err := b.launch(ctx, inst, spec, att, &boot.Resume)
	if err != nil {
		return backend.Status{}, err
	}
	tLaunch := time.Now()
	st := backend.Status{Running: true, Pid: pid}
	defer func() {
		if !ok {
			b.kill(context.WithoutCancel(ctx), inst)
		}
	}()
	if inst.OnCreated != nil {
		if err := inst.OnCreated(st); err != nil {
			return backend.Status{}, err
		}
	}
	sess := b.session(inst)
	var rep vmproto.Reply
	if err := sess.request(ctx, vmproto.KindBoot, &boot, &rep); err != nil {
		return backend.Status{}, fmt.Errorf("boot the jail's machine: %w%s", err, consoleTail(p.run))
	}
	sess.markReady()
	ok = true
	b.opts.Log.Debug("started jail", "jail", inst.ID, "images_and_network", tNet.Sub(t0),
		"launch", tLaunch.Sub(tNet), "boot", time.Since(tLaunch), "accel", b.accel)
	return st, nil
}

// launch starts the machine spec of inst, on the network of att (a tap
// spliced to the jail's link, whose settings go into r), in the jail's
// host cgroup, and returns QEMU's pid. On error no machine runs.
func (b *Backend) launch(ctx context.Context, inst backend.Instance, spec machineSpec, att netpolicy.Attachment, r *vmproto.Resume) (int, error) {
	if att.IP.IsValid() {
		tap, mac, mtu, err := tapIn(b.paths(inst).netns)
		if err != nil {
			return 0, fmt.Errorf("network: %w", err)
		}
		// QEMU has its own descriptor: the tap goes with the machine.
		defer tap.Close()
		spec.tap, spec.mac = tap, mac
		r.Net = &vmproto.Net{MAC: mac, Addr: netipPrefix32(att.IP), Gateway: att.Gateway, MTU: mtu}
	}
	pid, err := launch(ctx, b.opts.QEMU, spec)
	if err != nil {
		return 0, err
	}
	if err := confine(inst.ID, inst.Config.Isolation.Resources, spec.memMiB, pid); err != nil {
		return 0, errors.Join(err, b.kill(context.WithoutCancel(ctx), inst))
	}
	return pid, nil
}

// consoleTail is the end of a machine's console, for errors.
func consoleTail(run string) string {
	b, err := os.ReadFile(filepath.Join(run, consoleLog))
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	return "; the machine's console ends: " + strings.TrimSpace(string(b))
}

// session returns the control session of inst's machine.
func (b *Backend) session(inst backend.Instance) *session {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.sessions[inst.ID]
	if !ok {
		s = newSession(b.paths(inst).run)
		b.sessions[inst.ID] = s
	}
	return s
}

// dropSession ends and forgets the control session of inst.
func (b *Backend) dropSession(inst backend.Instance) {
	b.mu.Lock()
	s := b.sessions[inst.ID]
	delete(b.sessions, inst.ID)
	b.mu.Unlock()
	if s != nil {
		s.close()
	}
}

// kill ends inst's machine (SIGKILL to QEMU) and waits for it.
func (b *Backend) kill(ctx context.Context, inst backend.Instance) error {
	b.dropSession(inst)
	run := b.paths(inst).run
	pid, err := readPid(run)
	if err != nil || pid == 0 {
		return err
	}
	if err := unix.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill the machine (pid %d): %w", pid, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := procwait.WaitPid(wctx, pid); err != nil {
		return fmt.Errorf("the machine (pid %d) did not exit after SIGKILL: %w", pid, err)
	}
	os.Remove(filepath.Join(run, pidFile))
	return nil
}

// Stop implements backend.Backend: init is asked to end (SIGTERM, as for
// containers); the guest powers off when it has.
func (b *Backend) Stop(ctx context.Context, inst backend.Instance, grace time.Duration) error {
	run := b.paths(inst).run
	pid, err := readPid(run)
	if err != nil {
		return err
	}
	if pid > 0 {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var rep vmproto.Reply
		err := b.session(inst).request(sctx, vmproto.KindShutdown, struct{}{}, &rep)
		cancel()
		if err == nil {
			wctx, cancel := context.WithTimeout(ctx, grace+5*time.Second)
			_ = procwait.WaitPid(wctx, pid)
			cancel()
		}
	}
	err = b.kill(ctx, inst)
	b.net.DetachLogged(ctx, inst.ID)
	return err
}

// Destroy implements backend.Backend.
func (b *Backend) Destroy(ctx context.Context, inst backend.Instance) error {
	p := b.paths(inst)
	errs := []error{b.kill(ctx, inst)}
	errs = append(errs, hostjail.Release(ctx, b.net, b.opts.Pool, inst.ID, nil, p.disk, p.netns)...)
	if err := os.RemoveAll(p.run); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Status implements backend.Backend.
func (b *Backend) Status(ctx context.Context, inst backend.Instance) (backend.Status, error) {
	pid, err := readPid(b.paths(inst).run)
	if err != nil || pid == 0 {
		return backend.Status{}, err
	}
	return backend.Status{Running: true, Pid: pid}, nil
}

// Reattach implements backend.Backend.
func (b *Backend) Reattach(ctx context.Context, inst backend.Instance) error {
	p := b.paths(inst)
	b.session(inst).markReady()
	att, err := b.net.Attach(ctx, inst, p.netns)
	if err != nil || !att.IP.IsValid() {
		return err
	}
	// The jail's link was made again (another MAC, perhaps another
	// address): splice the running machine's tap to it and tell the guest.
	var n vmproto.Net
	err = netns.Do(p.netns, func() error {
		eth, err := netlinkByName(jailLink)
		if err != nil {
			return err
		}
		t, err := netlinkByName(tapLink)
		if err != nil {
			return err
		}
		if err := redirect(eth, t); err != nil {
			return err
		}
		n = vmproto.Net{MAC: eth.Attrs().HardwareAddr.String(), Addr: netipPrefix32(att.IP), Gateway: att.Gateway, MTU: eth.Attrs().MTU}
		return redirect(t, eth)
	})
	if err != nil {
		return err
	}
	r := vmproto.Resume{ResolvConf: att.ResolvConf, CAPEM: att.CAPEM, CAPath: att.CAPath, Net: &n}
	var rep vmproto.Reply
	if err := b.session(inst).request(ctx, vmproto.KindResume, &r, &rep); err != nil {
		return fmt.Errorf("jail %s: the guest's network: %w", inst.Name, err)
	}
	return nil
}

// UpdateNetwork implements backend.Backend.
func (b *Backend) UpdateNetwork(ctx context.Context, inst backend.Instance) error {
	return b.net.Update(ctx, inst)
}

// Rename implements backend.Backend.
func (b *Backend) Rename(ctx context.Context, inst backend.Instance, st backend.Status) error {
	var rep vmproto.Reply
	if err := b.session(inst).request(ctx, vmproto.KindHostname, vmproto.Hostname{Name: inst.Hostname}, &rep); err != nil {
		return fmt.Errorf("jail %s: set host name: %w", inst.Name, err)
	}
	return b.net.Rename(ctx, inst)
}

// Stats implements backend.Backend: the guest reports its usage; the
// CPU time is the machine's, as the host accounts it.
func (b *Backend) Stats(ctx context.Context, inst backend.Instance) (backend.Stats, error) {
	var s vmproto.Stats
	if err := b.session(inst).request(ctx, vmproto.KindStats, nil, &s); err != nil {
		return backend.Stats{}, fmt.Errorf("jail %s: %w", inst.Name, err)
	}
	st := backend.Stats{
		MemoryBytes: s.MemoryBytes, MemoryLimitBytes: uint64(inst.Config.Isolation.Resources.MemoryBytes),
		Pids: s.Pids, PidsLimit: s.PidsLimit, OOMKills: s.OOMKills,
		DiskUsedBytes: s.DiskUsedBytes, DiskLimitBytes: s.DiskTotalBytes,
	}
	if cs, err := cgroups.Read(string(hostjail.CgroupOf(inst.ID))); err == nil {
		st.CPUTimeNs = cs.CPUTimeNs
	}
	return st, nil
}

// OOMKills implements backend.OOMReporter: the guest kernel counts the
// jail's processes it killed for exceeding the jail's memory.
func (b *Backend) OOMKills(inst backend.Instance) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var s vmproto.Stats
	if err := b.session(inst).request(ctx, vmproto.KindStats, nil, &s); err != nil {
		return 0, fmt.Errorf("jail %s: %w", inst.Name, err)
	}
	return s.OOMKills, nil
}

// InitDialer implements backend.Backend: each connection is a stream of
// the machine's control session.
func (b *Backend) InitDialer(inst backend.Instance) initclient.Dialer {
	return func(ctx context.Context) (net.Conn, error) {
		return b.session(inst).stream(ctx, vmproto.KindInit)
	}
}
