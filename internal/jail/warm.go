package jail

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/tenant"
)

// The warm pool keeps jails of the default configuration started and
// ready. A create whose effective configuration is exactly the default
// takes one, which costs a rename (name, UTS host name, the name other
// jails' network rules see) instead of a container start (runc create and
// start, init start-up, network attach: 100-200 ms on a small host).
//
// The pool adapts to bursts: it keeps at least its base size
// (serve --warm-jails) and as many as the largest burst of such creates
// seen recently (the most within demandBurst over the last demandWindow),
// up to its maximum (serve --warm-max); once no burst is left in the
// window it shrinks back. Ready jails are started in the background, a few
// at a time (warmParallel). A create that finds no ready jail while some
// are being started waits for the first of them, which is ready sooner
// than a jail it would start itself.
//
// A ready jail lives in DATA_DIR/jails/{id} like any jail, with a marker
// file, but is in neither index, so the API does not see it. A daemon
// that stops destroys its ready jails; one that restarts after a crash
// destroys those it finds (their marker says they were never handed out).

// warmMarker marks the directory of a ready, not yet handed out, jail.
const warmMarker = "warm"

// makingMarker marks the directory of a jail being made (created or
// restored) until the request that makes it answers: after a crash, such a
// jail is released, not adopted.
const makingMarker = "making"

// warmRetryMax bounds the wait between refills that fail.
const warmRetryMax = 30 * time.Second

// The pool's measure of demand: its target is the most creates of its
// configuration within any demandBurst of the last demandWindow.
const (
	demandBurst  = 10 * time.Second
	demandWindow = 5 * time.Minute
	// maxDemand bounds the creates remembered.
	maxDemand = 1024
)

// refillPause is how long a burst of creates must pause before the pool
// refills, while more ready jails are left than refills start at once
// (warmParallel, at most a quarter of the target).
const refillPause = 250 * time.Millisecond

// warmParallel is how many ready jails start at once: one per CPU, so
// that a refill after a burst does not take the jails of the burst the
// whole host.
var warmParallel = max(runtime.NumCPU(), 1)

type warmPool struct {
	size int // the base size
	max  int // the most it grows to
	// key is the default configuration, canonical JSON: a request matches
	// when its effective configuration encodes to the same bytes.
	key []byte

	stop chan struct{} // closed by stopWarm
	wg   sync.WaitGroup

	mu      sync.Mutex
	ready   []*entry // oldest first
	filling int      // fillers running (see fillWarm)
	backoff int      // of those, the ones waiting to retry after a failure
	waiters []chan *entry
	closed  bool
	taken   uint64
	lastErr error
	// creates are the times of the creates of the configuration within
	// the window (the last maxDemand at most), oldest first.
	creates []time.Time
	trimmer *time.Timer // shrinks the pool once a burst leaves the window
	// lastTake is when a create last took a ready jail; resume refills
	// once a burst pauses.
	lastTake time.Time
	resume   *time.Timer // shrinks the pool once a burst leaves the window
}

func newWarmPool(size, maxSize int) (*warmPool, error) {
	cfg := config.Config{}
	cfg.ApplyDefaults()
	key, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	return &warmPool{size: size, max: max(size, maxSize), key: key, stop: make(chan struct{})}, nil
}

// matches reports whether cfg (defaults applied) is the pool's configuration.
func (w *warmPool) matches(cfg *config.Config) bool {
	b, err := json.Marshal(cfg)
	return err == nil && bytes.Equal(b, w.key)
}

// config returns a fresh copy of the pool's configuration.
func (w *warmPool) config() config.Config {
	var cfg config.Config
	if err := json.Unmarshal(w.key, &cfg); err != nil {
		panic(err) // key is json.Marshal's output of a Config
	}
	return cfg
}

// noteDemand counts a create of the pool's configuration. w.mu is held.
func (w *warmPool) noteDemand(now time.Time) {
	old := 0
	for old < len(w.creates) && now.Sub(w.creates[old]) > demandWindow {
		old++
	}
	old = max(old, len(w.creates)-maxDemand+1)
	w.creates = append(w.creates[:0], w.creates[old:]...)
	w.creates = append(w.creates, now)
}

// target is how many ready jails the pool wants now: its base size, or
// the most creates within any demandBurst of the last demandWindow, up to
// its maximum. w.mu is held.
func (w *warmPool) target(now time.Time) int {
	peak, first := 0, 0
	for i, t := range w.creates {
		if now.Sub(t) > demandWindow {
			first = i + 1
			continue
		}
		for t.Sub(w.creates[first]) > demandBurst {
			first++
		}
		peak = max(peak, i-first+1)
	}
	return min(max(w.size, peak), w.max)
}

func (w *warmPool) status() *model.WarmPool {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := &model.WarmPool{Size: w.size, Max: w.max, Target: w.target(time.Now()), Ready: len(w.ready), Taken: w.taken}
	if w.lastErr != nil {
		st.Error = w.lastErr.Error()
	}
	return st
}

// startWarm starts keeping ready jails: size at least, up to maxSize
// after bursts (none when size <= 0).
func (m *Manager) startWarm(size, maxSize int) error {
	if size <= 0 {
		return nil
	}
	w, err := newWarmPool(size, maxSize)
	if err != nil {
		return err
	}
	m.warm = w
	m.refillWarm()
	return nil
}

// refillWarm starts background fillers while the pool (ready jails and
// those being started) is below its target, or creates wait, up to
// warmParallel at once; and destroys the ready jails above the target.
func (m *Manager) refillWarm() {
	w := m.warm
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	now := time.Now()
	target := w.target(now)
	// While a burst takes ready jails and some are left, starting more
	// would only take CPU from the jails just handed out (the burst's
	// slowest creates were those beside a refill): wait until the burst
	// pauses, or nearly empties the pool.
	if len(w.waiters) == 0 && len(w.ready) >= max(min(target/4, warmParallel), 1) && now.Sub(w.lastTake) < refillPause {
		if w.resume == nil {
			w.resume = time.AfterFunc(refillPause, func() {
				w.mu.Lock()
				w.resume = nil
				w.mu.Unlock()
				m.refillWarm()
			})
		}
		return
	}
	for w.filling < warmParallel && (len(w.ready)+w.filling < target || len(w.waiters) > w.filling) {
		w.filling++
		w.wg.Add(1)
		go m.fillWarm()
	}
	if extra := len(w.ready) - target; extra > 0 {
		old := slices.Clone(w.ready[:extra])
		w.ready = slices.Delete(w.ready, 0, extra)
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for _, e := range old {
				m.discardWarm(e)
			}
		}()
	}
	// Look again as the bursts leave the window.
	if target > w.size && w.trimmer == nil {
		w.trimmer = time.AfterFunc(demandBurst, func() {
			w.mu.Lock()
			w.trimmer = nil
			w.mu.Unlock()
			m.refillWarm()
		})
	}
}

// fillWarm starts ready jails while the pool wants more (see refillWarm);
// after a failure it waits (doubling up to warmRetryMax) before trying
// again. A jail it starts goes to the first waiting create, else to the
// pool.
func (m *Manager) fillWarm() {
	w := m.warm
	defer w.wg.Done()
	retry := time.Second
	for {
		w.mu.Lock()
		// The others being started count toward the target.
		if w.closed || len(w.ready)+w.filling-1 >= w.target(time.Now()) && len(w.waiters) < w.filling {
			w.filling--
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
		e, err := m.makeWarm()
		w.mu.Lock()
		w.lastErr = err
		kept := err == nil && !w.closed
		switch {
		case err != nil:
			// The creates waiting start jails of their own.
			for _, c := range w.waiters {
				close(c)
			}
			w.waiters = nil
		case kept && len(w.waiters) > 0:
			w.waiters[0] <- e
			w.waiters = w.waiters[1:]
			retry = time.Second
		case kept:
			w.ready = append(w.ready, e)
			retry = time.Second
		}
		w.mu.Unlock()
		switch {
		case err != nil:
			m.log.Error("starting a ready jail for the warm pool", "err", err, "retry_in", retry)
			w.mu.Lock()
			w.backoff++
			w.mu.Unlock()
			select {
			case <-w.stop:
			case <-time.After(retry):
			}
			w.mu.Lock()
			w.backoff--
			w.mu.Unlock()
			retry = min(2*retry, warmRetryMax)
		case !kept: // the pool closed meanwhile
			m.discardWarm(e)
		}
	}
}

// makeWarm prepares and starts one jail of the pool's configuration.
func (m *Manager) makeWarm() (*entry, error) {
	id := newID()
	e := &entry{dir: m.jailDir(id), rec: model.Jail{ID: id, Name: "warm-" + id[:6], Status: model.StateCreated,
		CreatedAt: time.Now().UTC(), Config: m.warm.config()}}
	e.op.Lock()
	defer e.op.Unlock()
	if err := m.build(context.Background(), e, true, true); err != nil {
		return nil, err
	}
	return e, nil
}

// discardWarm destroys a ready jail that is not handed out.
func (m *Manager) discardWarm(e *entry) {
	e.op.Lock()
	defer e.op.Unlock()
	m.unwatch(e)
	m.observeStop(e)
	m.releaseJail(context.Background(), e, false)
}

// takeWarm hands out a ready jail as a new jail named name ("" names it
// after its id), or returns nil when none is ready or the one taken could
// not be renamed (the caller then creates a jail the usual way). With none
// ready while some are being started, it waits for the first of them. A
// name that another jail has is a conflict, and the ready jail stays
// ready.
func (m *Manager) takeWarm(ctx context.Context, name string) (*model.Jail, error) {
	e, err := m.warm.take(ctx)
	if e == nil || err != nil {
		m.refillWarm()
		return nil, err
	}
	w := m.warm
	j, err := m.adoptWarm(ctx, e, name)
	if refused := errors.Is(err, errdefs.ErrQuota) || errors.Is(err, errdefs.ErrForbidden); refused || errors.Is(err, errNameTaken) {
		// The ready jail stays ready for the next create.
		w.give(e, m)
		if refused {
			return nil, err
		}
		return nil, errdefs.Conflictf("a jail named %q already exists", name)
	}
	if err != nil {
		m.log.Error("handing out a ready jail; starting a new one instead", "jail", e.rec.ID, "err", err)
		m.discardWarm(e)
		j = nil
	} else {
		w.mu.Lock()
		w.taken++
		w.mu.Unlock()
	}
	m.refillWarm()
	return j, nil
}

// take counts a create and returns a ready jail: the newest ready one, or
// the next one started when some are being started (nil when none is, the
// refills are failing, or the start failed). A done ctx while waiting is ctx's error.
func (w *warmPool) take(ctx context.Context) (*entry, error) {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil, nil
	}
	w.noteDemand(time.Now())
	if n := len(w.ready); n > 0 {
		e := w.ready[n-1]
		w.ready = w.ready[:n-1]
		w.lastTake = time.Now()
		w.mu.Unlock()
		return e, nil
	}
	if w.filling-w.backoff == 0 {
		// Nothing is being started (a failing refill waits to retry).
		w.mu.Unlock()
		return nil, nil
	}
	c := make(chan *entry, 1)
	w.waiters = append(w.waiters, c)
	w.mu.Unlock()
	select {
	case e := <-c:
		return e, nil
	case <-ctx.Done():
	}
	w.mu.Lock()
	if i := slices.Index(w.waiters, c); i >= 0 {
		w.waiters = slices.Delete(w.waiters, i, i+1)
		w.mu.Unlock()
		return nil, ctx.Err()
	}
	w.mu.Unlock()
	// A jail was handed over meanwhile (or the start failed): keep it.
	if e := <-c; e != nil {
		w.mu.Lock()
		w.ready = append(w.ready, e)
		w.mu.Unlock()
	}
	return nil, ctx.Err()
}

// give puts a ready jail back (a create that took it could not use its
// name), or destroys it when the pool closed meanwhile.
func (w *warmPool) give(e *entry, m *Manager) {
	w.mu.Lock()
	closed := w.closed
	if !closed {
		w.ready = append(w.ready, e)
	}
	w.mu.Unlock()
	if closed {
		m.discardWarm(e)
	}
}

// errNameTaken is adoptWarm's refusal of a name in use.
var errNameTaken = errors.New("name taken")

// adoptWarm renames the ready jail e and registers it as a jail of the API.
func (m *Manager) adoptWarm(ctx context.Context, e *entry, name string) (*model.Jail, error) {
	e.op.Lock()
	defer e.op.Unlock()
	cur := e.snapshot()
	if cur.Status != model.StateRunning {
		return nil, fmt.Errorf("the ready jail is %s: %s", cur.Status, cur.Error)
	}
	if name == "" {
		name = "jail-" + cur.ID[:6]
	}
	oldName := cur.Name
	e.mu.Lock()
	e.rec.Name, e.rec.Tenant = name, tenant.Owner(ctx)
	e.mu.Unlock()
	if err := m.register(e); err != nil {
		e.mu.Lock()
		e.rec.Name, e.rec.Tenant = oldName, ""
		e.mu.Unlock()
		if !errors.Is(err, errdefs.ErrConflict) {
			return nil, err
		}
		return nil, errNameTaken
	}
	b, err := m.backendOf(e)
	if err != nil {
		m.forget(e)
		return nil, err
	}
	if err := b.Rename(ctx, m.instance(e), backend.Status{Running: true, Pid: cur.Pid}); err != nil {
		m.forget(e)
		return nil, err
	}
	now := time.Now().UTC()
	m.setState(e, func(j *model.Jail) { j.CreatedAt = now; j.StartedAt = &now })
	// From here on the jail is the caller's: a crash no longer discards it.
	if err := os.Remove(filepath.Join(e.dir, warmMarker)); err != nil {
		m.forget(e)
		return nil, fmt.Errorf("handing out a ready jail: %w", err)
	}
	return e.view(), nil
}

// stopWarm stops refilling and destroys the ready jails.
func (m *Manager) stopWarm() {
	w := m.warm
	if w == nil {
		return
	}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.closed = true
	close(w.stop)
	ready := w.ready
	w.ready = nil
	for _, c := range w.waiters {
		close(c)
	}
	w.waiters = nil
	for _, t := range []**time.Timer{&w.trimmer, &w.resume} {
		if *t != nil {
			(*t).Stop()
			*t = nil
		}
	}
	w.mu.Unlock()
	w.wg.Wait()
	var wg sync.WaitGroup
	for _, e := range ready {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.discardWarm(e)
		}()
	}
	wg.Wait()
}

// releaseUnfinishedDir destroys what a ready jail of an earlier daemon
// run, or a jail it was still making (a create or restore that had not
// answered), left in dir; it reports false when dir is neither.
func (m *Manager) releaseUnfinishedDir(ctx context.Context, dir string) bool {
	what := "a ready jail of an earlier run"
	if _, err := os.Stat(filepath.Join(dir, warmMarker)); err != nil {
		if _, err := os.Stat(filepath.Join(dir, makingMarker)); err != nil {
			return false
		}
		what = "a jail an earlier run did not finish making"
	}
	e := &entry{dir: dir}
	data, err := os.ReadFile(filepath.Join(dir, "jail.json"))
	if err == nil {
		err = json.Unmarshal(data, &e.rec)
	}
	recordless := err != nil || e.rec.ID != filepath.Base(dir)
	if recordless {
		e.rec = model.Jail{ID: filepath.Base(dir)}
		e.rec.Config.ApplyDefaults()
	}
	m.log.Info("releasing "+what, "jail", e.rec.ID)
	m.releaseJail(ctx, e, recordless)
	return true
}
