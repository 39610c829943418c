package conformance

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"
)

// preview: a server bound to the jail's loopback answers through the
// daemon's preview of its port (a signed link, followed as a browser
// does: the link's credential becomes a cookie).
func (h *harness) preview(t *testing.T) {
	j := h.jail(t, nil)
	const marker = "served-from-the-jail"
	h.sh(t, j.ID, "mkdir -p pv && echo "+marker+" > pv/index.html && "+
		"(python3 -m http.server 8000 --bind 127.0.0.1 --directory pv >/dev/null 2>&1 &)")
	link, err := h.Client.Preview(callCtx(t), j.ID, 8000, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(link.URL)
	if err != nil {
		t.Fatal(err)
	}
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	// The preview host is a name under .localhost: connect to the
	// daemon's loopback port whatever the name.
	hc := &http.Client{Jar: jar, Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, net.JoinHostPort("127.0.0.1", u.Port()))
		},
	}}
	defer hc.CloseIdleConnections()
	var last string
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := hc.Get(link.URL)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(string(body), marker) {
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body)))
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("the jail's server on 127.0.0.1:8000 through the preview %s: %s", link.URL, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
