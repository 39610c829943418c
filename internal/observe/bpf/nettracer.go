package bpf

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/observe"
	"github.com/agentjail/agentjail/internal/observe/netcap"
)

// Flow flags (enum flow_flag in net.h) and directions (enum net_dir).
const (
	flowInbound = 1
	flowFinOut  = 2
	flowFinIn   = 4
	flowRST     = 8
	flowOwner   = 16

	dirOut = 0
	dirIn  = 1

	protoTCP = 6
)

// NetConfig tunes a NetTracer; zero fields take the defaults.
type NetConfig struct {
	// Poll is how often the flow table and the DNS ring are read (default
	// 200 ms): the longest a DNS event waits, and the resolution of the
	// flow timeouts.
	Poll time.Duration
	// MaxFlows bounds the kernel's flow table, shared by every jail
	// (default 65536). Packets of new flows that do not fit are counted as
	// lost.
	MaxFlows int
	// RingBytes is the size of the ring carrying DNS payloads, a power of
	// two of at least one page (default 1 MiB).
	RingBytes int
	// Flows tunes when flows are reported.
	Flows netcap.FlowConfig
}

// netWatch is the user-space side of one cgroup watched for network
// traffic.
type netWatch struct {
	path     string
	id       uint64
	jail     observe.JailKey
	sink     observe.Sink
	links    []link.Link
	flows    *netcap.FlowTable
	lostSeen uint64
}

// NetTracer accounts the network traffic of jails by their cgroup v2
// directory: per-flow bytes and packets with the owning process, and the
// DNS messages of port-53 traffic, delivered as observe.TypeNet events (see
// package netcap for the records). One NetTracer serves every jail; the
// programs are loaded once and attached to each watched cgroup. It is safe
// for concurrent use, and independent of Tracer: it can run when syscall
// tracing cannot, and the reverse.
//
// Events are delivered from the NetTracer's own goroutine. A sink shared
// with a Tracer is therefore called from two goroutines and must serialise
// itself.
type NetTracer struct {
	objs netobsObjects
	rd   *ringbuf.Reader
	cfg  NetConfig

	// mu guards the watches, the ring reader and every sink call: after
	// UnwatchNet returns, the jail's sink is not called again.
	mu      sync.Mutex
	watches map[uint64]*netWatch
	byPath  map[string]*netWatch
	keys    []netobsFlowKey
	vals    []netobsFlowVal
	rec     ringbuf.Record
	ev      observe.Event

	monoOff   atomic.Int64
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
	readErr   atomic.Pointer[error]
}

// OpenNet loads the network programs and starts the reader. Nothing is
// accounted until WatchNet. When the kernel refuses a program or map the
// error wraps ErrNotSupported and names it. On error nothing stays loaded.
func OpenNet(cfg NetConfig) (*NetTracer, error) {
	if cfg.Poll <= 0 {
		cfg.Poll = 200 * time.Millisecond
	}
	if cfg.MaxFlows == 0 {
		cfg.MaxFlows = 65536
	}
	if cfg.MaxFlows < 0 {
		return nil, errdefs.Invalidf("observe: max_flows %d: must not be negative", cfg.MaxFlows)
	}
	if cfg.RingBytes == 0 {
		cfg.RingBytes = 1 << 20
	}
	if cfg.RingBytes < os.Getpagesize() || cfg.RingBytes&(cfg.RingBytes-1) != 0 {
		return nil, errdefs.Invalidf("observe: ring_bytes %d: must be a power of two of at least one page", cfg.RingBytes)
	}
	if err := Probe(); err != nil {
		return nil, err
	}
	spec, err := loadNetobs()
	if err != nil {
		return nil, fmt.Errorf("observe: parse embedded network programs: %w", err)
	}
	spec.Maps[netobsMapFlows].MaxEntries = uint32(cfg.MaxFlows)
	spec.Maps[netobsMapDnsEvents].MaxEntries = uint32(cfg.RingBytes)

	t := &NetTracer{
		cfg:     cfg,
		watches: make(map[uint64]*netWatch),
		byPath:  make(map[string]*netWatch),
		keys:    make([]netobsFlowKey, 256),
		vals:    make([]netobsFlowVal, 256),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	if err := spec.LoadAndAssign(&t.objs, nil); err != nil {
		return nil, notSupported("load network programs", err)
	}
	t.rd, err = ringbuf.NewReader(t.objs.DnsEvents)
	if err != nil {
		t.objs.Close()
		return nil, notSupported("open DNS ring buffer reader", err)
	}
	t.rd.SetDeadline(time.Unix(1, 0)) // never wait inside ReadInto
	t.rec.RawSample = make([]byte, 0, int(unsafe.Sizeof(netobsDnsEv{}))+64)
	t.syncClock()
	go t.run()
	return t, nil
}

// attachment is one program attached to each watched cgroup.
type attachment struct {
	typ  ebpf.AttachType
	prog *ebpf.Program
}

func (t *NetTracer) attachments() []attachment {
	p := &t.objs.netobsPrograms
	return []attachment{
		{ebpf.AttachCGroupInetSockCreate, p.SockCreate},
		{ebpf.AttachCGroupInet4Connect, p.Connect4},
		{ebpf.AttachCGroupInet6Connect, p.Connect6},
		{ebpf.AttachCGroupUDP4Sendmsg, p.Sendmsg4},
		{ebpf.AttachCGroupUDP6Sendmsg, p.Sendmsg6},
		{ebpf.AttachCGroupInetEgress, p.SkbEgress},
		{ebpf.AttachCGroupInetIngress, p.SkbIngress},
	}
}

// WatchNet starts accounting the network traffic of the sockets of the
// processes in the cgroup v2 directory at cgroupPath (an absolute path,
// e.g. /sys/fs/cgroup/unified/agentjail-{id}), delivering TypeNet events
// for jail to sink. Sockets of descendant cgroups are not accounted.
// Sockets created before the call are accounted from their next packet,
// without a process until they connect or send. Watching a cgroup twice is
// a conflict; a missing directory is ErrNotFound. On error nothing stays
// attached.
func (t *NetTracer) WatchNet(cgroupPath string, jail observe.JailKey, sink observe.Sink) error {
	if sink == nil {
		return errdefs.Invalidf("observe: network sink: required")
	}
	if !filepath.IsAbs(cgroupPath) {
		return errdefs.Invalidf("observe: cgroup path %q: must be absolute", cgroupPath)
	}
	cgroupPath = filepath.Clean(cgroupPath)
	id, err := CgroupID(cgroupPath)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return errdefs.NotFoundf("observe: cgroup %s does not exist", cgroupPath)
		}
		return err
	}

	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-t.stop:
		return errdefs.Conflictf("observe: network tracer is closed")
	default:
	}
	if old := t.byPath[cgroupPath]; old != nil {
		return errdefs.Conflictf("observe: cgroup %s: network already watched for jail %s", cgroupPath, old.jail)
	}
	if old := t.watches[id]; old != nil {
		return errdefs.Conflictf("observe: cgroup %s (id %d): network already watched for jail %s", cgroupPath, id, old.jail)
	}
	if err := t.objs.NetWatched.Update(id, &netobsNetWatch{}, ebpf.UpdateNoExist); err != nil {
		return fmt.Errorf("observe: watch network of cgroup %s: %w", cgroupPath, err)
	}
	w := &netWatch{path: cgroupPath, id: id, jail: jail, sink: sink, flows: netcap.NewFlowTable(t.cfg.Flows)}
	for _, a := range t.attachments() {
		l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupPath, Attach: a.typ, Program: a.prog})
		if err != nil {
			t.closeLinks(w)
			t.objs.NetWatched.Delete(id)
			t.deleteFlows(id)
			return notSupported(fmt.Sprintf("attach %s to cgroup %s", a.prog, cgroupPath), err)
		}
		w.links = append(w.links, l)
	}
	t.watches[id] = w
	t.byPath[cgroupPath] = w
	return nil
}

// Owner returns the process that owns the jail's end of a flow of the
// cgroup with id cgroupID (a watched one; see CgroupID): proto is
// unix.IPPROTO_TCP or unix.IPPROTO_UDP, local and remote the addresses as
// the jail's socket sees them (before any redirection on the host). It
// gives the process's pid in the jail and its comm; ok is false when the
// table has no such flow, or no owner for it. It is one lookup in the
// kernel's flow table, safe from any goroutine.
func (t *NetTracer) Owner(cgroupID uint64, proto uint8, local, remote netip.AddrPort) (pid int32, comm string, ok bool) {
	k := netobsFlowKey{Cgroup: cgroupID, Proto: proto, Lport: local.Port(), Rport: remote.Port()}
	l, r := local.Addr().Unmap(), remote.Addr().Unmap()
	switch {
	case l.Is4() && r.Is4():
		k.Family = 4
		a, b := l.As4(), r.As4()
		copy(k.Laddr[:], a[:])
		copy(k.Raddr[:], b[:])
	case l.Is6() && r.Is6():
		k.Family = 6
		k.Laddr, k.Raddr = l.As16(), r.As16()
	default:
		return 0, "", false
	}
	var v netobsFlowVal
	if err := t.objs.Flows.Lookup(&k, &v); err != nil || v.Flags&flowOwner == 0 {
		return 0, "", false
	}
	return nsOr(v.NsTgid, v.Tgid), commString(&v.Comm), true
}

// UnwatchNet stops accounting the cgroup at cgroupPath: the programs are
// detached, the DNS messages already captured are delivered, every flow
// still in the table gets its final record (netcap.OpClose when it had
// closed, else netcap.OpEnd), a lost event follows if anything was dropped
// since the last one, and the sink is not called again once UnwatchNet
// returns. Unwatching a cgroup that is not watched (or whose watch already
// ended because the directory was removed) is a no-op.
func (t *NetTracer) UnwatchNet(cgroupPath string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	w := t.byPath[filepath.Clean(cgroupPath)]
	if w == nil {
		return nil
	}
	return t.endWatch(w)
}

// Lost returns how many packets and DNS messages of the cgroup at
// cgroupPath could not be recorded (flow table or ring full). A cgroup
// that is not watched is ErrNotFound.
func (t *NetTracer) Lost(cgroupPath string) (uint64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	w := t.byPath[filepath.Clean(cgroupPath)]
	if w == nil {
		return 0, errdefs.NotFoundf("observe: cgroup %s: network not watched", cgroupPath)
	}
	var nw netobsNetWatch
	if err := t.objs.NetWatched.Lookup(w.id, &nw); err != nil {
		return 0, fmt.Errorf("observe: read lost counters of cgroup %s: %w", cgroupPath, err)
	}
	return nw.LostPkts + nw.LostDns, nil
}

// Err returns the error that stopped the reader, or nil while it runs (or
// after a clean Close).
func (t *NetTracer) Err() error {
	if p := t.readErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Close ends every watch as UnwatchNet does (final records delivered),
// stops the reader and unloads the programs. Sinks are not called after
// Close returns. Closing twice is a no-op.
func (t *NetTracer) Close() error {
	t.closeOnce.Do(func() {
		close(t.stop)
		<-t.done
		t.mu.Lock()
		var err error
		for _, w := range t.watches {
			err = errors.Join(err, t.endWatch(w))
		}
		err = errors.Join(err, t.rd.Close(), t.objs.Close())
		t.mu.Unlock()
		if err != nil {
			t.closeErr = fmt.Errorf("observe: close network tracer: %w", err)
		}
	})
	return t.closeErr
}

// endWatch detaches w's programs, delivers what the kernel still holds for
// it and forgets it; the caller holds t.mu.
func (t *NetTracer) endWatch(w *netWatch) error {
	err := t.closeLinks(w)
	if rerr := t.drainDNS(); rerr != nil {
		err = errors.Join(err, rerr)
	}
	now := time.Now().UnixNano()
	serr := t.scanFlows(func(k *netobsFlowKey, v *netobsFlowVal) {
		if k.Cgroup != w.id {
			return
		}
		var final netobsFlowVal
		if t.objs.Flows.LookupAndDelete(k, &final) != nil {
			return
		}
		s := t.sample(k, &final)
		op := netcap.OpEnd
		if s.Closed {
			op = netcap.OpClose
		}
		w.flows.Record(&s, op, now, &t.ev)
		w.sink.Handle(&t.ev)
	})
	if serr != nil {
		err = errors.Join(err, serr)
	}
	t.reportLost(w)
	if derr := t.objs.NetWatched.Delete(w.id); derr != nil && !errors.Is(derr, ebpf.ErrKeyNotExist) {
		err = errors.Join(err, fmt.Errorf("observe: unwatch network of cgroup %s: %w", w.path, derr))
	}
	delete(t.watches, w.id)
	delete(t.byPath, w.path)
	return err
}

func (t *NetTracer) closeLinks(w *netWatch) error {
	var err error
	for i := len(w.links) - 1; i >= 0; i-- {
		if cerr := w.links[i].Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("observe: detach from cgroup %s: %w", w.path, cerr))
		}
	}
	w.links = nil
	return err
}

// deleteFlows removes the flow entries of cgroup id without reporting
// them (a watch that failed to start).
func (t *NetTracer) deleteFlows(id uint64) {
	t.scanFlows(func(k *netobsFlowKey, _ *netobsFlowVal) {
		if k.Cgroup == id {
			t.objs.Flows.Delete(k)
		}
	})
}

// scanFlows calls fn for every entry of the flow table; fn may delete the
// entry it is given.
func (t *NetTracer) scanFlows(fn func(*netobsFlowKey, *netobsFlowVal)) error {
	var cursor ebpf.MapBatchCursor
	for {
		n, err := t.objs.Flows.BatchLookup(&cursor, t.keys, t.vals, nil)
		for i := range n {
			fn(&t.keys[i], &t.vals[i])
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("observe: read flow table: %w", err)
		}
	}
}

// sample converts a kernel flow entry to a netcap.FlowSample.
func (t *NetTracer) sample(k *netobsFlowKey, v *netobsFlowVal) netcap.FlowSample {
	off := t.monoOff.Load()
	s := netcap.FlowSample{
		Key:   flowKey(k),
		First: int64(v.FirstNs) + off, Last: int64(v.LastNs) + off,
		BytesOut: v.Bytes[dirOut], BytesIn: v.Bytes[dirIn],
		PacketsOut: v.Pkts[dirOut], PacketsIn: v.Pkts[dirIn],
		Inbound: v.Flags&flowInbound != 0,
		Closed:  v.Flags&flowRST != 0 || v.Flags&(flowFinOut|flowFinIn) == flowFinOut|flowFinIn,
	}
	if v.Flags&flowOwner != 0 {
		s.PID, s.HostPID = nsOr(v.NsTgid, v.Tgid), int32(v.Tgid)
		s.Comm = commString(&v.Comm)
	}
	return s
}

func flowKey(k *netobsFlowKey) netcap.FlowKey {
	var l, r netip.Addr
	if k.Family == 4 {
		l = netip.AddrFrom4([4]byte(k.Laddr[:4]))
		r = netip.AddrFrom4([4]byte(k.Raddr[:4]))
	} else {
		l = netip.AddrFrom16(k.Laddr)
		r = netip.AddrFrom16(k.Raddr)
	}
	return netcap.FlowKey{Proto: k.Proto, Local: netip.AddrPortFrom(l, k.Lport), Remote: netip.AddrPortFrom(r, k.Rport)}
}

func commString(c *[16]int8) string {
	return cstring(unsafe.Slice((*byte)(unsafe.Pointer(&c[0])), len(c)))
}

// reportLost sends w's sink a lost event for the drops since the last
// one; the caller holds t.mu.
func (t *NetTracer) reportLost(w *netWatch) {
	var nw netobsNetWatch
	if t.objs.NetWatched.Lookup(w.id, &nw) != nil {
		return
	}
	total := nw.LostPkts + nw.LostDns
	if total <= w.lostSeen {
		return
	}
	t.ev = observe.Event{Type: observe.TypeLost, TS: time.Now().UnixNano(), Source: observe.LostKernel, Lost: total - w.lostSeen}
	w.lostSeen = total
	w.sink.Handle(&t.ev)
}

// syncClock records the offset between CLOCK_MONOTONIC (the records'
// timestamps) and the wall clock.
func (t *NetTracer) syncClock() {
	if off, ok := monoOffset(); ok {
		t.monoOff.Store(off)
	}
}

// run is the reader goroutine: every poll period it delivers the DNS
// messages, reports the flows that are due, ends the watches whose cgroup
// went away and lets the sinks flush.
func (t *NetTracer) run() {
	defer close(t.done)
	tick := time.NewTicker(t.cfg.Poll)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tick.C:
		}
		t.syncClock()
		if err := t.poll(); err != nil {
			t.readErr.Store(&err)
			return
		}
	}
}

func (t *NetTracer) poll() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.drainDNS(); err != nil {
		return err
	}
	now := time.Now().UnixNano()
	err := t.scanFlows(func(k *netobsFlowKey, v *netobsFlowVal) {
		w := t.watches[k.Cgroup]
		if w == nil {
			t.objs.Flows.Delete(k) // left by a watch that ended
			return
		}
		s := t.sample(k, v)
		op := w.flows.Check(&s, now)
		switch op {
		case "":
			return
		case netcap.OpUpdate:
		default:
			var final netobsFlowVal
			if t.objs.Flows.LookupAndDelete(k, &final) != nil {
				return
			}
			s = t.sample(k, &final)
		}
		w.flows.Record(&s, op, now, &t.ev)
		w.sink.Handle(&t.ev)
	})
	if err != nil {
		return err
	}
	for _, w := range t.watches {
		var st unix.Stat_t
		if serr := unix.Stat(w.path, &st); serr != nil || st.Ino != w.id {
			// The cgroup was removed: its programs are already detached by
			// the kernel; deliver what is left and release the links.
			t.endWatch(w)
			continue
		}
		t.reportLost(w)
		w.sink.Idle()
	}
	return nil
}

// drainDNS delivers the DNS payloads in the ring; the caller holds t.mu.
func (t *NetTracer) drainDNS() error {
	for {
		err := t.rd.ReadInto(&t.rec)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("observe: read DNS ring buffer: %w", err)
		}
		t.deliverDNS(t.rec.RawSample)
	}
}

func (t *NetTracer) deliverDNS(raw []byte) {
	if len(raw) < int(unsafe.Offsetof(netobsDnsEv{}.Data)) {
		return
	}
	e := (*netobsDnsEv)(unsafe.Pointer(&raw[0]))
	w := t.watches[e.Key.Cgroup]
	if w == nil {
		return
	}
	n := min(int(e.Len), len(e.Data), len(raw)-int(unsafe.Offsetof(netobsDnsEv{}.Data)))
	msgs, err := netcap.DecodeDNS(e.Data[:n], e.Key.Proto == protoTCP)
	if err != nil {
		return // not DNS, or a TCP segment continuing a message
	}
	key := flowKey(&e.Key)
	ts := int64(e.Ts) + t.monoOff.Load()
	for i := range msgs {
		netcap.DNSEvent(&msgs[i], key, e.Dir == dirOut, ts, &t.ev)
		if e.HasOwner != 0 {
			t.ev.PID, t.ev.HostPID = nsOr(e.NsTgid, e.Tgid), int32(e.Tgid)
			t.ev.Comm = commString(&e.Comm)
		}
		w.sink.Handle(&t.ev)
	}
}
