package netpolicy

import (
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
		l.reqs.tokens--
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
