package netpolicy

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
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
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		b.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return n
}

// BenchmarkPolicyPath compares an allowed HTTP download and small
// requests through the transparent proxy ("policy", port 80 of
// allowed.test) with the same server reached directly ("direct", port
// 8080 allowed by an IP rule in bridge mode), from a jail namespace.
func BenchmarkPolicyPath(b *testing.B) {
	e := setup(b)
	p := basePolicy()
	p.Allow = append(p.Allow, Rule{Destination: inetA.String(), Ports: []int{8080}})
	j := attach(b, e.m, "bench", ModeBridge, p)
	// The client connects by address (its resolver is the host's); the
	// proxy decides by the Host header.
	paths := map[string]string{"direct": "http://" + inetA.String() + ":8080", "policy": "http://" + inetA.String()}
	for _, name := range []string{"direct", "policy"} {
		base := paths[name]
		b.Run("download8MiB/"+name, func(b *testing.B) {
			c := benchClient(j, true)
			b.SetBytes(bigSize)
			for b.Loop() {
				benchGet(b, c, base+"/big", "allowed.test")
			}
		})
		b.Run("request/"+name, func(b *testing.B) {
			c := benchClient(j, true)
			for b.Loop() {
				benchGet(b, c, base+"/", "allowed.test")
			}
		})
		b.Run("newconn/"+name, func(b *testing.B) {
			c := benchClient(j, false)
			for b.Loop() {
				benchGet(b, c, base+"/", "allowed.test")
			}
		})
	}
}
