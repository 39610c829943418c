package jail

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/netpolicy"
	"github.com/agentjail/agentjail/internal/observe"
	"github.com/agentjail/agentjail/internal/observe/bpf"
	"github.com/agentjail/agentjail/internal/observe/fanwatch"
	"github.com/agentjail/agentjail/internal/observe/netcap"
	"github.com/agentjail/agentjail/internal/snapshot"
)

// busCapacity is how many recent events a jail's live stream keeps for
// late-joining clients (about 600 bytes each, allocated per running jail;
// the JSONL files keep everything).
const busCapacity = 4096

// writerOptions size a jail's JSONL buffers: 4 streams × 64 KiB while idle,
// at most 4 MiB queued for the disk during a burst.
var writerOptions = observe.WriterOptions{ChunkBytes: 64 << 10, QueueChunks: 64}

// eventReserve is the free space a jail's event files leave on the data
// dir's filesystem, which the storage pool's image shares: 5 % of the
// filesystem, at most 1 GiB (0 when its size is unknown).
func eventReserve(dir string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0
	}
	return min(int64(st.Blocks)*st.Bsize/20, 1<<30)
}

// observation is the record of one run of a jail: its JSONL files, its
// live stream and the aggregates the report is made of. The tracer's
// delivery goroutine and the network policy both feed it, serialised by mu.
type observation struct {
	mu       sync.Mutex
	rec      *observe.Recorder
	bus      *observe.Bus
	agg      *aggregate
	cgroupID uint64
	watching bool
	// netCgroup is the cgroup directory the network tracer watches, and
	// netCgroupID its id while it is watched (0 otherwise).
	netCgroup   string
	netCgroupID atomic.Uint64
	// capture writes the jail's packets to a pcap file, when asked.
	capture *netcap.Capture
	// fan reports files closed after writing, to cross-check the record.
	fan *fanwatch.Watcher
	// stopEvents ends the backend's own event source (nil without one).
	stopEvents func() error
	// root is the host path of the jail's root ("" when the host cannot
	// see it).
	root  string
	since time.Time
	// reason says why the kernel side does not watch the jail (empty when
	// it does).
	reason string
	// foreign are host pids in the jail's cgroup that are not the jail's
	// (backend.Status.Foreign): their events are dropped.
	foreign map[int32]bool
	// stopLogs ends the export of the events as OpenTelemetry logs (nil
	// without one).
	stopLogs func()
}

// Handle implements observe.Sink.
func (o *observation) Handle(ev *observe.Event) {
	if o.foreign[ev.HostPID] {
		return
	}
	o.mu.Lock()
	o.rec.Handle(ev)
	o.mu.Unlock()
}

// Idle implements observe.Sink.
func (o *observation) Idle() {
	o.mu.Lock()
	o.rec.Idle()
	o.mu.Unlock()
}

// observeStart opens the jail's record of the run st (on backend b) and,
// unless tracing is off or nothing can observe the jail, attaches what can:
// the kernel-side tracers on the jail's cgroup (syscalls, processes,
// files, network flows and DNS) for an Observable backend, or the
// backend's own event source; and captures its packets when asked. It
// runs after the jail's processes exist and before its init executes
// anything.
func (m *Manager) observeStart(e *entry, b backend.Backend, st backend.Status) (err error) {
	j := e.snapshot()
	dir := filepath.Join(e.dir, "events")
	opts := writerOptions
	opts.ReserveBytes = eventReserve(e.dir)
	opts.MaxFileBytes = j.Config.Tracing.MaxFileBytes
	if opts.MaxFileBytes == 0 {
		opts.MaxFileBytes = config.DefaultEventFileBytes
	}
	w, err := observe.OpenWriter(dir, opts)
	if err != nil {
		return fmt.Errorf("event files: %w", err)
	}
	o := &observation{bus: observe.NewBus(busCapacity), agg: newAggregate(), since: time.Now().UTC()}
	if len(st.Foreign) > 0 {
		o.foreign = make(map[int32]bool, len(st.Foreign))
		for _, pid := range st.Foreign {
			o.foreign[int32(pid)] = true
		}
	}
	o.rec = observe.NewRecorder(w, o.bus)
	o.rec.Observe = o.agg.add
	if m.opts.EventLogs != nil {
		emit, stop := m.opts.EventLogs(j)
		o.rec.Observe = func(ev *observe.Event) {
			o.agg.add(ev)
			emit(ev)
		}
		o.stopLogs = stop
	}
	defer func() {
		if err != nil {
			m.stopObservation(e.rec.ID, o)
		}
	}()
	inst := m.instance(e)
	level := b.Capabilities().Level
	tr := j.Config.Tracing
	var ob backend.Observed
	obs, observable := b.(backend.Observable)
	if observable {
		if ob, err = obs.Observe(inst, st); err != nil {
			return fmt.Errorf("observation: %w", err)
		}
		o.root = ob.Root
	}
	es, ownEvents := b.(backend.EventSource)
	var reasons []string
	switch {
	case tr.Mode == config.TraceOff:
		reasons = append(reasons, "tracing is off for this jail")
	case ownEvents:
		if o.stopEvents, err = es.Events(inst, st, o); err != nil {
			return fmt.Errorf("observation: %w", err)
		}
	case !observable:
		reasons = append(reasons, fmt.Sprintf("the %s level cannot be observed", level))
	case m.tracer == nil:
		reasons = append(reasons, m.tracerErr.Error())
	default:
		err = m.tracer.Watch(ob.CgroupID, observe.JailKey(j.ID), bpf.Options{
			Mode: bpf.Mode(tr.Mode), Include: tr.Include, Exclude: tr.Exclude, Sink: o, InitPid: st.Pid,
		})
		if err != nil {
			return fmt.Errorf("observation: %w", err)
		}
		o.cgroupID, o.watching = ob.CgroupID, true
	}
	switch {
	case tr.Mode == config.TraceOff || !observable:
	case m.netTracer == nil:
		reasons = append(reasons, m.netTracerErr.Error())
	default:
		o.netCgroup = ob.CgroupDir
		if err := m.netTracer.WatchNet(o.netCgroup, observe.JailKey(j.ID), o); err != nil {
			o.netCgroup = ""
			return fmt.Errorf("network observation: %w", err)
		}
		if id, err := bpf.CgroupID(o.netCgroup); err == nil {
			o.netCgroupID.Store(id)
		}
	}
	if tr.Mode != config.TraceOff && ob.Root != "" {
		o.fan, err = fanwatch.Watch(ob.Root, func(ev fanwatch.Event) {
			o.mu.Lock()
			o.agg.fanWritten(ev.Path)
			o.mu.Unlock()
		})
		if err != nil {
			reasons = append(reasons, "no fanotify cross-check: "+err.Error())
			o.fan, err = nil, nil
		}
	}
	if tr.Pcap && tr.Mode != config.TraceOff {
		if ob.NetInterface == "" {
			reasons = append(reasons, fmt.Sprintf("no packet capture: the jail has no network link the host can capture on (mode none or host, or the %s level)", level))
		} else {
			name := fmt.Sprintf("capture-%s.pcap", time.Now().UTC().Format("20060102T150405"))
			if o.capture, err = netcap.StartCapture(ob.NetInterface, filepath.Join(dir, name), opts.MaxFileBytes); err != nil {
				return fmt.Errorf("packet capture: %w", err)
			}
		}
	}
	o.reason = strings.Join(reasons, "; ")
	e.mu.Lock()
	e.obs = o
	e.mu.Unlock()
	return nil
}

// observeRestored records the processes a restore brought back, which the
// tracer did not see start: a proc event "restored" for each, parents
// first, with its parent, command line, working directory and user as
// /proc shows them while the processes wait to resume. initPid is init's
// host pid. Only the processes of an Observable backend are host
// processes the daemon can read this way.
func (m *Manager) observeRestored(e *entry, initPid int) {
	e.mu.Lock()
	o := e.obs
	e.mu.Unlock()
	if o == nil || o.root == "" || initPid <= 0 {
		return
	}
	root := o.root
	now := time.Now().UnixNano()
	jailPid := map[int]int32{}
	queue := []int{initPid}
	for len(queue) > 0 {
		hp := queue[0]
		queue = queue[1:]
		ev, ok := restoredProc(hp, root)
		if !ok {
			continue
		}
		jailPid[hp] = ev.PID
		if hp != initPid {
			ev.PPID = jailPid[int(ev.HostPPID)]
		}
		ev.TS = now
		o.Handle(ev)
		queue = append(queue, procChildren(hp)...)
	}
}

// restoredProc describes host process hp for observeRestored (its PPID is
// the host one's, to be translated); false when it is gone.
func restoredProc(hp int, root string) (*observe.Event, bool) {
	dir := fmt.Sprintf("/proc/%d", hp)
	status, err := os.ReadFile(dir + "/status")
	if err != nil {
		return nil, false
	}
	ev := &observe.Event{Type: observe.TypeProc, Op: "restored", HostPID: int32(hp), HostTID: int32(hp)}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, _ := strings.Cut(line, ":")
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.Atoi(f[len(f)-1])
		switch k {
		case "Name":
			ev.Comm = strings.TrimSpace(v)
		case "NSpid": // the last is the pid in the jail's namespace
			ev.PID, ev.TID = int32(n), int32(n)
		case "PPid":
			ev.HostPPID = int32(n)
		case "Uid", "Gid":
			id, _ := strconv.Atoi(f[0])
			if k == "Uid" {
				ev.UID = uint32(id)
			} else {
				ev.GID = uint32(id)
			}
		}
	}
	if cmdline, err := os.ReadFile(dir + "/cmdline"); err == nil && len(cmdline) > 0 {
		ev.Argv = strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")
	}
	ev.Exe = inRoot(dir+"/exe", root)
	ev.Cwd = inRoot(dir+"/cwd", root)
	return ev, ev.PID > 0
}

// inRoot reads the /proc link and returns its target as seen in the jail
// (root is the jail's root directory on the host), "" when unreadable.
func inRoot(link, root string) string {
	t, err := os.Readlink(link)
	if err != nil || !strings.HasPrefix(t, "/") {
		return ""
	}
	if t == root {
		return "/"
	}
	if rest, ok := strings.CutPrefix(t, root+"/"); ok {
		return "/" + rest
	}
	// Outside the daemon's view of the root, the kernel gives the path
	// in the jail's own mount namespace.
	return t
}

// procChildren lists the children of host process hp (of all its threads).
func procChildren(hp int) []int {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", hp))
	var out []int
	for _, t := range tasks {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", hp, t.Name()))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(data)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// stopObservation ends what observeStart started for o. The network
// tracer's unwatch must not run under o.mu (it delivers to o).
func (m *Manager) stopObservation(jailID string, o *observation) {
	if o.watching {
		if err := m.tracer.Unwatch(o.cgroupID); err != nil {
			m.log.Error("unwatching jail", "jail", jailID, "err", err)
		}
		o.watching = false
	}
	if o.netCgroup != "" {
		o.netCgroupID.Store(0)
		if err := m.netTracer.UnwatchNet(o.netCgroup); err != nil {
			m.log.Error("unwatching jail network", "jail", jailID, "err", err)
		}
		o.netCgroup = ""
	}
	if o.stopEvents != nil {
		if err := o.stopEvents(); err != nil {
			m.log.Error("stopping the jail's event source", "jail", jailID, "err", err)
		}
		o.stopEvents = nil
	}
	if o.fan != nil {
		if err := o.fan.Close(); err != nil {
			m.log.Warn("closing fanotify watch", "jail", jailID, "err", err)
		}
		o.fan = nil
	}
	if o.capture != nil {
		if _, dropped, err := o.capture.Stop(); err != nil || dropped > 0 || o.capture.OverBound() > 0 {
			m.log.Warn("packet capture ended", "jail", jailID, "dropped", dropped, "over_bound", o.capture.OverBound(), "err", err)
		}
		o.mu.Lock()
		o.capture = nil
		o.mu.Unlock()
	}
	o.mu.Lock()
	err := o.rec.Close()
	o.mu.Unlock()
	if err != nil {
		m.log.Error("closing the jail's event files", "jail", jailID, "err", err)
	}
	if o.stopLogs != nil {
		o.stopLogs()
		o.stopLogs = nil
	}
}

// observeStop ends the current record: the kernel side stops, buffered
// events are written, and the live stream ends after its recent past.
func (m *Manager) observeStop(e *entry) {
	e.mu.Lock()
	o := e.obs
	e.mu.Unlock()
	if o != nil {
		m.stopObservation(e.rec.ID, o)
	}
}

// recordNet feeds one network policy record into the jail's observation.
func (m *Manager) recordNet(jailID string, ce netpolicy.ConnEvent) {
	if m.opts.NetObserver != nil {
		m.opts.NetObserver(ce)
	}
	m.mu.Lock()
	e := m.jails[jailID]
	m.mu.Unlock()
	if e == nil {
		return
	}
	e.mu.RLock()
	o := e.obs
	e.mu.RUnlock()
	if o == nil {
		return
	}
	ev := observe.Event{
		Type: observe.TypeNet, TS: ce.Time.UnixNano(), PID: int32(ce.Pid), Comm: ce.Comm,
		Dir: ce.Dir, Proto: ce.Proto, Src: ce.Src, Dst: ce.Dst, Bytes: ce.BytesOut, BytesIn: ce.BytesIn,
		Via: ce.Via, Host: ce.Host, Verdict: ce.Verdict, Rule: ce.Rule, Method: ce.Method, Path: ce.Path,
		Status: int32(ce.Status), QType: ce.QType, Answers: ce.Answers, Error: ce.Error,
		Upstream: ce.Upstream, Credentials: ce.Credentials,
		FirstTS: ce.Time.UnixNano(), LastTS: ce.Time.Add(time.Duration(ce.DurNS)).UnixNano(),
	}
	o.Handle(&ev)
}

// Events subscribes to a jail's live event stream from sequence number
// after (0: the oldest event still held) for the given types (none: all),
// and returns the newest sequence number at the time of subscribing.
func (m *Manager) Events(ctx context.Context, ref string, after uint64, types []string) (*observe.Subscription, uint64, error) {
	var mask observe.TypeMask
	for _, t := range types {
		typ, err := observe.ParseType(t)
		if err != nil {
			return nil, 0, err
		}
		mask |= observe.MaskOf(typ)
	}
	e, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, 0, err
	}
	e.mu.RLock()
	o := e.obs
	e.mu.RUnlock()
	if o == nil {
		return nil, 0, errdefs.Conflictf("jail %s has not run yet: no events", e.snapshot().Name)
	}
	return o.bus.Subscribe(after, mask), o.bus.Last(), nil
}

// Processes returns the jail's process tree as observed.
func (m *Manager) Processes(ctx context.Context, ref string) (*model.ProcessTree, error) {
	_, o, err := m.observation(ctx, ref)
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	t := o.agg.tree()
	return &t, nil
}

func (m *Manager) observation(ctx context.Context, ref string) (*entry, *observation, error) {
	e, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	e.mu.RLock()
	o := e.obs
	e.mu.RUnlock()
	if o == nil {
		return nil, nil, errdefs.Conflictf("jail %s has not run yet: nothing was observed", e.snapshot().Name)
	}
	return e, o, nil
}

// Report returns the whole observation of a jail as one document.
func (m *Manager) Report(ctx context.Context, ref string) (*model.Report, error) {
	e, o, err := m.observation(ctx, ref)
	if err != nil {
		return nil, err
	}
	j := e.snapshot()
	since := o.since
	r := &model.Report{
		JailID: j.ID, Name: j.Name, Status: j.Status, GeneratedAt: time.Now().UTC(), Since: &since,
		Tracing:     j.Config.Tracing.Mode,
		Observation: model.Check{OK: o.reason == "", Message: o.reason},
	}
	o.mu.Lock()
	o.agg.fill(r)
	capture := o.capture
	o.mu.Unlock()
	// A full data dir, or an event file at its bound, loses events but
	// not the jail: say so here. A file past its bound stays incomplete,
	// so that is said for good; a full disk while it refuses writes.
	lost, err := o.rec.Health()
	bounded, boundErr := o.rec.OverBound()
	if bounded > 0 {
		r.Lost[lostBound] = bounded
		r.Observation = failed(r.Observation, fmt.Sprintf("event files: %v (tracing.max_file_bytes; %d events not written so far)", boundErr, bounded))
	}
	if lost > bounded {
		r.Lost[lostDisk] = lost - bounded
	}
	if err != nil && !errors.Is(err, observe.ErrBound) {
		r.Observation = failed(r.Observation, fmt.Sprintf("event files: %v (%d events not written so far)", err, r.Lost[lostDisk]))
	}
	if capture != nil {
		if n := capture.OverBound(); n > 0 {
			r.Lost[lostPcap] = n
			r.Observation = failed(r.Observation, fmt.Sprintf("packet capture: its file reached its bound (tracing.max_file_bytes; %d packets not written so far)", n))
		}
	}
	if o.watching {
		if n, err := m.tracer.Lost(o.cgroupID); err == nil && n > r.Lost[observe.LostKernel] {
			r.Lost[observe.LostKernel] = n
		}
	}
	if o.netCgroup != "" {
		if n, err := m.netTracer.Lost(o.netCgroup); err == nil {
			r.Lost["network"] = n
		}
	}
	if d, err := m.FsDiff(ctx, ref, false); err == nil {
		r.FsDiff = d
	}
	if s, ok := m.net.DNSStats(j.ID); ok {
		r.DNS = &model.DNSStats{Answered: s.Answered, DroppedRateLimit: s.DroppedRateLimit, DroppedBusy: s.DroppedBusy}
	}
	return r, nil
}

// failed returns c failing, with msg added to its message.
func failed(c model.Check, msg string) model.Check {
	return model.Check{OK: false, Message: strings.Trim(c.Message+"; "+msg, "; ")}
}

// The report's counts of events not written to the event files: those the
// disk refused (a full data dir), and those past a file's bound
// (tracing.max_file_bytes).
const (
	lostDisk  = "disk"
	lostBound = "limit"
	// lostPcap counts the packets left out of the capture file past its
	// bound.
	lostPcap = "pcap"
)

// maxPaths and maxExited bound the aggregates of a long-running jail.
const (
	maxPaths  = 10000
	maxExited = 10000
)

// aggregate is what the report is made of, kept up to date event by event.
type aggregate struct {
	// written holds the files fanotify saw closed after writing.
	written  map[string]bool
	events   map[string]uint64
	syscalls map[int32]*model.SyscallStat
	files    map[string]*model.FileStat
	net      map[string]*model.NetStat
	procs    map[int32]*model.Process
	exited   []int32
	lost     map[string]uint64
}

func newAggregate() *aggregate {
	return &aggregate{
		events: map[string]uint64{}, syscalls: map[int32]*model.SyscallStat{},
		files: map[string]*model.FileStat{}, net: map[string]*model.NetStat{},
		procs: map[int32]*model.Process{}, lost: map[string]uint64{}, written: map[string]bool{},
	}
}

func (a *aggregate) add(ev *observe.Event) {
	a.events[ev.Type.String()]++
	switch ev.Type {
	case observe.TypeSyscall:
		s := a.syscalls[ev.NR]
		if s == nil {
			s = &model.SyscallStat{Name: ev.Name(), Nr: int(ev.NR)}
			a.syscalls[ev.NR] = s
		}
		s.Count += uint64(ev.Calls())
		s.TotalNs += ev.DurNS
		if ev.Ret < 0 && ev.Ret > -4096 {
			s.Errors += uint64(ev.Calls())
		}
	case observe.TypeFile:
		a.addFile(ev)
	case observe.TypeNet:
		a.addNet(ev)
	case observe.TypeProc:
		a.addProc(ev)
	case observe.TypeLost:
		a.lost[ev.Source] += ev.Lost
	}
}

func (a *aggregate) addFile(ev *observe.Event) {
	if ev.Path == "" {
		return
	}
	f := a.files[ev.Path]
	if f == nil {
		if len(a.files) >= maxPaths {
			f = a.files["(other paths)"]
			if f == nil {
				f = &model.FileStat{Path: "(other paths)"}
				a.files[f.Path] = f
			}
		} else {
			f = &model.FileStat{Path: ev.Path}
			a.files[ev.Path] = f
		}
	}
	switch ev.Op {
	case "read":
		f.BytesRead += ev.Bytes
	case "write":
		f.BytesWritten += ev.Bytes
	case "open", "create":
		f.Opens++
	case "close":
	default:
		if f.Ops == nil {
			f.Ops = map[string]uint64{}
		}
		f.Ops[ev.Op]++
	}
}

func (a *aggregate) addNet(ev *observe.Event) {
	dest := ev.Host
	if dest == "" {
		dest = ev.Dst
		if ev.Dir == netcap.DirIngress {
			dest = ev.Src
		}
	}
	if dest == "" || ev.Op == netcap.OpDNSQuery || ev.Op == netcap.OpDNSAnswer {
		return
	}
	n := a.net[dest]
	if n == nil {
		if len(a.net) >= maxPaths {
			return
		}
		n = &model.NetStat{Destination: dest}
		a.net[dest] = n
	}
	switch ev.Op {
	case netcap.OpDNSQuery, netcap.OpDNSAnswer:
		return
	case netcap.OpUpdate:
	case "", netcap.OpClose, netcap.OpIdle, netcap.OpEnd:
		n.Connections++
	}
	n.BytesOut += ev.Bytes
	n.BytesIn += ev.BytesIn
	switch ev.Verdict {
	case "allow":
		n.Allowed++
	case "block", "deny", "refuse":
		n.Blocked++
	}
}

func (a *aggregate) addProc(ev *observe.Event) {
	ts := time.Unix(0, ev.TS).UTC()
	switch ev.Op {
	case "fork":
		if ev.Thread {
			return
		}
		a.procs[ev.PID] = &model.Process{Pid: int(ev.PID), Ppid: int(ev.PPID), HostPid: int(ev.HostPID), Comm: ev.Comm, StartedAt: ts}
	case "exec", "restored":
		p := a.proc(ev, ts)
		p.Exe, p.Argv, p.Cwd, p.UID, p.Comm = ev.Exe, ev.Argv, ev.Cwd, ev.UID, ev.Comm
	case "exit":
		if ev.Thread {
			return
		}
		p := a.proc(ev, ts)
		p.ExitedAt = &ts
		if ev.Signal != 0 {
			p.Signal = unix.SignalName(unix.Signal(ev.Signal))
		} else {
			code := int(ev.ExitCode)
			p.ExitCode = &code
		}
		a.exited = append(a.exited, ev.PID)
		if len(a.exited) > maxExited {
			old := a.exited[0]
			a.exited = a.exited[1:]
			if q := a.procs[old]; q != nil && q.ExitedAt != nil {
				delete(a.procs, old)
			}
		}
	}
}

// proc returns the process of ev, creating it when its fork was not seen
// (init itself, or processes from before a daemon restart).
func (a *aggregate) proc(ev *observe.Event, ts time.Time) *model.Process {
	p := a.procs[ev.PID]
	if p == nil {
		p = &model.Process{Pid: int(ev.PID), Ppid: int(ev.PPID), HostPid: int(ev.HostPID), Comm: ev.Comm, StartedAt: ts}
		a.procs[ev.PID] = p
	}
	return p
}

// tree builds the process tree (copies, so callers may keep it).
func (a *aggregate) tree() model.ProcessTree {
	nodes := make(map[int]*model.Process, len(a.procs))
	for pid, p := range a.procs {
		c := *p
		c.Children = nil
		nodes[int(pid)] = &c
	}
	var t model.ProcessTree
	pids := make([]int, 0, len(nodes))
	for pid := range nodes {
		pids = append(pids, pid)
	}
	sort.Ints(pids)
	for _, pid := range pids {
		p := nodes[pid]
		t.Total++
		if p.ExitedAt == nil {
			t.Running++
		}
		if parent, ok := nodes[p.Ppid]; ok && p.Ppid != p.Pid {
			parent.Children = append(parent.Children, p)
		} else {
			t.Roots = append(t.Roots, p)
		}
	}
	if t.Roots == nil {
		t.Roots = []*model.Process{}
	}
	return t
}

// fanWritten notes a file fanotify saw closed after writing.
func (a *aggregate) fanWritten(path string) {
	if len(a.written) < maxPaths {
		a.written[path] = true
	}
}

// fileCheck lists the files fanotify saw written that the syscall-derived
// record lacks (nil when the record overflowed its bounds).
func (a *aggregate) fileCheck() *model.FileCheck {
	if _, overflow := a.files["(other paths)"]; overflow || len(a.written) >= maxPaths {
		return nil
	}
	fc := &model.FileCheck{Written: len(a.written), Missing: []string{}}
	for p := range a.written {
		if _, ok := a.files[p]; !ok {
			fc.Missing = append(fc.Missing, p)
		}
	}
	sort.Strings(fc.Missing)
	return fc
}

// fill copies the aggregates into r, largest first.
func (a *aggregate) fill(r *model.Report) {
	r.Events = map[string]uint64{}
	for k, v := range a.events {
		r.Events[k] = v
	}
	r.Lost = map[string]uint64{observe.LostKernel: 0, observe.LostWriter: 0}
	for k, v := range a.lost {
		r.Lost[k] += v
	}
	r.Syscalls = []model.SyscallStat{}
	for _, s := range a.syscalls {
		r.Syscalls = append(r.Syscalls, *s)
	}
	sort.Slice(r.Syscalls, func(i, j int) bool {
		if r.Syscalls[i].Count != r.Syscalls[j].Count {
			return r.Syscalls[i].Count > r.Syscalls[j].Count
		}
		return r.Syscalls[i].Nr < r.Syscalls[j].Nr
	})
	r.Files = []model.FileStat{}
	for _, f := range a.files {
		c := *f
		r.Files = append(r.Files, c)
	}
	sort.Slice(r.Files, func(i, j int) bool {
		ti := r.Files[i].BytesRead + r.Files[i].BytesWritten
		tj := r.Files[j].BytesRead + r.Files[j].BytesWritten
		if ti != tj {
			return ti > tj
		}
		return strings.Compare(r.Files[i].Path, r.Files[j].Path) < 0
	})
	r.Network = []model.NetStat{}
	for _, n := range a.net {
		r.Network = append(r.Network, *n)
	}
	sort.Slice(r.Network, func(i, j int) bool {
		ti := r.Network[i].BytesOut + r.Network[i].BytesIn
		tj := r.Network[j].BytesOut + r.Network[j].BytesIn
		if ti != tj {
			return ti > tj
		}
		return r.Network[i].Destination < r.Network[j].Destination
	})
	r.Process = a.tree()
	r.FileCheck = a.fileCheck()
}

// FsDiff lists what the jail changed in its root filesystem (its overlay
// upper against the lower tree).
func (m *Manager) FsDiff(ctx context.Context, ref string, text bool) (*model.FsDiff, error) {
	e, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	lb, err := m.layered(e)
	if err != nil {
		return nil, err
	}
	lower, upper, err := lb.Layers(m.instance(e))
	if err != nil {
		return nil, err
	}
	// The lower tree alone is a tree with an empty upper layer.
	empty := filepath.Join(m.opts.DataDir, "run", "empty")
	if err := os.MkdirAll(empty, 0o755); err != nil {
		return nil, err
	}
	return snapshot.Diff(ctx, snapshot.Tree{Lower: lower, Upper: empty}, snapshot.Tree{Lower: lower, Upper: upper}, snapshot.SkipInternal, text)
}

// validateTracing checks the syscall names of a tracing config.
func validateTracing(t *config.Tracing) error {
	for field, names := range map[string][]string{"include": t.Include, "exclude": t.Exclude} {
		for i, n := range names {
			if _, ok := observe.SyscallNumber(n); !ok {
				return errdefs.Unprocessablef("tracing.%s[%d]: unknown syscall %q", field, i, n)
			}
		}
	}
	return nil
}
