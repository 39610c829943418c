package observe

import (
	"context"
	"strconv"
	"sync"

	"github.com/agentjail/agentjail/internal/errdefs"
)

// ErrBusClosed is returned by Subscription.Next once the Bus is closed and
// the subscriber has read everything published before.
var ErrBusClosed = errdefs.New(errdefs.ErrUnavailable, "observe: event bus closed")

// Bus is a jail's live event stream: a bounded ring of the most recent
// events, numbered with consecutive sequence numbers from 1, read by any
// number of subscribers.
//
// Each subscriber owns a cursor into the ring, so its queue is bounded by the
// ring's capacity and publishing costs the same whatever the number of
// subscribers. A subscriber that falls more than the capacity behind is moved
// to the oldest event still held and first receives a notice event carrying
// how many it missed; the publisher never waits for anyone. A subscriber that
// joins late starts from any sequence number still held (Last-Event-ID).
type Bus struct {
	mu      sync.Mutex
	ring    []Event
	mask    uint64
	next    uint64 // sequence number of the next event
	wake    chan struct{}
	waiting bool
	closed  bool
}

// NewBus returns a Bus holding the last capacity events (rounded up to a
// power of two, at least 16).
func NewBus(capacity int) *Bus {
	n := 16
	for n < capacity {
		n <<= 1
	}
	return &Bus{ring: make([]Event, n), mask: uint64(n - 1), next: 1, wake: make(chan struct{})}
}

// Capacity returns the number of events the ring holds.
func (b *Bus) Capacity() int { return len(b.ring) }

// Publish copies ev into the ring, sets ev.Seq to its sequence number and
// returns it. It never blocks on subscribers. Publishing on a closed Bus is
// a no-op returning 0.
func (b *Bus) Publish(ev *Event) uint64 {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return 0
	}
	seq := b.next
	b.next++
	ev.Seq = seq
	b.ring[seq&b.mask] = *ev
	if b.waiting {
		close(b.wake)
		b.wake = make(chan struct{})
		b.waiting = false
	}
	b.mu.Unlock()
	return seq
}

// Last returns the sequence number of the newest event (0 when none).
func (b *Bus) Last() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.next - 1
}

// Close wakes every subscriber; after reading what was published they get
// ErrBusClosed. Closing twice is a no-op.
func (b *Bus) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.closed = true
	close(b.wake)
}

// Subscribe returns a subscription whose first event is the one with
// sequence number after+1 (after = 0: the oldest event still held; use
// Last() to receive only new events), restricted to the types in mask (0 =
// all).
func (b *Bus) Subscribe(after uint64, mask TypeMask) *Subscription {
	return &Subscription{bus: b, next: after + 1, mask: mask}
}

// Subscription is one reader of a Bus. It is not safe for concurrent use.
type Subscription struct {
	bus  *Bus
	next uint64
	mask TypeMask
}

// Next appends to dst, and returns, the subscriber's next events: at least
// one, at most cap(dst)-len(dst) (or 64 when dst has no spare capacity). It
// blocks until an event is available, ctx is done (ctx.Err()), or the bus is
// closed and drained (ErrBusClosed). When the subscriber fell behind the
// ring, the first event returned is a TypeNotice whose Lost field counts the
// skipped events.
func (s *Subscription) Next(ctx context.Context, dst []Event) ([]Event, error) {
	limit := cap(dst) - len(dst)
	if limit <= 0 {
		limit = 64
	}
	b := s.bus
	for {
		b.mu.Lock()
		oldest := uint64(1)
		if held := uint64(len(b.ring)); b.next > held {
			oldest = b.next - held
		}
		if s.next < oldest {
			skipped := oldest - s.next
			s.next = oldest
			b.mu.Unlock()
			dst = append(dst, Event{
				Type: TypeNotice, TS: nowNano(), Lost: skipped,
				Message: "subscriber fell behind; skipped " + strconv.FormatUint(skipped, 10) + " events",
			})
			return dst, nil
		}
		n := 0
		for s.next < b.next && n < limit {
			ev := &b.ring[s.next&b.mask]
			s.next++
			if s.mask.Has(ev.Type) {
				dst = append(dst, *ev)
				n++
			}
		}
		if n > 0 {
			b.mu.Unlock()
			return dst, nil
		}
		if b.closed {
			b.mu.Unlock()
			return dst, ErrBusClosed
		}
		b.waiting = true
		wake := b.wake
		b.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return dst, ctx.Err()
		}
	}
}

// Position returns the sequence number of the last event this subscription
// has passed (for resuming with Subscribe).
func (s *Subscription) Position() uint64 { return s.next - 1 }
