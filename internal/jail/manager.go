package jail

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/atomicfile"
	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/cgroups"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/image"
	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/netpolicy"
	"github.com/agentjail/agentjail/internal/observe"
	"github.com/agentjail/agentjail/internal/observe/bpf"
	"github.com/agentjail/agentjail/internal/procwait"
	"github.com/agentjail/agentjail/internal/profile"
	"github.com/agentjail/agentjail/internal/rootfs"
	"github.com/agentjail/agentjail/internal/storage"
	"github.com/agentjail/agentjail/internal/tenant"
	"github.com/agentjail/agentjail/internal/tracing"
)

// Version is the daemon's version, reported by /health.
var Version = "0.1.0"

// Options configures a Manager.
type Options struct {
	// DataDir holds all state (default /var/lib/agentjail).
	DataDir string
	// Backends make the backends of the isolation levels the daemon
	// offers (cmd/agentjail wires them); a factory that fails leaves its
	// level unavailable, with the reason reported by Health and by a
	// create that asks for it.
	Backends []backend.Factory
	// PoolSize is the size of the sparse storage pool image (default: 64 GiB,
	// or 90 % of the free space of the data dir's filesystem when smaller).
	PoolSize int64
	// WarmDisks is how many default-size disks to keep ready (default 2;
	// negative: none).
	WarmDisks int
	// WarmJails is how many started jails of the default configuration to
	// keep ready for creates that ask for it (warm.go; default none).
	WarmJails int
	// WarmMax is how many the pool grows to after bursts of such creates
	// (default: WarmJails, a pool of fixed size).
	WarmMax int
	// Logger receives diagnostics (default: discard).
	Logger *slog.Logger
	// AllowHostNetwork permits jails with network mode "host".
	AllowHostNetwork bool
	// Hosts are static name → address entries the jails' DNS answers
	// before asking the host's resolver (like /etc/hosts).
	Hosts map[string][]netip.Addr
	// Subnet is the jail network (default 10.88.0.0/16).
	Subnet string
	// NetPrefix names the host interfaces and nftables table the daemon
	// owns (default "aj"); two daemons on one host need distinct prefixes
	// and subnets. Both are remembered in DATA_DIR/network.json.
	NetPrefix string
	// Secrets resolves the secrets that credentials name (model API keys):
	// the values stay in the daemon (nil: none).
	Secrets func(name string) (string, bool)
	// Registries are the per-registry settings of image pulls.
	Registries image.Registries
	// ProfileCache keeps built profile tarballs across data dirs
	// (default /var/cache/agentjail/profiles).
	ProfileCache string
	// DebianMirror is the mirror profiles are built from (default:
	// mmdebstrap's).
	DebianMirror string
	// Quotas limits what each tenant may hold (nil: no limits).
	Quotas *tenant.Quotas
	// NetObserver, when set, sees every network policy record of every
	// jail (the metrics count proxied bytes and refusals with it).
	NetObserver func(netpolicy.ConnEvent)
	// EventLogs, when set, exports each run's events elsewhere (as
	// OpenTelemetry logs): it is called when a jail's observation starts
	// and returns the function each event goes to (called on the event
	// path: it must not block) and the one that ends the export.
	EventLogs func(j model.Jail) (emit func(*observe.Event), stop func())
}

// Manager owns every jail of one data dir.
type Manager struct {
	opts    Options
	lock    *os.File // the data dir's lock (lockDataDir), held until Close
	log     *slog.Logger
	levels  *backend.Registry
	pool    *storage.Pool
	net     *netpolicy.Manager
	watcher *procwait.Watcher
	// tracer is the kernel side of observation, shared by all jails; nil
	// when it cannot load here (tracerErr says why). netTracer accounts
	// network flows and DNS likewise.
	tracer       *bpf.Tracer
	tracerErr    error
	netTracer    *bpf.NetTracer
	netTracerErr error
	host         config.Host
	// snaps is the snapshot store (snapshots.go).
	snaps *snapshotState
	// warm is the pool of ready jails (warm.go); nil when none are kept.
	warm *warmPool
	// images is the image store of `image:` jails (images.go).
	images *image.Store
	// imageOwners says which tenants own which images (imagetenants.go).
	imageOwners *imageTenants
	// profiles builds the images of `profile:` and `nix:` jails.
	profiles *profile.Builder
	// regCache serves the registry cache to jails (regcache.go).
	regCache *regCache

	mu    sync.Mutex
	jails map[string]*entry  // by id
	names map[nameKey]string // (tenant, name) → id
}

// entry is one jail. op serialises lifecycle transitions; mu guards rec.
type entry struct {
	op     sync.Mutex
	mu     sync.RWMutex
	rec    model.Jail
	dir    string
	unwait func()
	// obs is the record of the jail's current (or last) run.
	obs *observation
	// health says whether the running jail's init answers.
	health health
	// ctl is the client of the running jail's init (pid ctlPid) that keeps
	// connections open, for backends that allow it; see Manager.client.
	ctl    *initclient.Client
	ctlPid int
	// making is set while the jail's directory holds makingMarker: a
	// crash releases the jail then, so its record is written without
	// waiting for the disk until made makes it durable.
	making bool
}

// view is the jail as the API shows it: credential values redacted, and
// a running jail whose init does not answer shown as unresponsive.
func (e *entry) view() *model.Jail {
	e.mu.RLock()
	j, h := e.rec, e.health
	e.mu.RUnlock()
	j.Config = j.Config.Redact()
	if h.unresponsive && j.Status == model.StateRunning && h.pid == j.Pid {
		j.Status = model.StateUnresponsive
		j.Error = fmt.Sprintf("the jail's init (pid %d) has not answered since %s", h.pid, h.since.Format(time.RFC3339))
	}
	return &j
}

func (e *entry) snapshot() model.Jail {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.rec
}

// NewManager opens the data dir: the storage pool, the host rootfs, the
// backend, and every jail recorded there — re-adopting those still running.
func NewManager(ctx context.Context, opts Options) (_ *Manager, err error) {
	if opts.DataDir == "" {
		opts.DataDir = "/var/lib/agentjail"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.WarmDisks == 0 {
		opts.WarmDisks = 2
	}
	dataDir, err := filepath.Abs(opts.DataDir)
	if err != nil {
		return nil, err
	}
	opts.DataDir = dataDir
	for _, d := range []string{dataDir, filepath.Join(dataDir, "jails"), filepath.Join(dataDir, "bin"), filepath.Join(dataDir, "run")} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("data dir: %w", err)
		}
	}
	if err := os.Chmod(dataDir, 0o711); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	lock, err := lockDataDir(dataDir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			lock.Close()
		}
	}()
	m := &Manager{opts: opts, log: opts.Logger, jails: map[string]*entry{}, names: map[nameKey]string{}, lock: lock}
	initBin, err := installBinary(dataDir)
	if err != nil {
		return nil, err
	}
	if err := backend.StaticBinary(initBin); err != nil {
		m.log.Warn("jails of images and virtual machines will not start", "err", err)
	}
	lower, err := rootfs.EnsureHost(dataDir)
	if err != nil {
		return nil, fmt.Errorf("host rootfs: %w", err)
	}
	m.images, err = image.Open(image.Options{Dir: filepath.Join(dataDir, "images"), Registries: opts.Registries})
	if err != nil {
		return nil, err
	}
	m.images.SetInUse(m.imagesInUse)
	if m.imageOwners, err = openImageTenants(dataDir); err != nil {
		return nil, err
	}
	if opts.ProfileCache == "" {
		opts.ProfileCache = "/var/cache/agentjail/profiles"
	}
	m.profiles, err = profile.New(profile.Options{Dir: filepath.Join(dataDir, "profiles"), CacheDir: opts.ProfileCache, Images: m.images, Mirror: opts.DebianMirror})
	if err != nil {
		return nil, err
	}
	if err := m.startRegistryCache(); err != nil {
		return nil, err
	}
	size := opts.PoolSize
	if size == 0 {
		size = defaultPoolSize(dataDir)
	}
	warm := max(opts.WarmDisks, 0)
	m.pool, err = storage.OpenPool(dataDir, size, config.DefaultDisk, warm)
	if err != nil {
		return nil, fmt.Errorf("storage pool: %w", err)
	}
	if err := rememberNetwork(dataDir, &m.opts); err != nil {
		m.pool.Close()
		return nil, err
	}
	m.net, err = netpolicy.New(ctx, netpolicy.Options{
		DataDir:       dataDir,
		Subnet:        m.opts.Subnet,
		Prefix:        m.opts.NetPrefix,
		AllowHostMode: opts.AllowHostNetwork,
		Resolver:      hostsResolver{hosts: opts.Hosts},
		Record:        m.recordNet,
		Owner:         m.socketOwner,
		Log:           m.log,
		Secrets:       opts.Secrets,
	})
	if err != nil {
		m.pool.Close()
		return nil, fmt.Errorf("jail network: %w", err)
	}
	m.levels, err = backend.NewRegistry(backend.Host{
		DataDir:          dataDir,
		InitBinary:       initBin,
		Pool:             m.pool,
		HostLower:        lower,
		Net:              m.net,
		Images:           m.images,
		AllowHostNetwork: opts.AllowHostNetwork,
		Log:              m.log,
	}, opts.Backends)
	if err != nil {
		m.net.Close()
		m.pool.Close()
		return nil, err
	}
	if m.tracer, err = bpf.Open(); err != nil {
		m.tracerErr = fmt.Errorf("kernel-side observation is unavailable: %w", err)
		m.log.Warn("jails will run unobserved", "err", err)
	}
	if m.netTracer, err = bpf.OpenNet(bpf.NetConfig{}); err != nil {
		m.netTracerErr = fmt.Errorf("network flow accounting is unavailable: %w", err)
		m.log.Warn("jails' network flows will not be accounted", "err", err)
	}
	m.watcher, err = procwait.NewWatcher()
	if err != nil {
		m.pool.Close()
		return nil, err
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return nil, err
	}
	m.host = config.Host{NofileMax: lim.Max, CPUs: runtime.NumCPU(), Levels: m.levels.Available()}
	if err := m.openSnapshots(); err != nil {
		m.pool.Close()
		return nil, err
	}
	if err := m.recover(ctx); err != nil {
		m.pool.Close()
		return nil, err
	}
	m.recoverCheckpoints(ctx)
	if err := m.startWarm(opts.WarmJails, opts.WarmMax); err != nil {
		m.pool.Close()
		return nil, err
	}
	return m, nil
}

// Close releases the manager's background resources and destroys the
// ready jails of the warm pool. Jails keep running and are re-adopted by
// the next manager on the same data dir; this one no longer acts on them
// (an init that exits now is the next manager's to notice).
func (m *Manager) Close() error {
	m.stopWarm()
	m.mu.Lock()
	jails := make([]*entry, 0, len(m.jails))
	for _, e := range m.jails {
		jails = append(jails, e)
	}
	m.mu.Unlock()
	for _, e := range jails {
		m.unwatch(e)
	}
	var errs []error
	if m.tracer != nil {
		errs = append(errs, m.tracer.Close())
	}
	if m.netTracer != nil {
		errs = append(errs, m.netTracer.Close())
	}
	if m.regCache != nil {
		errs = append(errs, m.regCache.srv.Close())
	}
	errs = append(errs, m.images.Close(), m.net.Close(), m.pool.Close())
	// The data dir is free for the next daemon once nothing of this one
	// uses it.
	m.lock.Close()
	return errors.Join(errs...)
}

// defaultPoolSize is 64 GiB or 90 % of the free space, whichever is smaller.
func defaultPoolSize(dir string) int64 {
	const def = 64 * config.GiB
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return def
	}
	free := int64(st.Bavail) * int64(st.Bsize) / 10 * 9
	return max(min(def, free), 2*config.GiB)
}

// initBinaryMode is the installed init binary's mode: executable by
// everyone, readable by no one without a capability that overrides file
// permissions. A process that execs a binary it cannot read is made
// non-dumpable by the kernel, so init's shims (started without those
// capabilities) can never be traced by a jail's processes, not even
// before they protect themselves.
const initBinaryMode = 0o111

// installBinary copies the running executable into DATA_DIR/bin under a
// content-addressed name, so jails keep the init they started with even
// when the daemon's binary is replaced.
func installBinary(dataDir string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("locating the agentjail binary: %w", err)
	}
	data, err := os.ReadFile(self)
	if err != nil {
		return "", fmt.Errorf("reading the agentjail binary: %w", err)
	}
	sum := sha256.Sum256(data)
	dst := filepath.Join(dataDir, "bin", "agentjail-"+hex.EncodeToString(sum[:6]))
	if st, err := os.Stat(dst); err == nil {
		if st.Mode().Perm() != initBinaryMode {
			if err := os.Chmod(dst, initBinaryMode); err != nil {
				return "", fmt.Errorf("installing the init binary: %w", err)
			}
		}
		return dst, nil
	}
	if err := atomicfile.WriteFile(dst, data, initBinaryMode); err != nil {
		return "", fmt.Errorf("installing the init binary: %w", err)
	}
	return dst, nil
}

func newID() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}

func (m *Manager) jailDir(id string) string { return filepath.Join(m.opts.DataDir, "jails", id) }

func (m *Manager) instance(e *entry) backend.Instance {
	j := e.snapshot()
	cfg := j.Config
	return backend.Instance{ID: j.ID, Name: j.Name, Dir: e.dir, Config: &cfg, Hostname: hostname(&j)}
}

func hostname(j *model.Jail) string {
	if j.Config.Hostname != "" {
		return j.Config.Hostname
	}
	h := strings.NewReplacer("_", "-", ".", "-").Replace(j.Name)
	return strings.Trim(h, "-")
}

// lookup finds a jail by id or name, as the caller of ctx may see it: a
// jail of another tenant is not found (internal/tenant). Every operation
// on a jail goes through here, which makes it the one place where a
// request's tenant meets the jail's.
func (m *Manager) lookup(ctx context.Context, ref string) (*entry, error) {
	m.mu.Lock()
	e, ok := m.jails[ref]
	var err error
	if !ok {
		e, err = m.byNameLocked(ctx, ref)
	}
	m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if e == nil || !tenant.Visible(ctx, e.snapshot().Tenant) {
		return nil, errdefs.NotFoundf("no jail with id or name %q", ref)
	}
	return e, nil
}

// persist writes the record atomically to jail.json, durably unless the
// jail is being made (entry.making).
func (m *Manager) persist(e *entry) error {
	e.mu.RLock()
	j, making := e.rec, e.making
	e.mu.RUnlock()
	j.Stats = nil
	data, err := json.MarshalIndent(j, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(e.dir, "jail.json")
	if making {
		return atomicfile.Refresh(path, data, 0o600)
	}
	return atomicfile.WriteFile(path, data, 0o600)
}

// setState changes the record under its lock and persists it.
func (m *Manager) setState(e *entry, f func(j *model.Jail)) {
	e.mu.Lock()
	f(&e.rec)
	e.dropControl()
	e.mu.Unlock()
	if err := m.persist(e); err != nil {
		m.log.Error("persisting jail state", "jail", e.rec.ID, "err", err)
	}
}

// Create implements the API's create: validate, record, prepare and
// (unless req.Start is false) start. A failed create leaves nothing behind.
func (m *Manager) Create(ctx context.Context, req model.CreateRequest) (j *model.Jail, err error) {
	ctx, span := tracing.Start(ctx, "jail.create", tracing.JailTenant.String(tenant.Owner(ctx)))
	defer func() {
		if j != nil {
			span.SetAttributes(tracing.JailID.String(j.ID), tracing.JailName.String(j.Name), tracing.JailLevel.String(j.Config.Isolation.Level))
		}
		tracing.End(span, err)
	}()
	cfg := req.Config
	// The image's config fills what the request leaves unset.
	m.applyRegistryCache(&cfg.Isolation.Network)
	release, err := m.resolveImage(ctx, &cfg)
	if err != nil {
		return nil, err
	}
	defer release()
	cfg.ApplyDefaults()
	if _, err := m.checkConfig(&cfg); err != nil {
		return nil, err
	}
	if err := validateTracing(&cfg.Tracing); err != nil {
		return nil, err
	}
	if req.Name != "" {
		if err := config.ValidName(req.Name); err != nil {
			return nil, err
		}
	}
	owner := tenant.Owner(ctx)
	if err := m.admit(owner, jailUsage(&cfg)); err != nil {
		return nil, err
	}
	if m.warm != nil && (req.Start == nil || *req.Start) && m.warm.matches(&cfg) {
		if j, err := m.takeWarm(ctx, req.Name); j != nil || err != nil {
			return j, err
		}
	}
	id := newID()
	name := req.Name
	if name == "" {
		name = "jail-" + id[:6]
	}
	e := &entry{dir: m.jailDir(id), rec: model.Jail{ID: id, Name: name, Tenant: owner, Status: model.StateCreated, CreatedAt: time.Now().UTC(), Config: cfg}}
	if err := m.register(e); err != nil {
		return nil, err
	}
	e.op.Lock()
	defer e.op.Unlock()
	if err := m.build(ctx, e, req.Start == nil || *req.Start, false); err != nil {
		m.forget(e)
		return nil, err
	}
	m.made(e)
	return e.view(), nil
}

// build makes the new jail e: its effective config (as its level sets
// it), its directory (holding the warm pool's marker when warm), its
// record and its backend resources; then it starts it when start is set.
// On failure it releases all it made. e.op is held.
func (m *Manager) build(ctx context.Context, e *entry, start, warm bool) error {
	b, err := m.backendOf(e)
	if err != nil {
		return err
	}
	inst := m.instance(e)
	if err := b.Configure(inst); err != nil {
		return err
	}
	m.setConfig(e, *inst.Config)
	if err = os.Mkdir(e.dir, 0o711); err != nil {
		return fmt.Errorf("jail dir: %w", err)
	}
	marker := makingMarker
	if warm {
		marker = warmMarker
	}
	if err = os.WriteFile(filepath.Join(e.dir, marker), nil, 0o600); err != nil {
		err = fmt.Errorf("jail dir: %w", err)
	} else if !warm {
		e.mu.Lock()
		e.making = true
		e.mu.Unlock()
	}
	if err == nil {
		err = m.persist(e)
	}
	if err == nil {
		pctx, span := tracing.Start(ctx, "backend.prepare", tracing.JailID.String(e.rec.ID), tracing.JailLevel.String(b.Capabilities().Level))
		err = b.Prepare(pctx, m.instance(e))
		tracing.End(span, err)
	}
	if err == nil && start {
		err = m.start(ctx, e)
	}
	if err != nil {
		m.releaseJail(context.WithoutCancel(ctx), e, false)
	}
	return err
}

// made marks the new jail e as the caller's: from here on a crash no
// longer releases it. Its record is made durable first.
func (m *Manager) made(e *entry) {
	e.mu.Lock()
	e.making = false
	e.mu.Unlock()
	if err := atomicfile.Sync(filepath.Join(e.dir, "jail.json")); err != nil {
		m.log.Error("a new jail stays marked as being made; a crash would release it", "jail", e.snapshot().ID, "err", err)
		return
	}
	if err := os.Remove(filepath.Join(e.dir, makingMarker)); err != nil {
		m.log.Error("a new jail stays marked as being made; a crash would release it", "jail", e.snapshot().ID, "err", err)
	}
}

// setConfig replaces e's config in memory (persist writes it).
func (m *Manager) setConfig(e *entry, cfg config.Config) {
	e.mu.Lock()
	e.rec.Config = cfg
	e.mu.Unlock()
}

// releaseJail destroys the backend resources and the directory of a jail that
// was never handed out or whose creation failed (errors are logged; the
// directory stays when the backend could not release everything). A jail
// without a record (recordless) is released by every backend, since its
// level is unknown.
func (m *Manager) releaseJail(ctx context.Context, e *entry, recordless bool) {
	id := e.snapshot().ID
	var bs []backend.Backend
	if recordless {
		bs = m.levels.Backends()
	} else if b, err := m.backendOf(e); err == nil {
		bs = []backend.Backend{b}
	} else {
		m.log.Error("releasing a jail", "jail", id, "err", err)
		return
	}
	var errs []error
	for _, b := range bs {
		errs = append(errs, b.Destroy(ctx, m.instance(e)))
	}
	if err := errors.Join(errs...); err != nil {
		m.log.Error("releasing a jail", "jail", id, "err", err)
		return
	}
	if err := removeJailDir(e.dir); err != nil {
		m.log.Error("removing a jail's directory", "jail", id, "err", err)
	}
}

// register adds a new jail to the indexes, reserving its name
// (ErrConflict when another jail has it) and its share of its tenant's
// quota (ErrQuota, ErrForbidden: see tenant.Quota.Admit).
func (m *Manager) register(e *entry) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, taken := m.names[keyOf(&e.rec)]; taken {
		return errdefs.Conflictf("a jail named %q already exists", e.rec.Name)
	}
	if err := m.admitLocked(e.rec.Tenant, jailUsage(&e.rec.Config)); err != nil {
		return err
	}
	m.names[keyOf(&e.rec)] = e.rec.ID
	m.jails[e.rec.ID] = e
	return nil
}

// forget drops e from the indexes.
func (m *Manager) forget(e *entry) {
	j := e.snapshot()
	m.mu.Lock()
	delete(m.jails, j.ID)
	if m.names[keyOf(&j)] == j.ID {
		delete(m.names, keyOf(&j))
	}
	m.mu.Unlock()
}

// List returns every jail the caller of ctx may see, oldest first.
func (m *Manager) List(ctx context.Context) ([]*model.Jail, error) {
	m.mu.Lock()
	out := make([]*model.Jail, 0, len(m.jails))
	for _, e := range m.jails {
		if j := e.view(); tenant.Visible(ctx, j.Tenant) {
			out = append(out, j)
		}
	}
	m.mu.Unlock()
	sort.Slice(out, func(a, b int) bool {
		if out[a].CreatedAt.Equal(out[b].CreatedAt) {
			return out[a].ID < out[b].ID
		}
		return out[a].CreatedAt.Before(out[b].CreatedAt)
	})
	return out, nil
}

// Get returns a jail with live stats when it runs.
func (m *Manager) Get(ctx context.Context, ref string) (*model.Jail, error) {
	e, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	j := e.view()
	if j.Status == model.StateRunning || j.Status == model.StateUnresponsive {
		if st, err := m.stats(ctx, e); err == nil {
			j.Stats = &model.Stats{
				MemoryBytes: st.MemoryBytes, MemoryLimitBytes: st.MemoryLimitBytes,
				CPUTimeNs: st.CPUTimeNs, Pids: st.Pids, PidsLimit: uint64(j.Config.Isolation.Resources.PidsLimit), OOMKills: st.OOMKills,
				DiskUsedBytes: st.DiskUsedBytes, DiskLimitBytes: st.DiskLimitBytes,
			}
		} else {
			m.log.Warn("reading jail stats", "jail", j.ID, "err", err)
		}
	}
	return j, nil
}

// Start starts a created, stopped or failed jail.
func (m *Manager) Start(ctx context.Context, ref string) (*model.Jail, error) {
	e, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	if err := m.lockLifecycle(e); err != nil {
		return nil, err
	}
	defer e.op.Unlock()
	if err := m.start(ctx, e); err != nil {
		return nil, err
	}
	return e.view(), nil
}

// lockLifecycle takes e.op for a start or a stop. While another start or
// stop of the jail is under way (the jail is starting or stopping) it
// takes nothing and answers ErrConflict at once: the transition is not
// queued behind, as the state machine has no start or stop from those
// states. Other holders of e.op (a snapshot, a network update) are waited
// for.
func (m *Manager) lockLifecycle(e *entry) error {
	if e.op.TryLock() {
		return nil
	}
	if j := e.snapshot(); j.Status == model.StateStarting || j.Status == model.StateStopping {
		return errdefs.Conflictf("jail %s is %s; try again when that is done", j.Name, j.Status)
	}
	e.op.Lock()
	return nil
}

// start runs with e.op held.
func (m *Manager) start(ctx context.Context, e *entry) error {
	j := e.snapshot()
	switch j.Status {
	case model.StateCreated, model.StateStopped, model.StateError:
	default:
		return errdefs.Conflictf("jail %s is %s; only a created, stopped or failed jail can be started", j.Name, j.Status)
	}
	b, err := m.backendOf(e)
	if err != nil {
		return err
	}
	// The last run's recordings are stored before the start clears the
	// control dir they are in.
	m.finalizeRecordings(e, false)
	m.setState(e, func(j *model.Jail) { j.Status = model.StateStarting; j.Error = "" })
	inst := m.instance(e)
	inst.OnCreated = func(st backend.Status) error { return m.observeStart(e, b, st) }
	sctx, span := tracing.Start(ctx, "backend.start", tracing.JailID.String(j.ID), tracing.JailLevel.String(b.Capabilities().Level))
	st, err := b.Start(sctx, inst)
	tracing.End(span, err)
	if err != nil {
		m.observeStop(e)
		m.setState(e, func(j *model.Jail) { j.Status = model.StateError; j.Error = err.Error(); j.Pid = 0 })
		return err
	}
	now := time.Now().UTC()
	m.setState(e, func(j *model.Jail) {
		j.Status = model.StateRunning
		j.Pid = st.Pid
		j.StartedAt = &now
		j.StoppedAt = nil
	})
	m.watch(e, st.Pid)
	return nil
}

// watch marks the jail failed if its init exits while it should run.
func (m *Manager) watch(e *entry, pid int) {
	cancel, err := m.watcher.Watch(pid, func() { m.initExited(e, pid) })
	if err != nil {
		m.log.Error("watching jail init", "jail", e.rec.ID, "err", err)
		return
	}
	e.mu.Lock()
	e.unwait = cancel
	e.mu.Unlock()
}

func (m *Manager) unwatch(e *entry) {
	e.mu.Lock()
	cancel := e.unwait
	e.unwait = nil
	e.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

func (m *Manager) initExited(e *entry, pid int) {
	e.op.Lock()
	defer e.op.Unlock()
	j := e.snapshot()
	if j.Status != model.StateRunning || j.Pid != pid {
		return
	}
	m.log.Warn("jail init exited unexpectedly", "jail", j.ID, "pid", pid)
	if b, err := m.backendOf(e); err != nil {
		m.log.Error("cleaning up after init exit", "jail", j.ID, "err", err)
	} else if err := b.Stop(context.Background(), m.instance(e), 0); err != nil {
		m.log.Error("cleaning up after init exit", "jail", j.ID, "err", err)
	}
	m.observeStop(e)
	now := time.Now().UTC()
	m.setState(e, func(j *model.Jail) {
		j.Status = model.StateError
		j.Error = "the jail's init exited unexpectedly"
		j.Pid = 0
		j.StoppedAt = &now
	})
}

// Stop stops a running (or failed) jail, waiting up to grace for its
// processes to exit before killing them.
func (m *Manager) Stop(ctx context.Context, ref string, grace time.Duration) (*model.Jail, error) {
	e, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	if err := m.lockLifecycle(e); err != nil {
		return nil, err
	}
	defer e.op.Unlock()
	j := e.snapshot()
	switch j.Status {
	case model.StateRunning, model.StateError:
	case model.StateStopped, model.StateCreated:
		return nil, errdefs.Conflictf("jail %s is already stopped (%s)", j.Name, j.Status)
	default:
		return nil, errdefs.Conflictf("jail %s is %s; only a running jail can be stopped", j.Name, j.Status)
	}
	b, err := m.backendOf(e)
	if err != nil {
		return nil, err
	}
	m.unwatch(e)
	m.setState(e, func(j *model.Jail) { j.Status = model.StateStopping })
	err = b.Stop(ctx, m.instance(e), grace)
	m.observeStop(e)
	if err != nil {
		m.setState(e, func(j *model.Jail) { j.Status = model.StateError; j.Error = err.Error() })
		return nil, err
	}
	// Stored now, the run's recordings no longer hold the control dir's
	// room (memory, at some levels) while the jail is stopped.
	m.finalizeRecordings(e, false)
	now := time.Now().UTC()
	m.setState(e, func(j *model.Jail) { j.Status = model.StateStopped; j.Pid = 0; j.StoppedAt = &now })
	return e.view(), nil
}

// Destroy kills a jail's processes and releases everything it has.
func (m *Manager) Destroy(ctx context.Context, ref string) error {
	e, err := m.lookup(ctx, ref)
	if err != nil {
		return err
	}
	e.op.Lock()
	defer e.op.Unlock()
	j := e.snapshot()
	if j.Status == model.StateDestroyed {
		return errdefs.NotFoundf("no jail with id or name %q", ref)
	}
	b, err := m.backendOf(e)
	if err != nil {
		return fmt.Errorf("destroying jail %s: %w", j.Name, err)
	}
	m.unwatch(e)
	m.observeStop(e)
	if err := b.Destroy(ctx, m.instance(e)); err != nil {
		m.setState(e, func(j *model.Jail) { j.Status = model.StateError; j.Error = "destroy: " + err.Error() })
		return fmt.Errorf("destroying jail %s: %w", j.Name, err)
	}
	if err := removeJailDir(e.dir); err != nil {
		return fmt.Errorf("destroying jail %s: %w", j.Name, err)
	}
	e.mu.Lock()
	e.rec.Status = model.StateDestroyed
	e.dropControl()
	e.mu.Unlock()
	m.forget(e)
	return nil
}

// removeJailDir deletes a jail's directory, refusing when anything is
// still mounted below it (deleting through a mount would destroy data).
func removeJailDir(dir string) error {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return err
	}
	if len(mounts) > 0 {
		return errdefs.Conflictf("%s is still mounted; not removing the jail directory", mounts[0].Mountpoint)
	}
	return os.RemoveAll(dir)
}

// recover loads every jail of the data dir and re-adopts running ones.
func (m *Manager) recover(ctx context.Context) error {
	dirs, err := os.ReadDir(filepath.Join(m.opts.DataDir, "jails"))
	if err != nil {
		return err
	}
	for _, d := range dirs {
		if !d.IsDir() {
			continue
		}
		dir := m.jailDir(d.Name())
		if m.releaseUnfinishedDir(ctx, dir) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, "jail.json"))
		if err != nil {
			m.log.Warn("jail directory without a record: releasing it", "dir", dir)
			e := &entry{dir: dir, rec: model.Jail{ID: d.Name()}}
			e.rec.Config.ApplyDefaults()
			m.releaseJail(ctx, e, true)
			continue
		}
		e := &entry{dir: dir}
		if err := json.Unmarshal(data, &e.rec); err != nil {
			m.log.Error("unreadable jail record; leaving it alone", "dir", dir, "err", err)
			continue
		}
		m.jails[e.rec.ID] = e
		m.names[keyOf(&e.rec)] = e.rec.ID
		if err := m.readopt(ctx, e); err != nil {
			return err
		}
	}
	return nil
}

// readopt re-adopts the recorded jail e if it still runs, and records a
// jail that a crash left starting or stopping as stopped. A jail whose
// level this daemon cannot run is shown failed, with why, until a daemon
// that has the level starts; nothing of it is touched.
func (m *Manager) readopt(ctx context.Context, e *entry) error {
	switch e.rec.Status {
	case model.StateRunning, model.StateStarting, model.StateStopping:
	default:
		return nil
	}
	b, err := m.backendOf(e)
	if err != nil {
		m.log.Error("a jail's level is unavailable; leaving it alone", "jail", e.rec.ID, "err", err)
		e.rec.Status, e.rec.Error = model.StateError, err.Error()
		return nil
	}
	inst := m.instance(e)
	st, err := b.Status(ctx, inst)
	if err == nil && st.Running && e.rec.Status == model.StateRunning {
		e.rec.Pid = st.Pid
		m.log.Info("re-adopted running jail", "jail", e.rec.ID, "pid", st.Pid)
		if err := b.Reattach(ctx, inst); err != nil {
			m.log.Error("re-attaching jail network", "jail", e.rec.ID, "err", err)
		}
		if err := m.observeStart(e, b, st); err != nil {
			m.log.Error("re-watching jail", "jail", e.rec.ID, "err", err)
		}
		// The tracer knows init's shims by having seen init start
		// them: let those started before this daemon exit, so the
		// next commands run under shims it knows.
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := m.control(b, inst).SetIdleShims(sctx, false); err != nil {
			m.log.Warn("emptying init's idle shims of a re-adopted jail", "jail", e.rec.ID, "err", err)
		}
		cancel()
		m.watch(e, st.Pid)
		return nil
	}
	if err := b.Stop(ctx, inst, 0); err != nil {
		m.log.Error("stopping a jail found half-way", "jail", e.rec.ID, "err", err)
	}
	now := time.Now().UTC()
	e.rec.Status, e.rec.Pid, e.rec.StoppedAt = model.StateStopped, 0, &now
	return m.persist(e)
}

// Health reports the daemon's state.
func (m *Manager) Health(ctx context.Context) model.Health {
	h := model.Health{Status: "ok", Version: Version, Checks: map[string]model.Check{},
		Host: map[string]string{"cgroups": cgroups.Mode()}, Levels: m.levels.Levels()}
	m.mu.Lock()
	h.Jails = len(m.jails)
	for _, e := range m.jails {
		if e.snapshot().Status == model.StateRunning {
			h.Running++
		}
	}
	m.mu.Unlock()
	pool := filepath.Join(m.opts.DataDir, "pool")
	if ok, err := storage.IsMounted(pool); err != nil || !ok {
		h.Checks["storage"] = model.Check{OK: false, Message: fmt.Sprintf("storage pool %s is not mounted", pool)}
		h.Status = "degraded"
	} else {
		h.Checks["storage"] = model.Check{OK: true}
	}
	h.Checks["levels"] = levelsCheck(h.Levels)
	h.Checks["checkpoint"] = checkpointCheck(h.Levels)
	if m.warm != nil {
		h.Warm = m.warm.status()
	}
	if m.tracer == nil {
		h.Checks["observation"] = model.Check{OK: false, Message: m.tracerErr.Error()}
		h.Status = "degraded"
	} else if err := m.tracer.Err(); err != nil {
		h.Checks["observation"] = model.Check{OK: false, Message: err.Error()}
		h.Status = "degraded"
	} else {
		h.Checks["observation"] = model.Check{OK: true}
	}
	return h
}

// levelsCheck is OK when every level the daemon knows runs here; its
// message names the available ones and why the others are missing.
func levelsCheck(levels []model.Level) model.Check {
	c := model.Check{OK: true}
	var parts []string
	for _, l := range levels {
		switch {
		case !l.Available:
			c.OK = false
			parts = append(parts, l.Reason)
		case l.Capabilities.Unsafe:
			parts = append(parts, l.Name+" (UNSAFE: no isolation)")
		default:
			parts = append(parts, l.Name+" ("+l.Capabilities.Runtime+")")
		}
	}
	c.Message = strings.Join(parts, "; ")
	return c
}

// checkpointCheck is OK when every available level that snapshots
// filesystems also checkpoints processes; its message says why not.
func checkpointCheck(levels []model.Level) model.Check {
	c := model.Check{OK: true}
	var why []string
	for _, l := range levels {
		if l.Available && l.Capabilities.FSSnapshot && !l.Capabilities.Checkpoint {
			c.OK = false
			why = append(why, l.Name+": "+l.Capabilities.CheckpointReason)
		}
	}
	c.Message = strings.Join(why, "; ")
	return c
}

// Teardown destroys every jail of the data dir of opts (made with
// opts.Backends) and releases its storage pool: for tests and
// uninstalling. A data dir that holds nothing is left alone.
func Teardown(ctx context.Context, opts Options) error {
	dataDir := opts.DataDir
	_, imgErr := os.Stat(filepath.Join(dataDir, "storage.img"))
	jails, _ := os.ReadDir(filepath.Join(dataDir, "jails"))
	poolMounted, _ := storage.IsMounted(filepath.Join(dataDir, "pool"))
	if errors.Is(imgErr, os.ErrNotExist) && len(jails) == 0 && !poolMounted {
		return nil
	}
	opts.WarmDisks, opts.WarmJails = -1, 0
	m, err := NewManager(ctx, opts)
	if err != nil {
		return err
	}
	list, _ := m.List(ctx)
	var errs []error
	for _, j := range list {
		if err := m.Destroy(ctx, j.ID); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, m.snaps.store.RemoveAll())
	// The project caches' disks, mounted until now.
	errs = append(errs, storage.UnmountAll(filepath.Join(dataDir, "caches")))
	errs = append(errs, m.Close())
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := netpolicy.Teardown(netpolicy.Options{DataDir: m.opts.DataDir, Prefix: m.opts.NetPrefix, Subnet: m.opts.Subnet}); err != nil {
		return err
	}
	return storage.Teardown(m.opts.DataDir)
}
