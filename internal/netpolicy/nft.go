package netpolicy

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"path"
	"reflect"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// rb builds the expressions of one nftables rule.
type rb struct{ e []expr.Any }

func rule() *rb { return &rb{} }

func ifnameBytes(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

func (r *rb) add(e ...expr.Any) *rb { r.e = append(r.e, e...); return r }

func (r *rb) meta(key expr.MetaKey, op expr.CmpOp, data []byte) *rb {
	return r.add(&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: op, Register: 1, Data: data})
}

// iif matches the input interface; with prefix set, every name starting
// with name (nft's "name*").
func (r *rb) iif(name string, prefix bool) *rb {
	if prefix {
		return r.meta(expr.MetaKeyIIFNAME, expr.CmpOpEq, []byte(name))
	}
	return r.meta(expr.MetaKeyIIFNAME, expr.CmpOpEq, ifnameBytes(name))
}

func (r *rb) oif(name string, prefix bool, op expr.CmpOp) *rb {
	if prefix {
		return r.meta(expr.MetaKeyOIFNAME, op, []byte(name))
	}
	return r.meta(expr.MetaKeyOIFNAME, op, ifnameBytes(name))
}

func (r *rb) ip4() *rb {
	return r.meta(expr.MetaKeyNFPROTO, expr.CmpOpEq, []byte{unix.NFPROTO_IPV4})
}

func (r *rb) l4(proto byte) *rb {
	return r.meta(expr.MetaKeyL4PROTO, expr.CmpOpEq, []byte{proto})
}

// addr matches the IPv4 source (off 12) or destination (off 16) against p
// (op Eq: inside, Neq: outside). The caller has matched ip4 first.
func (r *rb) addr(off uint32, p netip.Prefix, op expr.CmpOp) *rb {
	r.add(&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4})
	if p.Bits() < 32 {
		mask := make([]byte, 4)
		binary.BigEndian.PutUint32(mask, ^uint32(0)<<(32-p.Bits()))
		r.add(&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)})
	}
	a := p.Masked().Addr().As4()
	return r.add(&expr.Cmp{Op: op, Register: 1, Data: a[:]})
}

func (r *rb) saddr(p netip.Prefix) *rb { return r.addr(12, p, expr.CmpOpEq) }
func (r *rb) daddr(p netip.Prefix) *rb { return r.addr(16, p, expr.CmpOpEq) }

func (r *rb) dport(port int) *rb {
	b := make([]byte, 2)
	binary.BigEndian.PutUint16(b, uint16(port))
	return r.add(&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b})
}

// ctState matches when the connection state has any of bits.
func (r *rb) ctState(bits uint32) *rb {
	b := make([]byte, 4)
	binary.NativeEndian.PutUint32(b, bits)
	return r.add(&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: b, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)})
}

// log sends the packet to nflog group with prefix (truncated to the
// kernel's limit).
func (r *rb) log(group uint16, prefix string) *rb {
	if len(prefix) > 127 {
		prefix = prefix[:127]
	}
	return r.add(&expr.Log{Key: 1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_PREFIX | 1<<unix.NFTA_LOG_SNAPLEN,
		Group: group, Snaplen: 64, Data: []byte(prefix)})
}

// note logs the packet for the connection record: the prefix is
// "<jail id> <a|b> <rule>" (a: allowed, b: refused).
func (r *rb) note(rs *ruleset, id string, allow bool, label string) *rb {
	v := " b "
	if allow {
		v = " a "
	}
	return r.log(rs.group, id+v+label)
}

func (r *rb) verdict(k expr.VerdictKind, chain string) *rb {
	return r.add(&expr.Verdict{Kind: k, Chain: chain})
}

func (r *rb) accept() *rb            { return r.verdict(expr.VerdictAccept, "") }
func (r *rb) drop() *rb              { return r.verdict(expr.VerdictDrop, "") }
func (r *rb) jump(chain string) *rb  { return r.verdict(expr.VerdictJump, chain) }
func (r *rb) gotoC(chain string) *rb { return r.verdict(expr.VerdictGoto, chain) }
func (r *rb) refuse() *rb            { return r.gotoC(chainRefuse) }
func (r *rb) masquerade() *rb        { return r.add(&expr.Masq{}) }
func (r *rb) dnat(a netip.Addr, port int) *rb {
	ab := a.As4()
	pb := make([]byte, 2)
	binary.BigEndian.PutUint16(pb, uint16(port))
	return r.add(&expr.Immediate{Register: 1, Data: ab[:]},
		&expr.Immediate{Register: 2, Data: pb},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true})
}

// ruleMatches appends the port/protocol part of a policy rule to a copy
// of base and returns one rule per (protocol, port) combination.
func portRules(base func() *rb, proto string, ports []int) []*rb {
	protos := []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP}
	switch proto {
	case ProtoTCP:
		protos = protos[:1]
	case ProtoUDP:
		protos = protos[1:]
	}
	if len(ports) == 0 && proto == "" {
		return []*rb{base()}
	}
	var out []*rb
	for _, p := range protos {
		if len(ports) == 0 {
			out = append(out, base().l4(p))
			continue
		}
		for _, port := range ports {
			out = append(out, base().l4(p).dport(port))
		}
	}
	return out
}

const (
	chainRefuse  = "refuse"
	chainGuard   = "guard"
	chainPreNAT  = "pre_nat"
	chainInput   = "input"
	chainForward = "forward"
	chainPostNAT = "post_nat"
)

// The table has a shared part, which New builds once: the base chains,
// the refusal chain, and verdict maps that send a packet, by the jail
// interface it comes in on or goes out to, to that jail's own chains.
// Everything else belongs to one jail: chains, direct sets, counters and
// its interface's elements in the maps, all named after its id. They are
// added, changed and removed in a transaction of their own (see
// Manager.syncLocked), so attaching or detaching a jail leaves every
// other jail's objects as they are, save the chains of inter-jail rules
// of the jails a rule relates it to.

// Verdict maps of the shared part: a jail's host-side interface name →
// jump to one of its chains.
const (
	mapGuard    = "guard_of"
	mapPreNAT   = "pre_nat_of"
	mapInput    = "input_of"
	mapFrom     = "from_jail"
	mapTo       = "to_jail"
	mapBytesIn  = "bytes_from"
	mapBytesOut = "bytes_to"
)

// Prefixes of a jail's chains (followed by its id).
const (
	chainGuardOf   = "g_" // anti-spoofing and the DNS rate limit
	chainPreNATOf  = "p_" // redirection to the daemon's services
	chainInputOf   = "h_" // what the jail may reach on the host
	chainFromOf    = "f_" // forwarded from the jail: inter-jail rules, then egress
	chainEgressOf  = "j_" // egress policy
	chainNamedOf   = "n_" // protected addresses a rule names
	chainIngressOf = "i_" // forwarded to the jail from outside
	chainBytesOf   = "c_" // counts direct bytes
)

// jailRules is the kernel view of one attached jail.
type jailRules struct {
	id, name, veth string
	ip             netip.Addr
	mode           string
	policy         *compiledPolicy
	// limited names the rate limit the jail is over ("" when none): its
	// direct connections are refused until the budget refills.
	limited string
	// direct are the sets of learned addresses the jail may reach
	// directly (bridge mode; see direct.go).
	direct []directSet
}

// ruleset is what the rules of the manager's table are made from: the
// shared settings and the attached jails (for inter-jail rules).
type ruleset struct {
	table     string
	prefix    string // host-side interface name prefix of the jails' veths
	subnet    netip.Prefix
	daemon    netip.Addr
	group     uint16
	ports     servicePorts
	jails     []jailRules    // every attached jail, by id
	protected []netip.Prefix // protected IPv4 ranges for the kernel
}

// jailObjs is everything one jail owns in the table.
type jailObjs struct {
	veth     string
	counters []string
	sets     []directSet
	chains   []jailChain
	elems    []mapElem
}

// jailChain is one of a jail's chains and its rules.
type jailChain struct {
	name  string
	rules []*rb
}

// mapElem sends the jail's interface in verdict map vmap to chain.
type mapElem struct{ vmap, chain string }

// withChain returns a copy of o whose chain name holds rules.
func (o *jailObjs) withChain(name string, rules []*rb) *jailObjs {
	n := *o
	n.chains = slices.Clone(o.chains)
	for i := range n.chains {
		if n.chains[i].name == name {
			n.chains[i].rules = rules
		}
	}
	return &n
}

// chain returns the rules of o's chain name.
func (o *jailObjs) chain(name string) []*rb {
	for _, c := range o.chains {
		if c.name == name {
			return c.rules
		}
	}
	return nil
}

// nlBuffer is the netlink socket buffer size for table transactions: the
// kernel acknowledges every message of the batch, and a transaction may
// replace many jails' objects at once (pruning learned addresses).
const nlBuffer = 32 << 20

// bigBuffers sizes a transaction's netlink socket for a large batch.
func bigBuffers(c *netlink.Conn) error {
	if err := c.SetReadBuffer(nlBuffer); err != nil {
		return err
	}
	return c.SetWriteBuffer(nlBuffer)
}

// vmap is the verdict map called name in t.
func vmap(t *nftables.Table, name string) *nftables.Set {
	return &nftables.Set{Table: t, Name: name, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict}
}

// dispatch looks the packet's input (or output) interface up in verdict
// map name.
func (r *rb) dispatch(key expr.MetaKey, set *nftables.Set) *rb {
	return r.add(&expr.Meta{Key: key, Register: 1},
		&expr.Lookup{SourceRegister: 1, IsDestRegSet: true, DestRegister: 0, SetName: set.Name, SetID: set.ID})
}

// applyBase replaces the manager's table with its shared part, without
// jails, in one transaction.
func (rs *ruleset) applyBase() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	t := &nftables.Table{Name: rs.table, Family: nftables.TableFamilyINet}
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	maps := map[string]*nftables.Set{}
	for _, name := range []string{mapGuard, mapPreNAT, mapInput, mapFrom, mapTo, mapBytesIn, mapBytesOut} {
		s := vmap(t, name)
		if err := c.AddSet(s, nil); err != nil {
			return fmt.Errorf("nftables: map %s: %w", name, err)
		}
		maps[name] = s
	}
	add := func(ch *nftables.Chain, rules ...*rb) {
		for _, r := range rules {
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r.e})
		}
	}
	base := func(name string, typ nftables.ChainType, hook *nftables.ChainHook, prio *nftables.ChainPriority) *nftables.Chain {
		return c.AddChain(&nftables.Chain{Name: name, Table: t, Type: typ, Hooknum: hook, Priority: prio})
	}
	refuse := c.AddChain(&nftables.Chain{Name: chainRefuse, Table: t})
	add(refuse, rule().l4(unix.IPPROTO_TCP).add(&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}),
		rule().add(&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}))

	guard := base(chainGuard, nftables.ChainTypeFilter, nftables.ChainHookPrerouting, nftables.ChainPriorityRaw)
	preNAT := base(chainPreNAT, nftables.ChainTypeNAT, nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest)
	input := base(chainInput, nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter)
	forward := base(chainForward, nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter)
	postNAT := base(chainPostNAT, nftables.ChainTypeNAT, nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource)

	in, out := expr.MetaKeyIIFNAME, expr.MetaKeyOIFNAME
	add(guard, rule().dispatch(in, maps[mapGuard]))
	add(preNAT, rule().dispatch(in, maps[mapPreNAT]))
	add(input, rule().iif(rs.prefix, true).ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED).accept(),
		rule().dispatch(in, maps[mapInput]),
		rule().iif(rs.prefix, true).drop())
	// Direct bytes are counted first, then established connections pass;
	// a new one goes by the chains of the jail it comes from, else of the
	// jail it goes to.
	add(forward, rule().dispatch(in, maps[mapBytesIn]), rule().dispatch(out, maps[mapBytesOut]),
		rule().ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED).accept(),
		rule().iif(rs.prefix, true).ctState(expr.CtStateBitINVALID).drop(),
		rule().dispatch(in, maps[mapFrom]), rule().dispatch(out, maps[mapTo]),
		// Interfaces of ours that no attached jail owns: nothing passes.
		rule().iif(rs.prefix, true).refuse(), rule().oif(rs.prefix, true, expr.CmpOpEq).refuse())
	add(postNAT, rule().ip4().saddr(rs.subnet).oif(rs.prefix, true, expr.CmpOpNeq).masquerade())

	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: replacing table %s: %w", rs.table, err)
	}
	return nil
}

// objects returns what jail j owns in the table.
func (rs *ruleset) objects(j jailRules) *jailObjs {
	o := &jailObjs{veth: j.veth}
	id := j.id
	guard, preNAT, input := chainGuardOf+id, chainPreNATOf+id, chainInputOf+id
	from, egress, named, ingress := chainFromOf+id, chainEgressOf+id, chainNamedOf+id, chainIngressOf+id
	jp := netip.PrefixFrom(j.ip, 32)
	daemon := netip.PrefixFrom(rs.daemon, 32)

	// DNS over UDP past the jail's rate is dropped (and counted) first,
	// before it can fill the daemon's socket for every jail; then
	// anti-spoofing: a jail sends IPv4 from its own address only.
	o.counters = append(o.counters, dnsCounterPrefix+id)
	g := append(rs.dnsLimit(j), rule().ip4().saddr(jp).accept(), rule().drop())

	// Transparent redirection of HTTP, HTTPS and DNS to the daemon.
	notJails := func() *rb { return rule().ip4().addr(16, rs.subnet, expr.CmpOpNeq) }
	p := []*rb{
		notJails().l4(unix.IPPROTO_TCP).dport(80).dnat(rs.daemon, rs.ports.HTTP),
		notJails().l4(unix.IPPROTO_TCP).dport(443).dnat(rs.daemon, rs.ports.TLS),
		rule().ip4().l4(unix.IPPROTO_UDP).dport(53).dnat(rs.daemon, rs.ports.DNS),
		rule().ip4().l4(unix.IPPROTO_TCP).dport(53).dnat(rs.daemon, rs.ports.DNS),
	}

	// The daemon's services are the only local destinations.
	var h []*rb
	for _, port := range rs.ports.tcp() {
		h = append(h, rule().ip4().daddr(daemon).l4(unix.IPPROTO_TCP).dport(port).accept())
	}
	h = append(h, rule().ip4().daddr(daemon).l4(unix.IPPROTO_UDP).dport(rs.ports.DNS).accept())
	if j.mode == ModeBridge {
		// Host addresses named exactly by a rule.
		for _, c := range slices.Concat(j.policy.alwaysAllow, j.policy.allow) {
			if c.prefix.IsValid() && c.prefix.Addr().Is4() && c.prefix.Bits() == 32 && c.prefix != daemon {
				for _, r := range portRules(func() *rb { return rule().ip4().daddr(c.prefix) }, c.Protocol, c.Ports) {
					h = append(h, r.gotoC(named))
				}
			}
		}
	}
	h = append(h, rule().note(rs, id, false, "protected:host").refuse())

	// Egress of the jail, after inter-jail rules (its chain "from").
	var e, n []*rb
	if j.limited != "" {
		e = append(e, rule().note(rs, id, false, j.limited).refuse())
		n = append(n, rule().note(rs, id, false, j.limited).refuse())
	}
	if j.mode == ModeBridge {
		o.sets = j.direct
		be, bn := rs.bridgeEgress(j, named, rs.directRules(j))
		e, n = append(e, be...), append(n, bn...)
	} else {
		e = append(e, rule().note(rs, id, false, "mode:"+j.mode).refuse())
	}
	// Ingress from outside the host.
	var i []*rb
	for _, c := range j.policy.ingress {
		if !c.prefix.Addr().Is4() {
			continue
		}
		for _, r := range portRules(func() *rb { return rule().ip4().saddr(c.prefix) }, c.Protocol, c.Ports) {
			i = append(i, r.note(rs, id, true, "ingress:"+c.Destination).accept())
		}
	}
	i = append(i, rule().note(rs, id, false, "ingress:default").refuse())

	o.chains = []jailChain{{guard, g}, {preNAT, p}, {input, h}, {from, rs.fromRules(j)},
		{egress, e}, {named, n}, {ingress, i}}
	o.elems = []mapElem{{mapGuard, guard}, {mapPreNAT, preNAT}, {mapInput, input}, {mapFrom, from}, {mapTo, ingress}}
	if countsBytes(j.mode, j.policy) {
		o.counters = append(o.counters, counterPrefix+id)
		o.chains = append(o.chains, jailChain{chainBytesOf + id, []*rb{rule().add(
			&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: counterPrefix + id})}})
		o.elems = append(o.elems, mapElem{mapBytesIn, chainBytesOf + id}, mapElem{mapBytesOut, chainBytesOf + id})
	}
	return o
}

// fromRules are the rules of the chain for what jail a sends to be
// forwarded: the inter-jail rules between a and each other attached jail
// (refusals, then acceptances), the default refusal of other jails, then
// a's egress policy.
func (rs *ruleset) fromRules(a jailRules) []*rb {
	var out []*rb
	for _, b := range rs.jails {
		if a.id == b.id {
			continue
		}
		for _, allow := range []bool{false, true} {
			for _, cp := range []*compiledPolicy{a.policy, b.policy} {
				for _, r := range cp.src.InterJail {
					if r.Allow != allow || !interJailRuleMatches(r, a.name, b.name) {
						continue
					}
					for _, x := range portRules(func() *rb { return rule().oif(b.veth, false, expr.CmpOpEq) }, "", r.Ports) {
						x = x.note(rs, a.id, allow, "inter_jail:"+r.From+"->"+r.To)
						if allow {
							out = append(out, x.accept())
						} else {
							out = append(out, x.refuse())
						}
					}
				}
			}
		}
	}
	return append(out, rule().oif(rs.prefix, true, expr.CmpOpEq).note(rs, a.id, false, "inter_jail:default").refuse(),
		rule().jump(chainEgressOf+a.id))
}

// fromTail is the number of rules that end every chain fromRules makes:
// a chain of no more holds no inter-jail rule.
const fromTail = 2

// tx is one transaction on the manager's table.
type tx struct {
	c *nftables.Conn
	t *nftables.Table
	// msgs counts the messages of the transaction.
	msgs int
}

func (x *tx) chain(name string) *nftables.Chain { return &nftables.Chain{Name: name, Table: x.t} }

func (x *tx) set(s directSet) *nftables.Set {
	return &nftables.Set{Table: x.t, Name: s.name, KeyType: nftables.TypeIPAddr}
}

// change adds to x what turns a jail's objects old into new; old is nil
// for a jail being attached, new for one being detached. Objects are
// made before what refers to them and removed after.
func (x *tx) change(old, new *jailObjs) error {
	if old == nil {
		old = &jailObjs{}
	}
	if new == nil {
		new = &jailObjs{veth: old.veth}
	}
	for _, n := range new.counters {
		if !slices.Contains(old.counters, n) {
			x.c.AddObj(&nftables.CounterObj{Table: x.t, Name: n})
			x.msgs++
		}
	}
	oldSets := map[string]directSet{}
	for _, s := range old.sets {
		oldSets[s.name] = s
	}
	for _, s := range new.sets {
		o, had := oldSets[s.name]
		switch {
		case !had:
			if err := x.c.AddSet(x.set(s), s.elements()); err != nil {
				return fmt.Errorf("nftables: set %s: %w", s.name, err)
			}
			x.msgs += 2
		case !slices.Equal(o.addrs, s.addrs):
			x.c.FlushSet(x.set(s))
			x.msgs++
			if len(s.addrs) > 0 {
				if err := x.c.SetAddElements(x.set(s), s.elements()); err != nil {
					return fmt.Errorf("nftables: set %s: %w", s.name, err)
				}
				x.msgs++
			}
		}
	}
	oldChains := map[string][]*rb{}
	for _, c := range old.chains {
		oldChains[c.name] = c.rules
	}
	var fill []jailChain
	for _, c := range new.chains {
		rules, had := oldChains[c.name]
		switch {
		case !had:
			x.c.AddChain(x.chain(c.name))
			x.msgs++
		case !reflect.DeepEqual(rules, c.rules):
			x.c.FlushChain(x.chain(c.name))
			x.msgs++
		default:
			continue
		}
		fill = append(fill, c)
	}
	for _, c := range fill {
		for _, r := range c.rules {
			x.c.AddRule(&nftables.Rule{Table: x.t, Chain: x.chain(c.name), Exprs: r.e})
			x.msgs++
		}
	}
	key := ifnameBytes(new.veth)
	for _, e := range new.elems {
		if !slices.Contains(old.elems, e) {
			el := nftables.SetElement{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: e.chain}}
			if err := x.c.SetAddElements(vmap(x.t, e.vmap), []nftables.SetElement{el}); err != nil {
				return fmt.Errorf("nftables: map %s: %w", e.vmap, err)
			}
			x.msgs++
		}
	}
	// Removal: map elements, then the chains (emptied first: they may
	// refer to each other), sets and counters.
	for _, e := range old.elems {
		if !slices.Contains(new.elems, e) {
			if err := x.c.SetDeleteElements(vmap(x.t, e.vmap), []nftables.SetElement{{Key: ifnameBytes(old.veth)}}); err != nil {
				return fmt.Errorf("nftables: map %s: %w", e.vmap, err)
			}
			x.msgs++
		}
	}
	var gone []string
	for _, c := range old.chains {
		if !slices.ContainsFunc(new.chains, func(n jailChain) bool { return n.name == c.name }) {
			gone = append(gone, c.name)
			x.c.FlushChain(x.chain(c.name))
			x.msgs++
		}
	}
	for _, name := range gone {
		x.c.DelChain(x.chain(name))
		x.msgs++
	}
	for _, s := range old.sets {
		if !slices.ContainsFunc(new.sets, func(n directSet) bool { return n.name == s.name }) {
			x.c.DelSet(x.set(s))
			x.msgs++
		}
	}
	for _, n := range old.counters {
		if !slices.Contains(new.counters, n) {
			x.c.DeleteObject(&nftables.CounterObj{Table: x.t, Name: n})
			x.msgs++
		}
	}
	return nil
}

// bridgeEgress returns the rules of a bridge-mode jail's egress chain (see
// Policy for the order they implement) and of its chain named for
// protected addresses a rule names, direct the rules of its direct sets.
func (rs *ruleset) bridgeEgress(j jailRules, named string, direct []*rb) (egress, nm []*rb) {
	v4 := func(list []compiled) []compiled {
		var out []compiled
		for _, c := range list {
			if c.prefix.IsValid() && c.prefix.Addr().Is4() {
				out = append(out, c)
			}
		}
		return out
	}
	aa, al, bl := v4(j.policy.alwaysAllow), v4(j.policy.allow), v4(j.policy.block)
	emit := func(ch *[]*rb, c compiled, verdict func(*rb) *rb) {
		for _, r := range portRules(func() *rb { return rule().ip4().daddr(c.prefix) }, c.Protocol, c.Ports) {
			*ch = append(*ch, verdict(r))
		}
	}
	acceptAs := func(c compiled) func(*rb) *rb {
		return func(r *rb) *rb { return r.note(rs, j.id, true, c.label()).accept() }
	}
	refuseAs := func(label string) func(*rb) *rb {
		return func(r *rb) *rb { return r.note(rs, j.id, false, label).refuse() }
	}
	namesProtected := func(c compiled) bool {
		for _, p := range rs.protected {
			if p.Contains(c.prefix.Addr()) && c.prefix.Bits() >= p.Bits() {
				return true
			}
		}
		return false
	}
	// Protected addresses named by always_allow, then by allow (which a
	// block rule can still refuse).
	for _, c := range aa {
		if namesProtected(c) {
			emit(&egress, c, acceptAs(c))
		}
	}
	for _, c := range al {
		if namesProtected(c) {
			emit(&egress, c, func(r *rb) *rb { return r.gotoC(named) })
		}
	}
	for _, c := range aa {
		emit(&nm, c, acceptAs(c))
	}
	for _, c := range bl {
		emit(&nm, c, refuseAs(c.label()))
	}
	// Recorded with the first allow rule that matches, as the daemon's
	// decisions are (one of them named the address to get here).
	for _, c := range al {
		emit(&nm, c, acceptAs(c))
	}
	nm = append(nm, rule().note(rs, j.id, true, "named").accept())
	for _, p := range rs.protected {
		egress = append(egress, rule().ip4().daddr(p).note(rs, j.id, false, "protected:"+p.String()).refuse())
	}
	// Addresses learned from DNS: their sets hold only what the policy
	// allows there, block rules included.
	egress = append(egress, direct...)
	for _, c := range aa {
		emit(&egress, c, acceptAs(c))
	}
	for _, c := range bl {
		emit(&egress, c, refuseAs(c.label()))
	}
	for _, c := range al {
		emit(&egress, c, acceptAs(c))
	}
	egress = append(egress, rule().note(rs, j.id, false, "default").refuse())
	return egress, nm
}

func interJailRuleMatches(r InterJailRule, from, to string) bool {
	fm, _ := path.Match(r.From, from)
	tm, _ := path.Match(r.To, to)
	return fm && tm
}

// deleteTable removes the table named name if it exists.
func deleteTable(name string) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	t := &nftables.Table{Name: name, Family: nftables.TableFamilyINet}
	c.AddTable(t)
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: deleting table %s: %w", name, err)
	}
	return nil
}
