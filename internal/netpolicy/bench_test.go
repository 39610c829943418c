package netpolicy

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// benchClient returns an HTTP client whose connections are made inside
// the jail's namespace.
func benchClient(j *testJail, keepAlive bool) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DisableKeepAlives: !keepAlive,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialIn(j.path, addr)
		},
	}}
}

func benchGet(b *testing.B, c *http.Client, url, host string) int64 {
	req, _ := http.NewRequest("GET", url, nil)
	req.Host = host
	resp, err := c.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	n, err := io.CopyBuffer(struct{ io.Writer }{io.Discard}, resp.Body, make([]byte, 256<<10))
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		b.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return n
}

// relay accepts connections at listen inside the test internet and
// splices each, both ways, to a new connection to target.
func relay(b *testing.B, in *internet, listen, target netip.AddrPort) {
	ln := listenIn(b, in.path, "tcp4", listen.String())
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := dialIn(in.path, target.String())
				if err != nil {
					return
				}
				defer u.Close()
				go func() {
					io.Copy(u, c)
					u.(*net.TCPConn).CloseWrite()
				}()
				io.Copy(c, u)
			}()
		}
	}()
}

func median(s []time.Duration) time.Duration {
	s = slices.Clone(s)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// alternate runs ours and ref once each per iteration, in alternating
// order, so both see the same load on the machine.
func alternate(b *testing.B, ours, ref func()) {
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			ref()
			ours()
		} else {
			ours()
			ref()
		}
	}
}

// BenchmarkPolicyPath compares an allowed HTTP download, small requests
// and new connections through the transparent proxy (port 80 of
// allowed.test, decided by the Host header) with the same server reached
// directly (port 8080, allowed by an IP rule in bridge mode), from a jail
// namespace. Each iteration does the operation both ways (alternate); the
// medians are reported in the units of scripts/benchtable.sh (ms: through the policy
// path, ref-ms: direct).
func BenchmarkPolicyPath(b *testing.B) {
	e := setup(b)
	p := basePolicy()
	relayAddr := netip.AddrPortFrom(inetA, 8081)
	p.Allow = append(p.Allow, Rule{Destination: inetA.String(), Ports: []int{8080, int(relayAddr.Port())}})
	j := attach(b, e.m, "bench", ModeBridge, p)
	direct, policy := "http://"+inetA.String()+":8080", "http://"+inetA.String()
	pair := func(b *testing.B, keepAlive bool, path string) (pol, dir []time.Duration) {
		cp, cd := benchClient(j, keepAlive), benchClient(j, keepAlive)
		get := func(c *http.Client, base string, into *[]time.Duration) {
			t0 := time.Now()
			benchGet(b, c, base+path, "allowed.test")
			*into = append(*into, time.Since(t0))
		}
		alternate(b, func() { get(cp, policy, &pol) }, func() { get(cd, direct, &dir) })
		return pol, dir
	}
	report := func(b *testing.B, pol, dir []time.Duration) (time.Duration, time.Duration) {
		mp, md := median(pol), median(dir)
		b.ReportMetric(ms(mp), "ms")
		b.ReportMetric(ms(md), "ref-ms")
		b.ReportMetric(float64(mp)/float64(md), "x-ref")
		return mp, md
	}
	reportDownload := func(b *testing.B, pol, dir []time.Duration) {
		mp, md := report(b, pol, dir)
		// ≥ 80 % of direct throughput is at most 1.25 times its time.
		b.ReportMetric(1.25, "target-x")
		b.ReportMetric(bigSize/mp.Seconds()/1e6, "MB/s")
		b.ReportMetric(bigSize/md.Seconds()/1e6, "ref-MB/s")
		b.ReportMetric(100*float64(md)/float64(mp), "pct-of-direct")
	}
	b.Run("download8MiB", func(b *testing.B) {
		pol, dir := pair(b, true, "/big")
		reportDownload(b, pol, dir)
	})
	// The same with curl in the jail's namespace, a process of its own as
	// an agent's tools are: each iteration is one curl run per path that
	// downloads five times over one connection; curl times each transfer.
	// A third path is the floor of any proxy here: a bare relay in the
	// test internet that splices each connection to the same server over
	// a second TCP connection, with no policy, parsing or recording.
	b.Run("download8MiB-curl", func(b *testing.B) {
		relay(b, e.in, relayAddr, netip.AddrPortFrom(inetB, 8080))
		var pol, dir, rel []time.Duration
		curl := func(base string, into *[]time.Duration) {
			args := []string{"curl", "-sS", "--fail", "-H", "Host: allowed.test", "-w", "%{time_total}\n"}
			for range 5 {
				args = append(args, "-o", "/dev/null", base+"/big")
			}
			out, code := j.exec(b, nil, args...)
			if code != 0 {
				b.Fatalf("curl %s: exit %d: %s", base, code, out)
			}
			for _, f := range strings.Fields(out) {
				s, err := strconv.ParseFloat(f, 64)
				if err != nil {
					b.Fatalf("curl %s: %q", base, out)
				}
				*into = append(*into, time.Duration(s*float64(time.Second)))
			}
		}
		runs := []func(){
			func() { curl(policy, &pol) },
			func() { curl(direct, &dir) },
			func() { curl("http://"+relayAddr.String(), &rel) },
		}
		for i := 0; b.Loop(); i++ {
			for k := range runs {
				runs[(i+k)%len(runs)]()
			}
		}
		reportDownload(b, pol, dir)
		mr, md := median(rel), median(dir)
		b.ReportMetric(bigSize/mr.Seconds()/1e6, "relay-MB/s")
		b.ReportMetric(100*float64(md)/float64(mr), "relay-pct-of-direct")
	})
	b.Run("request", func(b *testing.B) {
		pol, dir := pair(b, true, "/")
		mp, md := report(b, pol, dir)
		b.ReportMetric(ms(md)+1, "target-ms")
		b.ReportMetric(ms(mp-md), "added-ms")
	})
	b.Run("newconn", func(b *testing.B) {
		pol, dir := pair(b, false, "/")
		mp, md := report(b, pol, dir)
		b.ReportMetric(float64(time.Second)/float64(mp), "conn/s")
		b.ReportMetric(float64(time.Second)/float64(md), "ref-conn/s")
	})
}

// BenchmarkAttach times attaching a jail's network (veth, addresses,
// routes and its objects in the table; detached after each) to a manager
// with 50 jails attached beside the same with a manager holding 1 jail
// (ref-ms), alternately: each jail's objects are added and removed on
// their own, so the cost does not grow with the jails attached. msgs is
// the number of messages of an attach's transaction on the table
// (ref-msgs beside 1 jail).
func BenchmarkAttach(b *testing.B) {
	e := setup(b)
	many, err := New(context.Background(), Options{DataDir: b.TempDir(), Subnet: "10.90.0.0/24", Prefix: testPrefix + "5",
		Resolver: mapResolver(testNames), UpstreamRoots: e.ca.pool})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { many.Close() })
	p := basePolicy()
	p.Allow = append(p.Allow, Rule{Destination: inetA.String(), Ports: []int{7}, Protocol: ProtoTCP})
	p.BytesPerHour = 1 << 30
	attach(b, e.m, "bench-1", ModeBridge, p)
	for i := range 50 {
		attach(b, many, "bench-"+strconv.Itoa(i), []string{ModeBridge, ModeIsolated}[i%2], p)
	}
	_, path := addNetns(b, "ajtb")
	n := 0
	attachOnce := func(m *Manager, times *[]time.Duration, msgs *int) {
		n++
		id := "bench-attach-" + strconv.Itoa(n)
		start := time.Now()
		if _, err := m.Attach(context.Background(), Jail{ID: id, Name: id, NetnsPath: path, Mode: ModeBridge, Policy: p}); err != nil {
			b.Fatal(err)
		}
		*times = append(*times, time.Since(start))
		m.mu.Lock()
		*msgs = m.lastTx
		m.mu.Unlock()
		if err := m.Detach(context.Background(), id); err != nil {
			b.Fatal(err)
		}
	}
	var t1, t50 []time.Duration
	var m1, m50 int
	alternate(b, func() { attachOnce(many, &t50, &m50) }, func() { attachOnce(e.m, &t1, &m1) })
	b.ReportMetric(ms(median(t50)), "ms")
	b.ReportMetric(ms(median(t1)), "ref-ms")
	b.ReportMetric(float64(median(t50))/float64(median(t1)), "x-ref")
	b.ReportMetric(float64(m50), "msgs")
	b.ReportMetric(float64(m1), "ref-msgs")
}
