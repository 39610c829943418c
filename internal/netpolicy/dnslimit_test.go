package netpolicy

import (
	"testing"
	"time"
)

// TestDNSAdmission: a jail's queries over TCP are held to its rate (a
// second's worth at once, then as the bucket refills), and no jail has
// more than dnsPerJail queries in flight whatever the transport.
func TestDNSAdmission(t *testing.T) {
	s := newDNSState(5)
	for i := range 5 {
		if why := s.admit(true); why != "" {
			t.Fatalf("query %d of the first second: %s", i, why)
		}
		s.done(true)
	}
	if why := s.admit(true); why != dnsDropRate {
		t.Fatalf("sixth query in the second: %q", why)
	}
	// UDP queries were limited by the kernel: only the in-flight bound.
	for i := range dnsPerJail {
		if why := s.admit(false); why != "" {
			t.Fatalf("query %d in flight: %s", i, why)
		}
	}
	if why := s.admit(false); why != dnsDropBusy {
		t.Fatalf("query past %d in flight: %q", dnsPerJail, why)
	}
	s.done(true)
	if why := s.admit(false); why != "" {
		t.Fatalf("after one answer: %q", why)
	}
	// The rate refills; a new rate starts full.
	s.mu.Lock()
	s.bucket.at = s.bucket.at.Add(-time.Second)
	s.inflight = 0
	s.mu.Unlock()
	if why := s.admit(true); why != "" {
		t.Fatalf("a second later: %q", why)
	}
	s.setRate(0)
	if got := s.bucket.capacity; got != 100 {
		t.Fatalf("default rate: %v", got)
	}
	if st := s.snapshot(); st.Answered != 6 {
		t.Fatalf("answered %d, want 6", st.Answered)
	}
}
