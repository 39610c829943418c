package netpolicy

import (
	"cmp"
	"sync"
	"time"
)

// limiter enforces a jail's requests_per_minute and bytes_per_hour with
// two token buckets: each refills continuously at its rate and holds at
// most one period's worth.
type limiter struct {
	mu       sync.Mutex
	reqs     bucket
	bytes    bucket
	now      func() time.Time
	reqLimit bool
	byteLim  bool
}

type bucket struct {
	tokens, capacity, perSec float64
	at                       time.Time
}

func (b *bucket) refill(now time.Time) {
	b.tokens = min(b.capacity, b.tokens+now.Sub(b.at).Seconds()*b.perSec)
	b.at = now
}

func newLimiter(reqPerMin int, bytesPerHour int64) *limiter {
	now := time.Now()
	l := &limiter{now: time.Now, reqLimit: reqPerMin > 0, byteLim: bytesPerHour > 0}
	l.reqs = bucket{tokens: float64(reqPerMin), capacity: float64(reqPerMin), perSec: float64(reqPerMin) / 60, at: now}
	l.bytes = bucket{tokens: float64(bytesPerHour), capacity: float64(bytesPerHour), perSec: float64(bytesPerHour) / 3600, at: now}
	return l
}

// admit takes one request token. It returns "" when the request may go
// on, else which limit refused it.
func (l *limiter) admit() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if why := l.over(); why != "" {
		return why
	}
	if l.reqLimit {
		l.reqs.tokens--
	}
	return ""
}

// over refills the buckets and names the limit that refuses the next
// request ("" when none does). l.mu is held.
func (l *limiter) over() string {
	now := l.now()
	if l.byteLim {
		l.bytes.refill(now)
		if l.bytes.tokens <= 0 {
			return "limit:bytes_per_hour"
		}
	}
	if l.reqLimit {
		l.reqs.refill(now)
		if l.reqs.tokens < 1 {
			return "limit:requests_per_minute"
		}
	}
	return ""
}

// spend charges n transferred bytes (the budget may go negative: the
// transfer in flight is not cut, the next one is refused).
func (l *limiter) spend(n int64) {
	if !l.byteLim || n <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.bytes.refill(l.now())
	l.bytes.tokens -= float64(n)
}

// exhausted reports which limit refuses the next request, without taking
// a token ("" when none does).
func (l *limiter) exhausted() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.over()
}

// retryAfter is how long until the buckets admit a request again (0 when
// they do now).
func (l *limiter) retryAfter() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	var wait float64
	if l.byteLim {
		l.bytes.refill(now)
		if l.bytes.tokens <= 0 && l.bytes.perSec > 0 {
			wait = max(wait, (1-l.bytes.tokens)/l.bytes.perSec)
		}
	}
	if l.reqLimit {
		l.reqs.refill(now)
		if l.reqs.tokens < 1 && l.reqs.perSec > 0 {
			wait = max(wait, (1-l.reqs.tokens)/l.reqs.perSec)
		}
	}
	return time.Duration(wait * float64(time.Second))
}

// admit takes a request token from the jail's budget for a connection or
// request of the proxies. It returns "" when it may go on, else the limit
// that refuses it. Once the budget is spent, the kernel refuses the jail's
// direct connections too, until it refills.
func (m *Manager) admit(js *jailState) string {
	l := js.limiter()
	why := l.admit()
	if over := cmp.Or(why, l.exhausted()); over != "" {
		m.overLimit(js, over)
	}
	return why
}

// spend charges n bytes the proxies transferred to the jail's budget.
func (m *Manager) spend(js *jailState, n int64) {
	l := js.limiter()
	l.spend(n)
	if over := l.exhausted(); over != "" {
		m.overLimit(js, over)
	}
}

// chargeDirect charges a direct connection of the jail that the kernel let
// through (seen in its log) to the request budget.
func (m *Manager) chargeDirect(jailID string) {
	m.mu.Lock()
	js := m.jails[jailID]
	m.mu.Unlock()
	if js != nil {
		m.admit(js)
	}
}

// overLimit makes the kernel refuse the jail's direct connections (logged
// with rule why) until its budget has refilled.
func (m *Manager) overLimit(js *jailState, why string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.jails[js.id] != js || js.limited == why {
		return
	}
	js.limited = why
	if err := m.syncLocked(js.id); err != nil {
		m.log.Warn("refusing direct connections over the rate limit", "jail", js.id, "err", err)
		js.limited = ""
		return
	}
	m.scheduleRelief(js)
}

// scheduleRelief re-checks the jail's budget when it should have refilled.
// m.mu is held.
func (m *Manager) scheduleRelief(js *jailState) {
	if js.relief != nil {
		js.relief.Stop()
	}
	wait := max(js.limiter().retryAfter(), 10*time.Millisecond)
	js.relief = time.AfterFunc(wait, func() { m.relieve(js) })
}

// relieve lets the kernel pass the jail's direct connections again once
// its budget has refilled.
func (m *Manager) relieve(js *jailState) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.jails[js.id] != js || js.limited == "" {
		return
	}
	if js.limiter().exhausted() != "" {
		m.scheduleRelief(js)
		return
	}
	js.limited = ""
	if err := m.syncLocked(js.id); err != nil {
		m.log.Warn("lifting the rate limit of direct connections", "jail", js.id, "err", err)
	}
}
