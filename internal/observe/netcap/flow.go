// Package netcap is the user-space half of agentjail's network
// observation. FlowTable turns the cumulative per-flow counters the kernel
// keeps for a jail's sockets into flow events (when a flow closes, goes
// idle, or periodically while it lasts); DecodeDNS decodes the DNS messages
// copied from a jail's port-53 traffic; Capture records every packet of a
// jail's interface to a pcap file readable by tshark and Wireshark.
//
// The kernel side (the cgroup programs and their reader) lives in the
// observe/bpf package, which feeds FlowTable and DecodeDNS.
package netcap

import (
	"net/netip"
	"strconv"
	"time"

	"github.com/agentjail/agentjail/internal/observe"
)

// Op values of the net events made here. Flow records carry the counters
// accumulated since the flow's previous record, so the sum of a flow's
// records is its total.
const (
	// OpClose is the final record of a TCP flow that ended: a FIN went
	// each way, or a RST crossed it.
	OpClose = "close"
	// OpIdle is the final record of a flow that saw no packet for
	// FlowConfig.IdleTimeout. A later packet of the same 5-tuple starts a
	// new flow.
	OpIdle = "idle"
	// OpUpdate is a record of a flow that goes on (at most one per
	// FlowConfig.Interim).
	OpUpdate = "update"
	// OpEnd is the final record of a flow still open when its jail's
	// observation stopped.
	OpEnd = "end"
	// OpDNSQuery and OpDNSAnswer are a DNS query and a DNS response seen
	// in the jail's port-53 traffic.
	OpDNSQuery  = "dns_query"
	OpDNSAnswer = "dns_answer"
)

// Dir values: who started the flow.
const (
	DirEgress  = "egress"  // the jail
	DirIngress = "ingress" // the remote side
)

// FlowKey identifies a flow from the jail's side.
type FlowKey struct {
	Proto  uint8          // IP protocol number (6 tcp, 17 udp, ...)
	Local  netip.AddrPort // the jail's address; port 0 for protocols without ports
	Remote netip.AddrPort
}

// FlowSample is the state of one flow at one moment: cumulative counters
// since the flow was first seen. Bytes are IP-layer bytes (IP header,
// transport header and payload) of what the jail's socket sent (Out) or
// received (In); a segmentation-offloaded (GSO) packet counts once, as it
// does on the jail's veth.
type FlowSample struct {
	Key                   FlowKey
	First, Last           int64 // Unix ns of the first and the latest packet
	BytesOut, BytesIn     uint64
	PacketsOut, PacketsIn uint64
	// Inbound is set when the remote side started the flow.
	Inbound bool
	// Closed is set for a TCP flow once a FIN went each way or a RST was
	// seen.
	Closed bool
	// PID and HostPID (in the jail's pid namespace and the host's) and
	// Comm name the process the socket belongs to: the one that created,
	// connected or last sent on it; an accepted socket inherits its
	// listener's. Zero when unknown.
	PID, HostPID int32
	Comm         string
}

// FlowConfig tunes a FlowTable; zero fields take the defaults.
type FlowConfig struct {
	// IdleTimeout retires a flow that saw no packet for this long
	// (default 60 s).
	IdleTimeout time.Duration
	// CloseLinger is how long a closed TCP flow is kept after its latest
	// packet, for the last ACKs to be counted (default 1 s).
	CloseLinger time.Duration
	// Interim is the period of the update records of a long flow
	// (default 60 s).
	Interim time.Duration
}

// flowState is what was reported of a flow.
type flowState struct {
	bytesOut, bytesIn, pktsOut, pktsIn uint64
	reportedAt                         int64
}

// FlowTable decides when each flow of one jail is reported and computes
// what each record carries. It is not safe for concurrent use.
type FlowTable struct {
	cfg   FlowConfig
	flows map[FlowKey]*flowState
}

// NewFlowTable returns an empty table.
func NewFlowTable(cfg FlowConfig) *FlowTable {
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 60 * time.Second
	}
	if cfg.CloseLinger <= 0 {
		cfg.CloseLinger = time.Second
	}
	if cfg.Interim <= 0 {
		cfg.Interim = 60 * time.Second
	}
	return &FlowTable{cfg: cfg, flows: make(map[FlowKey]*flowState)}
}

// Check returns what the flow sampled as s calls for at now (Unix ns): ""
// (nothing yet), OpUpdate (report it with Record and keep counting), or a
// final op, OpClose or OpIdle: the caller retires the flow's kernel entry
// and reports its last counters with Record.
func (t *FlowTable) Check(s *FlowSample, now int64) string {
	quiet := time.Duration(now - s.Last)
	switch {
	case s.Closed && quiet >= t.cfg.CloseLinger:
		return OpClose
	case quiet >= t.cfg.IdleTimeout:
		return OpIdle
	}
	st := t.flows[s.Key]
	since := s.First
	if st != nil {
		if st.bytesOut == s.BytesOut && st.bytesIn == s.BytesIn && st.pktsOut == s.PacketsOut && st.pktsIn == s.PacketsIn {
			return ""
		}
		since = st.reportedAt
	}
	if time.Duration(now-since) >= t.cfg.Interim {
		return OpUpdate
	}
	return ""
}

// Record fills ev with the record of the flow sampled as s for op at now
// (Unix ns): the counters since the flow's previous record. A final op
// (anything but OpUpdate) forgets the flow.
func (t *FlowTable) Record(s *FlowSample, op string, now int64, ev *observe.Event) {
	st := t.flows[s.Key]
	if st == nil {
		st = &flowState{}
	}
	*ev = observe.Event{
		Type: observe.TypeNet, TS: now, Op: op,
		PID: s.PID, HostPID: s.HostPID, Comm: s.Comm,
		Proto:   ProtoName(s.Key.Proto),
		Bytes:   int64(s.BytesOut - min(st.bytesOut, s.BytesOut)),
		BytesIn: int64(s.BytesIn - min(st.bytesIn, s.BytesIn)),
		Packets: s.PacketsOut - min(st.pktsOut, s.PacketsOut), PacketsIn: s.PacketsIn - min(st.pktsIn, s.PacketsIn),
		FirstTS: s.First, LastTS: s.Last,
	}
	if s.Inbound {
		ev.Dir, ev.Src, ev.Dst = DirIngress, s.Key.Remote.String(), s.Key.Local.String()
	} else {
		ev.Dir, ev.Src, ev.Dst = DirEgress, s.Key.Local.String(), s.Key.Remote.String()
	}
	if op != OpUpdate {
		delete(t.flows, s.Key)
		return
	}
	st.bytesOut, st.bytesIn, st.pktsOut, st.pktsIn = s.BytesOut, s.BytesIn, s.PacketsOut, s.PacketsIn
	st.reportedAt = now
	t.flows[s.Key] = st
}

// ProtoName returns the lower-case name of IP protocol p ("tcp", "udp",
// "icmp", "icmpv6"), or its number.
func ProtoName(p uint8) string {
	switch p {
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 1:
		return "icmp"
	case 58:
		return "icmpv6"
	}
	return strconv.Itoa(int(p))
}
