package bpf

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/netns"
	"github.com/agentjail/agentjail/internal/observe"
)

// The test network: a "jail" namespace and a "server" namespace joined by
// a veth pair. Nothing is reachable from or to the host's namespaces.
var (
	jailAddr   = netip.MustParseAddr("10.77.0.1")
	serverAddr = netip.MustParseAddr("10.77.0.2")
)

const (
	jailIf      = "aj-jail"
	serverIf    = "aj-srv"
	xferPort    = 9000
	dnsName     = "jail.test"
	helperEnv   = "AGENTJAIL_NET_HELPER"
	helperTag   = "NETHELPER "
	etherHeader = 14
)

var dnsAnswers = []netip.Addr{netip.MustParseAddr("10.77.0.99"), netip.MustParseAddr("10.77.0.100")}

type testNet struct {
	jailNS, serverNS string
}

// newTestNet makes the two namespaces and the veth pair; cleanup removes
// them.
func newTestNet(t testing.TB) *testNet {
	t.Helper()
	dir := t.TempDir()
	n := &testNet{jailNS: filepath.Join(dir, "jail"), serverNS: filepath.Join(dir, "server")}
	for _, p := range []string{n.jailNS, n.serverNS} {
		if err := netns.Create(p); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := netns.Remove(p); err != nil {
				t.Errorf("remove netns: %v", err)
			}
		})
	}
	jfd, err := unix.Open(n.jailNS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(jfd)
	sfd, err := unix.Open(n.serverNS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(sfd)
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: jailIf, Namespace: netlink.NsFd(jfd)},
		PeerName:      serverIf,
		PeerNamespace: netlink.NsFd(sfd),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("create veth: %v", err)
	}
	// The pair goes away with the namespaces.
	n.configure(t, n.jailNS, jailIf, jailAddr)
	n.configure(t, n.serverNS, serverIf, serverAddr)
	return n
}

func (n *testNet) configure(t testing.TB, ns, ifname string, addr netip.Addr) {
	t.Helper()
	err := inNetns(ns, func() error {
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+ifname+"/disable_ipv6", []byte("1"), 0o644); err != nil {
			return err
		}
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		a := &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(24, 32)}}
		if err := netlink.AddrAdd(l, a); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		t.Fatalf("configure %s: %v", ifname, err)
	}
}

// inNetns runs fn on a thread moved into the network namespace at path;
// sockets fn creates belong to that namespace. The thread is discarded.
func inNetns(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			errc <- fmt.Errorf("setns %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// servers runs, in the server namespace, the transfer server (the client
// sends the size of the reply, then its data until EOF; the server reads
// it all and replies with that many bytes) and a DNS server on UDP and
// TCP port 53 answering A queries for dnsName.
func (n *testNet) servers(t testing.TB) {
	t.Helper()
	var xfer, dnsTCP net.Listener
	var dnsUDP net.PacketConn
	err := inNetns(n.serverNS, func() error {
		var err error
		if xfer, err = net.Listen("tcp4", netip.AddrPortFrom(serverAddr, xferPort).String()); err != nil {
			return err
		}
		if dnsTCP, err = net.Listen("tcp4", netip.AddrPortFrom(serverAddr, 53).String()); err != nil {
			return err
		}
		dnsUDP, err = net.ListenPacket("udp4", netip.AddrPortFrom(serverAddr, 53).String())
		return err
	})
	if err != nil {
		t.Fatalf("start servers: %v", err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		xfer.Close()
		dnsTCP.Close()
		dnsUDP.Close()
		wg.Wait()
	})
	serve := func(l net.Listener, handle func(net.Conn)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer c.Close()
					c.SetDeadline(time.Now().Add(30 * time.Second))
					handle(c)
				}()
			}
		}()
	}
	serve(xfer, func(c net.Conn) {
		var hdr [8]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		if _, err := io.Copy(io.Discard, c); err != nil {
			return
		}
		io.CopyN(c, zeroReader{}, int64(binary.BigEndian.Uint64(hdr[:])))
	})
	serve(dnsTCP, func(c net.Conn) {
		var l [2]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return
		}
		q := make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(c, q); err != nil {
			return
		}
		r := dnsReply(q)
		c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(r))), r...))
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 1500)
		for {
			n, from, err := dnsUDP.ReadFrom(buf)
			if err != nil {
				return
			}
			if r := dnsReply(buf[:n]); r != nil {
				dnsUDP.WriteTo(r, from)
			}
		}
	}()
}

type zeroReader struct{}

func (zeroReader) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}

// dnsReply answers a query for dnsName with dnsAnswers, anything else with
// NXDOMAIN.
func dnsReply(q []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil
	}
	question, err := p.Question()
	if err != nil {
		return nil
	}
	rh := dnsmessage.Header{ID: h.ID, Response: true, RecursionDesired: h.RecursionDesired}
	known := question.Name.String() == dnsName+"." && question.Type == dnsmessage.TypeA
	if !known {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.StartQuestions()
	b.Question(question)
	b.StartAnswers()
	if known {
		for _, a := range dnsAnswers {
			b.AResource(dnsmessage.ResourceHeader{Name: question.Name, Class: dnsmessage.ClassINET, TTL: 60},
				dnsmessage.AResource{A: a.As4()})
		}
	}
	r, err := b.Finish()
	if err != nil {
		return nil
	}
	return r
}

// helperJob is what the helper process does, passed in helperEnv.
type helperJob struct {
	Netns      string
	Send, Recv int64 // transfer sizes (payload bytes)
	DNS        bool  // also query dnsName over UDP and TCP
	// Pause makes the transfer stop after half of Send, print pausedTag
	// and wait for a line on stdin before it goes on.
	Pause bool
}

// pausedTag is the line a pausing helper prints half-way through its
// transfer.
const pausedTag = "HELPER-PAUSED"

// helperResult is what the helper reports: the local address of each of
// its connections.
type helperResult struct {
	Pid          int
	Xfer         string
	DNSUDP       string
	DNSTCP       string
	UDPAnswers   []string
	TCPAnswers   []string
	XferReceived int64
	XferNS       int64 // duration of the transfer
}

// TestNetHelper is the client process of the network tests: it only runs
// when started by them, with helperEnv set.
func TestNetHelper(t *testing.T) {
	spec := os.Getenv(helperEnv)
	if spec == "" {
		t.Skip("helper process of the network tests")
	}
	var job helperJob
	if err := json.Unmarshal([]byte(spec), &job); err != nil {
		t.Fatal(err)
	}
	// Every socket below is created on this thread, in the jail namespace.
	runtime.LockOSThread()
	fd, err := unix.Open(job.Netns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	res := helperResult{Pid: os.Getpid()}
	if job.Send > 0 || job.Recv > 0 {
		start := time.Now()
		if res.Xfer, res.XferReceived, err = transfer(job.Send, job.Recv, job.Pause); err != nil {
			t.Fatal(err)
		}
		res.XferNS = int64(time.Since(start))
	}
	if job.DNS {
		if res.DNSUDP, res.UDPAnswers, err = queryUDP(); err != nil {
			t.Fatal(err)
		}
		if res.DNSTCP, res.TCPAnswers, err = queryTCP(); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := json.Marshal(res)
	fmt.Println(helperTag + string(b))
}

func transfer(send, recv int64, pause bool) (string, int64, error) {
	c, err := net.DialTCP("tcp4", nil, net.TCPAddrFromAddrPort(netip.AddrPortFrom(serverAddr, xferPort)))
	if err != nil {
		return "", 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	var hdr [8]byte
	binary.BigEndian.PutUint64(hdr[:], uint64(recv))
	if _, err := c.Write(hdr[:]); err != nil {
		return "", 0, err
	}
	first := send
	if pause {
		first = send / 2
	}
	if _, err := io.CopyN(c, zeroReader{}, first); err != nil {
		return "", 0, err
	}
	if pause {
		fmt.Println(pausedTag)
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			return "", 0, fmt.Errorf("waiting to go on: %w", err)
		}
		c.SetDeadline(time.Now().Add(30 * time.Second))
	}
	if _, err := io.CopyN(c, zeroReader{}, send-first); err != nil {
		return "", 0, err
	}
	if err := c.CloseWrite(); err != nil {
		return "", 0, err
	}
	n, err := io.Copy(io.Discard, c)
	if err != nil {
		return "", 0, err
	}
	if n != recv {
		return "", n, fmt.Errorf("received %d bytes, want %d", n, recv)
	}
	return c.LocalAddr().String(), n, nil
}

func dnsQuery(id uint16) []byte {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	b.StartQuestions()
	b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(dnsName + "."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	q, _ := b.Finish()
	return q
}

func answersOf(r []byte) ([]string, error) {
	var p dnsmessage.Parser
	if _, err := p.Start(r); err != nil {
		return nil, err
	}
	if err := p.SkipAllQuestions(); err != nil {
		return nil, err
	}
	as, err := p.AllAnswers()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, a := range as {
		if r, ok := a.Body.(*dnsmessage.AResource); ok {
			out = append(out, netip.AddrFrom4(r.A).String())
		}
	}
	return out, nil
}

func queryUDP() (string, []string, error) {
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(serverAddr, 53)))
	if err != nil {
		return "", nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(dnsQuery(0x1234)); err != nil {
		return "", nil, err
	}
	buf := make([]byte, 1500)
	n, err := c.Read(buf)
	if err != nil {
		return "", nil, err
	}
	as, err := answersOf(buf[:n])
	return c.LocalAddr().String(), as, err
}

func queryTCP() (string, []string, error) {
	c, err := net.DialTCP("tcp4", nil, net.TCPAddrFromAddrPort(netip.AddrPortFrom(serverAddr, 53)))
	if err != nil {
		return "", nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	q := dnsQuery(0x4321)
	if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(q))), q...)); err != nil {
		return "", nil, err
	}
	var l [2]byte
	if _, err := io.ReadFull(c, l[:]); err != nil {
		return "", nil, err
	}
	r := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(c, r); err != nil {
		return "", nil, err
	}
	as, err := answersOf(r)
	return c.LocalAddr().String(), as, err
}

// runHelper runs the helper process with job, in cg when cg is not nil,
// and returns its result.
func runHelper(t testing.TB, cg *testCgroup, job helperJob) helperResult {
	t.Helper()
	return runPausingHelper(t, cg, job, nil)
}

// runPausingHelper runs the helper like runHelper; with job.Pause it calls
// paused once the helper has stopped half-way and lets it go on when paused
// returns.
func runPausingHelper(t testing.TB, cg *testCgroup, job helperJob, paused func()) helperResult {
	t.Helper()
	spec, _ := json.Marshal(job)
	args := []string{"-test.run=^TestNetHelper$", "-test.v"}
	var cmd *exec.Cmd
	if cg != nil {
		cmd = cg.command(os.Args[0], args...)
	} else {
		cmd = exec.Command(os.Args[0], args...)
	}
	cmd.Env = append(os.Environ(), helperEnv+"="+string(spec))
	var out []byte
	var err error
	if job.Pause {
		out, err = runPaused(cmd, paused)
	} else {
		out, err = cmd.CombinedOutput()
	}
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), helperTag); ok {
			var r helperResult
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatal(err)
			}
			if r.Pid != cmd.Process.Pid {
				t.Fatalf("helper reports pid %d, started as %d", r.Pid, cmd.Process.Pid)
			}
			return r
		}
	}
	t.Fatalf("helper printed no result:\n%s", out)
	return helperResult{}
}

// runPaused runs cmd, calls paused when it prints pausedTag, then tells it
// to go on; it returns everything cmd printed.
func runPaused(cmd *exec.Cmd, paused func()) ([]byte, error) {
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	waited := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		pw.Close()
		waited <- err
	}()
	var out bytes.Buffer
	br := bufio.NewReader(pr)
	for {
		line, rerr := br.ReadString('\n')
		out.WriteString(line)
		if strings.TrimSpace(line) == pausedTag {
			paused()
			fmt.Fprintln(stdin, "go on")
		}
		if rerr != nil {
			break
		}
	}
	stdin.Close()
	return out.Bytes(), <-waited
}

// netCollector is a Sink keeping copies of every event, with a condition
// to wait on.
type netCollector struct {
	mu     sync.Mutex
	events []observe.Event
}

func (c *netCollector) Handle(ev *observe.Event) {
	c.mu.Lock()
	c.events = append(c.events, *ev)
	c.mu.Unlock()
}

func (c *netCollector) Idle() {}

func (c *netCollector) snapshot() []observe.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]observe.Event(nil), c.events...)
}

// waitFor polls until cond holds for the collected events or the deadline
// passes.
func (c *netCollector) waitFor(t testing.TB, what string, cond func([]observe.Event) bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond(c.snapshot()) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
