package netpolicy

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestInterJailAndBridge(t *testing.T) {
	e := setup(t)
	p := basePolicy()
	p.Allow = append(p.Allow, Rule{Destination: inetA.String() + "/32", Ports: []int{7}, Protocol: ProtoTCP},
		Rule{Destination: "169.254.169.254", Ports: []int{8080}})
	p.Block = append(p.Block, Rule{Destination: "198.18.0.0/24", Ports: []int{7}, Protocol: ProtoUDP})
	a := attach(t, e.m, "alpha", ModeBridge, p)
	b := attach(t, e.m, "beta", ModeIsolated, basePolicy())

	// Bridge mode: direct connections where an IP rule allows.
	if got := a.connect(t, inetA.String(), 7); got != "connected ping" {
		t.Errorf("bridge: allowed direct tcp: %s", got)
	}
	if got := a.connect(t, inetB.String(), 7); got != "refused" {
		t.Errorf("bridge: direct tcp to an address no rule names: %s, want refused", got)
	}
	if got := a.connect(t, metadata.String(), 8080, true); got != "connected" {
		t.Errorf("bridge: metadata named by a rule: %s", got)
	}
	if got := a.connect(t, metadata.String(), 7, true); got != "refused" {
		t.Errorf("bridge: metadata port 7 (no rule names it): %s", got)
	}
	if got := b.connect(t, inetA.String(), 7); got != "refused" {
		t.Errorf("isolated: direct tcp: %s, want refused", got)
	}
	e.rec.wait(t, a.id, "kernel allow", func(ev ConnEvent) bool {
		return ev.Via == ViaKernel && ev.Verdict == VerdictAllow && ev.Dst == inetA.String()+":7"
	})

	// Inter-jail: a server in beta, denied until a rule allows the pair.
	srv := exec.Command("ip", "netns", "exec", b.ns, python, "-u", "-c", `
import http.server, sys
s = http.server.HTTPServer((sys.argv[1], 8000), http.server.SimpleHTTPRequestHandler)
print("ready", flush=True)
s.serve_forever()
`, b.att.IP.String())
	out, _ := srv.StdoutPipe()
	srv.Dir = t.TempDir()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	ready := make(chan bool, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		ready <- strings.HasPrefix(line, "ready")
	}()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatal("server in beta did not start")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("server in beta did not start")
	}
	url := fmt.Sprintf("http://%s:8000/", b.att.IP)
	if s, c := a.curl(t, nil, url); c != 7 {
		t.Errorf("inter-jail before a rule: %s exit %d, want 7 (refused)", s, c)
	}
	e.rec.wait(t, a.id, "inter-jail refusal", func(ev ConnEvent) bool {
		return ev.Dir == "inter_jail" && ev.Verdict == VerdictBlock && ev.Rule == "inter_jail:default"
	})
	p.InterJail = []InterJailRule{{From: "al*", To: "beta", Ports: []int{8000}, Allow: true}}
	if err := e.m.Update(context.Background(), a.id, p); err != nil {
		t.Fatal(err)
	}
	if s, c := a.curl(t, nil, url); s != "200" {
		t.Errorf("inter-jail with a rule: %s exit %d, want 200", s, c)
	}
	if s, c := b.curl(t, nil, fmt.Sprintf("http://%s:8000/", a.att.IP)); c != 7 {
		t.Errorf("reverse direction: %s exit %d, want refused", s, c)
	}
	// A deny rule in the destination's policy wins.
	bp := basePolicy()
	bp.InterJail = []InterJailRule{{From: "*", To: "beta", Allow: false}}
	if err := e.m.Update(context.Background(), b.id, bp); err != nil {
		t.Fatal(err)
	}
	if s, c := a.curl(t, nil, url); c != 7 {
		t.Errorf("inter-jail denied by the destination: %s exit %d", s, c)
	}
	// Rules follow a renamed jail: alpha may reach "gamma", which beta
	// becomes (without its deny rule).
	p.InterJail = []InterJailRule{{From: "alpha", To: "gamma", Ports: []int{8000}, Allow: true}}
	if err := e.m.Update(context.Background(), a.id, p); err != nil {
		t.Fatal(err)
	}
	if s, c := a.curl(t, nil, url); c != 7 {
		t.Errorf("inter-jail to a name beta does not have yet: %s exit %d, want refused", s, c)
	}
	if err := e.m.Rename(context.Background(), b.id, "gamma", basePolicy()); err != nil {
		t.Fatal(err)
	}
	if s, c := a.curl(t, nil, url); s != "200" {
		t.Errorf("inter-jail after beta was renamed gamma: %s exit %d, want 200", s, c)
	}
	if err := e.m.Rename(context.Background(), "no-such-jail", "x", basePolicy()); err == nil {
		t.Error("renaming a jail that is not attached succeeded")
	}
}

func TestTLSInspectionAndCredentials(t *testing.T) {
	e := setup(t)
	p := basePolicy()
	p.TLSInspection = true
	p.Credentials = []Credential{{Host: "api.test", Header: "X-Api-Key", Value: secret}}
	j := attach(t, e.m, "inspect", ModeIsolated, p)

	env := map[string]string{}
	for k, v := range j.att.Env {
		if v == JailCAPath || v == JailTrustStore {
			v = e.caJF
		}
		env[k] = v
	}
	for _, k := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO"} {
		if env[k] == "" {
			t.Errorf("attachment env lacks %s", k)
		}
	}
	// A backend sets its jail's processes up with Env while it attaches.
	if got := e.m.Env(ModeIsolated, p); !maps.Equal(got, j.att.Env) {
		t.Errorf("Env = %v, the attachment's env is %v", got, j.att.Env)
	}
	if got := e.m.Env(ModeIsolated, basePolicy()); got["SSL_CERT_FILE"] != "" || got["https_proxy"] != j.att.Env["https_proxy"] {
		t.Errorf("Env without inspection = %v", got)
	}
	if got := e.m.Env(ModeNone, p); got != nil {
		t.Errorf("Env of mode none = %v, want none", got)
	}
	caEnv := map[string]string{"SSL_CERT_FILE": e.caJF}
	if s, c := j.curl(t, caEnv, "https://api.test/v1/models?x=1"); s != "200" {
		t.Fatalf("inspected https: %s exit %d", s, c)
	}
	if !e.in.sawHeader("X-Api-Key", secret) {
		t.Error("the test server did not get the injected header")
	}
	ev := e.rec.wait(t, j.id, "inspected request", func(ev ConnEvent) bool {
		return ev.Proto == "https" && ev.Inspected && ev.Path == "/v1/models" && ev.Method == "GET" && ev.Status == 200 && ev.Host == "api.test"
	})
	if ev.BytesIn == 0 {
		t.Errorf("no bytes recorded: %+v", ev)
	}
	// Python trusts the CA through the variables too, via the explicit proxy.
	pyEnv := map[string]string{"SSL_CERT_FILE": e.caJF, "https_proxy": env["https_proxy"]}
	out, _ := j.exec(t, pyEnv, python, "-c", `
import urllib.request
print(urllib.request.urlopen("https://allowed.test/py-path", timeout=8).status)`)
	if strings.TrimSpace(out) != "200" {
		t.Errorf("python over CONNECT with inspection: %s", out)
	}
	e.rec.wait(t, j.id, "python request", func(ev ConnEvent) bool {
		return ev.Inspected && ev.Path == "/py-path" && ev.Status == 200
	})
	// The header goes to api.test only.
	e.in.mu.Lock()
	e.in.headers = nil
	e.in.mu.Unlock()
	j.curl(t, caEnv, "https://allowed.test/")
	if e.in.sawHeader("X-Api-Key", secret) {
		t.Error("credential sent to another host")
	}
	// A client that does not trust the CA fails, and the failure is recorded.
	if s, c := j.curl(t, nil, "https://allowed.test/untrusted"); c != 60 {
		t.Errorf("untrusting client: %s exit %d, want 60 (certificate problem)", s, c)
	}
	e.rec.wait(t, j.id, "inspection failure", func(ev ConnEvent) bool {
		return ev.Verdict == VerdictError && ev.Rule == "tls_inspection" && strings.Contains(ev.Error, "agentjail CA")
	})

	// The secret never reaches the jail: its environment, its processes'
	// environ, what the daemon gives it, or the record.
	envOut, _ := j.exec(t, env, "env")
	if strings.Contains(envOut, secret) {
		t.Error("secret in the jail's env")
	}
	sleeper := exec.Command("ip", "netns", "exec", j.ns, "sleep", "30")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })
	nsLink, _ := os.Readlink(filepath.Join("/proc", fmt.Sprint(sleeper.Process.Pid), "ns", "net"))
	deadline := time.Now().Add(5 * time.Second)
	for nsLink == "" || !strings.HasPrefix(nsLink, "net:") {
		if time.Now().After(deadline) {
			t.Fatal("no process in the jail netns")
		}
		time.Sleep(10 * time.Millisecond)
		nsLink, _ = os.Readlink(filepath.Join("/proc", fmt.Sprint(sleeper.Process.Pid), "ns", "net"))
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	checked := 0
	for _, p := range procs {
		if l, _ := os.Readlink(p + "/ns/net"); l != nsLink || l == "" {
			continue
		}
		data, err := os.ReadFile(p + "/environ")
		if err != nil {
			continue
		}
		checked++
		if strings.Contains(string(data), secret) {
			t.Errorf("secret in %s/environ", p)
		}
	}
	if checked == 0 {
		t.Error("found no jail process to check")
	}
	att := fmt.Sprintf("%+v", j.att)
	if strings.Contains(att, secret) {
		t.Error("secret in the attachment")
	}
	if strings.Contains(e.rec.dump(), secret) {
		t.Error("secret in the record")
	}
}

// TestAnswerWhileRequestStreams: through the egress proxy, plain and
// with TLS inspection, an upstream that answers before the request body
// has ended (a streamed model answer, a long upload with progress) is
// heard by the client at once, and the whole body is counted. The proxy
// must not hold the answer until the request ends: its server must not
// take the body over to drain it when it writes the answer's head (that
// held the head back and, when the body had ended, could close it under
// the transport's last read and cut the answer), and the plain path must
// read the answer while it writes the request.
func TestAnswerWhileRequestStreams(t *testing.T) {
	e := setup(t)
	p := basePolicy()
	p.TLSInspection = true
	j := attach(t, e.m, "duplex", ModeIsolated, p)
	// A raw client: it sends the first chunk of its body, waits for the
	// first part of the answer, and only then sends the rest.
	const client = `
import socket, ssl, sys
s = socket.create_connection(("api.test", int(sys.argv[1])), timeout=8)
if sys.argv[1] == "443":
    s = ssl.create_default_context(cafile=sys.argv[2]).wrap_socket(s, server_hostname="api.test")
s.sendall(b"POST /stream HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nhello\n\r\n")
buf = b""
try:
    while b"got hello\n" not in buf:
        d = s.recv(65536)
        if not d:
            sys.exit("the connection ended before the first part: %r" % buf)
        buf += d
except socket.timeout:
    sys.exit("no answer while the request body was open: %r" % buf)
s.sendall(b"4\r\nmore\r\n0\r\n\r\n")
while b"then more" not in buf:
    d = s.recv(65536)
    if not d:
        sys.exit("the connection ended before the rest: %r" % buf)
    buf += d
print("complete")
`
	for _, tc := range []struct {
		port      string
		inspected bool
	}{{"80", false}, {"443", true}} {
		out, code := j.exec(t, nil, python, "-c", client, tc.port, e.caJF)
		if code != 0 || strings.TrimSpace(out) != "complete" {
			t.Fatalf("port %s: exit %d: %s", tc.port, code, out)
		}
		ev := e.rec.wait(t, j.id, "the streamed request to port "+tc.port, func(ev ConnEvent) bool {
			return ev.Inspected == tc.inspected && ev.Path == "/stream" && ev.Method == "POST" && ev.Status == 200
		})
		if ev.BytesOut != int64(len("hello\nmore")) {
			t.Errorf("port %s: %d request body bytes counted, want %d", tc.port, ev.BytesOut, len("hello\nmore"))
		}
	}
}

// count returns how many of the jail's records f accepts.
func (r *recorder) count(id string, f func(ConnEvent) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, ev := range r.evs[id] {
		if f(ev) {
			n++
		}
	}
	return n
}

// TestRateLimitAllTraffic: a jail's request budget covers its direct
// connections too. Once it is spent, the kernel refuses direct
// connections and the proxy answers 429, each recorded with the limit
// (lookups still resolve, so that name-based HTTP clients get their 429);
// when the budget refills, or a new limit gives a fresh one, both pass
// again.
func TestRateLimitAllTraffic(t *testing.T) {
	e := setup(t)
	p := basePolicy()
	p.Allow = append(p.Allow, Rule{Destination: inetA.String() + "/32", Ports: []int{7}, Protocol: ProtoTCP})
	p.RequestsPerMinute = 2
	j := attach(t, e.m, "limited", ModeBridge, p)
	for i := range 2 {
		if got := j.connect(t, inetA.String(), 7); got != "connected ping" {
			t.Fatalf("direct connection %d within the budget: %s", i+1, got)
		}
	}
	// The kernel's log of each connection charges it; both are recorded
	// once charged.
	direct := func(ev ConnEvent) bool {
		return ev.Via == ViaKernel && ev.Verdict == VerdictAllow && ev.Dst == inetA.String()+":7"
	}
	if err := pollUntil(5*time.Second, func() bool { return e.rec.count(j.id, direct) >= 2 }); err != nil {
		t.Fatalf("direct connections recorded: %d, want 2", e.rec.count(j.id, direct))
	}
	if got := j.connect(t, inetA.String(), 7); got != "refused" {
		t.Errorf("direct connection over the budget: %s, want refused", got)
	}
	e.rec.wait(t, j.id, "kernel refusal over the limit", func(ev ConnEvent) bool {
		return ev.Via == ViaKernel && ev.Verdict == VerdictBlock && ev.Rule == "limit:requests_per_minute" && ev.Dst == inetA.String()+":7"
	})
	if s, c := j.curl(t, nil, "http://allowed.test/"); s != "429" {
		t.Errorf("http over the budget: %s exit %d, want 429", s, c)
	}

	// The budget refills (the limiter's clock is moved a minute on).
	e.m.mu.Lock()
	js := e.m.jails[j.id]
	e.m.mu.Unlock()
	later := time.Now().Add(time.Minute)
	lim := js.limiter()
	lim.mu.Lock()
	lim.now = func() time.Time { return later }
	lim.mu.Unlock()
	e.m.relieve(js)
	if got := j.connect(t, inetA.String(), 7); got != "connected ping" {
		t.Errorf("direct connection after the budget refilled: %s", got)
	}

	// Spend it again, then a new limit: a fresh budget at once.
	j.connect(t, inetA.String(), 7)
	if err := pollUntil(5*time.Second, func() bool { return e.rec.count(j.id, direct) >= 4 }); err != nil {
		t.Fatalf("direct connections recorded: %d, want 4", e.rec.count(j.id, direct))
	}
	if got := j.connect(t, inetA.String(), 7); got != "refused" {
		t.Errorf("direct connection over the refilled budget: %s, want refused", got)
	}
	p.RequestsPerMinute = 100
	if err := e.m.Update(context.Background(), j.id, p); err != nil {
		t.Fatal(err)
	}
	if got := j.connect(t, inetA.String(), 7); got != "connected ping" {
		t.Errorf("direct connection under a new limit: %s", got)
	}
}

// pollUntil checks cond every 10 ms until it holds or timeout passes.
func pollUntil(timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v", timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}
