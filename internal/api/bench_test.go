package api

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/api/apitest"
	"github.com/agentjail/agentjail/internal/apikey"
	"github.com/agentjail/agentjail/internal/metrics"
)

// benchRequests measures GET /jails (an in-memory service) through each
// handler in turn, one request at a time and interleaved so that both see
// the same machine, and reports the median of the first (ms) beside the
// second's (ref-ms), their ratio, and the difference (overhead-ms).
func benchRequests(b *testing.B, ours, ref http.Handler, oursCred, refCred string, target time.Duration) {
	b.Helper()
	do := func(h http.Handler, cred string) time.Duration {
		r := httptest.NewRequest("GET", "/jails", nil)
		r.Header.Set("Authorization", "Bearer "+cred)
		w := httptest.NewRecorder()
		start := time.Now()
		h.ServeHTTP(w, r)
		d := time.Since(start)
		if w.Code != http.StatusOK {
			b.Fatalf("GET /jails: %d %s", w.Code, w.Body)
		}
		return d
	}
	for range 200 { // warm up: the key's first check pays argon2id
		do(ours, oursCred)
		do(ref, refCred)
	}
	var a, c []time.Duration
	for b.Loop() {
		a = append(a, do(ours, oursCred))
		c = append(c, do(ref, refCred))
	}
	med := func(s []time.Duration) time.Duration {
		s = slices.Clone(s)
		slices.Sort(s)
		return s[len(s)/2]
	}
	mo, mr := med(a), med(c)
	msOf := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(msOf(mo), "ms")
	b.ReportMetric(msOf(mr), "ref-ms")
	b.ReportMetric(float64(mo)/float64(mr), "x-ref")
	b.ReportMetric(msOf(mo-mr), "overhead-ms")
	if target > 0 {
		b.ReportMetric(msOf(target), "target-ms")
	}
}

// BenchmarkAPIKeyCheck: a request with an API key (verified once, then
// remembered) against the same request with the bootstrap token (a
// constant-time comparison): what checking a key adds to every request.
// Target: under 0.05 ms.
func BenchmarkAPIKeyCheck(b *testing.B) {
	store, err := apikey.Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	_, key, err := store.Create("bench", "bench", apikey.RoleUser)
	if err != nil {
		b.Fatal(err)
	}
	h := NewServer(apitest.New(), testToken, nil, WithKeys(store))
	benchRequests(b, h, h, key, testToken, 50*time.Microsecond)
}

// BenchmarkAPIMetrics: a request to a daemon that records metrics (the
// request counter, and the latency histograms of the routes that have
// one) against the same request to one that does not.
func BenchmarkAPIMetrics(b *testing.B) {
	svc := apitest.New()
	with := NewServer(svc, testToken, nil, WithMetrics(metrics.New()))
	without := NewServer(svc, testToken, nil)
	benchRequests(b, with, without, testToken, testToken, 0)
}
