package netpolicy

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/duplextest"
	jailnetns "github.com/agentjail/agentjail/internal/netns"
	"github.com/agentjail/agentjail/internal/testenv"
)

// The test network: a namespace "internet" reached from the host over a
// veth (198.18.0.1 host side), holding servers for several names, and
// jail namespaces attached to a Manager with prefix "ajt" and subnet
// 10.89.0.0/16.
const (
	testPrefix = "ajt"
	testSubnet = "10.89.0.0/16"
	secret     = "s3cr3t-token-7f1c9a"
)

var (
	inetHost  = netip.MustParseAddr("198.18.0.1")
	inetA     = netip.MustParseAddr("198.18.0.2") // allowed.test, api.test, x.wild.test
	inetB     = netip.MustParseAddr("198.18.0.3") // other.test
	inetC     = netip.MustParseAddr("198.18.0.4") // bad.wild.test
	metadata  = netip.MustParseAddr("169.254.169.254")
	testNames = map[string][]netip.Addr{
		"allowed.test":  {inetA},
		"api.test":      {inetA},
		"x.wild.test":   {inetA},
		"other.test":    {inetB},
		"bad.wild.test": {inetC},
		"meta.test":     {metadata},
	}
)

func needRoot(t testing.TB) {
	t.Helper()
	missing := ""
	if os.Geteuid() != 0 {
		missing = "root"
	}
	for _, tool := range []string{"ip", "curl", "python3", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing += " " + tool
		}
	}
	testenv.Need(t, strings.TrimSpace(missing))
}

type mapResolver map[string][]netip.Addr

func (r mapResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	addrs, ok := r[strings.TrimSuffix(host, ".")]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	var out []netip.Addr
	for _, a := range addrs {
		if network == "ip" || (network == "ip4") == a.Is4() {
			out = append(out, a)
		}
	}
	return out, nil
}

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// addNetns makes a named network namespace (lo up) removed at cleanup.
func addNetns(t testing.TB, prefix string) (name, path string) {
	t.Helper()
	name = prefix + randHex(3)
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", name).Run()
		os.RemoveAll(filepath.Join("/etc/netns", name))
	})
	run(t, "ip", "-n", name, "link", "set", "lo", "up")
	return name, filepath.Join("/run/netns", name)
}

// testCA is the "public" CA of the test internet's HTTPS servers.
type testCA struct {
	pool    *x509.CertPool
	pemFile string
	cert    tls.Certificate
}

func newTestCA(t testing.TB) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test internet CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(der)
	lkey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	var names []string
	for n := range testNames {
		names = append(names, n)
	}
	ltmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "allowed.test"},
		DNSNames: names, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	lder, err := x509.CreateCertificate(rand.Reader, ltmpl, caCert, &lkey.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca := &testCA{pool: x509.NewCertPool(), cert: tls.Certificate{Certificate: [][]byte{lder}, PrivateKey: lkey}}
	ca.pool.AddCert(caCert)
	ca.pemFile = filepath.Join(t.TempDir(), "test-ca.pem")
	os.WriteFile(ca.pemFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	return ca
}

// internet is the test internet namespace and what its servers saw.
type internet struct {
	ns      string
	path    string // the namespace's bind mount
	mu      sync.Mutex
	headers []http.Header           // request headers seen by the servers
	conns   map[string]int          // connections accepted, by server address
	servers map[string]*http.Server // the HTTP servers, by address
	// A request for /hold is announced on holding and answered once hold
	// is sent to.
	holding, hold chan struct{}
}

// accepted returns how many connections the server at addr accepted.
func (in *internet) accepted(addr string) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.conns[addr]
}

func (in *internet) sawHeader(key, value string) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, h := range in.headers {
		if h.Get(key) == value {
			return true
		}
	}
	return false
}

// listenIn opens a listener inside the namespace at path.
func listenIn(t testing.TB, path, network, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := jailnetns.Do(path, func() (err error) { ln, err = net.Listen(network, addr); return err }); err != nil {
		t.Fatalf("listen %s in %s: %v", addr, path, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// dialIn connects from inside the namespace at path.
func dialIn(path, addr string) (net.Conn, error) {
	var c net.Conn
	err := jailnetns.Do(path, func() (err error) { c, err = net.DialTimeout("tcp", addr, 5*time.Second); return err })
	return c, err
}

func newInternet(t testing.TB, ca *testCA) *internet {
	t.Helper()
	ns, path := addNetns(t, "ajtinet")
	host, peer := "ajxi"+randHex(2), "ajxp"+randHex(2)
	run(t, "ip", "link", "add", host, "type", "veth", "peer", "name", peer, "netns", ns)
	t.Cleanup(func() { exec.Command("ip", "link", "del", host).Run() })
	run(t, "ip", "addr", "add", inetHost.String()+"/24", "dev", host)
	run(t, "ip", "link", "set", host, "up")
	for _, a := range []netip.Addr{inetA, inetB, inetC} {
		run(t, "ip", "-n", ns, "addr", "add", a.String()+"/24", "dev", peer)
	}
	run(t, "ip", "-n", ns, "addr", "add", metadata.String()+"/32", "dev", peer)
	run(t, "ip", "-n", ns, "link", "set", peer, "up")
	run(t, "ip", "-n", ns, "route", "add", "default", "via", inetHost.String())
	// A route to the metadata address, so a leak would really reach it.
	run(t, "ip", "route", "add", metadata.String()+"/32", "via", inetA.String(), "dev", host)

	in := &internet{ns: ns, path: path, conns: map[string]int{}, servers: map[string]*http.Server{},
		holding: make(chan struct{}, 1), hold: make(chan struct{})}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in.mu.Lock()
		in.headers = append(in.headers, r.Header.Clone())
		in.mu.Unlock()
		switch r.URL.Path {
		case "/big":
			w.Header().Set("Content-Length", fmt.Sprint(bigSize))
			w.Write(bigBody)
		case "/chunked": // no length: the body is sent chunked
			for i := 0; i < len(bigBody); i += 1 << 20 {
				w.Write(bigBody[i : i+1<<20])
				w.(http.Flusher).Flush()
			}
		case "/echo":
			io.Copy(w, r.Body)
		case "/stream": // answers the first line at once, the rest at its end
			duplextest.Handler().ServeHTTP(w, r)
		case "/hold":
			in.holding <- struct{}{}
			<-in.hold
			fmt.Fprint(w, "released")
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		default:
			fmt.Fprintf(w, "hello from %s %s", r.Host, r.URL.Path)
		}
	})
	serve := func(ln net.Listener) {
		srv := &http.Server{Handler: handler, ConnState: func(c net.Conn, s http.ConnState) {
			if s == http.StateNew {
				in.mu.Lock()
				in.conns[c.LocalAddr().String()]++
				in.mu.Unlock()
			}
		}}
		in.servers[ln.Addr().String()] = srv
		go srv.Serve(ln)
	}
	for _, a := range []netip.Addr{inetA, inetB, inetC, metadata} {
		for _, port := range []string{"80", "8080"} {
			serve(listenIn(t, path, "tcp4", net.JoinHostPort(a.String(), port)))
		}
		serve(tls.NewListener(listenIn(t, path, "tcp4", net.JoinHostPort(a.String(), "443")),
			&tls.Config{Certificates: []tls.Certificate{ca.cert}}))
		echo := listenIn(t, path, "tcp4", net.JoinHostPort(a.String(), "7"))
		go func() {
			for {
				c, err := echo.Accept()
				if err != nil {
					return
				}
				go func() { io.Copy(c, c); c.Close() }()
			}
		}()
		var pc net.PacketConn
		if err := jailnetns.Do(path, func() (err error) { pc, err = net.ListenPacket("udp4", net.JoinHostPort(a.String(), "7")); return err }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pc.Close() })
		go func() {
			buf := make([]byte, 2048)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				pc.WriteTo(buf[:n], from)
			}
		}()
	}
	return in
}

const bigSize = 8 << 20

var bigBody = bytes.Repeat([]byte("0123456789abcdef"), bigSize/16)

// recorder collects connection records.
type recorder struct {
	mu  sync.Mutex
	evs map[string][]ConnEvent
}

func (r *recorder) add(id string, ev ConnEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evs[id] = append(r.evs[id], ev)
}

// wait returns the first event of jail id matching f, waiting up to 5 s.
func (r *recorder) wait(t testing.TB, id string, what string, f func(ConnEvent) bool) ConnEvent {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.mu.Lock()
		for _, ev := range r.evs[id] {
			if f(ev) {
				r.mu.Unlock()
				return ev
			}
		}
		all := fmt.Sprintf("%+v", r.evs[id])
		r.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("no record of %s for jail %s; have %s", what, id, all)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitCount waits up to 5 s until jail id has n records that f accepts.
func (r *recorder) waitCount(t testing.TB, id, what string, n int, f func(ConnEvent) bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for r.count(id, f) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d records of %s for jail %s, want %d", r.count(id, f), what, id, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (r *recorder) dump() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprintf("%+v", r.evs)
}

// inventory lists the interfaces, routes and nft tables of the host that
// belong to these tests' managers and test internet.
func inventory(t testing.TB) string {
	t.Helper()
	// Only what these tests make: other test packages (daemons of the
	// end-to-end tests) change the host's network at the same time.
	ours := func(line string) bool {
		for _, s := range []string{testPrefix, "ajx", "10.89.", "198.18.", "169.254.", "fd00:ec2:", "fd20:ce:"} {
			if strings.Contains(line, s) {
				return true
			}
		}
		return false
	}
	var out []string
	links := strings.Fields(run(t, "sh", "-c", "ip -o link | awk -F': ' '{print $2}'"))
	sort.Strings(links)
	for _, l := range links {
		if ours(l) {
			out = append(out, l)
		}
	}
	for _, cmd := range [][]string{{"ip", "route", "show", "table", "all"}, {"nft", "list", "tables"}} {
		for _, line := range strings.Split(run(t, cmd[0], cmd[1:]...), "\n") {
			if ours(line) {
				out = append(out, line)
			}
		}
	}
	return strings.Join(out, "\n")
}

// jail is an attached test jail.
type testJail struct {
	id, ns, path string
	att          Attachment
}

func attach(t testing.TB, m *Manager, name, mode string, p Policy) *testJail {
	t.Helper()
	ns, path := addNetns(t, "ajtj")
	j := &testJail{id: "t" + randHex(5), ns: ns, path: path}
	att, err := m.Attach(context.Background(), Jail{ID: j.id, Name: name, NetnsPath: path, Mode: mode, Policy: p})
	if err != nil {
		t.Fatalf("attach %s: %v", name, err)
	}
	j.att = att
	os.MkdirAll(filepath.Join("/etc/netns", ns), 0o755)
	os.WriteFile(filepath.Join("/etc/netns", ns, "resolv.conf"), []byte(att.ResolvConf), 0o644)
	t.Cleanup(func() { m.Detach(context.Background(), j.id) })
	return j
}

var python string

// exec runs argv in the jail's netns with env (plus PATH) and returns
// combined output and the exit code.
func (j *testJail) exec(t testing.TB, env map[string]string, argv ...string) (string, int) {
	t.Helper()
	args := []string{"netns", "exec", j.ns, "env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp"}
	for k, v := range env {
		args = append(args, k+"="+v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", append(args, argv...)...).CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running %v: %v", argv, err)
	}
	return string(out), code
}

// curl fetches url and returns the HTTP status ("000" on failure) and
// curl's exit code.
func (j *testJail) curl(t testing.TB, env map[string]string, args ...string) (string, int) {
	t.Helper()
	out, code := j.exec(t, env, append([]string{"curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "8"}, args...)...)
	return strings.TrimSpace(out), code
}

// py runs a python snippet and returns its output.
func (j *testJail) py(t testing.TB, env map[string]string, src string) string {
	t.Helper()
	out, _ := j.exec(t, env, python, "-c", src)
	return strings.TrimSpace(out)
}

const pyConnect = `
import socket, sys
s = socket.socket()
s.settimeout(5)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    if len(sys.argv) > 3:
        print("connected"); sys.exit(0)
    s.sendall(b"ping")
    print("connected", s.recv(4).decode())
except ConnectionRefusedError:
    print("refused")
except Exception as e:
    print("error", type(e).__name__, e)
`

// connect connects to addr:port directly; with noEcho, it reports success
// without waiting for an echo.
func (j *testJail) connect(t testing.TB, addr string, port int, noEcho ...bool) string {
	t.Helper()
	args := []string{"-c", pyConnect, addr, fmt.Sprint(port)}
	if len(noEcho) > 0 {
		args = append(args, "noecho")
	}
	out, _ := j.exec(t, nil, append([]string{python}, args...)...)
	return strings.TrimSpace(out)
}

type env struct {
	m    *Manager
	rec  *recorder
	in   *internet
	ca   *testCA
	caJF string // the daemon CA, as a file the test jails' processes can read
}

func setup(t testing.TB) *env {
	needRoot(t)
	if python == "" {
		out, err := exec.Command("python3", "-c", "import sys; print(sys.executable)").Output()
		if err != nil {
			t.Fatalf("python3: %v", err)
		}
		python = strings.TrimSpace(string(out))
	}
	before := inventory(t)
	t.Cleanup(func() {
		if after := inventory(t); after != before {
			t.Errorf("host network changed:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	})
	ca := newTestCA(t)
	in := newInternet(t, ca)
	rec := &recorder{evs: map[string][]ConnEvent{}}
	m, err := New(context.Background(), Options{DataDir: t.TempDir(), Subnet: testSubnet, Prefix: testPrefix,
		Resolver: mapResolver(testNames), UpstreamRoots: ca.pool, Record: rec.add})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	caJF := filepath.Join(t.TempDir(), "agentjail-ca.pem")
	os.WriteFile(caJF, m.ca.certPEM, 0o644)
	return &env{m: m, rec: rec, in: in, ca: ca, caJF: caJF}
}

func basePolicy() Policy {
	return Policy{
		Allow: []Rule{{Destination: "allowed.test"}, {Destination: "*.wild.test"}, {Destination: "api.test"}},
		Block: []Rule{{Destination: "bad.wild.test"}},
	}
}

func TestIsolatedJail(t *testing.T) {
	e := setup(t)
	j := attach(t, e.m, "alpha", ModeIsolated, basePolicy())
	cacert := "--cacert"

	check := func(what, want string, got string, code int) {
		t.Helper()
		if got != want {
			t.Errorf("%s: status %s (curl exit %d), want %s", what, got, code, want)
		}
	}
	// Transparent: no proxy variables.
	s, c := j.curl(t, nil, "http://allowed.test/")
	check("http allowed.test", "200", s, c)
	s, c = j.curl(t, nil, cacert, e.ca.pemFile, "https://allowed.test/")
	check("https allowed.test", "200", s, c)
	s, c = j.curl(t, nil, "http://x.wild.test/")
	check("http x.wild.test", "200", s, c)
	// Names outside the policy do not resolve.
	if s, c = j.curl(t, nil, "http://other.test/"); c != 6 {
		t.Errorf("other.test: curl exit %d (status %s), want 6 (could not resolve)", c, s)
	}
	if s, c = j.curl(t, nil, "http://bad.wild.test/"); c != 6 {
		t.Errorf("bad.wild.test: curl exit %d (status %s), want 6", c, s)
	}
	// A name the client resolved itself is still decided by the proxy.
	s, c = j.curl(t, nil, "--resolve", "other.test:80:"+inetB.String(), "http://other.test/")
	check("http other.test by address", "403", s, c)
	s, c = j.curl(t, nil, "-H", "Host: other.test", "http://"+inetA.String()+"/")
	check("spoofed Host header", "403", s, c)
	if s, c = j.curl(t, nil, cacert, e.ca.pemFile, "--resolve", "other.test:443:"+inetB.String(), "https://other.test/"); c != 35 || !strings.Contains(s, "reset") {
		t.Errorf("https other.test: %s (exit %d), want a reset connection", s, c)
	}
	// Metadata: through the proxy and directly.
	s, c = j.curl(t, nil, "http://169.254.169.254/")
	check("metadata over http", "403", s, c)
	if c = 0; true {
		if _, c = j.curl(t, nil, "http://meta.test/"); c != 6 {
			t.Errorf("meta.test resolved (curl exit %d), want NXDOMAIN", c)
		}
	}
	if got := j.connect(t, metadata.String(), 8080); got != "refused" {
		t.Errorf("direct metadata connection: %s, want refused", got)
	}
	// Direct connections that bypass the proxy are refused, not dropped.
	if got := j.connect(t, inetA.String(), 7); got != "refused" {
		t.Errorf("direct tcp to allowed.test:7: %s, want refused", got)
	}
	if got := j.connect(t, "10.89.0.1", 22); got != "refused" {
		t.Errorf("daemon address port 22: %s, want refused", got)
	}
	if got := j.connect(t, inetHost.String(), 22); got != "refused" {
		t.Errorf("host address: %s, want refused", got)
	}
	udp := j.py(t, nil, `
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
s.connect(("`+inetA.String()+`", 7))
s.send(b"x")
try:
    s.recv(10); print("leak")
except socket.timeout:
    print("timeout")
except OSError as e:
    print("refused", e.errno)
`)
	if !strings.HasPrefix(udp, "refused") {
		t.Errorf("udp: %s, want refused", udp)
	}

	// Explicit proxies.
	px := j.att.Env
	s, c = j.curl(t, map[string]string{"http_proxy": px["http_proxy"]}, "http://allowed.test/")
	check("http proxy allowed", "200", s, c)
	s, c = j.curl(t, map[string]string{"http_proxy": px["http_proxy"]}, "http://other.test/")
	check("http proxy other.test", "403", s, c)
	s, c = j.curl(t, map[string]string{"https_proxy": px["https_proxy"]}, cacert, e.ca.pemFile, "https://allowed.test/")
	check("CONNECT allowed", "200", s, c)
	if s, c = j.curl(t, map[string]string{"https_proxy": px["https_proxy"]}, cacert, e.ca.pemFile, "https://other.test/"); c != 56 {
		t.Errorf("CONNECT other.test: exit %d status %s, want 56 (proxy refused)", c, s)
	}
	s, c = j.curl(t, map[string]string{"ALL_PROXY": px["ALL_PROXY"]}, cacert, e.ca.pemFile, "https://allowed.test/")
	check("socks5 allowed", "200", s, c)
	if s, c = j.curl(t, map[string]string{"ALL_PROXY": px["ALL_PROXY"]}, "http://other.test/"); c != 97 {
		t.Errorf("socks5 other.test: exit %d status %s, want 97 (socks refused)", c, s)
	}
	// Python, with and without proxy variables.
	const pyGet = `
import urllib.request, sys
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=8).status)
except urllib.error.HTTPError as e:
    print(e.code)
except Exception as e:
    print("error", e)
`
	for _, env := range []map[string]string{nil, px} {
		out, _ := j.exec(t, env, python, "-c", pyGet, "http://allowed.test/")
		if strings.TrimSpace(out) != "200" {
			t.Errorf("python allowed.test (env %v): %s", env != nil, out)
		}
		out, _ = j.exec(t, env, python, "-c", pyGet, "http://"+inetB.String()+"/")
		if strings.TrimSpace(out) != "403" {
			t.Errorf("python by address (env %v): %s", env != nil, out)
		}
	}

	// The record.
	r := e.rec
	r.wait(t, j.id, "allowed transparent http", func(ev ConnEvent) bool {
		return ev.Via == ViaTransparent && ev.Host == "allowed.test" && ev.Verdict == VerdictAllow && ev.Status == 200 && ev.Method == "GET" && ev.BytesIn > 0
	})
	r.wait(t, j.id, "dns answer", func(ev ConnEvent) bool {
		return ev.Via == ViaDNS && ev.Host == "allowed.test" && ev.Verdict == VerdictAllow && slices.Contains(ev.Answers, inetA.String())
	})
	r.wait(t, j.id, "dns refusal", func(ev ConnEvent) bool {
		return ev.Via == ViaDNS && ev.Host == "bad.wild.test" && ev.Verdict == VerdictBlock && ev.Rule == "block:bad.wild.test"
	})
	r.wait(t, j.id, "tls pass-through", func(ev ConnEvent) bool {
		return ev.Via == ViaTransparent && ev.Proto == "tls" && ev.Host == "allowed.test" && ev.Verdict == VerdictAllow && ev.BytesIn > 0 && ev.BytesOut > 0
	})
	r.wait(t, j.id, "tls refusal", func(ev ConnEvent) bool {
		return ev.Proto == "tls" && ev.Host == "other.test" && ev.Verdict == VerdictBlock && ev.Rule == "default"
	})
	r.wait(t, j.id, "metadata refusal", func(ev ConnEvent) bool {
		return ev.Host == metadata.String() && ev.Verdict == VerdictBlock && ev.Rule == "protected:169.254.0.0/16"
	})
	r.wait(t, j.id, "kernel refusal", func(ev ConnEvent) bool {
		return ev.Via == ViaKernel && ev.Dst == inetA.String()+":7" && ev.Verdict == VerdictBlock && ev.Rule == "mode:isolated"
	})
	r.wait(t, j.id, "kernel refusal of the host", func(ev ConnEvent) bool {
		return ev.Via == ViaKernel && ev.Dst == inetHost.String()+":22" && ev.Rule == "protected:host"
	})
	r.wait(t, j.id, "socks", func(ev ConnEvent) bool {
		return ev.Via == ViaSOCKS && ev.Host == "allowed.test" && ev.Verdict == VerdictAllow
	})
	r.wait(t, j.id, "connect refusal", func(ev ConnEvent) bool {
		return ev.Via == ViaConnect && ev.Host == "other.test" && ev.Verdict == VerdictBlock
	})

	// Live policy change, then a rate limit.
	p := basePolicy()
	p.Allow = append(p.Allow, Rule{Destination: "other.test", Ports: []int{80}})
	if err := e.m.Update(context.Background(), j.id, p); err != nil {
		t.Fatal(err)
	}
	s, c = j.curl(t, nil, "http://other.test/")
	check("other.test after update", "200", s, c)
	_, c = j.curl(t, nil, cacert, e.ca.pemFile, "https://other.test/")
	if c == 0 {
		t.Errorf("other.test:443 allowed though the rule names port 80 only")
	}
	p.RequestsPerMinute = 3
	if err := e.m.Update(context.Background(), j.id, p); err != nil {
		t.Fatal(err)
	}
	var codes []string
	for range 4 {
		s, _ = j.curl(t, nil, "http://allowed.test/")
		codes = append(codes, s)
	}
	if !slices.Equal(codes, []string{"200", "200", "200", "429"}) {
		t.Errorf("rate limit: statuses %v, want 3×200 then 429", codes)
	}
	r.wait(t, j.id, "limit", func(ev ConnEvent) bool {
		return ev.Verdict == VerdictLimit && ev.Status == 429 && ev.Rule == "limit:requests_per_minute"
	})

	// Detach removes the veth; detaching twice is fine.
	if err := e.m.Detach(context.Background(), j.id); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Detach(context.Background(), j.id); err != nil {
		t.Fatal(err)
	}
	if _, err := net.InterfaceByName(vethName(testPrefix, j.id)); err == nil {
		t.Error("veth left after detach")
	}
}
