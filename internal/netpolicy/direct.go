package netpolicy

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Direct connections by name (bridge mode). A domain rule names hosts,
// which the kernel cannot see; the daemon's DNS can. When it answers a
// bridge-mode jail with addresses of a name a domain rule allows, it
// adds them to per-jail nftables sets, one per (protocol, port) that the
// jail's domain rules name (port 0: every port), and the jail may then
// connect to them directly, for learnedTTL after the last answer. A
// jail's sets are refilled from its learned addresses whenever its
// objects in the table change, so a policy update takes effect for new
// connections at once.

// learnedTTL is how long an address the daemon's DNS gave a jail stays
// reachable directly, counted from the last answer naming it. It is far
// longer than the answers' TTL (dnsTTL), since clients cache answers.
const learnedTTL = 10 * time.Minute

// learnedNames are the names the daemon's DNS gave a jail one address
// for, each with the end of its lifetime. Several names may share an
// address (virtual hosts, CDNs): a connection to it cannot tell them
// apart, so it is allowed where any of them is.
type learnedNames map[string]time.Time

// directSet is the kernel set of a jail's learned addresses reachable
// directly on one protocol and port (0: every port).
type directSet struct {
	name  string
	proto byte
	port  int
	addrs []netip.Addr
}

// protoName is the Target protocol of an IP protocol number.
func protoName(p byte) string {
	if p == unix.IPPROTO_UDP {
		return ProtoUDP
	}
	return ProtoTCP
}

// directSets returns the sets of a jail's learned addresses under policy
// cp: one per (protocol, port) its domain allow rules name, each holding
// the addresses still fresh at now that the policy allows there. An
// address joins an every-port set only when a domain rule without ports
// allows its name and no block rule matches it on any port; narrower
// cases go by the port sets.
func directSets(id string, cp *compiledPolicy, learned map[netip.Addr]learnedNames, extra []netip.Prefix, now time.Time) []directSet {
	type key struct {
		proto byte
		port  int
	}
	var keys []key
	for _, c := range slices.Concat(cp.alwaysAllow, cp.allow) {
		if c.domain == "" {
			continue
		}
		for _, p := range []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
			if c.Protocol != "" && c.Protocol != protoName(p) {
				continue
			}
			if len(c.Ports) == 0 {
				keys = append(keys, key{p, 0})
			}
			for _, port := range c.Ports {
				keys = append(keys, key{p, port})
			}
		}
	}
	slices.SortFunc(keys, func(a, b key) int { return int(a.proto)*65536 + a.port - int(b.proto)*65536 - b.port })
	keys = slices.Compact(keys)
	addrs := slices.SortedFunc(maps.Keys(learned), netip.Addr.Compare)
	sets := make([]directSet, 0, len(keys))
	for _, k := range keys {
		s := directSet{name: fmt.Sprintf("d_%s_%d_%d", id, k.proto, k.port), proto: k.proto, port: k.port}
		for _, a := range addrs {
			for name, until := range learned[a] {
				t := Target{Host: name, IP: a, Port: k.port, Proto: protoName(k.proto)}
				if now.Before(until) && (k.port != 0 && cp.decide(t, extra).Allow || k.port == 0 && cp.allowsEveryPort(t, extra)) {
					s.addrs = append(s.addrs, a)
					break
				}
			}
		}
		sets = append(sets, s)
	}
	return sets
}

// allowsEveryPort reports whether t (with Port 0) is allowed on every
// port: the address passes the protected check, no block rule matches it
// on any port, and a domain rule without ports allows its name.
func (cp *compiledPolicy) allowsEveryPort(t Target, extra []netip.Prefix) bool {
	if !cp.decide(t, extra).Allow {
		return false
	}
	for _, c := range cp.block {
		if c.match(t, t.Host) {
			return false
		}
	}
	for _, c := range slices.Concat(cp.alwaysAllow, cp.allow) {
		if c.domain != "" && len(c.Ports) == 0 && c.matchPort(0, t.Proto) && c.matchName(t.Host) {
			return true
		}
	}
	return false
}

// directRules returns one accepting rule per direct set of jail j, for
// its egress chain.
func (rs *ruleset) directRules(j jailRules) []*rb {
	var rules []*rb
	for _, s := range j.direct {
		r := rule().ip4().l4(s.proto)
		if s.port != 0 {
			r = r.dport(s.port)
		}
		r.add(&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: s.name})
		rules = append(rules, r.note(rs, j.id, true, ruleDNS).accept())
	}
	return rules
}

// elements are the set's addresses as nftables set elements.
func (s directSet) elements() []nftables.SetElement {
	elems := make([]nftables.SetElement, 0, len(s.addrs))
	for _, a := range s.addrs {
		b := a.As4()
		elems = append(elems, nftables.SetElement{Key: b[:]})
	}
	return elems
}

// ruleDNS is the kernel's label for a direct connection to a learned
// address; the record names the rule that allowed it instead.
const ruleDNS = "dns"

// learn records the addresses the daemon's DNS is about to give a
// bridge-mode jail for name, and adds those new to it that the policy
// allows directly to the kernel's sets before the answer leaves, so the
// jail's first connection finds them. An address already learned for the
// name is in the sets since the table was last built (which used every
// learned address): its answer only extends its lifetime.
func (m *Manager) learn(js *jailState, name string, addrs []netip.Addr) {
	if len(addrs) == 0 {
		return
	}
	extra := m.extraProtected()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.jails[js.id] != js || js.mode != ModeBridge {
		return // detached meanwhile, or not in bridge mode
	}
	now := m.now()
	if js.learned == nil {
		js.learned = map[netip.Addr]learnedNames{}
	}
	fresh := map[netip.Addr]learnedNames{}
	for _, a := range addrs {
		if js.learned[a] == nil {
			js.learned[a] = learnedNames{}
		}
		if until, ok := js.learned[a][name]; !ok || !now.Before(until) {
			fresh[a] = learnedNames{name: now.Add(learnedTTL)}
		}
		js.learned[a][name] = now.Add(learnedTTL)
	}
	m.schedulePrune(now.Add(learnedTTL))
	if len(fresh) == 0 {
		return
	}
	c, err := nftables.New()
	if err != nil {
		m.log.Warn("nftables", "err", err)
		return
	}
	t := &nftables.Table{Name: m.table, Family: nftables.TableFamilyINet}
	var added []directSet
	for _, s := range directSets(js.id, js.pol(), fresh, extra, now) {
		if len(s.addrs) == 0 {
			continue
		}
		if err := c.SetAddElements(&nftables.Set{Table: t, Name: s.name, KeyType: nftables.TypeIPAddr}, s.elements()); err != nil {
			m.log.Warn("nftables: learned addresses", "jail", js.id, "err", err)
			return
		}
		added = append(added, s)
	}
	if len(added) == 0 {
		return
	}
	if err := c.Flush(); err != nil {
		m.log.Warn("nftables: learned addresses", "jail", js.id, "name", name, "err", err)
		return
	}
	if o := m.installed[js.id]; o != nil {
		for _, s := range added {
			for i := range o.sets {
				if o.sets[i].name == s.name {
					merged := slices.Concat(o.sets[i].addrs, s.addrs)
					slices.SortFunc(merged, netip.Addr.Compare)
					o.sets[i].addrs = slices.Compact(merged)
				}
			}
		}
	}
}

// schedulePrune makes sure the learned addresses are pruned (and taken
// out of their sets) no later than a minute after at. m.mu is
// held.
func (m *Manager) schedulePrune(at time.Time) {
	if !m.pruneAt.IsZero() && !m.pruneAt.After(at.Add(time.Minute)) {
		return
	}
	if m.pruner != nil {
		m.pruner.Stop()
	}
	m.pruneAt = at.Add(time.Minute)
	m.pruner = time.AfterFunc(m.pruneAt.Sub(m.now()), m.pruneLearned)
}

// pruneLearned forgets the learned addresses that expired and takes them
// out of the sets of their jails.
func (m *Manager) pruneLearned() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pruneAt, m.pruner = time.Time{}, nil
	select {
	case <-m.closing:
		return
	default:
	}
	now := m.now()
	var next time.Time
	var pruned []string
	for _, js := range m.jails {
		for a, names := range js.learned {
			for name, until := range names {
				if !now.Before(until) {
					delete(names, name)
					if !slices.Contains(pruned, js.id) {
						pruned = append(pruned, js.id)
					}
				} else if next.IsZero() || until.Before(next) {
					next = until
				}
			}
			if len(names) == 0 {
				delete(js.learned, a)
			}
		}
	}
	if len(pruned) > 0 {
		if err := m.syncLocked(pruned...); err != nil {
			m.log.Warn("nftables: pruning learned addresses", "err", err)
		}
	}
	if !next.IsZero() {
		m.schedulePrune(next)
	}
}

// learnedRule names, for a direct connection of jail id to a learned
// address, the host and the rule that allowed it: the first fresh name
// of the address (in order) whose rules allow the port.
func (m *Manager) learnedRule(id string, t Target, extra []netip.Prefix) (host, rule string, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	js, found := m.jails[id]
	if !found {
		return "", "", false
	}
	now := m.now()
	names := js.learned[t.IP]
	for _, name := range slices.Sorted(maps.Keys(names)) {
		t.Host = name
		if d := js.pol().decide(t, extra); d.Allow && now.Before(names[name]) {
			return name, d.Rule, true
		}
	}
	return "", "", false
}
