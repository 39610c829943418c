package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/netns"
)

// testInternet is a network namespace reached from the host over a veth,
// with an HTTP server on port 80 (a WebSocket echo at /ws), an HTTPS server (a self-signed
// certificate no one trusts) on port 443 and TCP echo services on ports 7
// and 9 at addr. The daemon's DNS gets its names from the hosts file at
// hosts.
type testInternet struct {
	addr  string
	hosts string

	mu   sync.Mutex
	reqs []*http.Request
}

var inetSeq atomic.Int64

// newTestInternet makes the namespace, the veth and the servers, all
// removed when the test ends. names resolve to the server's address.
func newTestInternet(t *testing.T, names ...string) *testInternet {
	t.Helper()
	n := (os.Getpid() + int(inetSeq.Add(1))) % 250
	host, addr := fmt.Sprintf("198.19.%d.1", n), fmt.Sprintf("198.19.%d.2", n)
	ns := fmt.Sprintf("ajitnet%d", n)
	hostIf, peerIf := fmt.Sprintf("ajiti%d", n), fmt.Sprintf("ajitp%d", n)
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	sh("ip", "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	sh("ip", "link", "add", hostIf, "type", "veth", "peer", "name", peerIf, "netns", ns)
	t.Cleanup(func() { exec.Command("ip", "link", "del", hostIf).Run() })
	sh("ip", "addr", "add", host+"/30", "dev", hostIf)
	sh("ip", "link", "set", hostIf, "up")
	sh("ip", "-n", ns, "addr", "add", addr+"/30", "dev", peerIf)
	sh("ip", "-n", ns, "link", "set", peerIf, "up")
	sh("ip", "-n", ns, "link", "set", "lo", "up")

	in := &testInternet{addr: addr, hosts: filepath.Join(t.TempDir(), "hosts")}
	if err := os.WriteFile(in.hosts, []byte(addr+" "+strings.Join(names, " ")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in.mu.Lock()
		in.reqs = append(in.reqs, r.Clone(r.Context()))
		in.mu.Unlock()
		if r.URL.Path == "/ws" {
			echoWebSocket(w, r)
			return
		}
		fmt.Fprintf(w, "hello from %s%s", r.Host, r.URL.Path)
	})
	cert := selfSigned(t, names)
	for _, port := range []string{"80", "443"} {
		ln := listenInNetns(t, ns, net.JoinHostPort(addr, port))
		if port == "443" {
			ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}})
		}
		srv := &http.Server{Handler: handler}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
	}
	// TCP echo services on ports 7 and 9, for direct connections.
	for _, port := range []string{"7", "9"} {
		echo := listenInNetns(t, ns, net.JoinHostPort(addr, port))
		go func() {
			for {
				c, err := echo.Accept()
				if err != nil {
					return
				}
				go func() { io.Copy(c, c); c.Close() }()
			}
		}()
	}
	return in
}

// headers returns the value of header h in each request the servers got
// for host, in order.
func (in *testInternet) headers(host, h string) []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	var out []string
	for _, r := range in.reqs {
		if r.Host == host {
			out = append(out, r.Header.Get(h))
		}
	}
	return out
}

// listenInNetns opens a TCP listener inside the named network namespace;
// the socket stays there whichever thread serves it.
func listenInNetns(t *testing.T, ns, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := netns.Do(filepath.Join("/run/netns", ns), func() (err error) { ln, err = net.Listen("tcp4", addr); return err }); err != nil {
		t.Fatalf("listening on %s in %s: %v", addr, ns, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// selfSigned makes a certificate for names that no trust store holds.
func selfSigned(t *testing.T, names []string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// netRecord is one line of a jail's network log.
type netRecord struct {
	Via     string `json:"via"`
	Proto   string `json:"proto"`
	Host    string `json:"host"`
	Method  string `json:"method"`
	Path    string `json:"path"`
	Status  int    `json:"status"`
	Verdict string `json:"verdict"`
	Rule    string `json:"rule"`
	Comm    string `json:"comm"`
	Pid     int    `json:"pid"`
	Error   string `json:"error"`
}

// waitNetRecord polls the jail's network log until a record satisfies f.
func (d *daemon) waitNetRecord(t *testing.T, id, what string, f func(netRecord) bool) {
	t.Helper()
	var body string
	err := waitFor(10*time.Second, func() error {
		body = string(d.api.do(t, "GET", "/jails/"+id+"/network/log", nil).body)
		for _, line := range strings.Split(body, "\n") {
			var r netRecord
			if json.Unmarshal([]byte(line), &r) == nil && f(r) {
				return nil
			}
		}
		return fmt.Errorf("no record")
	})
	if err != nil {
		t.Errorf("network log has no record of %s:\n%s", what, body)
	}
}

// curlStatus runs curl in the jail and returns the HTTP status it printed
// and its exit code (6: the name did not resolve).
func (d *daemon) curlStatus(t *testing.T, id string, args ...string) (string, int) {
	t.Helper()
	cmd := append([]string{"curl", "-s", "-m", "8", "-o", "/dev/null", "-w", "%{http_code}"}, args...)
	res := d.exec(t, id, execReq{Cmd: cmd})
	return res.Stdout, res.ExitCode
}

// TestNetworkPolicyThroughDaemon drives a jail's network policy through
// the API: allowed names answer, others do not resolve, PUT
// /jails/{id}/network grants and revokes names for the next connection,
// bad policies are refused with the field named, every decision is in the
// network log and the event stream, and an injected credential reaches
// its host only, never the jail, the answers, the record or the logs.
func TestNetworkPolicyThroughDaemon(t *testing.T) {
	requireEnv(t)
	in := newTestInternet(t, "web.test", "other.test")
	d := newDaemon(t, "--hosts-file", in.hosts)
	const secret = "agentjail-it-secret-5b0d27c4e9"
	cred := []map[string]any{{"host": "web.test", "header": "X-Api-Key", "value": secret}}
	policy := func(names ...string) map[string]any {
		var rules []map[string]any
		for _, n := range names {
			rules = append(rules, map[string]any{"destination": n})
		}
		return map[string]any{"mode": "isolated", "allowed_egress": rules, "credentials": cred}
	}
	j := d.createJail(t, map[string]any{"isolation": map[string]any{"network": policy("web.test")}})

	if s, c := d.curlStatus(t, j.ID, "http://web.test/first"); s != "200" {
		t.Fatalf("allowed name: status %q, curl exit %d", s, c)
	}
	if got := in.headers("web.test", "X-Api-Key"); len(got) != 1 || got[0] != secret {
		t.Errorf("the injected header at web.test: %q, want the secret once", got)
	}
	// Outside the policy: the explicit proxy (the jail's http_proxy)
	// answers 403, and without it the name does not resolve.
	if s, c := d.curlStatus(t, j.ID, "http://other.test/"); s != "403" {
		t.Errorf("a name outside the policy through the proxy: status %q, curl exit %d, want 403", s, c)
	}
	if s, c := d.curlStatus(t, j.ID, "--noproxy", "*", "http://other.test/"); c != 6 {
		t.Errorf("a name outside the policy without the proxy: status %q, curl exit %d, want 6 (does not resolve)", s, c)
	}

	// Granted live: the next connection passes; the credential stays
	// with its host.
	d.api.want(t, http.StatusOK, "PUT", "/jails/"+j.ID+"/network", policy("web.test", "other.test"), nil)
	if s, c := d.curlStatus(t, j.ID, "http://other.test/second"); s != "200" {
		t.Errorf("other.test after it was allowed: status %q, curl exit %d", s, c)
	}
	if got := in.headers("other.test", "X-Api-Key"); len(got) != 1 || got[0] != "" {
		t.Errorf("the header at other.test: %q, want one request without it", got)
	}
	// Revoked live.
	d.api.want(t, http.StatusOK, "PUT", "/jails/"+j.ID+"/network", policy("other.test"), nil)
	if s, c := d.curlStatus(t, j.ID, "http://web.test/third"); s != "403" {
		t.Errorf("web.test after its rule was removed: status %q, curl exit %d, want 403", s, c)
	}
	if s, c := d.curlStatus(t, j.ID, "--noproxy", "*", "http://web.test/fourth"); c != 6 {
		t.Errorf("web.test without the proxy after its rule was removed: status %q, curl exit %d, want 6 (does not resolve)", s, c)
	}
	if s, c := d.curlStatus(t, j.ID, "--noproxy", "*", "--resolve", "web.test:80:"+in.addr, "http://web.test/fifth"); s != "403" {
		t.Errorf("web.test by address after its rule was removed: status %q, curl exit %d, want 403 (transparent proxy)", s, c)
	}
	var got jailInfo
	d.api.want(t, http.StatusOK, "GET", "/jails/"+j.ID, nil, &got)
	if !strings.Contains(string(got.Config), `"other.test"`) || strings.Contains(string(got.Config), `"web.test"}`) {
		t.Errorf("the jail's config after the update: %s", got.Config)
	}

	// Bad policies change nothing.
	for _, c := range []struct {
		body  any
		field string
	}{
		{map[string]any{"mode": "isolated", "bogus": 1}, "bogus"},
		{map[string]any{"mode": "host"}, "mode"},
		{map[string]any{"mode": "none"}, "mode"},
		{map[string]any{"mode": "isolated", "allowed_egress": []map[string]any{{"destination": "bad name!"}}}, "allowed_egress[0].destination"},
		{map[string]any{"mode": "isolated", "limits": map[string]any{"requests_per_minute": -1}}, "limits.requests_per_minute"},
	} {
		r := d.api.do(t, "PUT", "/jails/"+j.ID+"/network", c.body)
		if r.status/100 != 4 || !strings.Contains(r.errorMessage(), c.field) {
			t.Errorf("PUT network %v: want a 4xx naming %q, got %s", c.body, c.field, r)
		}
	}
	if r := d.api.do(t, "PUT", "/jails/no-such-jail/network", policy("web.test")); r.status != http.StatusNotFound {
		t.Errorf("PUT network of an unknown jail: want 404, got %s", r)
	}
	if s, _ := d.curlStatus(t, j.ID, "http://other.test/after-bad"); s != "200" {
		t.Errorf("other.test after refused updates: status %q, want the policy unchanged", s)
	}

	// The record.
	d.waitNetRecord(t, j.ID, "the allowed request with its process", func(r netRecord) bool {
		return r.Host == "web.test" && r.Path == "/first" && r.Method == "GET" && r.Status == 200 && r.Verdict == "allow" && r.Comm == "curl" && r.Pid > 0
	})
	d.waitNetRecord(t, j.ID, "the request refused by the proxy", func(r netRecord) bool {
		return r.Via == "http_proxy" && r.Host == "other.test" && r.Verdict == "block" && r.Rule == "default" && r.Status == 403
	})
	d.waitNetRecord(t, j.ID, "the refused lookup", func(r netRecord) bool {
		return r.Via == "dns" && r.Host == "other.test" && r.Verdict == "block"
	})
	d.waitNetRecord(t, j.ID, "the request refused after the revocation", func(r netRecord) bool {
		return r.Host == "web.test" && r.Path == "/third" && r.Verdict == "block" && r.Status == 403
	})
	d.waitNetRecord(t, j.ID, "the transparent request refused after the revocation", func(r netRecord) bool {
		return r.Via == "transparent" && r.Host == "web.test" && r.Path == "/fifth" && r.Verdict == "block" && r.Status == 403
	})
	stream := string(d.api.want(t, http.StatusOK, "GET", "/jails/"+j.ID+"/events?type=net&follow=false", nil, nil).body)
	if !strings.Contains(stream, "event: net\n") || !strings.Contains(stream, `"/second"`) {
		t.Errorf("the event stream lacks the network events:\n%.2000s", stream)
	}

	// The secret: nowhere in the jail, the answers, the record or the
	// daemon's log. jail.json holds it, readable by root only.
	for _, p := range []string{"/jails", "/jails/" + j.ID, "/jails/" + j.ID + "/network/log", "/jails/" + j.ID + "/events?follow=false"} {
		if body := d.api.want(t, http.StatusOK, "GET", p, nil, nil).body; strings.Contains(string(body), secret) {
			t.Errorf("GET %s shows the secret", p)
		}
	}
	// The patterns go in on stdin, so that the scan's own argv (in the
	// process record) does not hold the secret; a control file shows
	// that the scan finds what is there.
	const control = "agentjail-it-control-91d3"
	d.putFile(t, j.ID, "/tmp/scan-control", []byte(control))
	inJail := d.exec(t, j.ID, execReq{User: "root", Stdin: secret + "\n" + control + "\n", Cmd: []string{"sh", "-c",
		`env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n'; echo files:; grep -rIlF -f /dev/stdin /etc /tmp /workspace /home /root /var /run /.agentjail 2>/dev/null`}})
	if _, files, _ := strings.Cut(inJail.Stdout, "files:\n"); strings.Contains(inJail.Stdout, secret) || files != "/tmp/scan-control\n" {
		t.Errorf("the secret inside the jail (files found: %q, want the control file only): %s", files, &inJail)
	}
	jailDir := filepath.Join(d.dir, "jails", j.ID)
	filepath.Walk(jailDir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return nil
		}
		data, _ := os.ReadFile(p)
		if !strings.Contains(string(data), secret) {
			return nil
		}
		if filepath.Base(p) != "jail.json" {
			t.Errorf("the secret is in %s", p)
		} else if fi.Mode().Perm() != 0o600 {
			t.Errorf("jail.json holds the secret with mode %v, want 0600", fi.Mode().Perm())
		}
		return nil
	})
	if log, err := os.ReadFile(d.logPath); err != nil || strings.Contains(string(log), secret) {
		t.Errorf("the daemon's log holds the secret (read error %v)", err)
	}
}

// TestNetworkTLSInspectionTrustStore: with TLS inspection on, the daemon's
// CA is in the jail's system trust store, so a client with an empty
// environment completes the TLS handshake with the inspecting proxy; the
// proxy then refuses the upstream server whose certificate no one trusts,
// and the record says why.
func TestNetworkTLSInspectionTrustStore(t *testing.T) {
	requireEnv(t)
	in := newTestInternet(t, "web.test")
	d := newDaemon(t, "--hosts-file", in.hosts)
	j := d.createJail(t, map[string]any{"isolation": map[string]any{"network": map[string]any{
		"mode": "isolated", "tls_inspection": true, "allowed_egress": []map[string]any{{"destination": "web.test"}},
	}}})
	caPEM, err := os.ReadFile(filepath.Join(d.dir, "ca", "ca.pem"))
	if err != nil {
		t.Fatalf("the daemon's CA certificate: %v", err)
	}
	env := d.mustSh(t, j.ID, "env")
	for _, k := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO"} {
		if !strings.Contains(env, k+"=") {
			t.Errorf("the jail's environment lacks %s:\n%s", k, env)
		}
	}
	bundle := d.mustSh(t, j.ID, "cat /etc/ssl/certs/ca-certificates.crt")
	if !strings.Contains(bundle, strings.TrimSpace(string(caPEM))) {
		t.Errorf("the jail's CA bundle lacks the daemon's CA")
	}
	// The variables that replace a client's roots name a bundle that
	// keeps the rootfs's roots (hosts the proxy does not inspect present
	// their own certificates), besides the daemon's CA.
	counts := d.mustSh(t, j.ID, `for f in "$SSL_CERT_FILE" "$REQUESTS_CA_BUNDLE" "$GIT_SSL_CAINFO" "$CURL_CA_BUNDLE"; do grep -c 'BEGIN CERTIFICATE' "$f"; done`)
	for _, n := range strings.Fields(counts) {
		if c, _ := strconv.Atoi(n); c < 2 {
			t.Errorf("certificates in the bundles the CA variables name: %q, want the system roots and the daemon's CA in each", counts)
			break
		}
	}
	if got := d.mustSh(t, j.ID, `cat "$NODE_EXTRA_CA_CERTS"`); strings.TrimSpace(got) != strings.TrimSpace(string(caPEM)) {
		t.Errorf("NODE_EXTRA_CA_CERTS names a file that is not the daemon's CA alone")
	}
	for _, cmd := range [][]string{
		{"curl", "-s", "-m", "8", "-o", "/dev/null", "-w", "%{http_code}", "https://web.test/curl-env"},
		{"env", "-i", "/usr/bin/curl", "-s", "-m", "8", "-o", "/dev/null", "-w", "%{http_code}", "https://web.test/curl"},
		{"env", "-i", "/usr/bin/python3", "-c", `
import urllib.request, urllib.error
try:
    urllib.request.urlopen("https://web.test/python", timeout=8)
except urllib.error.HTTPError as e:
    print(e.code, end="")
`},
	} {
		res := d.exec(t, j.ID, execReq{Cmd: cmd})
		if res.Stdout != "502" {
			t.Errorf("%v: want the proxy's 502 after a trusted handshake, got %s", cmd, &res)
		}
	}
	d.waitNetRecord(t, j.ID, "the untrusted upstream", func(r netRecord) bool {
		return r.Host == "web.test" && r.Path == "/curl" && r.Verdict == "error" && strings.Contains(r.Error, "certificate")
	})
}

// TestNetworkModes: mode none leaves the jail only its loopback; mode
// host is refused unless the daemon was started with
// --allow-host-network, and then the jail shares the host's network.
func TestNetworkModes(t *testing.T) {
	requireEnv(t)
	d := shared(t)
	none := d.createJail(t, map[string]any{"isolation": map[string]any{"network": map[string]any{"mode": "none"}}})
	ifs := d.mustSh(t, none.ID, `tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '`)
	if ifs != "lo\n" {
		t.Errorf("interfaces of a jail in mode none: %q, want lo only", ifs)
	}
	out := d.mustSh(t, none.ID, `python3 -c '
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
c = socket.create_connection(s.getsockname(), timeout=3); print("loopback ok")
try:
    socket.create_connection(("198.51.100.1", 80), timeout=3); print("leak")
except OSError as e:
    print("refused", e.errno)'`)
	if !strings.HasPrefix(out, "loopback ok\nrefused") {
		t.Errorf("mode none: %q, want loopback working and no way out", out)
	}

	r := d.api.do(t, "POST", "/jails", map[string]any{"name": uniqueName(t), "isolation": map[string]any{"network": map[string]any{"mode": "host"}}})
	if r.status/100 != 4 || !strings.Contains(r.errorMessage(), "allow-host-network") {
		t.Errorf("mode host without the daemon's opt-in: want a 4xx naming --allow-host-network, got %s", r)
	}

	hd := newDaemon(t, "--allow-host-network")
	host := hd.createJail(t, map[string]any{"isolation": map[string]any{"network": map[string]any{"mode": "host"}}})
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	if got := hd.mustSh(t, host.ID, "stat -L -c %i /proc/self/ns/net"); got != fmt.Sprintf("%d\n", st.Ino) {
		t.Errorf("a jail in mode host is in network namespace %q, want the host's %d", got, st.Ino)
	}
	// CRIU locks no network of a jail in the host's namespace: its disk is
	// copied at post-dump instead of at network-lock, and still matches
	// the processes' snapshot.
	hd.mustSh(t, host.ID, "echo before > /workspace/f")
	snap := hd.takeSnapshot(t, host.ID, "full")
	hd.mustSh(t, host.ID, "echo after > /workspace/f")
	restored := hd.restoreSnapshot(t, snap.ID)
	if got := hd.mustSh(t, restored.ID, "cat /workspace/f"); got != "before\n" {
		t.Errorf("a restored snapshot of a jail in mode host holds %q, want the file as it was at the snapshot", got)
	}
}

// TestNetworkBridgeDirectByName: a jail in bridge mode whose config allows
// a name on a port other than 80/443 connects to it directly once the
// daemon's DNS has answered for the name; before that answer, and on other
// ports or names, the kernel refuses; the record names the host and rule.
func TestNetworkBridgeDirectByName(t *testing.T) {
	requireEnv(t)
	in := newTestInternet(t, "echo.test", "other.test")
	d := newDaemon(t, "--hosts-file", in.hosts)
	j := d.createJail(t, map[string]any{"isolation": map[string]any{"network": map[string]any{
		"mode": "bridge", "allowed_egress": []map[string]any{{"destination": "echo.test", "ports": []int{7}, "protocol": "tcp"}},
	}}})
	const probe = `
import socket, sys
def connect(host, port):
    s = socket.socket(); s.settimeout(5)
    try:
        s.connect((host, port)); s.sendall(b"ping"); return s.recv(4).decode()
    except OSError as e:
        return "refused" if isinstance(e, ConnectionRefusedError) else "error %s" % e
addr = sys.argv[1]
print(connect(addr, 7))
print(socket.gethostbyname("echo.test"))
print(connect(addr, 7))
print(connect(addr, 9))
try:
    socket.gethostbyname("other.test"); print("resolved")
except socket.gaierror:
    print("nxdomain")
`
	res := d.exec(t, j.ID, execReq{Cmd: []string{"python3", "-c", probe, in.addr}})
	want := "refused\n" + in.addr + "\nping\nrefused\nnxdomain\n"
	if res.Stdout != want {
		t.Errorf("direct connections by name in bridge mode:\n%s\nwant (before the lookup, the lookup, after it, another port, another name):\n%s", &res, want)
	}
	d.waitNetRecord(t, j.ID, "the direct connection allowed by name", func(r netRecord) bool {
		return r.Via == "kernel" && r.Verdict == "allow" && r.Host == "echo.test" && r.Rule == "allow:echo.test"
	})
}
