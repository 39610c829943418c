package bpf

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/observe"
)

// Mode is a jail's tracing mode.
type Mode string

// The tracing modes.
const (
	// ModeFull records syscalls, processes and the file events derived
	// from the syscalls (the default).
	ModeFull Mode = "full"
	// ModeNoSyscalls records processes and file events; the syscalls the
	// file tracker needs still cross the ring but are delivered flagged
	// observe.FlagInternal.
	ModeNoSyscalls Mode = "no-syscalls"
	// ModeOff records nothing.
	ModeOff Mode = "off"
)

// Options configure the observation of one jail.
type Options struct {
	// Mode is the tracing mode; "" means ModeFull.
	Mode Mode
	// Include, when not empty, restricts the syscall stream to these
	// syscall names; Exclude removes names from it. Unknown names are
	// rejected. Neither affects process or file events.
	Include, Exclude []string
	// Sink receives the jail's events; required unless Mode is ModeOff.
	Sink observe.Sink
	// InitPid is the host pid of the jail's init. The processes it starts
	// for its own work (command shims), and each child of theirs until it
	// executes the command, are then left out of the syscall stream; their
	// process events are still recorded. So are init's own syscalls, but
	// those of a thread it marks (prctl initproto.RecordOption) while it
	// works on files for the files API. 0 records every process.
	InitPid int
}

// Config tunes a Tracer; zero fields take the defaults.
type Config struct {
	// RingBytes is the size of the kernel ring buffer shared by every
	// jail, a power of two of at least one page (default 32 MiB).
	RingBytes int
	// Poll is the reader's polling period while records come: the longest
	// a record waits in the ring before delivery, and how often lost
	// counters are read and sinks flushed (default 5 ms). After polls that
	// found the ring empty the reader sleeps longer, up to eight periods.
	// The ring must hold what the jails produce in eight periods. It is
	// also the longest a running task's repetitions of a call are counted
	// in the kernel before they are recorded.
	Poll time.Duration
}

const (
	wSyscalls = 1
	wProc     = 2

	// kernelMaxSyscalls is MAX_SYSCALLS of observe.h: the programs see
	// calls numbered below it.
	kernelMaxSyscalls = 512
)

// watchState is the user-space side of one watched cgroup.
type watchState struct {
	cgroup   uint64
	jail     observe.JailKey
	sink     observe.Sink
	user     [observe.MaxSyscall]bool // syscalls in the jail's syscall stream
	lostSeen uint64
	runs     coalescer
}

// Tracer owns the loaded programs, their links and the ring reader. One
// Tracer serves every jail; it is safe for concurrent use.
type Tracer struct {
	objs  observeObjects
	links []link.Link
	rd    *ring
	poll  time.Duration

	// mu guards watches and the delivery state below; the reader holds
	// it while it delivers, so after Unwatch returns the jail's sink is not
	// called again.
	mu      sync.Mutex
	watches map[uint64]*watchState
	last    *watchState
	dec     decoder

	drainReq  chan chan struct{} // Unwatch: closed once the ring was empty after the request
	stop      chan struct{}      // Close: the reader exits
	done      chan struct{}      // closed when the reader exits
	monoOff   atomic.Int64       // unix ns minus CLOCK_MONOTONIC ns
	closeOnce sync.Once
	readErr   atomic.Pointer[error]

	// lostKeys and lostVals receive the watch table in pollLost.
	lostKeys []uint64
	lostVals []observeWatch

	// bits is the programs' watch_bits filter, bitUsers how many cgroups
	// in the watch table set each bit, epoch the programs' watch_epoch;
	// t.mu guards them.
	bits     [watchBits / 64]uint64
	bitUsers [watchBits]uint16
	epoch    uint32
}

// watchBits is WATCH_BITS of observe.bpf.c.
const watchBits = 4096

// markWatched tells the programs that cgroupID entered or left the watch
// table: it sets or clears the cgroup's bit in their filter, then moves
// their epoch on, so that the tasks' copies of their watch are read again.
// The caller holds t.mu.
func (t *Tracer) markWatched(cgroupID uint64, watched bool) error {
	b := cgroupID % watchBits
	if watched {
		t.bitUsers[b]++
	} else {
		t.bitUsers[b]--
	}
	set := t.bitUsers[b] > 0
	if set != (t.bits[b/64]&(1<<(b%64)) != 0) {
		t.bits[b/64] ^= 1 << (b % 64)
		if err := t.objs.WatchBits.Set(t.bits); err != nil {
			return fmt.Errorf("observe: set the watch filter: %w", err)
		}
	}
	t.epoch++
	if err := t.objs.WatchEpoch.Set(t.epoch); err != nil {
		return fmt.Errorf("observe: set the watch epoch: %w", err)
	}
	return nil
}

// Open loads the programs with the default Config and attaches them; see
// OpenConfig.
func Open() (*Tracer, error) { return OpenConfig(Config{}) }

// OpenConfig loads the programs, attaches them to their tracepoints and
// starts the ring reader. Nothing is traced until Watch. When the kernel
// refuses a program or map the error wraps ErrNotSupported and names it. On
// error nothing stays loaded.
func OpenConfig(cfg Config) (*Tracer, error) {
	if cfg.RingBytes == 0 {
		cfg.RingBytes = 32 << 20
	}
	if cfg.RingBytes < os.Getpagesize() || cfg.RingBytes&(cfg.RingBytes-1) != 0 {
		return nil, errdefs.Invalidf("observe: ring_bytes %d: must be a power of two of at least one page", cfg.RingBytes)
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 5 * time.Millisecond
	}
	if err := Probe(); err != nil {
		return nil, err
	}
	spec, err := loadObserve()
	if err != nil {
		return nil, fmt.Errorf("observe: parse embedded programs: %w", err)
	}
	spec.Maps[observeMapEvents].MaxEntries = uint32(cfg.RingBytes)
	var specs [kernelMaxSyscalls]uint32
	for nr, s := range argSpecs {
		specs[nr] = s
	}
	if err := spec.Variables[observeVarArgspec].Set(specs); err != nil {
		return nil, fmt.Errorf("observe: set argspec: %w", err)
	}
	if err := spec.Variables[observeVarCoalesceMask].Set(kernelCoalescible()); err != nil {
		return nil, fmt.Errorf("observe: set coalesce_mask: %w", err)
	}
	if err := spec.Variables[observeVarHoldNs].Set(uint64(cfg.Poll)); err != nil {
		return nil, fmt.Errorf("observe: set hold_ns: %w", err)
	}

	t := &Tracer{
		poll:     cfg.Poll,
		watches:  make(map[uint64]*watchState),
		drainReq: make(chan chan struct{}),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		dec:      decoder{comms: make(map[[16]int8]string)},
	}
	if err := spec.LoadAndAssign(&t.objs, nil); err != nil {
		return nil, notSupported("load programs", err)
	}
	ok := false
	defer func() {
		if !ok {
			t.release()
		}
	}()
	for _, p := range []*ebpf.Program{t.objs.SysEnter, t.objs.SysExit, t.objs.SchedFork, t.objs.SchedExec, t.objs.SchedExit, t.objs.SchedSwitch} {
		l, err := link.AttachTracing(link.TracingOptions{Program: p, AttachType: ebpf.AttachTraceRawTp})
		if err != nil {
			return nil, notSupported("attach "+p.String(), err)
		}
		t.links = append(t.links, l)
	}
	t.rd, err = openRing(t.objs.Events)
	if err != nil {
		return nil, notSupported("open ring buffer reader", err)
	}
	t.syncClock()
	ok = true
	go t.run()
	return t, nil
}

func notSupported(what string, err error) error {
	if errors.Is(err, unix.EPERM) || errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EINVAL) ||
		errors.Is(err, unix.EOPNOTSUPP) {
		return fmt.Errorf("%w: %s: %w", ErrNotSupported, what, err)
	}
	var verr *ebpf.VerifierError
	if errors.As(err, &verr) {
		return fmt.Errorf("%w: %s: verifier: %w", ErrNotSupported, what, err)
	}
	return fmt.Errorf("observe: %s: %w", what, err)
}

func (t *Tracer) release() {
	if t.rd != nil {
		t.rd.close()
	}
	for i := len(t.links) - 1; i >= 0; i-- {
		t.links[i].Close()
	}
	t.links = nil
	t.objs.Close()
}

// Close stops the reader, delivers the runs of syscalls it held, detaches
// and unloads everything. Sinks are not called after Close returns. Closing twice is a no-op.
func (t *Tracer) Close() error {
	var err error
	t.closeOnce.Do(func() {
		close(t.stop)
		<-t.done
		t.mu.Lock()
		for _, st := range t.watches {
			if st.sink != nil {
				st.runs.flush(st.sink)
			}
		}
		t.mu.Unlock()
		err = t.rd.close()
		for i := len(t.links) - 1; i >= 0; i-- {
			err = errors.Join(err, t.links[i].Close())
		}
		err = errors.Join(err, t.objs.Close())
		if err != nil {
			err = fmt.Errorf("observe: close tracer: %w", err)
		}
	})
	return err
}

// Watch starts observing the processes of the cgroup v2 directory whose id
// is cgroupID (CgroupID returns it for a path), delivering the jail's events
// to opts.Sink. Call it before the first process enters the cgroup so the
// jail is seen from its first instruction. Processes in descendant cgroups
// are not observed. Watching an id twice is a conflict; unknown syscall
// names or modes are invalid.
func (t *Tracer) Watch(cgroupID uint64, jail observe.JailKey, opts Options) error {
	if cgroupID == 0 {
		return errdefs.Invalidf("observe: cgroup id: must not be 0")
	}
	mode := opts.Mode
	if mode == "" {
		mode = ModeFull
	}
	if mode != ModeFull && mode != ModeNoSyscalls && mode != ModeOff {
		return errdefs.Invalidf("observe: mode %q: want full, no-syscalls or off", opts.Mode)
	}
	if opts.Sink == nil && mode != ModeOff {
		return errdefs.Invalidf("observe: sink: required for mode %s", mode)
	}
	st := &watchState{cgroup: cgroupID, jail: jail, sink: opts.Sink}
	if len(opts.Include) == 0 {
		for nr := range st.user {
			st.user[nr] = true
		}
	}
	for _, name := range opts.Include {
		nr, ok := observe.SyscallNumber(name)
		if !ok {
			return errdefs.Invalidf("observe: include: unknown syscall %q", name)
		}
		st.user[nr] = true
	}
	for _, name := range opts.Exclude {
		nr, ok := observe.SyscallNumber(name)
		if !ok {
			return errdefs.Invalidf("observe: exclude: unknown syscall %q", name)
		}
		st.user[nr] = false
	}
	if opts.InitPid < 0 {
		return errdefs.Invalidf("observe: init pid %d: must not be negative", opts.InitPid)
	}
	kw := observeWatch{InitTgid: uint32(opts.InitPid)}
	switch mode {
	case ModeFull:
		kw.Flags = wSyscalls | wProc
		for nr, on := range st.user {
			if on {
				kw.Mask[nr>>6] |= 1 << (nr & 63)
			}
		}
	case ModeNoSyscalls:
		kw.Flags = wSyscalls | wProc
		st.user = [observe.MaxSyscall]bool{}
	}
	if kw.Flags != 0 {
		for _, nr := range observe.FileSyscalls() {
			kw.Mask[nr>>6] |= 1 << (nr & 63)
		}
	}

	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.watches[cgroupID]; ok {
		return errdefs.Conflictf("observe: cgroup %d: already watched for jail %s", cgroupID, old.jail)
	}
	if kw.Flags != 0 {
		if err := t.objs.Watched.Update(cgroupID, &kw, ebpf.UpdateNoExist); err != nil {
			return fmt.Errorf("observe: watch cgroup %d: %w", cgroupID, err)
		}
		if err := t.markWatched(cgroupID, true); err != nil {
			return errors.Join(err, t.objs.Watched.Delete(cgroupID), t.markWatched(cgroupID, false))
		}
	}
	t.watches[cgroupID] = st
	return nil
}

// Unwatch stops observing cgroupID: the kernel stops recording it, the
// records already in the ring are delivered, a final lost event is sent if
// records were dropped since the last one, and the sink is not called again
// once Unwatch returns. Unwatching an id that is not watched is a no-op.
func (t *Tracer) Unwatch(cgroupID uint64) error {
	t.mu.Lock()
	st, ok := t.watches[cgroupID]
	if !ok {
		t.mu.Unlock()
		return nil
	}
	var kw observeWatch
	kernel := t.objs.Watched.Lookup(cgroupID, &kw) == nil
	if kernel {
		if err := t.objs.Watched.Delete(cgroupID); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.mu.Unlock()
			return fmt.Errorf("observe: unwatch cgroup %d: %w", cgroupID, err)
		}
		if err := t.markWatched(cgroupID, false); err != nil {
			t.mu.Unlock()
			return err
		}
	}
	t.mu.Unlock()

	// Deliver what the kernel produced up to now: the reader answers once
	// it found the ring empty after taking the request.
	drained := make(chan struct{})
	select {
	case t.drainReq <- drained:
		select {
		case <-drained:
		case <-t.done:
		}
	case <-t.done:
	}

	t.mu.Lock()
	defer t.mu.Unlock()
	if st.sink != nil {
		st.runs.flush(st.sink)
	}
	if kernel && kw.Lost > st.lostSeen && st.sink != nil {
		t.deliverLost(st, kw.Lost)
	}
	delete(t.watches, cgroupID)
	if t.last == st {
		t.last = nil
	}
	return nil
}

// Lost returns how many of cgroupID's records the kernel dropped because
// the ring was full. An id that is not watched is ErrNotFound.
func (t *Tracer) Lost(cgroupID uint64) (uint64, error) {
	t.mu.Lock()
	_, ok := t.watches[cgroupID]
	t.mu.Unlock()
	if !ok {
		return 0, errdefs.NotFoundf("observe: cgroup %d: not watched", cgroupID)
	}
	var kw observeWatch
	if err := t.objs.Watched.Lookup(cgroupID, &kw); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) { // mode off
			return 0, nil
		}
		return 0, fmt.Errorf("observe: read lost counter of cgroup %d: %w", cgroupID, err)
	}
	return kw.Lost, nil
}

// Err returns the error that stopped the reader, or nil while it runs (or
// after a clean Close).
func (t *Tracer) Err() error {
	if p := t.readErr.Load(); p != nil {
		return *p
	}
	return nil
}

// syncClock records the offset between CLOCK_MONOTONIC (the records'
// timestamps) and the wall clock.
func (t *Tracer) syncClock() {
	if off, ok := monoOffset(); ok {
		t.monoOff.Store(off)
	}
}

// monoOffset is the wall clock minus CLOCK_MONOTONIC, in nanoseconds.
func monoOffset() (int64, bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, false
	}
	return time.Now().UnixNano() - ts.Nano(), true
}

// run is the reader goroutine. It never blocks in the kernel: while the
// ring holds committed records it drains them, and otherwise it sleeps on a
// Go timer for the poll period, twice as long after each poll that found
// nothing, up to quietPolls periods: an idle daemon wakes a few times a
// second, not two hundred. Blocking in epoll_wait instead keeps Go's
// system monitor polling at a high rate, which on the project's VMs slowed
// every other process's syscalls by ~0.4 µs; the programs therefore submit
// without wake-ups.
func (t *Tracer) run() {
	defer close(t.done)
	timer := time.NewTimer(t.poll)
	defer timer.Stop()
	sleep := t.poll
	lastIdle := time.Now()
	var waiting []chan struct{}
	for {
		select {
		case ch := <-t.drainReq:
			waiting = append(waiting, ch)
		default:
		}
		n, err := t.drain()
		if err != nil {
			err = fmt.Errorf("observe: read ring buffer: %w", err)
			t.readErr.Store(&err)
			for _, ch := range waiting {
				close(ch)
			}
			return
		}
		if t.rd.available() == 0 {
			for _, ch := range waiting {
				close(ch)
			}
			waiting = waiting[:0]
		}
		if time.Since(lastIdle) >= t.poll {
			t.idle()
			lastIdle = time.Now()
		}
		if n > 0 {
			sleep = t.poll
			continue
		}
		// Nothing committed: the ring is empty, or its next record is
		// still being written.
		timer.Reset(sleep)
		select {
		case <-t.stop:
			return
		case ch := <-t.drainReq:
			waiting = append(waiting, ch)
		case <-timer.C:
			sleep = min(2*sleep, quietPolls*t.poll)
		}
	}
}

// quietPolls bounds the reader's sleep while the ring stays empty, in poll
// periods: the longest the first record after a quiet spell waits.
const quietPolls = 8

// drain delivers up to a batch of committed records, holding t.mu, gives
// their space back to the kernel and returns how many it delivered.
func (t *Tracer) drain() (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	defer t.rd.release()
	for n := 0; n < 8192; n++ {
		raw, err := t.rd.next()
		if raw == nil {
			return n, err
		}
		t.dispatch(raw)
	}
	return 8192, nil
}

// idle delivers the held runs of syscalls, polls the lost counters,
// resynchronises the clock and lets every sink flush.
func (t *Tracer) idle() {
	t.syncClock()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, st := range t.watches {
		if st.sink != nil {
			st.runs.flush(st.sink)
		}
	}
	t.pollLost()
	for _, st := range t.watches {
		if st.sink != nil {
			st.sink.Idle()
		}
	}
}

// lostBatch is how many watch entries one read of the lost counters takes.
const lostBatch = 256

// pollLost delivers the drops counted since the last poll, reading the
// whole watch table in batches: one system call for up to lostBatch jails
// instead of one each, every poll period. A kernel that cannot read the
// table in batches is asked jail by jail. The caller holds t.mu.
func (t *Tracer) pollLost() {
	if t.lostKeys == nil {
		t.lostKeys, t.lostVals = make([]uint64, lostBatch), make([]observeWatch, lostBatch)
	}
	var cursor ebpf.MapBatchCursor
	for {
		n, err := t.objs.Watched.BatchLookup(&cursor, t.lostKeys, t.lostVals, nil)
		for i := range n {
			if st := t.watches[t.lostKeys[i]]; st != nil && st.sink != nil && t.lostVals[i].Lost > st.lostSeen {
				t.deliverLost(st, t.lostVals[i].Lost)
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, ebpf.ErrKeyNotExist): // the end of the table
			return
		default:
			var kw observeWatch
			for cg, st := range t.watches {
				if st.sink != nil && t.objs.Watched.Lookup(cg, &kw) == nil && kw.Lost > st.lostSeen {
					t.deliverLost(st, kw.Lost)
				}
			}
			return
		}
	}
}

// deliverLost sends st's sink a lost event for the drops since the last
// one; the caller holds t.mu.
func (t *Tracer) deliverLost(st *watchState, total uint64) {
	ev := observe.Event{Type: observe.TypeLost, TS: time.Now().UnixNano(), Source: observe.LostKernel, Lost: total - st.lostSeen}
	st.lostSeen = total
	st.sink.Handle(&ev)
}

// dispatch decodes one record and hands it to its jail's sink; the caller
// holds t.mu.
func (t *Tracer) dispatch(raw []byte) {
	if len(raw) < hdrSize {
		return
	}
	cg := cgroupOf(raw)
	st := t.last
	if st == nil || st.cgroup != cg {
		st = t.watches[cg]
		if st == nil || st.sink == nil {
			return // unwatched while the record was in the ring
		}
		t.last = st
	}
	ev := &t.dec.ev
	if !t.dec.decode(raw, t.monoOff.Load(), st) {
		return
	}
	st.runs.handle(ev, st.sink)
}

// CgroupID returns the id of the cgroup v2 directory at path (its inode
// number), the key Watch takes.
func CgroupID(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("observe: stat cgroup %s: %w", path, err)
	}
	return st.Ino, nil
}
