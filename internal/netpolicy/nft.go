package netpolicy

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"path"
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

// ruleset is everything the manager's table holds.
type ruleset struct {
	table     string
	prefix    string // host-side interface name prefix of the jails' veths
	subnet    netip.Prefix
	daemon    netip.Addr
	group     uint16
	ports     servicePorts
	jails     []jailRules
	protected []netip.Prefix // protected IPv4 ranges for the kernel
}

// nlBuffer is the netlink socket buffer size for table transactions: the
// kernel acknowledges every message of the batch, and with many jails the
// default buffer overflows (ENOBUFS).
const nlBuffer = 32 << 20

// bigBuffers sizes a transaction's netlink socket for a large batch.
func bigBuffers(c *netlink.Conn) error {
	if err := c.SetReadBuffer(nlBuffer); err != nil {
		return err
	}
	return c.SetWriteBuffer(nlBuffer)
}

// apply replaces the manager's table with rs in one transaction.
func (rs *ruleset) apply() error {
	c, err := nftables.New(nftables.WithSockOptions(bigBuffers))
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	t := &nftables.Table{Name: rs.table, Family: nftables.TableFamilyINet}
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	add := func(ch *nftables.Chain, rules ...*rb) {
		for _, r := range rules {
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r.e})
		}
	}
	base := func(name string, typ nftables.ChainType, hook *nftables.ChainHook, prio *nftables.ChainPriority) *nftables.Chain {
		return c.AddChain(&nftables.Chain{Name: name, Table: t, Type: typ, Hooknum: hook, Priority: prio})
	}
	regular := func(name string) *nftables.Chain { return c.AddChain(&nftables.Chain{Name: name, Table: t}) }

	refuse := regular(chainRefuse)
	add(refuse, rule().l4(unix.IPPROTO_TCP).add(&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}),
		rule().add(&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}))

	guard := base(chainGuard, nftables.ChainTypeFilter, nftables.ChainHookPrerouting, nftables.ChainPriorityRaw)
	preNAT := base(chainPreNAT, nftables.ChainTypeNAT, nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest)
	input := base(chainInput, nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter)
	forward := base(chainForward, nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter)
	postNAT := base(chainPostNAT, nftables.ChainTypeNAT, nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource)

	daemon := netip.PrefixFrom(rs.daemon, 32)
	add(input, rule().iif(rs.prefix, true).ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED).accept())
	rs.addByteCounters(c, t, add, forward)
	add(forward, rule().ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED).accept(),
		rule().iif(rs.prefix, true).ctState(expr.CtStateBitINVALID).drop())

	for _, j := range rs.jails {
		jp := netip.PrefixFrom(j.ip, 32)
		egress, named, in := regular("j_"+j.id), regular("n_"+j.id), regular("i_"+j.id)
		// DNS over UDP past the jail's rate is dropped (and counted) here,
		// before it can fill the daemon's socket for every jail.
		rs.addDNSLimit(c, t, add, guard, j)
		// Anti-spoofing: a jail sends IPv4 from its own address only.
		add(guard, rule().iif(j.veth, false).ip4().saddr(jp).accept(), rule().iif(j.veth, false).drop())

		// Transparent redirection of HTTP, HTTPS and DNS to the daemon.
		notJails := func() *rb {
			return rule().iif(j.veth, false).ip4().addr(16, rs.subnet, expr.CmpOpNeq)
		}
		add(preNAT,
			notJails().l4(unix.IPPROTO_TCP).dport(80).dnat(rs.daemon, rs.ports.HTTP),
			notJails().l4(unix.IPPROTO_TCP).dport(443).dnat(rs.daemon, rs.ports.TLS),
			rule().iif(j.veth, false).ip4().l4(unix.IPPROTO_UDP).dport(53).dnat(rs.daemon, rs.ports.DNS),
			rule().iif(j.veth, false).ip4().l4(unix.IPPROTO_TCP).dport(53).dnat(rs.daemon, rs.ports.DNS))

		// The daemon's services are the only local destinations.
		for _, p := range rs.ports.tcp() {
			add(input, rule().iif(j.veth, false).ip4().daddr(daemon).l4(unix.IPPROTO_TCP).dport(p).accept())
		}
		add(input, rule().iif(j.veth, false).ip4().daddr(daemon).l4(unix.IPPROTO_UDP).dport(rs.ports.DNS).accept())
		if j.mode == ModeBridge {
			// Host addresses named exactly by a rule.
			for _, c := range slices.Concat(j.policy.alwaysAllow, j.policy.allow) {
				if c.prefix.IsValid() && c.prefix.Addr().Is4() && c.prefix.Bits() == 32 && c.prefix != daemon {
					for _, r := range portRules(func() *rb { return rule().iif(j.veth, false).ip4().daddr(c.prefix) }, c.Protocol, c.Ports) {
						add(input, r.gotoC(named.Name))
					}
				}
			}
		}
		add(input, rule().iif(j.veth, false).note(rs, j.id, false, "protected:host").refuse())

		// Egress of the jail, after inter-jail rules (added below).
		if j.limited != "" {
			add(egress, rule().note(rs, j.id, false, j.limited).refuse())
			add(named, rule().note(rs, j.id, false, j.limited).refuse())
		}
		if j.mode == ModeBridge {
			direct, err := rs.addDirectSets(c, t, j)
			if err != nil {
				return err
			}
			rs.bridgeEgress(add, egress, named, j, direct)
		} else {
			add(egress, rule().note(rs, j.id, false, "mode:"+j.mode).refuse())
		}
		// Ingress from outside the host.
		for _, c := range j.policy.ingress {
			if !c.prefix.Addr().Is4() {
				continue
			}
			for _, r := range portRules(func() *rb { return rule().ip4().saddr(c.prefix) }, c.Protocol, c.Ports) {
				add(in, r.note(rs, j.id, true, "ingress:"+c.Destination).accept())
			}
		}
		add(in, rule().note(rs, j.id, false, "ingress:default").refuse())
	}

	// Inter-jail pairs, then each jail's egress and ingress chains.
	for _, a := range rs.jails {
		for _, b := range rs.jails {
			if a.id == b.id {
				continue
			}
			for _, cp := range []*compiledPolicy{a.policy, b.policy} {
				for _, r := range cp.src.InterJail {
					if !interJailRuleMatches(r, a.name, b.name) || r.Allow {
						continue
					}
					for _, x := range portRules(func() *rb { return rule().iif(a.veth, false).oif(b.veth, false, expr.CmpOpEq) }, "", r.Ports) {
						add(forward, x.note(rs, a.id, false, "inter_jail:"+r.From+"->"+r.To).refuse())
					}
				}
			}
			for _, cp := range []*compiledPolicy{a.policy, b.policy} {
				for _, r := range cp.src.InterJail {
					if !interJailRuleMatches(r, a.name, b.name) || !r.Allow {
						continue
					}
					for _, x := range portRules(func() *rb { return rule().iif(a.veth, false).oif(b.veth, false, expr.CmpOpEq) }, "", r.Ports) {
						add(forward, x.note(rs, a.id, true, "inter_jail:"+r.From+"->"+r.To).accept())
					}
				}
			}
		}
	}
	for _, j := range rs.jails {
		add(forward, rule().iif(j.veth, false).oif(rs.prefix, true, expr.CmpOpEq).note(rs, j.id, false, "inter_jail:default").refuse())
		add(forward, rule().iif(j.veth, false).jump("j_"+j.id))
	}
	for _, j := range rs.jails {
		add(forward, rule().oif(j.veth, false, expr.CmpOpEq).jump("i_"+j.id))
	}
	// Interfaces of ours that no attached jail owns: nothing passes.
	add(forward, rule().iif(rs.prefix, true).refuse(), rule().oif(rs.prefix, true, expr.CmpOpEq).refuse())
	add(input, rule().iif(rs.prefix, true).drop())
	add(postNAT, rule().ip4().saddr(rs.subnet).oif(rs.prefix, true, expr.CmpOpNeq).masquerade())

	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: replacing table %s: %w", rs.table, err)
	}
	return nil
}

// bridgeEgress fills a bridge-mode jail's egress chain (see Policy for
// the order it implements) and its chain for protected addresses a rule
// names.
func (rs *ruleset) bridgeEgress(add func(*nftables.Chain, ...*rb), egress, named *nftables.Chain, j jailRules, direct []*rb) {
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
	emit := func(ch *nftables.Chain, c compiled, verdict func(*rb) *rb) {
		for _, r := range portRules(func() *rb { return rule().ip4().daddr(c.prefix) }, c.Protocol, c.Ports) {
			add(ch, verdict(r))
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
			emit(egress, c, acceptAs(c))
		}
	}
	for _, c := range al {
		if namesProtected(c) {
			emit(egress, c, func(r *rb) *rb { return r.gotoC(named.Name) })
		}
	}
	for _, c := range aa {
		emit(named, c, acceptAs(c))
	}
	for _, c := range bl {
		emit(named, c, refuseAs(c.label()))
	}
	// Recorded with the first allow rule that matches, as the daemon's
	// decisions are (one of them named the address to get here).
	for _, c := range al {
		emit(named, c, acceptAs(c))
	}
	add(named, rule().note(rs, j.id, true, "named").accept())
	for _, p := range rs.protected {
		add(egress, rule().ip4().daddr(p).note(rs, j.id, false, "protected:"+p.String()).refuse())
	}
	// Addresses learned from DNS: their sets hold only what the policy
	// allows there, block rules included.
	add(egress, direct...)
	for _, c := range aa {
		emit(egress, c, acceptAs(c))
	}
	for _, c := range bl {
		emit(egress, c, refuseAs(c.label()))
	}
	for _, c := range al {
		emit(egress, c, acceptAs(c))
	}
	add(egress, rule().note(rs, j.id, false, "default").refuse())
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
