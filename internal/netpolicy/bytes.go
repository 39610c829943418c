package netpolicy

import (
	"strings"
	"time"

	"github.com/google/nftables"
)

// Direct bytes (bridge mode). The proxies charge the bytes they carry to
// a jail's bytes_per_hour budget; the bytes of a bridge jail's direct
// connections pass the kernel only, so the table counts them: a named
// counter per such jail, fed by its veth's forwarded packets both ways.
// The manager reads and resets the counters every bytesPoll (a jail's
// counter lives as long as it is attached and counted, whatever happens
// to other jails), charges the budgets, and once one is spent refuses
// the jail's new connections as it does when the proxies spend it.

// bytesPoll is how often the counters of direct bytes are read.
const bytesPoll = time.Second

// counterPrefix names the per-jail counters of direct bytes.
const counterPrefix = "b_"

// countsBytes reports whether the kernel counts a jail's direct bytes: a
// bridge jail with a byte budget.
func countsBytes(mode string, cp *compiledPolicy) bool {
	return mode == ModeBridge && cp.src.BytesPerHour > 0
}

// overBudget is a jail whose budget is spent (why names the limit) while
// the kernel still lets its direct connections through.
type overBudget struct {
	js  *jailState
	why string
}

// harvestBytesLocked reads and resets the table's counters: direct bytes
// are charged to the jails' budgets, UDP DNS queries the kernel dropped
// over a jail's rate are counted and recorded (dnsDropped); it returns the
// jails now over budget. m.mu is held.
func (m *Manager) harvestBytesLocked() []overBudget {
	if len(m.jails) == 0 {
		return nil // every jail has a counter of dropped DNS queries
	}
	c, err := nftables.New()
	if err != nil {
		m.log.Warn("nftables", "err", err)
		return nil
	}
	objs, err := c.ResetObjects(&nftables.Table{Name: m.table, Family: nftables.TableFamilyINet})
	if err != nil {
		m.log.Warn("reading the counters of direct bytes", "err", err)
		return nil
	}
	var over []overBudget
	for _, o := range objs {
		co, ok := o.(*nftables.CounterObj)
		if !ok {
			continue
		}
		if id, ok := strings.CutPrefix(co.Name, dnsCounterPrefix); ok && co.Packets > 0 {
			if js := m.jails[id]; js != nil {
				m.dnsDropped(js, dnsDropRate, co.Packets)
			}
			continue
		}
		if !strings.HasPrefix(co.Name, counterPrefix) || co.Bytes == 0 {
			continue
		}
		js := m.jails[strings.TrimPrefix(co.Name, counterPrefix)]
		if js == nil {
			continue
		}
		l := js.limiter()
		l.spend(int64(co.Bytes))
		if why := l.exhausted(); why != "" && js.limited != why {
			over = append(over, overBudget{js, why})
		}
	}
	return over
}

// pollBytes charges direct bytes every bytesPoll until the manager closes.
func (m *Manager) pollBytes() {
	defer m.wg.Done()
	t := time.NewTicker(bytesPoll)
	defer t.Stop()
	for {
		select {
		case <-m.closing:
			return
		case <-t.C:
		}
		m.mu.Lock()
		over := m.harvestBytesLocked()
		m.mu.Unlock()
		for _, o := range over {
			m.overLimit(o.js, o.why)
		}
	}
}
