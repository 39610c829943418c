package netpolicy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
)

// TestPlainHTTPForwarding checks the proxy's own HTTP/1.1 client for plain
// HTTP: bodies of every kind arrive intact (a long body of known length is
// spliced), the upstream connection is kept and reused, one the upstream
// closed meanwhile is replaced, and one whose client went away mid-body is
// not reused.
func TestPlainHTTPForwarding(t *testing.T) {
	e := setup(t)
	j := attach(t, e.m, "plain", ModeIsolated, basePolicy())
	sum := sha256.Sum256(bigBody)
	want := hex.EncodeToString(sum[:])
	sh := func(script string) string {
		t.Helper()
		out, code := j.exec(t, nil, "sh", "-c", script)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", script, code, out)
		}
		return strings.TrimSpace(out)
	}
	for _, path := range []string{"/big", "/chunked"} {
		got := sh("curl -sS --fail http://allowed.test" + path + " | sha256sum | cut -d' ' -f1")
		if got != want {
			t.Errorf("GET %s through the proxy: sha256 %s, want %s", path, got, want)
		}
		ev := e.rec.wait(t, j.id, "GET "+path, func(ev ConnEvent) bool { return ev.Path == path })
		if ev.BytesIn != bigSize || ev.Status != 200 || ev.Error != "" {
			t.Errorf("record of GET %s: bytes_in %d status %d error %q, want %d 200 none", path, ev.BytesIn, ev.Status, ev.Error, bigSize)
		}
	}
	if got := sh(`curl -sS --fail -I http://allowed.test/big | tr -d '\r' | grep -i '^content-length'`); !strings.EqualFold(got, fmt.Sprintf("content-length: %d", bigSize)) {
		t.Errorf("HEAD /big: %q", got)
	}
	if got := sh("curl -sS -o /dev/null -w '%{http_code}' http://allowed.test/empty"); got != "204" {
		t.Errorf("GET /empty: status %s, want 204", got)
	}
	if got := sh("head -c 3000000 /dev/zero | tr '\\0' x | curl -sS --fail --data-binary @- http://allowed.test/echo | wc -c"); got != "3000000" {
		t.Errorf("POST /echo of 3000000 bytes: %s came back", got)
	}

	// Kept-alive upstream connections: three curl runs, one connection.
	server := inetA.String() + ":80"
	gets := 0
	get := func() {
		t.Helper()
		if got := sh("curl -sS --fail http://allowed.test/hi"); got != "hello from allowed.test /hi" {
			t.Fatalf("GET /hi: %q", got)
		}
		// The proxy records a request after it released its upstream
		// connection: wait for that, so the next request finds it.
		gets++
		e.rec.waitCount(t, j.id, "GET /hi", gets, func(ev ConnEvent) bool { return ev.Path == "/hi" })
	}
	get()
	before := e.in.accepted(server)
	get()
	get()
	if n := e.in.accepted(server) - before; n != 0 {
		t.Errorf("the upstream accepted %d new connections for two requests after the first, want 0 (kept alive)", n)
	}
	// The upstream closes its idle connections: the next request gets a
	// new one.
	srv := e.in.servers[server]
	srv.SetKeepAlivesEnabled(false)
	srv.SetKeepAlivesEnabled(true)
	get()
	if n := e.in.accepted(server) - before; n != 1 {
		t.Errorf("after the upstream closed its idle connection: %d new connections, want 1", n)
	}
	// A policy change: idle connections are closed, and one in use by a
	// request is not kept after it (it was dialed under the old policy).
	get()
	mid := e.in.accepted(server)
	held := make(chan string, 1)
	go func() {
		out, _ := j.exec(t, nil, "curl", "-sS", "http://allowed.test/hold")
		held <- out
	}()
	<-e.in.holding
	if err := e.m.Update(context.Background(), j.id, basePolicy()); err != nil {
		t.Fatal(err)
	}
	e.in.hold <- struct{}{}
	if out := <-held; out != "released" {
		t.Fatalf("GET /hold: %q", out)
	}
	get()
	if n := e.in.accepted(server) - mid; n != 1 {
		t.Errorf("after a policy change during a request: %d new connections, want 1", n)
	}

	// A client that stops reading mid-body: its upstream connection still
	// holds the rest of the body and must not serve the next request.
	sh("curl -sS http://allowed.test/big?abort | head -c 1000 >/dev/null; true")
	ev := e.rec.wait(t, j.id, "the aborted GET", func(ev ConnEvent) bool { return ev.Path == "/big" && ev.Error != "" })
	if ev.BytesIn >= bigSize {
		t.Errorf("aborted GET recorded %d bytes in, want fewer than %d", ev.BytesIn, bigSize)
	}
	mid = e.in.accepted(server)
	get()
	if n := e.in.accepted(server) - mid; n != 1 {
		t.Errorf("after an aborted download: %d new connections, want 1 (the aborted one closed)", n)
	}
}
