package initclient_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/initproto"
)

// BenchmarkExecTrue measures an exec round trip of `true`: connect,
// request, start, exit received.
func BenchmarkExecTrue(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	req := initproto.ExecRequest{Argv: []string{"/bin/true"}}
	if _, err := e.c.Exec(ctx, req, nil, nil, nil); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		st, err := e.c.Exec(ctx, req, nil, nil, nil)
		if err != nil || st.Code != 0 {
			b.Fatalf("%v %+v", err, st)
		}
	}
}

// TestExecRoundTripMedian reports the median exec round trip of `true`
// and the median of a bare fork+exec+wait of it from this process, for
// comparison.
func TestExecRoundTripMedian(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	req := initproto.ExecRequest{Argv: []string{"/bin/true"}}
	const n = 200
	median := func(f func()) time.Duration {
		d := make([]time.Duration, n)
		for i := range d {
			start := time.Now()
			f()
			d[i] = time.Since(start)
		}
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[n/2]
	}
	f := func() {
		if st, err := e.c.Exec(ctx, req, nil, nil, nil); err != nil || st.Code != 0 {
			t.Fatalf("%v %+v", err, st)
		}
	}
	f() // warm the shim
	rt := median(f)
	bare := median(func() { bareForkExec(t, "/bin/true") })
	t.Logf("exec round trip of true: median %v (bare fork+exec+wait: median %v)", rt, bare)
	if rt > 50*time.Millisecond {
		t.Fatalf("exec round trip median %v is far too slow", rt)
	}
}
