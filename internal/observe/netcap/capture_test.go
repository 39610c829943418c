package netcap

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/netns"
	"github.com/agentjail/agentjail/internal/testenv"
)

// inNetns runs fn on a thread moved into the network namespace at path;
// the thread is discarded afterwards.
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
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

var (
	addrA = netip.MustParseAddr("10.78.0.1")
	addrB = netip.MustParseAddr("10.78.0.2")
)

// vethPair makes namespaces a and b joined by the veth "cap-a" / "cap-b".
func vethPair(t *testing.T) (a, b string) {
	t.Helper()
	dir := t.TempDir()
	a, b = filepath.Join(dir, "a"), filepath.Join(dir, "b")
	fds := map[string]int{}
	for _, p := range []string{a, b} {
		if err := netns.Create(p); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { netns.Remove(p) })
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		fds[p] = fd
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "cap-a", Namespace: netlink.NsFd(fds[a])},
		PeerName: "cap-b", PeerNamespace: netlink.NsFd(fds[b])}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	for ns, cfg := range map[string]struct {
		ifname string
		addr   netip.Addr
	}{a: {"cap-a", addrA}, b: {"cap-b", addrB}} {
		err := inNetns(ns, func() error {
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+cfg.ifname+"/disable_ipv6", []byte("1"), 0o644); err != nil {
				return err
			}
			l, err := netlink.LinkByName(cfg.ifname)
			if err != nil {
				return err
			}
			if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: cfg.addr.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
				return err
			}
			return netlink.LinkSetUp(l)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return a, b
}

// TestCaptureBurst sends a burst of UDP datagrams of known sizes across a
// veth and checks that the pcap holds every one, as tshark reads it.
func TestCaptureBurst(t *testing.T) {
	testenv.RequireRoot(t)
	tshark := testenv.RequireTool(t, "tshark")
	a, b := vethPair(t)
	var recv net.PacketConn
	if err := inNetns(b, func() (err error) {
		recv, err = net.ListenPacket("udp4", netip.AddrPortFrom(addrB, 7000).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer recv.Close()
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := recv.ReadFrom(buf); err != nil {
				return
			}
		}
	}()

	pcap := filepath.Join(t.TempDir(), "burst.pcap")
	var c *Capture
	var send *net.UDPConn
	if err := inNetns(a, func() (err error) {
		if c, err = StartCapture("cap-a", pcap, 0); err != nil {
			return err
		}
		send, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(addrB, 7000)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer send.Close()
	const n = 20000
	buf := make([]byte, 1400)
	var sent, sentBytes int
	start := time.Now()
	for i := range n {
		size := 1 + i%1400
		if _, err := send.Write(buf[:size]); err != nil {
			if errors.Is(err, unix.ENOBUFS) {
				continue
			}
			t.Fatal(err)
		}
		sent++
		sentBytes += size
	}
	elapsed := time.Since(start)
	packets, dropped, err := c.Stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d datagrams in %v (%.0f/s); capture: %d packets, %d dropped", sent, elapsed, float64(sent)/elapsed.Seconds(), packets, dropped)
	if again, d2, err2 := c.Stop(); again != packets || d2 != dropped || err2 != nil {
		t.Errorf("second Stop: %d %d %v", again, d2, err2)
	}
	out, err := exec.Command(tshark, "-r", pcap, "-T", "fields", "-e", "frame.number", "-e", "udp.dstport", "-e", "udp.length").Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	var frames, ours, payload int
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		frames++
		f := strings.Split(line, "\t")
		if len(f) == 3 && f[1] == "7000" {
			l, _ := strconv.Atoi(f[2])
			ours++
			payload += l - 8
		}
	}
	if uint64(frames) != packets {
		t.Errorf("tshark reads %d frames, Stop reported %d", frames, packets)
	}
	if ours != sent || payload != sentBytes || dropped != 0 {
		t.Errorf("captured %d datagrams (%d payload bytes), sent %d (%d); %d dropped", ours, payload, sent, sentBytes, dropped)
	}
}

func TestCaptureInterfaceGone(t *testing.T) {
	testenv.RequireRoot(t)
	a, _ := vethPair(t)
	pcap := filepath.Join(t.TempDir(), "gone.pcap")
	var c *Capture
	if err := inNetns(a, func() (err error) {
		c, err = StartCapture("cap-a", pcap, 0)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := inNetns(a, func() error {
		l, err := netlink.LinkByName("cap-a")
		if err != nil {
			return err
		}
		return netlink.LinkDel(l)
	}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, _, err := c.Stop()
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Stop after the interface went away: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not return after the interface went away")
	}
	if st, err := os.Stat(pcap); err != nil || st.Size() < 24 {
		t.Errorf("pcap file: %v, %v", st, err)
	}
}

func TestStartCaptureErrors(t *testing.T) {
	testenv.RequireRoot(t)
	a, _ := vethPair(t)
	dir := t.TempDir()
	existing := filepath.Join(dir, "exists.pcap")
	if err := os.WriteFile(existing, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	fdsBefore := openFDs(t)
	err := inNetns(a, func() error {
		if _, err := StartCapture("cap-missing", filepath.Join(dir, "x.pcap"), 0); !errors.Is(err, errdefs.ErrNotFound) {
			return fmt.Errorf("missing interface: %v, want not found", err)
		}
		if _, err := StartCapture("cap-a", existing, 0); !errors.Is(err, errdefs.ErrConflict) {
			return fmt.Errorf("existing file: %v, want conflict", err)
		}
		if _, err := StartCapture("", existing, 0); !errors.Is(err, errdefs.ErrInvalid) {
			return fmt.Errorf("empty interface: %v, want invalid", err)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "x.pcap")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("failed start left a file: %v", err)
	}
	if after := openFDs(t); after != fdsBefore {
		t.Errorf("open descriptors %d before, %d after the failed starts", fdsBefore, after)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// TestCaptureBound sends more traffic over a veth than a bounded capture
// file holds: the file stays within its bound and reads whole with tshark,
// and every packet it left out is counted.
func TestCaptureBound(t *testing.T) {
	testenv.RequireRoot(t)
	tshark := testenv.RequireTool(t, "tshark")
	a, _ := vethPair(t)
	const bound = 64 << 10
	pcap := filepath.Join(t.TempDir(), "bound.pcap")
	var c *Capture
	var send *net.UDPConn
	if err := inNetns(a, func() (err error) {
		if c, err = StartCapture("cap-a", pcap, bound); err != nil {
			return err
		}
		send, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(addrB, 7001)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer send.Close()
	sent := 0
	for range 500 { // about 500 KiB
		if _, err := send.Write(make([]byte, 1000)); err == nil {
			sent++
		}
	}
	packets, _, err := c.Stop()
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(pcap)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() > bound {
		t.Errorf("the capture file holds %d bytes, its bound is %d", st.Size(), bound)
	}
	out, err := exec.Command(tshark, "-r", pcap, "-T", "fields", "-e", "frame.number").Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	if frames := len(strings.Fields(string(out))); uint64(frames) != packets {
		t.Errorf("tshark reads %d frames, Stop reported %d", frames, packets)
	}
	if over := c.OverBound(); over == 0 || packets+over < uint64(sent) {
		t.Errorf("%d packets written and %d counted over the bound, of %d datagrams sent", packets, over, sent)
	}
}
