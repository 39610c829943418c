package jail

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/tenant"
)

// The warm pool keeps a few jails of the default configuration started and
// ready. A create whose effective configuration is exactly the default
// takes one, which costs a rename (name, UTS host name, the name other
// jails' network rules see) instead of a container start (runc create and
// start, init start-up, network attach: 100-200 ms on a small host). The
// pool refills in the background.
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

type warmPool struct {
	size int
	// key is the default configuration, canonical JSON: a request matches
	// when its effective configuration encodes to the same bytes.
	key []byte

	stop chan struct{} // closed by stopWarm
	wg   sync.WaitGroup

	mu      sync.Mutex
	ready   []*entry
	filling bool
	closed  bool
	taken   uint64
	lastErr error
}

func newWarmPool(size int) (*warmPool, error) {
	cfg := config.Config{}
	cfg.ApplyDefaults()
	key, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	return &warmPool{size: size, key: key, stop: make(chan struct{})}, nil
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

func (w *warmPool) status() *model.WarmPool {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := &model.WarmPool{Size: w.size, Ready: len(w.ready), Taken: w.taken}
	if w.lastErr != nil {
		st.Error = w.lastErr.Error()
	}
	return st
}

// startWarm starts keeping size ready jails (none when size <= 0).
func (m *Manager) startWarm(size int) error {
	if size <= 0 {
		return nil
	}
	w, err := newWarmPool(size)
	if err != nil {
		return err
	}
	m.warm = w
	m.refillWarm()
	return nil
}

// refillWarm starts the background filler unless it runs already.
func (m *Manager) refillWarm() {
	w := m.warm
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || w.filling || len(w.ready) >= w.size {
		return
	}
	w.filling = true
	w.wg.Add(1)
	go m.fillWarm()
}

// fillWarm starts ready jails until the pool is full (or closed); after a
// failure it waits (doubling up to warmRetryMax) before trying again.
func (m *Manager) fillWarm() {
	w := m.warm
	defer w.wg.Done()
	retry := time.Second
	for {
		w.mu.Lock()
		if w.closed || len(w.ready) >= w.size {
			w.filling = false
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
		e, err := m.makeWarm()
		w.mu.Lock()
		w.lastErr = err
		kept := err == nil && !w.closed
		if kept {
			w.ready = append(w.ready, e)
			retry = time.Second
		}
		w.mu.Unlock()
		switch {
		case err != nil:
			m.log.Error("starting a ready jail for the warm pool", "err", err, "retry_in", retry)
			select {
			case <-w.stop:
			case <-time.After(retry):
			}
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
// not be renamed (the caller then creates a jail the usual way). A name
// that another jail has is a conflict, and the ready jail stays ready.
func (m *Manager) takeWarm(ctx context.Context, name string) (*model.Jail, error) {
	w := m.warm
	w.mu.Lock()
	var e *entry
	if n := len(w.ready); n > 0 && !w.closed {
		e = w.ready[n-1]
		w.ready = w.ready[:n-1]
	}
	w.mu.Unlock()
	if e == nil {
		return nil, nil
	}
	j, err := m.adoptWarm(ctx, e, name)
	if refused := errors.Is(err, errdefs.ErrQuota) || errors.Is(err, errdefs.ErrForbidden); refused || errors.Is(err, errNameTaken) {
		// The ready jail stays ready for the next create.
		w.mu.Lock()
		closed := w.closed
		if !closed {
			w.ready = append(w.ready, e)
		}
		w.mu.Unlock()
		if closed {
			m.discardWarm(e)
		}
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
