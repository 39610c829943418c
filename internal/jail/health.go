package jail

import (
	"context"
	"fmt"
	"time"

	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/observe"
)

// probeInterval is how often the init of an unresponsive jail is pinged
// until it answers again.
const probeInterval = time.Second

// health is what the manager knows of a running jail's init beyond its
// lifecycle state: whether it answers. Guarded by entry.mu.
type health struct {
	// unresponsive is set when a call found that init does not answer,
	// and cleared when a probe gets an answer or the run ends.
	unresponsive bool
	since        time.Time
	pid          int // init's host pid when it was found unresponsive
}

// client returns the init client of a running jail that reports to the
// manager when init stops answering; it fails fast with ErrUnresponsive
// while the jail is known to be unresponsive.
func (m *Manager) client(e *entry, b backend.Backend, inst backend.Instance) (*initclient.Client, error) {
	e.mu.RLock()
	h, name, pid := e.health, e.rec.Name, e.rec.Pid
	e.mu.RUnlock()
	if h.unresponsive && h.pid == pid {
		return nil, errdefs.New(errdefs.ErrUnresponsive,
			"jail %s: its init has not answered since %s; stop or destroy the jail, or wait for it to answer again",
			name, h.since.Format(time.RFC3339))
	}
	if ka, ok := b.(backend.InitKeepAlive); !ok || !ka.KeepInitConnections(inst) {
		c := m.control(b, inst)
		c.OnUnresponsive = func(err error) { m.markUnresponsive(e, err) }
		return c, nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ctl == nil || e.ctlPid != e.rec.Pid {
		if e.ctl != nil {
			e.ctl.Close()
		}
		e.ctl, e.ctlPid = initclient.NewKeepAlive(b.InitDialer(inst), idleInitConns), e.rec.Pid
		e.ctl.OnUnresponsive = func(err error) { m.markUnresponsive(e, err) }
	}
	return e.ctl, nil
}

// idleInitConns is how many idle connections to each running jail's init
// the manager keeps open (for backends that allow it).
const idleInitConns = 4

// dropControl closes the idle connections of the jail's kept init client
// once its run ended (or changed); the next call makes a new client.
// Called with e.mu held.
func (e *entry) dropControl() {
	if e.ctl != nil && (e.rec.Status != model.StateRunning || e.rec.Pid != e.ctlPid) {
		e.ctl.Close()
		e.ctl = nil
	}
}

// markUnresponsive records that the running jail's init does not answer
// (once per episode: a jail event, a log line) and probes it until it
// answers again or the run ends.
func (m *Manager) markUnresponsive(e *entry, cause error) {
	e.mu.Lock()
	if e.health.unresponsive || e.rec.Status != model.StateRunning {
		e.mu.Unlock()
		return
	}
	pid := e.rec.Pid
	e.health = health{unresponsive: true, since: time.Now().UTC(), pid: pid}
	id := e.rec.ID
	e.mu.Unlock()
	m.log.Warn("jail init does not answer", "jail", id, "pid", pid, "err", cause)
	m.jailEvent(e, "unresponsive", fmt.Sprintf("init (pid %d) does not answer: %v", pid, cause))
	go m.probe(e, pid)
}

// probe pings an unresponsive jail's init until it answers (the jail is
// then running again) or the run it was found in has ended.
func (m *Manager) probe(e *entry, pid int) {
	t := time.NewTicker(probeInterval)
	defer t.Stop()
	for range t.C {
		e.mu.RLock()
		same := e.rec.Status == model.StateRunning && e.rec.Pid == pid
		e.mu.RUnlock()
		if !same {
			m.clearUnresponsive(e, pid, "")
			return
		}
		b, err := m.backendOf(e)
		if err != nil {
			m.clearUnresponsive(e, pid, "")
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), initclient.PingTimeout)
		err = m.control(b, m.instance(e)).Ping(ctx)
		cancel()
		if err == nil {
			m.clearUnresponsive(e, pid, fmt.Sprintf("init (pid %d) answers again", pid))
			return
		}
	}
}

// clearUnresponsive ends an unresponsive episode of the run of init pid;
// a non-empty message is recorded as a jail event.
func (m *Manager) clearUnresponsive(e *entry, pid int, msg string) {
	e.mu.Lock()
	if !e.health.unresponsive || e.health.pid != pid {
		e.mu.Unlock()
		return
	}
	e.health = health{}
	id := e.rec.ID
	e.mu.Unlock()
	if msg != "" {
		m.log.Info("jail init answers again", "jail", id, "pid", pid)
		m.jailEvent(e, "responsive", msg)
	}
}

// jailEvent records a jail event in the jail's current observation.
func (m *Manager) jailEvent(e *entry, op, msg string) {
	e.mu.RLock()
	o := e.obs
	e.mu.RUnlock()
	if o == nil {
		return
	}
	o.Handle(&observe.Event{Type: observe.TypeJail, TS: time.Now().UnixNano(), Op: op, Message: msg})
}
