package netpolicy

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/errdefs"
	jailnetns "github.com/agentjail/agentjail/internal/netns"
)

// pyDNS sends one hand-built DNS query (argv: server, name, qtype number,
// "udp" or "tcp") and prints "rcode <n> answers <a,b,...>", or "error ..."
// when no answer came.
const pyDNS = `
import random, socket, struct, sys
server, name, qtype, transport = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
qid = random.randrange(65536)
q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
for label in name.split("."):
    q += bytes([len(label)]) + label.encode()
q += b"\x00" + struct.pack(">HH", qtype, 1)
try:
    if transport == "tcp":
        s = socket.create_connection((server, 53), timeout=5)
        s.sendall(struct.pack(">H", len(q)) + q)
        def read(n):
            b = b""
            while len(b) < n:
                c = s.recv(n - len(b))
                if not c:
                    raise EOFError("short reply")
                b += c
            return b
        r = read(struct.unpack(">H", read(2))[0])
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(5)
        s.sendto(q, (server, 53))
        r, _ = s.recvfrom(4096)
except Exception as e:
    print("error", type(e).__name__, e)
    sys.exit(0)
if len(r) < 12 or struct.unpack(">H", r[:2])[0] != qid or not r[2] & 0x80:
    print("error not a reply to the query")
    sys.exit(0)
rcode = r[3] & 0x0f
an = struct.unpack(">H", r[6:8])[0]
i = 12
while r[i]:
    i += r[i] + 1
i += 5
addrs = []
for _ in range(an):
    if r[i] & 0xc0 == 0xc0:
        i += 2
    else:
        while r[i]:
            i += r[i] + 1
        i += 1
    typ, cls, ttl, rdlen = struct.unpack(">HHIH", r[i:i+10])
    i += 10
    if typ == 1:
        addrs.append(socket.inet_ntoa(r[i:i+rdlen]))
    i += rdlen
print("rcode", rcode, "answers", ",".join(addrs))
`

// DNS query types used below.
const (
	qtypeA    = 1
	qtypeAAAA = 28
)

// dns queries server for name from inside the jail and returns pyDNS's
// line.
func (j *testJail) dns(t testing.TB, server, name string, qtype int, transport string) string {
	t.Helper()
	out, _ := j.exec(t, nil, python, "-c", pyDNS, server, name, fmt.Sprint(qtype), transport)
	return strings.Join(strings.Fields(out), " ")
}

// serveIn serves HTTP on addr inside the namespace at nsPath, answering
// "<name> <path>", and returns the address it listens on.
func serveIn(t testing.TB, nsPath, network, addr, name string) string {
	t.Helper()
	ln := listenIn(t, nsPath, network, addr)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s", name, r.URL.Path)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// greetIn listens on addr inside the namespace at nsPath and writes
// greeting to every connection it accepts, then closes it.
func greetIn(t testing.TB, nsPath, addr, greeting string) {
	t.Helper()
	ln := listenIn(t, nsPath, "tcp4", addr)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, greeting)
			c.Close()
		}
	}()
}

// readFrom connects to addr from inside the namespace at nsPath (from
// address src when valid, or from the host's own namespace when nsPath is
// empty) and returns what the server sent before closing.
func readFrom(nsPath string, src netip.Addr, addr string) (string, error) {
	var c net.Conn
	dial := func() (err error) {
		d := net.Dialer{Timeout: 5 * time.Second}
		if src.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
		}
		c, err = d.Dial("tcp4", addr)
		return err
	}
	var err error
	if nsPath == "" {
		err = dial()
	} else {
		err = jailnetns.Do(nsPath, dial)
	}
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	return string(b), err
}

// TestModeNoneLoopbackOnly: a jail of mode none keeps the namespace the
// daemon made for it (netns.Create: loopback up) and gets nothing else:
// no veth, no address, no route, no proxy variables, no resolver. Its
// processes reach servers on its own loopback; DNS, the daemon's proxies
// and the internet are unreachable.
func TestModeNoneLoopbackOnly(t *testing.T) {
	e := setup(t)
	name := "ajtn" + randHex(3)
	path := filepath.Join("/run/netns", name)
	if err := jailnetns.Create(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		jailnetns.Remove(path)
		os.RemoveAll(filepath.Join("/etc/netns", name))
	})
	j := &testJail{id: "t" + randHex(5), ns: name, path: path}
	att, err := e.m.Attach(context.Background(), Jail{ID: j.id, Name: "nonet", NetnsPath: path, Mode: ModeNone, Policy: basePolicy()})
	if err != nil {
		t.Fatalf("attach mode none: %v", err)
	}
	t.Cleanup(func() { e.m.Detach(context.Background(), j.id) })
	j.att = att
	os.MkdirAll(filepath.Join("/etc/netns", name), 0o755)
	os.WriteFile(filepath.Join("/etc/netns", name, "resolv.conf"), []byte(att.ResolvConf), 0o644)

	if att.IP.IsValid() || att.Interface != "" || len(att.Env) != 0 || att.HostNetwork {
		t.Errorf("mode none attachment: %+v, want no address, interface, proxy variables or host network", att)
	}
	if strings.Contains(att.ResolvConf, "nameserver") {
		t.Errorf("mode none resolv.conf names a server: %q", att.ResolvConf)
	}
	if _, err := net.InterfaceByName(vethName(testPrefix, j.id)); err == nil {
		t.Error("mode none: a veth was made on the host")
	}

	// Loopback only, and up.
	links, _ := j.exec(t, nil, "ip", "-o", "link", "show")
	lines := strings.Split(strings.TrimSpace(links), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], ": lo:") || !strings.Contains(lines[0], ",UP") {
		t.Errorf("interfaces in the mode none jail:\n%s\nwant lo only, up", links)
	}
	if routes, _ := j.exec(t, nil, "ip", "-4", "route", "show"); strings.TrimSpace(routes) != "" {
		t.Errorf("routes in the mode none jail:\n%s\nwant none", routes)
	}
	greetIn(t, path, "127.0.0.1:9000", "hello over lo")
	if got := j.py(t, nil, `
import socket
s = socket.create_connection(("127.0.0.1", 9000), timeout=5)
print(s.recv(100).decode())`); got != "hello over lo" {
		t.Errorf("server on the jail's loopback: %q, want the greeting", got)
	}

	// Nothing outside: the internet, the daemon's DNS and proxies.
	for _, dst := range []string{inetA.String(), e.m.daemon.String()} {
		for _, port := range []int{80, 3128} {
			if got := j.connect(t, dst, port, true); !strings.Contains(got, "Network is unreachable") {
				t.Errorf("connect to %s:%d from mode none: %q, want network unreachable", dst, port, got)
			}
		}
	}
	for _, server := range []string{e.m.daemon.String(), "203.0.113.53"} {
		if got := j.dns(t, server, "allowed.test", qtypeA, "udp"); !strings.HasPrefix(got, "error") {
			t.Errorf("DNS to %s from mode none: %q, want no answer", server, got)
		}
	}
	if s, c := j.curl(t, nil, "http://allowed.test/"); c != 6 {
		t.Errorf("curl allowed.test from mode none: status %s exit %d, want 6 (could not resolve)", s, c)
	}
	if s, c := j.curl(t, nil, "http://"+inetA.String()+"/"); c != 7 {
		t.Errorf("curl %s from mode none: status %s exit %d, want 7 (could not connect)", inetA, s, c)
	}
	if n := e.rec.count(j.id, func(ConnEvent) bool { return true }); n != 0 {
		t.Errorf("mode none jail has %d connection records, want none (nothing reached the daemon): %s", n, e.rec.dump())
	}
	// A mode none jail has no policy to update.
	if err := e.m.Update(context.Background(), j.id, basePolicy()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("update of a mode none jail: %v, want not found", err)
	}
}

// TestRulePrecedence: always_allow beats block, block beats allow, and
// what no rule names is refused, both for names (DNS and proxy) and, in
// bridge mode, for IP/CIDR rules on direct connections; each decision is
// recorded with the rule that made it.
func TestRulePrecedence(t *testing.T) {
	e := setup(t)
	names := attach(t, e.m, "names", ModeIsolated, Policy{
		AlwaysAllow: []Rule{{Destination: "bad.wild.test"}},
		Allow:       []Rule{{Destination: "*.wild.test"}, {Destination: "allowed.test"}},
		Block:       []Rule{{Destination: "*.wild.test"}},
	})
	px := map[string]string{"http_proxy": names.att.Env["http_proxy"]}

	// always_allow over block.
	if got := names.dns(t, e.m.daemon.String(), "bad.wild.test", qtypeA, "udp"); got != "rcode 0 answers "+inetC.String() {
		t.Errorf("DNS bad.wild.test (always_allow over block): %q", got)
	}
	if s, c := names.curl(t, nil, "http://bad.wild.test/aa"); s != "200" {
		t.Errorf("bad.wild.test (always_allow over block): status %s exit %d, want 200", s, c)
	}
	if s, c := names.curl(t, px, "http://bad.wild.test/aa-proxy"); s != "200" {
		t.Errorf("bad.wild.test through the proxy: status %s exit %d, want 200", s, c)
	}
	e.rec.wait(t, names.id, "DNS allowed by always_allow", func(ev ConnEvent) bool {
		return ev.Via == ViaDNS && ev.Host == "bad.wild.test" && ev.Verdict == VerdictAllow && ev.Rule == "always_allow:bad.wild.test"
	})
	e.rec.wait(t, names.id, "request allowed by always_allow", func(ev ConnEvent) bool {
		return ev.Via == ViaTransparent && ev.Path == "/aa" && ev.Status == 200 && ev.Rule == "always_allow:bad.wild.test"
	})
	// block over allow: both name every host below wild.test.
	if got := names.dns(t, e.m.daemon.String(), "x.wild.test", qtypeA, "udp"); got != "rcode 3 answers" {
		t.Errorf("DNS x.wild.test (block over allow): %q, want NXDOMAIN", got)
	}
	if s, c := names.curl(t, px, "http://x.wild.test/"); s != "403" {
		t.Errorf("x.wild.test through the proxy (block over allow): status %s exit %d, want 403", s, c)
	}
	e.rec.wait(t, names.id, "request refused by block", func(ev ConnEvent) bool {
		return ev.Via == ViaHTTPProxy && ev.Host == "x.wild.test" && ev.Status == 403 && ev.Rule == "block:*.wild.test"
	})
	// Default deny; the allowed name still passes.
	if got := names.dns(t, e.m.daemon.String(), "other.test", qtypeA, "udp"); got != "rcode 3 answers" {
		t.Errorf("DNS other.test (no rule): %q, want NXDOMAIN", got)
	}
	if s, c := names.curl(t, px, "http://other.test/"); s != "403" {
		t.Errorf("other.test (no rule): status %s exit %d, want 403", s, c)
	}
	e.rec.wait(t, names.id, "default refusal", func(ev ConnEvent) bool {
		return ev.Via == ViaHTTPProxy && ev.Host == "other.test" && ev.Status == 403 && ev.Rule == "default"
	})
	if s, c := names.curl(t, nil, "http://allowed.test/"); s != "200" {
		t.Errorf("allowed.test: status %s exit %d, want 200", s, c)
	}

	// "*" allows every name, and still yields to block rules.
	any := attach(t, e.m, "any", ModeIsolated, Policy{
		Allow: []Rule{{Destination: "*"}},
		Block: []Rule{{Destination: "*.wild.test"}},
	})
	if got := any.dns(t, e.m.daemon.String(), "other.test", qtypeA, "udp"); got != "rcode 0 answers "+inetB.String() {
		t.Errorf("DNS other.test (allowed by *): %q", got)
	}
	if s, c := any.curl(t, nil, "http://other.test/any"); s != "200" {
		t.Errorf("other.test (allowed by *): status %s exit %d, want 200", s, c)
	}
	e.rec.wait(t, any.id, "request allowed by *", func(ev ConnEvent) bool {
		return ev.Via == ViaTransparent && ev.Path == "/any" && ev.Status == 200 && ev.Rule == "allow:*"
	})
	if got := any.dns(t, e.m.daemon.String(), "x.wild.test", qtypeA, "udp"); got != "rcode 3 answers" {
		t.Errorf("DNS x.wild.test (block over *): %q, want NXDOMAIN", got)
	}

	// IP/CIDR rules in bridge mode, on direct connections and through the
	// proxy.
	ips := attach(t, e.m, "ips", ModeBridge, Policy{
		AlwaysAllow: []Rule{{Destination: inetC.String(), Ports: []int{7, 80}}},
		Allow:       []Rule{{Destination: "198.18.0.0/24", Ports: []int{7, 80}}},
		Block:       []Rule{{Destination: inetB.String()}, {Destination: inetC.String() + "/32"}},
	})
	kernel := func(dst, verdict, rule string) {
		t.Helper()
		e.rec.wait(t, ips.id, "kernel "+verdict+" of "+dst, func(ev ConnEvent) bool {
			return ev.Via == ViaKernel && ev.Dst == dst && ev.Verdict == verdict && ev.Rule == rule
		})
	}
	if got := ips.connect(t, inetA.String(), 7); got != "connected ping" {
		t.Errorf("direct %s:7 (CIDR allow): %s", inetA, got)
	}
	kernel(inetA.String()+":7", VerdictAllow, "allow:198.18.0.0/24")
	if got := ips.connect(t, inetB.String(), 7); got != "refused" {
		t.Errorf("direct %s:7 (address block over CIDR allow): %s, want refused", inetB, got)
	}
	kernel(inetB.String()+":7", VerdictBlock, "block:"+inetB.String())
	if got := ips.connect(t, inetC.String(), 7); got != "connected ping" {
		t.Errorf("direct %s:7 (always_allow over block): %s", inetC, got)
	}
	kernel(inetC.String()+":7", VerdictAllow, "always_allow:"+inetC.String())
	if got := ips.connect(t, inetA.String(), 8080, true); got != "refused" {
		t.Errorf("direct %s:8080 (no rule names the port): %s, want refused", inetA, got)
	}
	kernel(inetA.String()+":8080", VerdictBlock, "default")
	for _, c := range []struct {
		addr   netip.Addr
		status string
		rule   string
	}{
		{inetA, "200", "allow:198.18.0.0/24"},
		{inetB, "403", "block:" + inetB.String()},
		{inetC, "200", "always_allow:" + inetC.String()},
	} {
		if s, code := ips.curl(t, nil, "http://"+c.addr.String()+"/by-address"); s != c.status {
			t.Errorf("http://%s/ through the proxy: status %s exit %d, want %s", c.addr, s, code, c.status)
		}
		e.rec.wait(t, ips.id, "proxy decision for "+c.addr.String(), func(ev ConnEvent) bool {
			return ev.Via == ViaTransparent && ev.Host == c.addr.String() && ev.Path == "/by-address" && ev.Rule == c.rule
		})
	}
}

// TestLiveRevocation: a destination that was reachable is refused for new
// connections as soon as Update removes its rule: by DNS (NXDOMAIN), by
// every proxy, and by the kernel for a CIDR rule in bridge mode; a rule
// added back works at once too.
func TestLiveRevocation(t *testing.T) {
	e := setup(t)
	p := Policy{Allow: []Rule{{Destination: "allowed.test"}, {Destination: "api.test"}}}
	j := attach(t, e.m, "revoke", ModeIsolated, p)
	env := j.att.Env
	proxy := map[string]string{"http_proxy": env["http_proxy"]}
	connect := map[string]string{"https_proxy": env["https_proxy"]}
	socks := map[string]string{"ALL_PROXY": env["ALL_PROXY"]}
	ca := []string{"--cacert", e.ca.pemFile}
	server := e.m.daemon.String()

	if got := j.dns(t, server, "allowed.test", qtypeA, "udp"); got != "rcode 0 answers "+inetA.String() {
		t.Fatalf("DNS allowed.test before: %q", got)
	}
	for what, s := range map[string]string{
		"transparent": status(j.curl(t, nil, "http://allowed.test/")),
		"http proxy":  status(j.curl(t, proxy, "http://allowed.test/")),
		"connect":     status(j.curl(t, connect, append(ca, "https://allowed.test/")...)),
		"socks":       status(j.curl(t, socks, append(ca, "https://allowed.test/")...)),
	} {
		if s != "200" {
			t.Fatalf("allowed.test %s before the update: status %s, want 200", what, s)
		}
	}

	p.Allow = p.Allow[1:]
	if err := e.m.Update(context.Background(), j.id, p); err != nil {
		t.Fatal(err)
	}
	if got := j.dns(t, server, "allowed.test", qtypeA, "udp"); got != "rcode 3 answers" {
		t.Errorf("DNS allowed.test after its rule went: %q, want NXDOMAIN", got)
	}
	if s, c := j.curl(t, nil, "http://allowed.test/"); c != 6 {
		t.Errorf("transparent allowed.test after revocation: status %s exit %d, want 6 (could not resolve)", s, c)
	}
	if s, c := j.curl(t, nil, "--resolve", "allowed.test:80:"+inetA.String(), "http://allowed.test/revoked"); s != "403" {
		t.Errorf("transparent allowed.test by address after revocation: status %s exit %d, want 403", s, c)
	}
	if s, c := j.curl(t, proxy, "http://allowed.test/revoked-proxy"); s != "403" {
		t.Errorf("http proxy after revocation: status %s exit %d, want 403", s, c)
	}
	if s, c := j.curl(t, connect, append(ca, "https://allowed.test/")...); c != 56 {
		t.Errorf("CONNECT after revocation: status %s exit %d, want 56 (proxy refused)", s, c)
	}
	if s, c := j.curl(t, socks, append(ca, "https://allowed.test/")...); c != 97 {
		t.Errorf("SOCKS after revocation: status %s exit %d, want 97 (socks refused)", s, c)
	}
	// The other name on the same address keeps working.
	if s, c := j.curl(t, nil, "http://api.test/"); s != "200" {
		t.Errorf("api.test (still allowed) after the update: status %s exit %d", s, c)
	}
	for _, via := range []string{ViaDNS, ViaTransparent, ViaHTTPProxy, ViaConnect, ViaSOCKS} {
		e.rec.wait(t, j.id, via+" refusal after revocation", func(ev ConnEvent) bool {
			return ev.Via == via && ev.Host == "allowed.test" && ev.Verdict == VerdictBlock && ev.Rule == "default"
		})
	}

	// A CIDR rule in bridge mode: the kernel refuses at once.
	bp := Policy{Allow: []Rule{{Destination: "198.18.0.0/30", Ports: []int{7}, Protocol: ProtoTCP}}}
	b := attach(t, e.m, "revoke-bridge", ModeBridge, bp)
	if got := b.connect(t, inetA.String(), 7); got != "connected ping" {
		t.Fatalf("direct connection before the update: %s", got)
	}
	if err := e.m.Update(context.Background(), b.id, Policy{}); err != nil {
		t.Fatal(err)
	}
	if got := b.connect(t, inetA.String(), 7); got != "refused" {
		t.Errorf("direct connection after its CIDR rule went: %s, want refused", got)
	}
	e.rec.wait(t, b.id, "kernel refusal after revocation", func(ev ConnEvent) bool {
		return ev.Via == ViaKernel && ev.Dst == inetA.String()+":7" && ev.Verdict == VerdictBlock && ev.Rule == "default"
	})
	if err := e.m.Update(context.Background(), b.id, bp); err != nil {
		t.Fatal(err)
	}
	if got := b.connect(t, inetA.String(), 7); got != "connected ping" {
		t.Errorf("direct connection once the rule is back: %s", got)
	}
}

// status drops curl's exit code.
func status(s string, _ int) string { return s }

// events returns a copy of the jail's records.
func (r *recorder) events(id string) []ConnEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]ConnEvent(nil), r.evs[id]...)
}

// TestBytesPerHour: the proxies charge the bodies and streams they carry
// to bytes_per_hour. Requests pass while budget is left; the one that
// overdraws it is delivered whole; after that HTTP gets 429, CONNECT and
// SOCKS are refused and the kernel refuses direct connections, each
// recorded with limit:bytes_per_hour, while DNS still answers. A new limit
// is a fresh budget.
func TestBytesPerHour(t *testing.T) {
	e := setup(t)
	const path = "/a"
	body := "hello from allowed.test " + path
	budget := int64(4*len(body) - 10) // the fourth request overdraws it
	p := Policy{
		Allow:        []Rule{{Destination: "allowed.test"}, {Destination: inetA.String(), Ports: []int{7}, Protocol: ProtoTCP}},
		BytesPerHour: budget,
	}
	// No direct connection before the budget is spent: the kernel counts
	// its bytes with their headers (TestDirectBytes), which would upset
	// the exact accounting of the proxied bodies below.
	j := attach(t, e.m, "bytes", ModeBridge, p)
	get := func(n int) (string, int) {
		t.Helper()
		out, code := j.exec(t, nil, "curl", "-sS", "--max-time", "8", "-w", " %{http_code}", "http://allowed.test"+path)
		out = strings.TrimSpace(out)
		// The proxy charges a request just before recording it.
		if code == 0 && strings.HasSuffix(out, " 200") {
			e.rec.waitCount(t, j.id, "requests charged", n, func(ev ConnEvent) bool {
				return ev.Path == path && ev.Status == 200
			})
		}
		return out, code
	}
	for i := 1; i <= 4; i++ {
		if out, code := get(i); out != body+" 200" {
			t.Fatalf("request %d (%d bytes of %d spent before it): %q exit %d, want the whole body and 200", i, (i-1)*len(body), budget, out, code)
		}
	}
	if out, code := get(5); !strings.HasSuffix(out, " 429") {
		t.Fatalf("request after the budget was spent: %q exit %d, want 429", out, code)
	}
	e.rec.wait(t, j.id, "429 recorded", func(ev ConnEvent) bool {
		return ev.Via == ViaTransparent && ev.Path == path && ev.Verdict == VerdictLimit && ev.Status == 429 && ev.Rule == "limit:bytes_per_hour"
	})
	var charged int64
	for _, ev := range e.rec.events(j.id) {
		if ev.Path == path && ev.Status == 200 {
			charged += ev.BytesIn + ev.BytesOut
		}
	}
	if charged != int64(4*len(body)) {
		t.Errorf("bytes recorded for the allowed requests: %d, want %d", charged, 4*len(body))
	}
	env := j.att.Env
	if s, c := j.curl(t, map[string]string{"http_proxy": env["http_proxy"]}, "http://allowed.test/x"); s != "429" {
		t.Errorf("http proxy over the budget: status %s exit %d, want 429", s, c)
	}
	if s, c := j.curl(t, map[string]string{"https_proxy": env["https_proxy"]}, "--cacert", e.ca.pemFile, "https://allowed.test/"); c != 56 {
		t.Errorf("CONNECT over the budget: status %s exit %d, want 56 (proxy refused)", s, c)
	}
	if s, c := j.curl(t, map[string]string{"ALL_PROXY": env["ALL_PROXY"]}, "--cacert", e.ca.pemFile, "https://allowed.test/"); c != 97 {
		t.Errorf("SOCKS over the budget: status %s exit %d, want 97 (socks refused)", s, c)
	}
	if got := j.connect(t, inetA.String(), 7); got != "refused" {
		t.Errorf("direct connection over the budget: %s, want refused", got)
	}
	for _, via := range []string{ViaHTTPProxy, ViaConnect, ViaSOCKS, ViaKernel} {
		e.rec.wait(t, j.id, via+" refusal over the byte budget", func(ev ConnEvent) bool {
			return ev.Via == via && ev.Verdict != VerdictAllow && ev.Rule == "limit:bytes_per_hour"
		})
	}
	if got := j.dns(t, e.m.daemon.String(), "allowed.test", qtypeA, "udp"); got != "rcode 0 answers "+inetA.String() {
		t.Errorf("DNS over the byte budget: %q, want an answer", got)
	}

	// A new limit: a fresh budget, and a download far larger than it is
	// still delivered whole (the transfer in flight is not cut).
	p.BytesPerHour = 1 << 20
	if err := e.m.Update(context.Background(), j.id, p); err != nil {
		t.Fatal(err)
	}
	if got := j.connect(t, inetA.String(), 7); got != "connected ping" {
		t.Errorf("direct connection under a new byte limit: %s", got)
	}
	size, code := j.exec(t, nil, "curl", "-sS", "--max-time", "20", "-o", "/dev/null", "-w", "%{http_code} %{size_download}", "http://allowed.test/big")
	if want := fmt.Sprintf("200 %d", bigSize); strings.TrimSpace(size) != want {
		t.Fatalf("GET /big with a %d byte budget: %q exit %d, want %q", p.BytesPerHour, size, code, want)
	}
	e.rec.wait(t, j.id, "the big download", func(ev ConnEvent) bool { return ev.Path == "/big" && ev.Status == 200 })
	if out, code := get(0); !strings.HasSuffix(out, " 429") {
		t.Errorf("request after the big download: %q exit %d, want 429", out, code)
	}
}

// The protected addresses the test internet hosts, besides
// 169.254.169.254: each with the protected range it lies in.
var protectedHosted = []struct {
	addr  netip.Addr
	rng   string
	label string
}{
	{netip.MustParseAddr("169.254.170.2"), "169.254.0.0/16", "ECS task metadata"},
	{netip.MustParseAddr("100.100.100.200"), "100.100.100.200/32", "Alibaba Cloud metadata"},
	{netip.MustParseAddr("192.0.0.192"), "192.0.0.192/32", "Oracle Cloud metadata"},
	{netip.MustParseAddr("fd00:ec2::254"), "fd00:ec2::/112", "AWS metadata over IPv6"},
	{netip.MustParseAddr("fd20:ce::254"), "fd20:ce::254/128", "GCP metadata over IPv6"},
}

// hostProtected puts the protected addresses of protectedHosted in the
// test internet, each with HTTP servers on ports 80 and 8080 answering
// "meta <addr> <path>", and routes them from the host.
func hostProtected(t *testing.T, in *internet) {
	t.Helper()
	hostDev := strings.Fields(run(t, "ip", "-o", "-4", "addr", "show", "to", inetHost.String()+"/32"))[1]
	peerDev := strings.Fields(run(t, "ip", "-n", in.ns, "-o", "-4", "addr", "show", "to", inetA.String()+"/32"))[1]
	// The IPv6 link between the host and the test internet.
	run(t, "ip", "-6", "addr", "add", "fd00:ec2::1/112", "dev", hostDev, "nodad")
	run(t, "ip", "-n", in.ns, "-6", "addr", "add", "fd00:ec2::2/112", "dev", peerDev, "nodad")
	run(t, "ip", "-n", in.ns, "-6", "route", "add", "default", "via", "fd00:ec2::1")
	for _, p := range protectedHosted {
		a := p.addr.String()
		if p.addr.Is4() {
			run(t, "ip", "-n", in.ns, "addr", "add", a+"/32", "dev", "lo")
			run(t, "ip", "route", "add", a+"/32", "via", inetA.String(), "dev", hostDev)
			t.Cleanup(func() { exec.Command("ip", "route", "del", a+"/32", "via", inetA.String(), "dev", hostDev).Run() })
		} else {
			run(t, "ip", "-n", in.ns, "-6", "addr", "add", a+"/128", "dev", "lo")
			run(t, "ip", "-6", "route", "add", a+"/128", "via", "fd00:ec2::2", "dev", hostDev)
		}
		for _, port := range []string{"80", "8080"} {
			serveIn(t, in.path, "tcp", net.JoinHostPort(a, port), "meta "+a)
		}
	}
	t.Cleanup(func() { exec.Command("ip", "-6", "addr", "del", "fd00:ec2::1/112", "dev", hostDev).Run() })
}

// TestProtectedAddresses: every cloud metadata address of the protected
// list that the test internet can host is refused, directly (bridge mode)
// and through each proxy, even under rules allowing everything, and so is
// an address of every other protected range; a rule naming the exact
// address allows it, and only it.
func TestProtectedAddresses(t *testing.T) {
	e := setup(t)
	hostProtected(t, e.in)
	// The servers are really there: the host reaches each one.
	for _, p := range protectedHosted {
		c := http.Client{Timeout: 5 * time.Second}
		resp, err := c.Get("http://" + net.JoinHostPort(p.addr.String(), "80") + "/check")
		if err != nil {
			t.Fatalf("%s (%s) from the host: %v", p.addr, p.label, err)
		}
		resp.Body.Close()
	}

	wide := Policy{Allow: []Rule{{Destination: "0.0.0.0/0"}, {Destination: "::/0"}, {Destination: "100.64.0.0/10"},
		{Destination: "169.254.0.0/15"}, {Destination: "192.0.0.0/24"}, {Destination: "fd00::/8"}}}
	w := attach(t, e.m, "wide", ModeBridge, wide)
	px := w.att.Env["http_proxy"]
	if got := w.connect(t, inetA.String(), 8080, true); got != "connected" {
		t.Fatalf("bridge jail allowing 0.0.0.0/0: direct %s:8080: %s", inetA, got)
	}
	for _, p := range protectedHosted {
		a := p.addr.String()
		url := "http://" + net.JoinHostPort(a, "80") + "/"
		rule := "protected:" + p.rng
		refused := func(via string) {
			t.Helper()
			e.rec.wait(t, w.id, via+" refusal of "+a, func(ev ConnEvent) bool {
				h, _, _ := net.SplitHostPort(ev.Dst)
				return ev.Via == via && (ev.Host == a || h == a) && ev.Verdict == VerdictBlock && ev.Rule == rule
			})
		}
		if s, c := w.curl(t, map[string]string{"http_proxy": px}, url); s != "403" {
			t.Errorf("%s (%s) through the http proxy: status %s exit %d, want 403", a, p.label, s, c)
		}
		refused(ViaHTTPProxy)
		if s, c := w.curl(t, nil, "-p", "-x", px, "http://"+net.JoinHostPort(a, "8080")+"/"); c != 56 {
			t.Errorf("%s (%s) by CONNECT: status %s exit %d, want 56 (proxy refused)", a, p.label, s, c)
		}
		refused(ViaConnect)
		if s, c := w.curl(t, nil, "--socks5", net.JoinHostPort(e.m.daemon.String(), "1080"), url); c != 97 {
			t.Errorf("%s (%s) by SOCKS: status %s exit %d, want 97 (socks refused)", a, p.label, s, c)
		}
		refused(ViaSOCKS)
		if !p.addr.Is4() {
			continue // the jail has no IPv6
		}
		if s, c := w.curl(t, nil, url); s != "403" {
			t.Errorf("%s (%s) transparently: status %s exit %d, want 403", a, p.label, s, c)
		}
		refused(ViaTransparent)
		if got := w.connect(t, a, 8080, true); got != "refused" {
			t.Errorf("%s (%s) directly: %s, want refused", a, p.label, got)
		}
		refused(ViaKernel)
	}

	// Every other protected range, and those known at run time (the jail
	// subnet, the host's addresses), through the proxy.
	others := map[netip.Addr]string{e.m.daemon: "protected:" + testSubnet, inetHost: "protected:" + inetHost.String() + "/32"}
	for _, r := range protectedRanges {
		a := r.Addr()
		if r.Bits() < a.BitLen() {
			a = a.Next()
		}
		others[a] = "protected:" + r.String()
	}
	for a, rule := range others {
		url := "http://" + net.JoinHostPort(a.String(), "80") + "/other"
		if s, c := w.curl(t, map[string]string{"http_proxy": px}, url); s != "403" {
			t.Errorf("%s through the http proxy: status %s exit %d, want 403", a, s, c)
		}
		e.rec.wait(t, w.id, "proxy refusal of "+a.String(), func(ev ConnEvent) bool {
			return ev.Via == ViaHTTPProxy && ev.Host == a.String() && ev.Path == "/other" && ev.Status == 403 && ev.Rule == rule
		})
	}

	// Rules naming the exact addresses.
	var named Policy
	for _, p := range protectedHosted[:4] {
		named.Allow = append(named.Allow, Rule{Destination: p.addr.String()})
	}
	n := attach(t, e.m, "named", ModeBridge, named)
	npx := map[string]string{"http_proxy": n.att.Env["http_proxy"]}
	for _, p := range protectedHosted {
		a := p.addr.String()
		url := "http://" + net.JoinHostPort(a, "80") + "/named"
		want, rule := "meta "+a+" /named", "allow:"+a
		if p.addr == protectedHosted[4].addr {
			want, rule = "", "protected:"+p.rng
		}
		out, _ := n.exec(t, npx, "curl", "-sS", "--max-time", "8", url)
		if want == "" {
			if strings.Contains(out, "meta") {
				t.Errorf("%s (%s), not named, through the proxy: %q, want a refusal", a, p.label, out)
			}
		} else if out != want {
			t.Errorf("%s (%s) named by a rule, through the proxy: %q, want %q", a, p.label, out, want)
		}
		e.rec.wait(t, n.id, "proxy decision for "+a, func(ev ConnEvent) bool {
			return ev.Via == ViaHTTPProxy && ev.Host == a && ev.Path == "/named" && ev.Rule == rule
		})
		if !p.addr.Is4() {
			continue
		}
		if out, _ := n.exec(t, nil, "curl", "-sS", "--max-time", "8", url); out != want {
			t.Errorf("%s (%s) named by a rule, transparently: %q, want %q", a, p.label, out, want)
		}
		if got := n.connect(t, a, 8080, true); got != "connected" {
			t.Errorf("%s (%s) named by a rule, directly: %s", a, p.label, got)
		}
		e.rec.wait(t, n.id, "kernel allow of "+a, func(ev ConnEvent) bool {
			return ev.Via == ViaKernel && ev.Dst == net.JoinHostPort(a, "8080") && ev.Verdict == VerdictAllow && ev.Rule == rule
		})
	}
	// Naming one metadata address does not open its neighbours.
	if got := n.connect(t, metadata.String(), 8080, true); got != "refused" {
		t.Errorf("169.254.169.254 with only 169.254.170.2 named: %s, want refused", got)
	}
}

// TestIngress: inbound connections to a jail's ports from outside the
// host are refused unless an ingress rule names their source (and port);
// the host itself always connects. Rules apply to new connections at
// once. In isolated mode this needs the host to forward, which a jail
// with ingress rules turns on (on a host that did not forward, an
// isolated jail's ingress rules had no effect).
func TestIngress(t *testing.T) {
	e := setup(t)
	for _, mode := range []string{ModeIsolated, ModeBridge} {
		t.Run(mode, func(t *testing.T) {
			// A rule for another source from the start.
			p := basePolicy()
			p.Ingress = []Rule{{Destination: inetC.String()}}
			j := attach(t, e.m, "ingress-"+mode, mode, p)
			greetIn(t, j.path, "0.0.0.0:9000", "hello from the jail")
			greetIn(t, j.path, "0.0.0.0:9001", "hello from the jail")
			at := func(port int) string { return net.JoinHostPort(j.att.IP.String(), fmt.Sprint(port)) }
			refused := func(src netip.Addr, port int) {
				t.Helper()
				if got, err := readFrom(e.in.path, src, at(port)); !errors.Is(err, syscall.ECONNREFUSED) {
					t.Errorf("from %s to port %d: %q, %v; want connection refused", src, port, got, err)
				}
			}
			accepted := func(src netip.Addr, port int) {
				t.Helper()
				if got, err := readFrom(e.in.path, src, at(port)); err != nil || got != "hello from the jail" {
					t.Errorf("from %s to port %d: %q, %v; want the greeting", src, port, got, err)
				}
			}
			if got, err := readFrom("", netip.Addr{}, at(9000)); err != nil || got != "hello from the jail" {
				t.Errorf("from the host without a rule: %q, %v; want the greeting", got, err)
			}
			refused(inetA, 9000)
			e.rec.wait(t, j.id, "ingress refusal", func(ev ConnEvent) bool {
				return ev.Dir == "ingress" && ev.Via == ViaKernel && ev.Verdict == VerdictBlock && ev.Rule == "ingress:default" &&
					strings.HasPrefix(ev.Src, inetA.String()+":") && ev.Dst == at(9000)
			})

			p.Ingress = []Rule{{Destination: inetA.String(), Ports: []int{9000}, Protocol: ProtoTCP}}
			if err := e.m.Update(context.Background(), j.id, p); err != nil {
				t.Fatal(err)
			}
			accepted(inetA, 9000)
			e.rec.wait(t, j.id, "ingress allowed", func(ev ConnEvent) bool {
				return ev.Dir == "ingress" && ev.Verdict == VerdictAllow && ev.Rule == "ingress:"+inetA.String() &&
					strings.HasPrefix(ev.Src, inetA.String()+":") && ev.Dst == at(9000)
			})
			refused(inetB, 9000) // another source
			refused(inetA, 9001) // another port
			if got, err := readFrom("", netip.Addr{}, at(9001)); err != nil || got != "hello from the jail" {
				t.Errorf("from the host to a port no rule names: %q, %v; want the greeting", got, err)
			}

			// A CIDR source, then none again.
			p.Ingress = []Rule{{Destination: "198.18.0.0/24"}}
			if err := e.m.Update(context.Background(), j.id, p); err != nil {
				t.Fatal(err)
			}
			accepted(inetB, 9001)
			p.Ingress = nil
			if err := e.m.Update(context.Background(), j.id, p); err != nil {
				t.Fatal(err)
			}
			refused(inetB, 9001)
		})
	}
}

// TestDNSAnswers: the jail's resolver answers refused names (no rule, a
// block rule, an address that is protected) and unknown names with
// NXDOMAIN, never SERVFAIL or REFUSED (an allowed name whose every
// address is refused too), over UDP and TCP, and also when the
// jail asks another server; an allowed name gets NOERROR with its
// address (and an empty NOERROR for AAAA: the jail has no IPv6).
func TestDNSAnswers(t *testing.T) {
	e := setup(t)
	p := basePolicy()
	p.Allow = append(p.Allow, Rule{Destination: "meta.test"}) // allowed by name, its address is not
	j := attach(t, e.m, "dns", ModeIsolated, p)
	daemon := e.m.daemon.String()
	elsewhere := "203.0.113.53" // any server: redirected to the daemon
	for _, c := range []struct {
		server, name string
		qtype        int
		transport    string
		want         string
	}{
		{daemon, "allowed.test", qtypeA, "udp", "rcode 0 answers " + inetA.String()},
		{daemon, "allowed.test", qtypeA, "tcp", "rcode 0 answers " + inetA.String()},
		{daemon, "x.wild.test", qtypeA, "udp", "rcode 0 answers " + inetA.String()},
		{daemon, "allowed.test", qtypeAAAA, "udp", "rcode 0 answers"},
		{elsewhere, "allowed.test", qtypeA, "udp", "rcode 0 answers " + inetA.String()},
		{elsewhere, "allowed.test", qtypeA, "tcp", "rcode 0 answers " + inetA.String()},
		{daemon, "other.test", qtypeA, "udp", "rcode 3 answers"},
		{daemon, "other.test", qtypeA, "tcp", "rcode 3 answers"},
		{daemon, "other.test", qtypeAAAA, "udp", "rcode 3 answers"},
		{daemon, "bad.wild.test", qtypeA, "udp", "rcode 3 answers"},
		{daemon, "meta.test", qtypeA, "udp", "rcode 3 answers"},
		{daemon, "no-such-name.test", qtypeA, "udp", "rcode 3 answers"},
		{daemon, "missing.wild.test", qtypeA, "udp", "rcode 3 answers"}, // allowed, but does not exist
		{elsewhere, "other.test", qtypeA, "udp", "rcode 3 answers"},
	} {
		if got := j.dns(t, c.server, c.name, c.qtype, c.transport); got != c.want {
			t.Errorf("%s over %s to %s, qtype %d: %q, want %q", c.name, c.transport, c.server, c.qtype, got, c.want)
		}
	}
	for name, rule := range map[string]string{"other.test": "default", "bad.wild.test": "block:bad.wild.test", "meta.test": "protected:169.254.0.0/16"} {
		e.rec.wait(t, j.id, "DNS refusal of "+name, func(ev ConnEvent) bool {
			return ev.Via == ViaDNS && ev.Host == name && ev.Verdict == VerdictBlock && ev.Rule == rule
		})
	}
}

// TestProxyEnvironment: the attachment's environment names the explicit
// proxies in both cases, as curl, python, git and others read them, and
// exempts the jail's own loopback. Python with only the upper-case
// variables goes through the HTTP proxy and CONNECT (not the transparent
// path); with the full environment it reaches a server on its loopback
// directly, and git goes through the proxy.
func TestProxyEnvironment(t *testing.T) {
	e := setup(t)
	j := attach(t, e.m, "env", ModeIsolated, basePolicy())
	env := j.att.Env
	proxy := fmt.Sprintf("http://%s:3128", e.m.daemon)
	socks := fmt.Sprintf("socks5h://%s:1080", e.m.daemon)
	for k, want := range map[string]string{
		"HTTP_PROXY": proxy, "http_proxy": proxy, "HTTPS_PROXY": proxy, "https_proxy": proxy,
		"ALL_PROXY": socks, "all_proxy": socks,
	} {
		if env[k] != want {
			t.Errorf("attachment env %s=%q, want %q", k, env[k], want)
		}
	}
	for _, k := range []string{"NO_PROXY", "no_proxy"} {
		hosts := strings.Split(env[k], ",")
		for _, h := range []string{"localhost", "127.0.0.1"} {
			if !containsString(hosts, h) {
				t.Errorf("attachment env %s=%q lacks %s", k, env[k], h)
			}
		}
	}

	const pyGet = `
import sys, urllib.request
try:
    r = urllib.request.urlopen(sys.argv[1], timeout=8)
    print(r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code)
except Exception as e:
    print("error", e)
`
	upper := map[string]string{"SSL_CERT_FILE": e.ca.pemFile}
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"} {
		upper[k] = env[k]
	}
	if out, _ := j.exec(t, upper, python, "-c", pyGet, "http://allowed.test/upper-http"); strings.TrimSpace(out) != "200 hello from allowed.test /upper-http" {
		t.Errorf("python, upper-case HTTP_PROXY: %q", out)
	}
	e.rec.wait(t, j.id, "python through the HTTP proxy", func(ev ConnEvent) bool {
		return ev.Via == ViaHTTPProxy && ev.Path == "/upper-http" && ev.Status == 200
	})
	if out, _ := j.exec(t, upper, python, "-c", pyGet, "https://api.test/upper-https"); strings.TrimSpace(out) != "200 hello from api.test /upper-https" {
		t.Errorf("python, upper-case HTTPS_PROXY: %q", out)
	}
	e.rec.wait(t, j.id, "python through CONNECT", func(ev ConnEvent) bool {
		return ev.Via == ViaConnect && ev.Host == "api.test" && ev.Port == 443 && ev.Verdict == VerdictAllow
	})
	if n := e.rec.count(j.id, func(ev ConnEvent) bool { return ev.Via == ViaTransparent }); n != 0 {
		t.Errorf("%d transparent records: python bypassed the proxy variables", n)
	}

	// The jail's loopback is not proxied (the proxy would refuse it).
	port := serveIn(t, j.path, "tcp4", "127.0.0.1:0", "loopback")
	_, p, _ := net.SplitHostPort(port)
	if out, _ := j.exec(t, env, python, "-c", pyGet, "http://localhost:"+p+"/lo"); strings.TrimSpace(out) != "200 loopback /lo" {
		t.Errorf("python to localhost with the attachment env: %q, want the loopback server", out)
	}
	if out, _ := j.exec(t, env, "curl", "-sS", "--max-time", "8", "http://127.0.0.1:"+p+"/lo"); out != "loopback /lo" {
		t.Errorf("curl to 127.0.0.1 with the attachment env: %q, want the loopback server", out)
	}

	// git reads the same variables.
	j.exec(t, env, "git", "ls-remote", "http://allowed.test/repo.git")
	e.rec.wait(t, j.id, "git through the HTTP proxy", func(ev ConnEvent) bool {
		return ev.Via == ViaHTTPProxy && ev.Host == "allowed.test" && ev.Path == "/repo.git/info/refs"
	})
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if strings.TrimSpace(x) == s {
			return true
		}
	}
	return false
}

// TestCAKeptInDataDir: the CA is made once in its directory (0700, key
// 0600, certificate 0644) and every later load uses the same certificate
// and key, so jails keep trusting it across daemon restarts; with half a
// CA on disk the load fails instead of replacing the key.
func TestCAKeptInDataDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ca")
	a, err := loadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{"": 0o700, "ca-key.pem": 0o600, "ca.pem": 0o644} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("%s: mode %v, want %v", filepath.Join(dir, name), got, want)
		}
	}
	b, err := loadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.certPEM, b.certPEM) || !a.cert.Equal(b.cert) || !a.key.Equal(b.key) {
		t.Fatal("a second load made a new CA")
	}
	// A leaf made after the reload verifies under the first certificate.
	leaf, err := b.leaf("allowed.test")
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(a.cert)
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "allowed.test"}); err != nil {
		t.Errorf("leaf of the reloaded CA under the first certificate: %v", err)
	}

	key, _ := os.ReadFile(filepath.Join(dir, "ca-key.pem"))
	os.Remove(filepath.Join(dir, "ca.pem"))
	if _, err := loadOrCreateCA(dir); err == nil {
		t.Error("loading a CA whose certificate is missing succeeded")
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "ca-key.pem")); !bytes.Equal(key, after) {
		t.Error("the CA key was replaced")
	}
}

// TestManagerReusesCA: a manager started again on the same data directory
// hands jails the same CA certificate.
func TestManagerReusesCA(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	open := func() []byte {
		t.Helper()
		m, err := New(context.Background(), Options{DataDir: dir, Subnet: testSubnet, Prefix: testPrefix, Resolver: mapResolver(testNames)})
		if err != nil {
			t.Fatal(err)
		}
		pem := m.ca.certPEM
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		return pem
	}
	first := open()
	if fi, err := os.Stat(filepath.Join(dir, "ca", "ca-key.pem")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("CA key in the data dir: %v, %v; want mode 0600", fi, err)
	}
	disk, _ := os.ReadFile(filepath.Join(dir, "ca", "ca.pem"))
	if !bytes.Equal(first, disk) {
		t.Error("the manager's CA is not the one in its data dir")
	}
	if second := open(); !bytes.Equal(first, second) {
		t.Error("a manager restarted on the same data dir made a new CA")
	}
}
