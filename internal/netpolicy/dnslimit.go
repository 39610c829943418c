package netpolicy

import (
	"fmt"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/config"
)

// Bounds of the daemon's DNS service, whatever the jails send.
const (
	// dnsWorkers answer the UDP queries of every jail.
	dnsWorkers = 128
	// dnsQueue bounds the UDP queries waiting for a worker.
	dnsQueue = 1024
	// dnsPerJail bounds one jail's queries waiting or being answered
	// (an answer may wait up to 10 s for the upstream resolver), so that
	// one jail cannot hold every worker.
	dnsPerJail = 64
	// maxDNSQuery is the largest query accepted (EDNS payloads stay well
	// under it); larger packets are dropped.
	maxDNSQuery = 4096
	// dnsReportEvery is how often a jail's dropped queries are recorded
	// (one record per reason with the count, not one per query).
	dnsReportEvery = time.Second
)

// Why a query was dropped (the rule of its record).
const (
	dnsDropRate = "limit:dns_queries_per_second"
	dnsDropBusy = "limit:dns_in_flight"
)

// DNSStats counts a jail's DNS queries: answered, and dropped by its rate
// limit or because it had dnsPerJail queries in flight (or the daemon's
// queue was full).
type DNSStats struct {
	Answered         uint64 `json:"answered"`
	DroppedRateLimit uint64 `json:"dropped_rate_limit"`
	DroppedBusy      uint64 `json:"dropped_busy"`
}

// dnsCounterPrefix names the per-jail nftables counter of UDP queries
// the kernel dropped over the jail's rate.
const dnsCounterPrefix = "d_"

// dnsRate is the jail's DNS rate limit, per second.
func dnsRate(cp *compiledPolicy) int {
	if r := cp.src.DNSQueriesPerSecond; r > 0 {
		return r
	}
	return config.DefaultDNSQueriesPerSecond
}

// dnsLimit returns the rules of jail j's DNS rate limit, first in its
// guard chain: UDP to port 53 (redirected to the daemon) or to the
// daemon's DNS port past the rate is dropped and counted in the jail's
// counter, which the byte harvest reads every second (see
// harvestBytesLocked).
func (rs *ruleset) dnsLimit(j jailRules) []*rb {
	rate := uint64(dnsRate(j.policy))
	ports := []int{53}
	if rs.ports.DNS != 53 {
		ports = append(ports, rs.ports.DNS)
	}
	var rules []*rb
	for _, port := range ports {
		rules = append(rules, rule().ip4().l4(unix.IPPROTO_UDP).dport(port).add(
			&expr.Limit{Type: expr.LimitTypePkts, Rate: rate, Over: true, Unit: expr.LimitTimeSecond, Burst: uint32(rate)},
			&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: dnsCounterPrefix + j.id}).drop())
	}
	return rules
}

// dnsState is one jail's DNS admission: a token bucket of its rate, its
// queries in flight, its counters, and the drops not yet recorded.
type dnsState struct {
	mu       sync.Mutex
	bucket   bucket
	inflight int
	stats    DNSStats
	pending  map[string]uint64 // drops by rule, since the last record
	timer    *time.Timer       // records pending drops; nil when none wait
}

func newDNSState(perSec int) *dnsState {
	s := &dnsState{}
	s.setRate(perSec)
	return s
}

// setRate (re)starts the bucket at perSec queries a second (0: the
// default), full.
func (s *dnsState) setRate(perSec int) {
	if perSec <= 0 {
		perSec = config.DefaultDNSQueriesPerSecond
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bucket = bucket{tokens: float64(perSec), capacity: float64(perSec), perSec: float64(perSec), at: time.Now()}
}

// admit takes a slot in flight and, with rate (a query the kernel did
// not already limit: DNS over TCP), a token; it returns "" when the query
// may be answered (done must follow), else the rule that drops it.
func (s *dnsState) admit(rate bool) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rate {
		s.bucket.refill(time.Now())
		if s.bucket.tokens < 1 {
			return dnsDropRate
		}
	}
	if s.inflight >= dnsPerJail {
		return dnsDropBusy
	}
	if rate {
		s.bucket.tokens--
	}
	s.inflight++
	return ""
}

// done releases an admitted query's slot; answered counts it.
func (s *dnsState) done(answered bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inflight--
	if answered {
		s.stats.Answered++
	}
}

// snapshot returns the counters.
func (s *dnsState) snapshot() DNSStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// dnsDropped counts n dropped queries of js and has them recorded, with
// the others dropped within dnsReportEvery, in one record per rule.
func (m *Manager) dnsDropped(js *jailState, rule string, n uint64) {
	s := js.dns
	s.mu.Lock()
	defer s.mu.Unlock()
	if rule == dnsDropRate {
		s.stats.DroppedRateLimit += n
	} else {
		s.stats.DroppedBusy += n
	}
	if s.pending == nil {
		s.pending = map[string]uint64{}
	}
	s.pending[rule] += n
	if s.timer == nil {
		s.timer = time.AfterFunc(dnsReportEvery, func() { m.recordDNSDrops(js) })
	}
}

// recordDNSDrops records the drops counted since the last record.
func (m *Manager) recordDNSDrops(js *jailState) {
	s := js.dns
	s.mu.Lock()
	pending := s.pending
	s.pending, s.timer = nil, nil
	s.mu.Unlock()
	for rule, n := range pending {
		m.record(js.id, ConnEvent{Via: ViaDNS, Proto: "dns", Src: js.ip.String(), Verdict: VerdictLimit, Rule: rule,
			Error: fmt.Sprintf("%d queries dropped", n)})
	}
}

// DNSStats returns the DNS counters of an attached jail (false when it has
// no network attached).
func (m *Manager) DNSStats(jailID string) (DNSStats, bool) {
	m.mu.Lock()
	js, ok := m.jails[jailID]
	m.mu.Unlock()
	if !ok {
		return DNSStats{}, false
	}
	return js.dns.snapshot(), true
}
