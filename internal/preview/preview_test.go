package preview

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/agentjail/agentjail/internal/duplextest"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/netns"
	"github.com/agentjail/agentjail/internal/testenv"
)

func TestParseHost(t *testing.T) {
	for host, want := range map[string]Target{
		"8000-myapp.localhost:8082":      {8000, "myapp"},
		"5173-fix-1.localhost":           {5173, "fix-1"},
		"3000-web.sandbox.local:8082":    {3000, "web"},
		"8000-MyApp.Localhost.":          {8000, "myapp"},
		"127.0.0.1:8082":                 {},
		"localhost:8082":                 {},
		"myapp.localhost":                {},
		"0-myapp.localhost":              {},
		"70000-myapp.localhost":          {},
		"8000-.localhost":                {},
		"8000-a.b.localhost":             {},
		"8000-myapp.localhost.evil.test": {},
	} {
		got, ok := ParseHost(host)
		if ok != (want.Port != 0) || got != want {
			t.Errorf("ParseHost(%q) = %v %v, want %v", host, got, ok, want)
		}
	}
}

func TestSignedLinks(t *testing.T) {
	dir := t.TempDir()
	h, err := New(fakeJails{
		"web":    {ID: "abc123", Name: "web", Status: model.StateRunning, Pid: 1},
		"My_App": {ID: "def456", Name: "My_App", Status: model.StateRunning, Pid: 1},
	}, "tok", dir)
	if err != nil {
		t.Fatal(err)
	}
	// A name that is a host label as it is names the host; another (a
	// host name's case is lost on the way back) is replaced by the id.
	for ref, want := range map[string]string{"web": "http://8000-web.localhost:8082/?agentjail_preview=", "My_App": "http://8000-def456.localhost:8082/?agentjail_preview="} {
		link, err := h.Link(context.Background(), ref, 8000, time.Minute, "127.0.0.1:8082")
		if err != nil {
			t.Fatal(err)
		}
		if link.Port != 8000 || !strings.HasPrefix(link.URL, want) {
			t.Fatalf("link of %s: %+v, want %s...", ref, link, want)
		}
	}
	exp := time.Now().Add(time.Minute).Unix()
	sig := h.sign("abc123", 8000, exp)
	if !h.verify("abc123", 8000, sig) || h.verify("abc123", 8001, sig) || h.verify("other", 8000, sig) {
		t.Fatal("a signature is bound to its jail and port")
	}
	if h.verify("abc123", 8000, h.sign("abc123", 8000, time.Now().Add(-time.Second).Unix())) {
		t.Fatal("an expired signature verified")
	}
	if _, err := h.Link(context.Background(), "web", 8000, 365*24*time.Hour, "x:1"); err == nil {
		t.Fatal("a link for a year was made")
	}
	// The key survives a restart, so links do too.
	h2, err := New(h.jails, "tok", dir)
	if err != nil || !h2.verify("abc123", 8000, sig) {
		t.Fatalf("a link signed before a restart does not verify after it (%v)", err)
	}
}

// fakeJails is a Jails of fixed records.
type fakeJails map[string]*model.Jail

func (f fakeJails) Get(_ context.Context, ref string) (*model.Jail, error) {
	if j, ok := f[ref]; ok {
		return j, nil
	}
	for _, j := range f {
		if j.ID == ref {
			return j, nil
		}
	}
	return nil, errdefs.NotFoundf("no jail %q", ref)
}

// DialPort connects to the port on this host's loopback: the jails'
// loopback here (the jail manager's own connects through the jail's
// init, which TestConformance checks at every level).
func (f fakeJails) DialPort(ctx context.Context, ref string, port int) (net.Conn, error) {
	if _, err := f.Get(ctx, ref); err != nil {
		return nil, err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if errors.Is(err, syscall.ECONNREFUSED) {
		return nil, errdefs.NotFoundf("nothing listens on port %d", port)
	}
	return c, err
}

// TestMDNS answers <jail>.sandbox.local and <port>-<jail>.sandbox.local
// over real multicast, in a network namespace the test makes: known jails
// get the announced address, others nothing.
func TestMDNS(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Need(t, "root (a network namespace)")
	}
	testenv.RequireTool(t, "ip")
	name := "ajmdns" + time.Now().Format("150405")
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	for _, args := range [][]string{{"link", "set", "lo", "multicast", "on"}, {"link", "set", "lo", "up"},
		{"route", "add", "224.0.0.0/4", "dev", "lo"}} {
		if out, err := exec.Command("ip", append([]string{"-n", name}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v %s", args, err, out)
		}
	}
	path := filepath.Join("/run/netns", name)
	jails := fakeJails{"web": {ID: "abc", Name: "web"}, "fix-1": {ID: "def", Name: "fix-1"}}
	var srv interface{ Close() error }
	if err := netns.Do(path, func() error {
		lo, err := net.InterfaceByName("lo")
		if err != nil {
			return err
		}
		srv, err = StartMDNS(jails, MDNSOptions{Iface: lo, Addrs: []net.IP{net.ParseIP("192.0.2.7")}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ask := func(q string) []dns.RR {
		t.Helper()
		var answers []dns.RR
		err := netns.Do(path, func() error {
			c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				return err
			}
			defer c.Close()
			m := new(dns.Msg)
			m.SetQuestion(q, dns.TypeA)
			m.RecursionDesired = false
			b, _ := m.Pack()
			if _, err := c.WriteToUDP(b, &net.UDPAddr{IP: net.IPv4(224, 0, 0, 251), Port: 5353}); err != nil {
				return err
			}
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, 1500)
			n, _, err := c.ReadFromUDP(buf)
			if err != nil {
				return nil // no answer
			}
			var r dns.Msg
			if err := r.Unpack(buf[:n]); err != nil {
				return err
			}
			answers = r.Answer
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return answers
	}
	for _, q := range []string{"web.sandbox.local.", "8000-web.sandbox.local.", "fix-1.sandbox.local.", "5173-fix-1.sandbox.local."} {
		rr := ask(q)
		if len(rr) != 1 || rr[0].(*dns.A).A.String() != "192.0.2.7" {
			t.Errorf("%s: %v, want A 192.0.2.7", q, rr)
		}
	}
	if rr := ask("nope.sandbox.local."); len(rr) != 0 {
		t.Errorf("an unknown jail was answered: %v", rr)
	}
}

// TestProxyIsFullDuplex: a dev server that answers as soon as it has read
// the start of a request body is heard through the preview while the body
// is still open, and its answer is not cut when that body ends.
func TestProxyIsFullDuplex(t *testing.T) {
	dev := httptest.NewServer(duplextest.Handler())
	defer dev.Close()
	_, port, err := net.SplitHostPort(dev.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(fakeJails{"web": {ID: "abc123", Name: "web", Status: model.StateRunning, Pid: os.Getpid()}}, "tok", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(h)
	defer front.Close()
	duplextest.Check(t, front.URL+"/upload", func(r *http.Request) {
		r.Host = port + "-web.localhost"
		r.Header.Set("Authorization", "Bearer tok")
	})
}

// TestTransportsBounded: the proxy keeps one transport per jail run (a
// new run of the jail replaces its earlier one) and at most maxTransports
// in all, however many jails were previewed.
func TestTransportsBounded(t *testing.T) {
	h, err := New(fakeJails{}, "tok", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	first := h.transport(&model.Jail{ID: "j0", Pid: 1})
	if again := h.transport(&model.Jail{ID: "j0", Pid: 1}); again != first {
		t.Fatal("a second request of the same run made another transport")
	}
	if next := h.transport(&model.Jail{ID: "j0", Pid: 2}); next == first || len(h.transports) != 1 {
		t.Fatalf("a new run of the jail: %d transports, same one %v", len(h.transports), next == first)
	}
	for i := range 3 * maxTransports {
		h.transport(&model.Jail{ID: "j" + strconv.Itoa(i+1), Pid: 1})
		if n := len(h.transports); n > maxTransports {
			t.Fatalf("%d transports kept after %d jails, bound %d", n, i+2, maxTransports)
		}
	}
}
