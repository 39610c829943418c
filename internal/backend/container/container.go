// Package container is the container isolation level: each jail is an OCI
// bundle run by runc, on an overlay root whose writable layer is a disk of
// exactly the jail's disk_bytes, in a network namespace made by the daemon,
// with the agentjail binary as PID 1.
package container

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/accounts"
	"github.com/agentjail/agentjail/internal/atomicfile"
	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/backend/hostjail"
	"github.com/agentjail/agentjail/internal/backend/oci"
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

// UIDMapBase is the host uid (and gid) that uid 0 of a jail with a user
// namespace maps to; the jail gets 65536 ids from there.
const UIDMapBase = 1000000

// startTimeout bounds how long init may take to become ready.
const startTimeout = 30 * time.Second

// DefaultPath is the PATH of every jail process.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Options configures the backend.
type Options struct {
	// Host is what the daemon shares with its backends.
	backend.Host
	// RuntimeBinary is the OCI runtime ("runc").
	RuntimeBinary string
	// CRIU is the CRIU binary for process checkpoints; empty: the first of
	// /usr/local/sbin/criu and criu on PATH that works.
	CRIU string
	// RuntimeArgs are global flags given to the runtime binary before
	// every command (runsc's platform, file and network options).
	RuntimeArgs []string
	// StateDir names the runtime's state directory under DATA_DIR/run
	// (default "runc").
	StateDir string
	// AdjustSpec, when set, changes each jail's runtime spec before it is
	// written (what a level's runtime needs differently).
	AdjustSpec func(*specs.Spec)
	// KeepCommandOOMScore leaves commands the oom_score_adj they inherit
	// from init (gVisor: the sandbox is one process to the host's OOM
	// killer, and its /proc is read-only); else each gets
	// initproto.CommandOOMScoreAdj.
	KeepCommandOOMScore bool
	// NoCheckpoint leaves process checkpoints out (a level that takes
	// them its own way), without probing for CRIU.
	NoCheckpoint bool
	// OrdinarySlack starts the runtime's containers with the ordinary
	// timer slack, not the daemon's coarse one: for a runtime whose
	// container runs the jail's code itself (gVisor's sandbox) rather than
	// agentjail's init.
	OrdinarySlack bool
	// ShareRestoredMemory lets jails restored from one process checkpoint
	// (restores, branches) share their memory copy-on-write through the
	// kernel's same-page merging (ksm.go); the first restore starts ksmd.
	ShareRestoredMemory bool
}

// Factory returns the factory of the container level: runc (or
// runtimeBinary), with process checkpoints through criu (empty: found as
// Options.CRIU says), whose restored jails share memory when shareMemory
// is set (Options.ShareRestoredMemory).
func Factory(runtimeBinary, criu string, shareMemory bool) backend.Factory {
	return backend.Factory{Level: config.LevelContainer, New: func(h backend.Host) (backend.Backend, error) {
		return New(Options{Host: h, RuntimeBinary: runtimeBinary, CRIU: criu, ShareRestoredMemory: shareMemory})
	}}
}

// Backend is the container level.
type Backend struct {
	opts    Options
	runtime *oci.Runtime
	caps    backend.Capabilities
	swap    bool
	// criu is the CRIU binary process checkpoints use ("" without one).
	criu string
	// net attaches jails to the daemon's policed network.
	net *hostjail.Network
	// ksmOnce starts ksmd at the first restore; ksmErr says why restored
	// memory is not shared.
	ksmOnce sync.Once
	ksmErr  error
}

var (
	_ backend.Backend       = (*Backend)(nil)
	_ backend.Checkpointer  = (*Backend)(nil)
	_ backend.Observable    = (*Backend)(nil)
	_ backend.OOMReporter   = (*Backend)(nil)
	_ backend.Layered       = (*Backend)(nil)
	_ backend.InitKeepAlive = (*Backend)(nil)
)

// New returns the container backend. It fails with errdefs.ErrUnavailable
// when the runtime binary cannot be run.
func New(opts Options) (*Backend, error) {
	out, err := exec.Command(opts.RuntimeBinary, "--version").Output()
	if err != nil {
		return nil, errdefs.Wrap(errdefs.ErrUnavailable, err, "OCI runtime %q", opts.RuntimeBinary)
	}
	version := strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	if opts.StateDir == "" {
		opts.StateDir = "runc"
	}
	b := &Backend{
		opts:    opts,
		runtime: oci.NewRuntime(opts.RuntimeBinary, filepath.Join(opts.DataDir, "run", opts.StateDir), opts.RuntimeArgs...),
		swap:    cgroups.SwapAccounting(),
		net:     &hostjail.Network{Net: opts.Net, Log: opts.Log},
	}
	if opts.OrdinarySlack {
		b.runtime.UseOrdinarySlack()
	}
	b.caps = backend.Capabilities{
		Level:          config.LevelContainer,
		Runtime:        version,
		NetworkModes:   []string{config.NetIsolated, config.NetNone, config.NetBridge},
		RootfsKinds:    []string{model.RootfsKindHost, model.RootfsKindDir, model.RootfsKindImage},
		Limits:         []string{model.LimitMemory, model.LimitPids, model.LimitCPU, model.LimitDisk},
		PTY:            true,
		Users:          true,
		UserNamespaces: true,
		Observers:      []string{model.ObserverKernel},
		FSSnapshot:     true,
		Guarantees: "an OCI container run by runc: its own pid, mount, network, UTS, IPC and cgroup namespaces, " +
			"an overlay root on a disk of its own, cgroup limits, a seccomp filter and a minimal capability set; " +
			"it shares the host's kernel",
	}
	// Process checkpoints (checkpoint.go) need a working CRIU.
	if !opts.NoCheckpoint {
		b.criu, b.caps.CheckpointReason = probeCheckpoint(opts.CRIU)
		b.caps.Checkpoint = b.criu != ""
	}
	if opts.AllowHostNetwork {
		b.caps.NetworkModes = append(b.caps.NetworkModes, config.NetHost)
	}
	return b, nil
}

// Capabilities implements backend.Backend.
func (b *Backend) Capabilities() backend.Capabilities { return b.caps }

// paths of one jail.
type paths struct {
	dir, disk, upper, work, merged, control, netns string
}

func (b *Backend) paths(inst backend.Instance) paths {
	disk := filepath.Join(inst.Dir, "rootfs")
	return paths{
		dir:     inst.Dir,
		disk:    disk,
		upper:   filepath.Join(disk, "upper"),
		work:    filepath.Join(disk, "work"),
		merged:  filepath.Join(disk, "merged"),
		control: filepath.Join(inst.Dir, "run"),
		netns:   filepath.Join(b.opts.DataDir, "run", "netns", inst.ID),
	}
}

// lower returns the tree the jail's root is made from, as one directory
// (an image's layers merged read-only): users, homes and the workspace
// are looked up there, and diffs compare against it.
func (b *Backend) lower(inst backend.Instance) (string, error) {
	fs := inst.Config.Isolation.Filesystem
	if fs.Rootfs == config.RootfsHost {
		return b.opts.HostLower, nil
	}
	if id, err := b.imageID(inst); id != "" || err != nil {
		if err != nil {
			return "", err
		}
		return b.opts.Images.View(id)
	}
	dir := strings.TrimPrefix(fs.Rootfs, config.RootfsDirPrefix)
	if err := rootfs.CheckDir(dir, b.opts.DataDir); err != nil {
		return "", err
	}
	return dir, nil
}

// imageID returns the pinned image id of an image jail ("" for other
// providers).
func (b *Backend) imageID(inst backend.Instance) (string, error) {
	rootfs := inst.Config.Isolation.Filesystem.Rootfs
	if !strings.HasPrefix(rootfs, config.RootfsImagePrefix) {
		return "", nil
	}
	if b.opts.Images == nil {
		return "", errdefs.Unprocessablef("isolation.filesystem.rootfs: %q: this daemon has no image store", rootfs)
	}
	id := image.PinnedID(rootfs)
	if id == "" {
		return "", errdefs.Unprocessablef("isolation.filesystem.rootfs: %q: the image is not pinned by id", rootfs)
	}
	return id, nil
}

// lowers returns the overlay lowers of the jail's root, top first.
func (b *Backend) lowers(inst backend.Instance) ([]string, error) {
	id, err := b.imageID(inst)
	if err != nil {
		return nil, err
	}
	if id != "" {
		return b.opts.Images.RootLayers(id)
	}
	lower, err := b.lower(inst)
	if err != nil {
		return nil, err
	}
	return []string{lower}, nil
}

func userns(c *config.Config) bool {
	ns := c.Isolation.Process.Namespaces
	return ns != nil && ns.User != nil && *ns.User
}

// Configure implements backend.Backend.
func (b *Backend) Configure(inst backend.Instance) error {
	if o := inst.Config.Isolation.Filesystem.UseOverlay; o != nil && !*o {
		return errdefs.Unprocessablef("isolation.filesystem.use_overlay: the container level always uses an overlay root; false is not supported")
	}
	return nil
}

// Prepare implements backend.Backend.
func (b *Backend) Prepare(ctx context.Context, inst backend.Instance) (err error) {
	p := b.paths(inst)
	defer func() {
		if err != nil {
			if derr := b.Destroy(context.WithoutCancel(ctx), inst); derr != nil {
				b.opts.Log.Error("releasing a half-prepared jail", "jail", inst.ID, "err", derr)
			}
		}
	}()
	lower, err := b.lower(inst)
	if err != nil {
		return err
	}
	if err := checkHostInputs(inst.Config, lower); err != nil {
		return err
	}
	t0 := time.Now()
	// The network namespace is made while the root is.
	nsErr := make(chan error, 1)
	go func() { nsErr <- netns.Create(p.netns) }()
	err = b.prepareRoot(inst, lower, p)
	if nerr := <-nsErr; nerr != nil && err == nil {
		err = fmt.Errorf("network namespace: %w", nerr)
	}
	if err != nil {
		return err
	}
	b.opts.Log.Debug("prepared jail", "jail", inst.ID, "total", time.Since(t0))
	return b.writeBundle(inst, p, hostNetwork(inst.Config))
}

// prepareRoot makes the jail's disk and root: the overlay of its lower
// tree and its writable layer, mounted, with init's control directory.
func (b *Backend) prepareRoot(inst backend.Instance, lower string, p paths) error {
	if err := b.opts.Pool.CreateDisk(inst.ID, inst.Config.Isolation.Resources.DiskBytes, p.disk); err != nil {
		return fmt.Errorf("jail disk: %w", err)
	}
	if err := b.seedUpper(inst, lower, p); err != nil {
		return err
	}
	lowers, err := b.lowers(inst)
	if err != nil {
		return err
	}
	if err := storage.MountOverlay(lowers, p.upper, p.work, p.merged); err != nil {
		return fmt.Errorf("jail root: %w", err)
	}
	// What Start writes again (with the bundle): it finds them as they
	// are when nothing changed meanwhile.
	return b.writeControl(inst, p, b.net.Env(inst))
}

// hostNetwork reports whether the jail shares the host's network
// namespace (mode host, which the network attachment refuses unless the
// daemon allows it).
func hostNetwork(c *config.Config) bool { return c.Isolation.Network.Mode == config.NetHost }

// seedUpper creates the workspace (owned by the jail's user) in the upper
// layer when the lower tree lacks it, and hands the upper to the mapped
// root when the jail has a user namespace.
func (b *Backend) seedUpper(inst backend.Instance, lower string, p paths) error {
	cfg := inst.Config
	uid, gid, _ := lookupUser(lower, cfg.Isolation.Process.User)
	shift := 0
	if userns(cfg) {
		shift = UIDMapBase
		for _, d := range []string{p.upper, p.work} {
			if err := os.Chown(d, shift, shift); err != nil {
				return fmt.Errorf("jail upper: %w", err)
			}
		}
	}
	if shift != 0 {
		// Root's and the user's homes belong to the mapped ids, so the
		// jail's root and user can write them (the lower tree's are owned
		// by the host's root, which the jail sees as nobody).
		homes := []struct {
			dir      string
			uid, gid int
			mode     os.FileMode
		}{{"root", shift, shift, 0o700}, {"home", shift, shift, 0o755}}
		if home := homeOf(lower, cfg.Isolation.Process.User); home != "" && home != "/root" {
			homes = append(homes, struct {
				dir      string
				uid, gid int
				mode     os.FileMode
			}{strings.TrimPrefix(home, "/"), shift + uid, shift + gid, 0o750})
		}
		for _, h := range homes {
			d := filepath.Join(p.upper, h.dir)
			if err := os.MkdirAll(d, h.mode); err != nil {
				return fmt.Errorf("jail home %s: %w", h.dir, err)
			}
			if err := os.Chmod(d, h.mode); err != nil {
				return fmt.Errorf("jail home %s: %w", h.dir, err)
			}
			if err := os.Chown(d, h.uid, h.gid); err != nil {
				return fmt.Errorf("jail home %s: %w", h.dir, err)
			}
		}
	}
	ws := cfg.Isolation.Filesystem.WorkspaceRoot
	if _, err := os.Lstat(filepath.Join(lower, ws)); err == nil && shift == 0 {
		return nil
	}
	rel := strings.TrimPrefix(ws, "/")
	cur := p.upper
	for _, part := range strings.Split(rel, "/") {
		cur = filepath.Join(cur, part)
		if err := os.Mkdir(cur, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("workspace %s: %w", ws, err)
		}
		if err := os.Chown(cur, shift, shift); err != nil {
			return fmt.Errorf("workspace %s: %w", ws, err)
		}
	}
	return os.Chown(cur, shift+uid, shift+gid)
}

// checkHostInputs verifies what the config names on the host and in the
// lower tree before anything is made: mount sources exist, the jail's user
// exists in the tree's /etc/passwd.
func checkHostInputs(cfg *config.Config, lower string) error {
	fs := cfg.Isolation.Filesystem
	for field, mounts := range map[string][]config.Mount{"read_only_mounts": fs.ReadOnlyMounts, "read_write_mounts": fs.ReadWriteMounts} {
		for i, m := range mounts {
			if _, err := os.Stat(m.Source); err != nil {
				return errdefs.Unprocessablef("isolation.filesystem.%s[%d].source: %v", field, i, err)
			}
		}
	}
	user := cfg.Isolation.Process.User
	if _, err := strconv.Atoi(user); err != nil {
		if _, _, ok := lookupUser(lower, user); !ok {
			return errdefs.Unprocessablef("isolation.process.user: no user %q in the jail's /etc/passwd (use a name it has or a numeric uid)", user)
		}
	}
	return nil
}

// homeOf returns the home directory of user (a name or a uid) in
// lower/etc/passwd ("" when it has no entry).
func homeOf(lower, user string) string {
	if u, ok := accounts.Find(lower, user); ok {
		return u.Home
	}
	return ""
}

// lookupUser resolves a user name or uid against lower/etc/passwd; an
// unknown name resolves to uid/gid 1000 with ok false.
func lookupUser(lower, user string) (uid, gid int, ok bool) {
	if n, err := strconv.Atoi(user); err == nil {
		return n, n, true
	}
	if u, ok := accounts.Find(lower, user); ok {
		return u.Uid, u.Gid, true
	}
	return 1000, 1000, false
}

// idleShims sizes init's pool of ready shims: each holds a few tasks of the
// jail's pids limit, so small limits get none.
func idleShims(pidsLimit int64) int {
	if pidsLimit >= 96 {
		return 2
	}
	return 0
}

// controlBytes bounds a jail's control directory: init's socket, config
// and log, and the recordings of the terminal sessions in progress (at most
// 64 MiB, an eighth of the jail's memory, at least 4 MiB).
func controlBytes(memoryBytes int64) int64 {
	return max(4<<20, min(64<<20, memoryBytes/8))
}

// mountControl makes the jail's control directory a tmpfs of controlBytes.
// The directory is bound into the jail read-write for its init, and the
// jail's root can write there too: on the host's disk it would be a way
// around the jail's disk limit onto the data dir's filesystem. A tmpfs is
// bounded, and its pages are charged to the memory of whoever writes them
// (the jail, for everything but the config the daemon writes).
//
// A jail started again keeps its tmpfs and its init's log (its last
// maxKeptLog bytes); everything else there is from the last run (the
// jail's manager has taken the recordings out before the start) and is
// removed, so that what the jail's root left cannot take the room the
// next run needs.
func mountControl(inst backend.Instance, p paths) error {
	if err := os.MkdirAll(p.control, 0o700); err != nil {
		return fmt.Errorf("control dir: %w", err)
	}
	mounted, err := storage.IsMounted(p.control)
	if err != nil {
		return err
	}
	if mounted {
		return clearControl(p.control, false)
	}
	owner := 0
	if userns(inst.Config) {
		owner = UIDMapBase
	}
	opts := fmt.Sprintf("size=%d,mode=0700,uid=%d,gid=%d", controlBytes(inst.Config.Isolation.Resources.MemoryBytes), owner, owner)
	if err := unix.Mount("agentjail-control", p.control, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return fmt.Errorf("control dir: mount tmpfs: %w", err)
	}
	return nil
}

// maxKeptLog is how much of init's log a jail started again keeps.
const maxKeptLog = 256 << 10

// clearControl removes what a control directory holds but init's log (cut
// to its last maxKeptLog bytes) and, with recordings, the recordings there
// (regular files named *.cast or *.cast.part) that the jail's manager is
// still to store.
func clearControl(dir string, recordings bool) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("control dir: %w", err)
	}
	for _, e := range ents {
		if e.Name() == initproto.LogName && e.Type().IsRegular() {
			continue
		}
		if recordings && e.Name() == initproto.RecordingsName && e.IsDir() {
			if err := clearRecordings(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("control dir: %w", err)
		}
	}
	log := filepath.Join(dir, initproto.LogName)
	fi, err := os.Lstat(log)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && fi.Size() <= maxKeptLog) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("control dir: %w", err)
	}
	f, err := os.OpenFile(log, os.O_RDWR|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("control dir: %w", err)
	}
	defer f.Close()
	tail := make([]byte, maxKeptLog)
	if _, err := f.ReadAt(tail, fi.Size()-maxKeptLog); err != nil {
		return fmt.Errorf("control dir: %w", err)
	}
	if err := f.Truncate(0); err != nil {
		return fmt.Errorf("control dir: %w", err)
	}
	if _, err := f.WriteAt(tail, 0); err != nil {
		return fmt.Errorf("control dir: %w", err)
	}
	return nil
}

// clearRecordings removes what a recordings directory holds but
// recordings.
func clearRecordings(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("control dir: %w", err)
	}
	for _, e := range ents {
		if e.Type().IsRegular() && (strings.HasSuffix(e.Name(), ".cast") || strings.HasSuffix(e.Name(), ".cast.part")) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("control dir: %w", err)
		}
	}
	return nil
}

func (b *Backend) writeControl(inst backend.Instance, p paths, netEnv map[string]string) error {
	if err := mountControl(inst, p); err != nil {
		return err
	}
	cfg := inst.Config
	// Init adds HOSTNAME itself, from the UTS namespace.
	env := []string{"PATH=" + DefaultPath, "LANG=C.UTF-8"}
	keys := make([]string, 0, len(cfg.Env))
	for k := range cfg.Env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		env = append(env, k+"="+cfg.Env[k])
	}
	netKeys := make([]string, 0, len(netEnv))
	for k := range netEnv {
		netKeys = append(netKeys, k)
	}
	slices.Sort(netKeys)
	for _, k := range netKeys {
		env = append(env, k+"="+netEnv[k])
	}
	ic := initproto.InitConfig{
		JailID:       inst.ID,
		DefaultUser:  cfg.Isolation.Process.User,
		DefaultGroup: cfg.Isolation.Process.Group,
		Workspace:    cfg.Isolation.Filesystem.WorkspaceRoot,
		Env:          env,
		BlockedPaths: cfg.Isolation.Filesystem.BlockedPaths,
		IdleShims:    idleShims(cfg.Isolation.Resources.PidsLimit),
	}
	if !b.opts.KeepCommandOOMScore {
		ic.CommandOOMScoreAdj = initproto.CommandOOMScoreAdj
	}
	data, err := json.MarshalIndent(ic, "", "  ")
	if err != nil {
		return err
	}
	// Written before each start, from the jail's record: not synced.
	path := filepath.Join(p.control, initproto.ConfigName)
	if err := atomicfile.Refresh(path, data, 0o600); err != nil {
		return err
	}
	if userns(inst.Config) {
		// The jail's root is an unprivileged host uid: hand it its config.
		return os.Chown(path, UIDMapBase, UIDMapBase)
	}
	return nil
}

func (b *Backend) writeBundle(inst backend.Instance, p paths, hostNet bool) error {
	var mounts []oci.Mount
	if inst.Config.Isolation.Filesystem.Rootfs == config.RootfsHost {
		for _, m := range rootfs.HostMounts() {
			mounts = append(mounts, oci.Mount{Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly})
		}
	}
	opts := oci.SpecOptions{
		ID:             inst.ID,
		Config:         inst.Config,
		Rootfs:         p.merged,
		NetnsPath:      p.netns,
		HostNetwork:    hostNet,
		CgroupsPath:    string(hostjail.CgroupOf(inst.ID)),
		InitBinary:     b.opts.InitBinary,
		ControlDir:     p.control,
		Mounts:         mounts,
		Hostname:       inst.Hostname,
		SwapAccounting: b.swap,
	}
	if userns(inst.Config) {
		opts.UIDMapBase = UIDMapBase
	}
	spec, err := oci.Spec(opts)
	if err != nil {
		return err
	}
	if b.opts.AdjustSpec != nil {
		b.opts.AdjustSpec(spec)
	}
	return oci.WriteBundle(p.dir, spec)
}

// ensure re-establishes the mounts Prepare made when they are missing
// (after a host reboot or a crash), so that Start works from any stopped
// state; prepare does the same for the network namespace.
func (b *Backend) ensure(ctx context.Context, inst backend.Instance, p paths) error {
	lowers, err := b.lowers(inst)
	if err != nil {
		return err
	}
	if err := b.opts.Pool.MountDisk(inst.ID, p.disk); err != nil {
		return fmt.Errorf("jail disk: %w", err)
	}
	mounted, err := storage.IsMounted(p.merged)
	if err != nil {
		return err
	}
	if !mounted {
		if err := storage.MountOverlay(lowers, p.upper, p.work, p.merged); err != nil {
			return fmt.Errorf("jail root: %w", err)
		}
	}
	_ = os.Remove(filepath.Join(p.control, initproto.SocketName))
	return nil
}

// prepare makes the jail's network namespace, then mounts its disk and
// root (ensure) while it attaches the namespace to the network: the two
// are independent until the network's files go into the root. On error
// the network is detached; mounts are left to the caller's cleanup, as
// after a failed ensure.
func (b *Backend) prepare(ctx context.Context, inst backend.Instance, p paths) (netpolicy.Attachment, error) {
	a, err := b.startAttach(ctx, inst, p)
	if err != nil {
		return netpolicy.Attachment{}, err
	}
	err = b.ensure(ctx, inst, p)
	return a.finish(ctx, err)
}

// attaching is a network attachment under way (startAttach): once the
// namespace is attached and the jail's root mounted (rootMounted), the
// network's files are written into the root.
type attaching struct {
	b    *Backend
	inst backend.Instance
	p    paths

	mounted, abort         chan struct{}
	mountedOnce, abortOnce sync.Once
	done                   chan struct{}
	// Set by the attaching goroutine before done is closed: the
	// attachment, whether the jail is attached (and must be detached if
	// the start fails), and why the attachment or its files failed.
	att      netpolicy.Attachment
	attached bool
	err      error
}

// startAttach makes the jail's network namespace when it is missing and
// starts attaching it to the network; the caller must call finish.
func (b *Backend) startAttach(ctx context.Context, inst backend.Instance, p paths) (*attaching, error) {
	if !netns.Exists(p.netns) {
		if err := netns.Create(p.netns); err != nil {
			return nil, fmt.Errorf("network namespace: %w", err)
		}
	}
	a := &attaching{b: b, inst: inst, p: p, mounted: make(chan struct{}), abort: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(a.done)
		if a.att, a.err = b.net.Attach(ctx, inst, p.netns); a.err != nil {
			return
		}
		a.attached = true
		select {
		case <-a.mounted:
			// writeNetFiles detaches the jail when it fails.
			if a.err = b.writeNetFiles(ctx, inst, p, a.att); a.err != nil {
				a.attached = false
			}
		case <-a.abort:
		}
	}()
	return a, nil
}

// rootMounted says that the jail's root is mounted: the network's files
// can go into it.
func (a *attaching) rootMounted() { a.mountedOnce.Do(func() { close(a.mounted) }) }

// finish waits for the attachment and its files (the root must be
// mounted when failed is nil) and returns the attachment. When failed
// (the caller's own error, with which the jail cannot start) is not nil,
// or the attachment or its files failed, the jail is left detached and
// the first error returned.
func (a *attaching) finish(ctx context.Context, failed error) (netpolicy.Attachment, error) {
	if failed != nil {
		a.abortOnce.Do(func() { close(a.abort) })
	} else {
		a.rootMounted()
	}
	<-a.done
	if failed != nil {
		if a.attached {
			a.b.detach(context.WithoutCancel(ctx), a.inst)
		}
		return netpolicy.Attachment{}, failed
	}
	return a.att, a.err
}

// Start implements backend.Backend. The jail's network is attached while
// its container is made (the two are independent until the network's
// files go into the root); init starts once both are done.
func (b *Backend) Start(ctx context.Context, inst backend.Instance) (st backend.Status, err error) {
	p := b.paths(inst)
	t0 := time.Now()
	a, err := b.startAttach(ctx, inst, p)
	if err != nil {
		return backend.Status{}, err
	}
	attached := false
	defer func() {
		if !attached {
			_, _ = a.finish(ctx, err)
		} else if err != nil {
			b.detach(context.WithoutCancel(ctx), inst)
		}
	}()
	if err := b.ensure(ctx, inst, p); err != nil {
		return backend.Status{}, err
	}
	a.rootMounted()
	tPrepare := time.Now()
	if err := b.writeControl(inst, p, b.net.Env(inst)); err != nil {
		return backend.Status{}, err
	}
	if err := b.writeBundle(inst, p, hostNetwork(inst.Config)); err != nil {
		return backend.Status{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	tBundle := time.Now()
	pid, err := b.runtime.Create(ctx, inst.ID, p.dir)
	if errors.Is(err, errdefs.ErrConflict) {
		// A stopped container left behind by a crash holds the id.
		if st, _, serr := b.runtime.State(ctx, inst.ID); serr == nil && st != "running" && st != "paused" {
			if derr := b.runtime.Delete(ctx, inst.ID, true); derr != nil {
				return backend.Status{}, derr
			}
			pid, err = b.runtime.Create(ctx, inst.ID, p.dir)
		}
	}
	if err != nil {
		return backend.Status{}, fmt.Errorf("create container: %w", err)
	}
	tCreate := time.Now()
	// The network is ready before init starts, and its files are in the
	// root before observation starts (they are not the jail's doing).
	attached = true
	_, err = a.finish(ctx, nil)
	tNet := time.Now()
	if err == nil && inst.OnCreated != nil {
		err = inst.OnCreated(backend.Status{Running: true, Pid: pid})
	}
	if err != nil {
		if kerr := b.kill(context.WithoutCancel(ctx), inst.ID, pid); kerr != nil {
			b.opts.Log.Error("removing a container whose start was aborted", "jail", inst.ID, "err", kerr)
		}
		return backend.Status{}, err
	}
	if err := b.runtime.Start(ctx, inst.ID); err != nil {
		return backend.Status{}, fmt.Errorf("start jail init: %w", err)
	}
	b.opts.Log.Debug("started jail", "jail", inst.ID, "disk", tPrepare.Sub(t0), "bundle", tBundle.Sub(tPrepare),
		"runtime_create", tCreate.Sub(tBundle), "network_after_create", tNet.Sub(tCreate), "observe_and_start", time.Since(tNet), "total", time.Since(t0))
	return backend.Status{Running: true, Pid: pid}, nil
}

// attach connects the jail's network namespace to the daemon's policed
// network and installs what the jail needs to use it: resolv.conf and,
// with TLS inspection, the daemon's CA. Mode none gets loopback only.
func (b *Backend) attach(ctx context.Context, inst backend.Instance, p paths) (netpolicy.Attachment, error) {
	att, err := b.net.Attach(ctx, inst, p.netns)
	if err != nil {
		return netpolicy.Attachment{}, err
	}
	return att, b.writeNetFiles(ctx, inst, p, att)
}

// writeNetFiles writes the network's resolv.conf and CA into the jail's
// mounted root; on error it detaches the network.
func (b *Backend) writeNetFiles(ctx context.Context, inst backend.Instance, p paths, att netpolicy.Attachment) error {
	var err error
	if att.ResolvConf != "" {
		err = writeInRoot(p.merged, "/etc/resolv.conf", []byte(att.ResolvConf), 0o644)
	}
	if err == nil && len(att.CAPEM) > 0 {
		err = writeInRoot(p.merged, att.CAPath, att.CAPEM, 0o644)
		if err == nil {
			err = trustCA(p.merged, att.CAPEM)
		}
	}
	if err != nil {
		b.detach(context.WithoutCancel(ctx), inst)
	}
	return err
}

// trustCA adds the daemon's CA to the jail's system trust store
// (netpolicy.JailTrustStore), once: a client with a cleared environment
// then trusts the inspecting proxy too, and the proxy variables that name
// the store keep the rootfs's roots. A root without the store (a minimal
// dir rootfs) gets one holding the CA alone.
func trustCA(root string, caPEM []byte) error {
	bundle, err := readInRoot(root, netpolicy.JailTrustStore, 16<<20)
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("trust store: %w", err)
	}
	if bytes.Contains(bundle, bytes.TrimSpace(caPEM)) {
		return nil
	}
	if len(bundle) > 0 && bundle[len(bundle)-1] != '\n' {
		bundle = append(bundle, '\n')
	}
	if err := writeInRoot(root, netpolicy.JailTrustStore, append(bundle, caPEM...), 0o644); err != nil {
		return fmt.Errorf("trust store: %w", err)
	}
	return nil
}

func (b *Backend) detach(ctx context.Context, inst backend.Instance) {
	b.net.DetachLogged(ctx, inst.ID)
}

// Reattach implements backend.Backend.
func (b *Backend) Reattach(ctx context.Context, inst backend.Instance) error {
	_, err := b.attach(ctx, inst, b.paths(inst))
	return err
}

// UpdateNetwork implements backend.Backend.
func (b *Backend) UpdateNetwork(ctx context.Context, inst backend.Instance) error {
	return b.net.Update(ctx, inst)
}

// Rename implements backend.Backend.
func (b *Backend) Rename(ctx context.Context, inst backend.Instance, st backend.Status) error {
	if err := setHostname(st.Pid, inst.Hostname); err != nil {
		return fmt.Errorf("jail %s: %w", inst.Name, err)
	}
	return b.net.Rename(ctx, inst)
}

// RenameNetwork gives the running jail inst.Name on the jail network:
// Rename without the host name, for a level whose jails' host name the
// host cannot set.
func (b *Backend) RenameNetwork(ctx context.Context, inst backend.Instance) error {
	return b.net.Rename(ctx, inst)
}

// setHostname sets the host name of the UTS namespace of process pid,
// from a thread that enters that namespace and leaves it again.
func setHostname(pid int, name string) error {
	runtime.LockOSThread()
	self, err := unix.Open("/proc/thread-self/ns/uts", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("set host name: %w", err)
	}
	defer unix.Close(self)
	target, err := unix.Open(fmt.Sprintf("/proc/%d/ns/uts", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("set host name: %w", err)
	}
	defer unix.Close(target)
	if err := unix.Setns(target, unix.CLONE_NEWUTS); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("set host name: enter the jail's UTS namespace: %w", err)
	}
	serr := unix.Sethostname([]byte(name))
	if err := unix.Setns(self, unix.CLONE_NEWUTS); err != nil {
		// The thread stays in the jail's namespace: keep it locked so
		// that it ends with this goroutine instead of serving others.
		return fmt.Errorf("set host name: return to the daemon's UTS namespace: %w", err)
	}
	runtime.UnlockOSThread()
	if serr != nil {
		return fmt.Errorf("set host name %q: %w", name, serr)
	}
	return nil
}

// Stop implements backend.Backend.
func (b *Backend) Stop(ctx context.Context, inst backend.Instance, grace time.Duration) error {
	st, pid, err := b.runtime.State(ctx, inst.ID)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if st == "running" && pid > 0 {
		if err := b.runtime.Kill(ctx, inst.ID, syscall.SIGTERM, false); err == nil {
			wctx, cancel := context.WithTimeout(ctx, grace)
			_ = procwait.WaitPid(wctx, pid)
			cancel()
		}
	}
	err = b.kill(ctx, inst.ID, pid)
	b.detach(ctx, inst)
	if err == nil {
		// The run's control dir holds memory (a tmpfs) while the jail is
		// stopped: only init's log and the recordings stay.
		err = clearControl(b.paths(inst).control, true)
	}
	return err
}

// kill SIGKILLs every process of the container, waits for init, and
// deletes the container (its cgroup goes with it).
func (b *Backend) kill(ctx context.Context, id string, pid int) error {
	if err := b.runtime.Kill(ctx, id, syscall.SIGKILL, true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		b.opts.Log.Debug("kill jail", "jail", id, "err", err)
	}
	if pid > 0 {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := procwait.WaitPid(wctx, pid)
		cancel()
		if err != nil {
			return fmt.Errorf("jail %s: init (pid %d) did not exit after SIGKILL: %w", id, pid, err)
		}
	}
	err := b.runtime.Delete(ctx, id, true)
	// What the daemon keeps open of the cgroup would keep it from being
	// freed.
	cgroups.CloseFiles(string(hostjail.CgroupOf(id)))
	if err != nil {
		return fmt.Errorf("delete container: %w", err)
	}
	return nil
}

// Destroy implements backend.Backend.
func (b *Backend) Destroy(ctx context.Context, inst backend.Instance) error {
	p := b.paths(inst)
	// A daemon killed half-way through making this jail left the runtime
	// (and CRIU) at work on it: end that first.
	// A restore killed with it leaves CRIU's cgroup yard mounted in its
	// work directory.
	errs := []error{b.runtime.KillStrays(ctx, inst.ID), storage.UnmountAll(filepath.Join(p.dir, restoreWorkDir))}
	_, pid, err := b.runtime.State(ctx, inst.ID)
	if err == nil {
		errs = append(errs, b.kill(ctx, inst.ID, pid))
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		errs = append(errs, err)
	}
	// What the runtime does not know of (a restore that never finished)
	// may still be in the jail's cgroup.
	kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	errs = append(errs, cgroups.Kill(kctx, string(hostjail.CgroupOf(inst.ID))))
	cancel()
	errs = append(errs, hostjail.Release(ctx, b.net, b.opts.Pool, inst.ID, []string{p.merged, p.control}, p.disk, p.netns)...)
	return errors.Join(errs...)
}

// Status implements backend.Backend.
func (b *Backend) Status(ctx context.Context, inst backend.Instance) (backend.Status, error) {
	st, pid, err := b.runtime.State(ctx, inst.ID)
	if errors.Is(err, errdefs.ErrNotFound) {
		return backend.Status{}, nil
	}
	if err != nil {
		return backend.Status{}, err
	}
	if st == "running" || st == "paused" {
		return backend.Status{Running: true, Pid: pid}, nil
	}
	return backend.Status{}, nil
}

// Stats implements backend.Backend.
func (b *Backend) Stats(ctx context.Context, inst backend.Instance) (backend.Stats, error) {
	return hostjail.CgroupOf(inst.ID).Stats(b.paths(inst).disk)
}

// IDShift implements backend.Layered.
func (b *Backend) IDShift(inst backend.Instance) int {
	if userns(inst.Config) {
		return UIDMapBase
	}
	return 0
}

// Layers implements backend.Layered.
func (b *Backend) Layers(inst backend.Instance) (string, string, error) {
	lower, err := b.lower(inst)
	if err != nil {
		return "", "", err
	}
	return lower, b.paths(inst).upper, nil
}

// InitDialer implements backend.Backend: init listens on a unix socket
// in the jail's control dir, which is bound into the container.
func (b *Backend) InitDialer(inst backend.Instance) initclient.Dialer {
	return initclient.UnixSocket(filepath.Join(b.paths(inst).control, initproto.SocketName))
}

// KeepInitConnections implements backend.InitKeepAlive: init's control
// socket is a host unix socket, and Checkpoint readies init (which
// closes the idle connections) before CRIU saves it.
func (b *Backend) KeepInitConnections(backend.Instance) bool { return true }

// Observe implements backend.Observable: runc puts every process of the
// jail in the cgroup v2 directory of the jail's cgroupsPath.
func (b *Backend) Observe(inst backend.Instance, st backend.Status) (backend.Observed, error) {
	ob, err := hostjail.CgroupOf(inst.ID).Observed(b.paths(inst).merged, b.net.Interface(inst.ID))
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
