package bpf

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/observe"
	"github.com/agentjail/agentjail/internal/observe/netcap"
	"github.com/agentjail/agentjail/internal/testenv"
)

func openNet(t testing.TB, cfg NetConfig) *NetTracer {
	t.Helper()
	requireRoot(t)
	nt, err := OpenNet(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := nt.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return nt
}

var testFlows = netcap.FlowConfig{CloseLinger: 200 * time.Millisecond, IdleTimeout: time.Minute, Interim: time.Minute}

// flowID names a flow as a record shows it.
type flowID struct{ proto, src, dst string }

// flowTotal is the sum of a flow's records.
type flowTotal struct {
	bytesOut, bytesIn, pktsOut, pktsIn int64
	ops                                []string
	pids                               []int32
	comms                              []string
	dirs                               []string
}

func flowTotals(evs []observe.Event) map[flowID]*flowTotal {
	out := map[flowID]*flowTotal{}
	for _, ev := range evs {
		if ev.Type != observe.TypeNet || strings.HasPrefix(ev.Op, "dns_") {
			continue
		}
		id := flowID{ev.Proto, ev.Src, ev.Dst}
		f := out[id]
		if f == nil {
			f = &flowTotal{}
			out[id] = f
		}
		f.bytesOut += ev.Bytes
		f.bytesIn += ev.BytesIn
		f.pktsOut += int64(ev.Packets)
		f.pktsIn += int64(ev.PacketsIn)
		f.ops = append(f.ops, ev.Op)
		f.pids = append(f.pids, ev.HostPID)
		f.comms = append(f.comms, ev.Comm)
		f.dirs = append(f.dirs, ev.Dir)
	}
	return out
}

// wireDir is one direction of a conversation in a capture.
type wireDir struct {
	frames, frameBytes, payload int64
}

// captureDirs sums, exactly, the frames of the capture per direction
// ("proto src -> dst") with tshark's own dissection.
func captureDirs(t *testing.T, tshark, pcap string) map[string]*wireDir {
	t.Helper()
	out, err := exec.Command(tshark, "-r", pcap, "-T", "fields", "-E", "separator=,",
		"-e", "frame.len", "-e", "ip.src", "-e", "ip.dst", "-e", "tcp.srcport", "-e", "tcp.dstport",
		"-e", "udp.srcport", "-e", "udp.dstport", "-e", "tcp.len", "-e", "udp.length").Output()
	if err != nil {
		t.Fatalf("tshark fields: %v", err)
	}
	dirs := map[string]*wireDir{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), ",")
		if len(f) != 9 || f[1] == "" {
			continue
		}
		var key string
		var payload int64
		switch {
		case f[3] != "":
			key = fmt.Sprintf("tcp %s:%s -> %s:%s", f[1], f[3], f[2], f[4])
			payload, _ = strconv.ParseInt(f[7], 10, 64)
		case f[5] != "":
			key = fmt.Sprintf("udp %s:%s -> %s:%s", f[1], f[5], f[2], f[6])
			payload, _ = strconv.ParseInt(f[8], 10, 64)
			payload -= 8
		default:
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			t.Fatalf("tshark frame.len %q: %v", f[0], err)
		}
		d := dirs[key]
		if d == nil {
			d = &wireDir{}
			dirs[key] = d
		}
		d.frames++
		d.frameBytes += n
		d.payload += payload
	}
	return dirs
}

// convSide is one direction of a `tshark -z conv` row: frames and bytes as
// printed (bytes in the printed unit, with the unit's size).
type convSide struct {
	frames int64
	value  int64
	unit   int64
}

// matches reports whether exact bytes print as this side's value.
func (c convSide) matches(exact int64) bool {
	if c.unit == 1 {
		return c.value == exact
	}
	return exact/c.unit == c.value || (exact+c.unit/2)/c.unit == c.value
}

// conversations parses `tshark -q -z conv,tcp -z conv,udp` into the two
// directions of each conversation, keyed "proto a -> b".
func conversations(t *testing.T, tshark, pcap string) map[string]convSide {
	t.Helper()
	out, err := exec.Command(tshark, "-r", pcap, "-q", "-z", "conv,tcp", "-z", "conv,udp").Output()
	if err != nil {
		t.Fatalf("tshark conv: %v", err)
	}
	units := map[string]int64{"bytes": 1, "kB": 1000, "MB": 1000 * 1000, "GB": 1000 * 1000 * 1000}
	convs := map[string]convSide{}
	proto := ""
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "TCP Conversations"):
			proto = "tcp"
			continue
		case strings.HasPrefix(line, "UDP Conversations"):
			proto = "udp"
			continue
		}
		f := strings.Fields(line)
		if len(f) < 12 || f[1] != "<->" {
			continue
		}
		side := func(i int) convSide {
			fr, err1 := strconv.ParseInt(f[i], 10, 64)
			v, err2 := strconv.ParseInt(strings.ReplaceAll(f[i+1], ",", ""), 10, 64)
			u, ok := units[f[i+2]]
			if err1 != nil || err2 != nil || !ok {
				t.Fatalf("tshark conv line %q: cannot parse", line)
			}
			return convSide{frames: fr, value: v, unit: u}
		}
		// "<-" is what B sent to A, "->" what A sent to B.
		convs[fmt.Sprintf("%s %s -> %s", proto, f[2], f[0])] = side(3)
		convs[fmt.Sprintf("%s %s -> %s", proto, f[0], f[2])] = side(6)
	}
	return convs
}

func TestNetFlowsMatchTshark(t *testing.T) {
	tshark := testenv.RequireTool(t, "tshark")
	nt := openNet(t, NetConfig{Poll: 50 * time.Millisecond, Flows: testFlows})
	n := newTestNet(t)
	n.servers(t)
	cg := newCgroup(t)
	col := &netCollector{}
	if err := nt.WatchNet(cg.path, "test", col); err != nil {
		t.Fatal(err)
	}
	pcap := filepath.Join(t.TempDir(), "jail.pcap")
	var capt *netcap.Capture
	if err := inNetns(n.serverNS, func() (err error) {
		capt, err = netcap.StartCapture(serverIf, pcap, 0)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	const send, recv = 3_000_000, 5_000_000
	in := runHelper(t, cg, helperJob{Netns: n.jailNS, Send: send, Recv: recv, DNS: true})
	out := runHelper(t, nil, helperJob{Netns: n.jailNS, Send: 100_000, Recv: 200_000})

	// Both TCP flows close by themselves; the UDP one ends at Unwatch.
	xfer := flowID{"tcp", in.Xfer, serverAddr.String() + ":9000"}
	dnsTCP := flowID{"tcp", in.DNSTCP, serverAddr.String() + ":53"}
	col.waitFor(t, "the TCP flows' close records", func(evs []observe.Event) bool {
		tot := flowTotals(evs)
		return tot[xfer] != nil && slices.Contains(tot[xfer].ops, netcap.OpClose) &&
			tot[dnsTCP] != nil && slices.Contains(tot[dnsTCP].ops, netcap.OpClose)
	})
	packets, dropped, err := capt.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if err := nt.UnwatchNet(cg.path); err != nil {
		t.Fatal(err)
	}
	evs := col.snapshot()
	for _, ev := range evs {
		t.Logf("%s", ev.AppendJSON(nil))
	}

	// Exactly the jail's three flows, attributed to the helper.
	totals := flowTotals(evs)
	dnsUDP := flowID{"udp", in.DNSUDP, serverAddr.String() + ":53"}
	var got []flowID
	for id := range totals {
		got = append(got, id)
	}
	if len(totals) != 3 || totals[xfer] == nil || totals[dnsTCP] == nil || totals[dnsUDP] == nil {
		t.Fatalf("flows %v, want exactly %v, %v and %v", got, xfer, dnsTCP, dnsUDP)
	}
	comm := filepath.Base(os.Args[0])
	if len(comm) > 15 {
		comm = comm[:15]
	}
	for id, f := range totals {
		for i := range f.ops {
			if f.pids[i] != int32(in.Pid) || f.comms[i] != comm || f.dirs[i] != netcap.DirEgress {
				t.Errorf("flow %v record %d: pid %d comm %q dir %q, want %d %q egress", id, i, f.pids[i], f.comms[i], f.dirs[i], in.Pid, comm)
			}
		}
	}
	if ops := totals[dnsUDP].ops; !slices.Equal(ops, []string{netcap.OpEnd}) {
		t.Errorf("UDP flow records %v, want [end]", ops)
	}

	// Outside the cgroup: on the wire, never in the events.
	for _, ev := range evs {
		if ev.Src == out.Xfer || ev.Dst == out.Xfer {
			t.Errorf("event of a process outside the cgroup: %s", ev.AppendJSON(nil))
		}
	}

	// Byte and packet counts against tshark. Flow bytes are IP-layer
	// bytes; a frame on the veth adds its 14-byte Ethernet header.
	wire := captureDirs(t, tshark, pcap)
	convs := conversations(t, tshark, pcap)
	if _, ok := wire[fmt.Sprintf("tcp %s -> %s:%d", out.Xfer, serverAddr, xferPort)]; !ok {
		t.Errorf("the outside process's transfer is not in the capture")
	}
	var frames int64
	for _, d := range wire {
		frames += d.frames
	}
	t.Logf("capture: %d packets written, %d dropped by the kernel; tshark reads %d TCP/UDP frames", packets, dropped, frames)
	if dropped != 0 {
		t.Errorf("capture dropped %d packets", dropped)
	}
	if int64(packets) < frames {
		t.Errorf("capture wrote %d packets, tshark found %d TCP/UDP frames", packets, frames)
	}
	for id, f := range totals {
		for _, side := range []struct {
			key         string
			bytes, pkts int64
		}{
			{fmt.Sprintf("%s %s -> %s", id.proto, id.src, id.dst), f.bytesOut, f.pktsOut},
			{fmt.Sprintf("%s %s -> %s", id.proto, id.dst, id.src), f.bytesIn, f.pktsIn},
		} {
			w := wire[side.key]
			c, ok := convs[side.key]
			if w == nil || !ok {
				t.Errorf("%s: not in the capture", side.key)
				continue
			}
			onWire := side.bytes + etherHeader*side.pkts
			if w.frames != side.pkts || w.frameBytes != onWire {
				t.Errorf("%s: flow %d packets, %d IP bytes (%d on the wire); tshark %d frames, %d bytes",
					side.key, side.pkts, side.bytes, onWire, w.frames, w.frameBytes)
			}
			if c.frames != side.pkts || !c.matches(onWire) {
				t.Errorf("%s: flow %d packets, %d bytes on the wire; tshark conv %d frames, %d×%d bytes",
					side.key, side.pkts, onWire, c.frames, c.value, c.unit)
			}
			t.Logf("%s: %d packets, %d IP bytes = tshark %d frames, %d frame bytes (conv %d×%d)",
				side.key, side.pkts, side.bytes, w.frames, w.frameBytes, c.value, c.unit)
		}
	}
	// The capture holds the whole transfer.
	if w := wire[fmt.Sprintf("tcp %s -> %s", xfer.src, xfer.dst)]; w == nil || w.payload < send+8 {
		t.Errorf("capture: transfer payload sent %+v, want ≥ %d", w, send+8)
	}
	if w := wire[fmt.Sprintf("tcp %s -> %s", xfer.dst, xfer.src)]; w == nil || w.payload < recv {
		t.Errorf("capture: transfer payload received %+v, want ≥ %d", w, recv)
	}

	// DNS over UDP and TCP: one query and one answer each.
	var dns []string
	for _, ev := range evs {
		if !strings.HasPrefix(ev.Op, "dns_") {
			continue
		}
		dns = append(dns, ev.Op+" "+ev.Proto)
		if ev.Host != dnsName || ev.QType != "A" || ev.HostPID != int32(in.Pid) || ev.Comm != comm {
			t.Errorf("DNS event: %s", ev.AppendJSON(nil))
		}
		want := []string{}
		if ev.Op == netcap.OpDNSAnswer {
			for _, a := range dnsAnswers {
				want = append(want, a.String())
			}
		}
		if !slices.Equal(ev.Answers, want) && !(len(want) == 0 && ev.Answers == nil) {
			t.Errorf("DNS %s answers %v, want %v", ev.Op, ev.Answers, want)
		}
	}
	slices.Sort(dns)
	if want := []string{"dns_answer tcp", "dns_answer udp", "dns_query tcp", "dns_query udp"}; !slices.Equal(dns, want) {
		t.Errorf("DNS events %v, want %v", dns, want)
	}
}

// attached counts the programs attached to the cgroup at path for typ.
func attached(t *testing.T, path string, typ ebpf.AttachType) int {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	r, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: typ})
	if err != nil {
		t.Fatal(err)
	}
	return len(r.Programs)
}

func TestNetWatchLifecycle(t *testing.T) {
	nt := openNet(t, NetConfig{Poll: 20 * time.Millisecond, Flows: testFlows})
	cg := newCgroup(t)
	col := &netCollector{}
	if err := nt.WatchNet("relative/path", "test", col); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("relative path: %v, want invalid", err)
	}
	if err := nt.WatchNet("/sys/fs/cgroup/unified/agentjail-test-missing", "test", col); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing cgroup: %v, want not found", err)
	}
	if err := nt.WatchNet(cg.path, "test", col); err != nil {
		t.Fatal(err)
	}
	if err := nt.WatchNet(cg.path, "again", col); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("second watch: %v, want conflict", err)
	}
	types := []ebpf.AttachType{ebpf.AttachCGroupInetEgress, ebpf.AttachCGroupInetIngress, ebpf.AttachCGroupInet4Connect, ebpf.AttachCGroupInetSockCreate}
	for _, typ := range types {
		if n := attached(t, cg.path, typ); n != 1 {
			t.Errorf("%s: %d programs attached, want 1", typ, n)
		}
	}
	if err := nt.UnwatchNet(cg.path); err != nil {
		t.Fatal(err)
	}
	for _, typ := range types {
		if n := attached(t, cg.path, typ); n != 0 {
			t.Errorf("after unwatch, %s: %d programs attached, want 0", typ, n)
		}
	}
	if err := nt.UnwatchNet(cg.path); err != nil {
		t.Errorf("second unwatch: %v", err)
	}
	if _, err := nt.Lost(cg.path); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("lost of an unwatched cgroup: %v, want not found", err)
	}

	// A watched cgroup that goes away ends its watch by itself, with the
	// final records of its open flows.
	n := newTestNet(t)
	n.servers(t)
	cg2 := newCgroup(t)
	if err := nt.WatchNet(cg2.path, "gone", col); err != nil {
		t.Fatal(err)
	}
	in := runHelper(t, cg2, helperJob{Netns: n.jailNS, DNS: true})
	cg2.fd.Close()
	cg2.fd = nil
	if err := os.Remove(cg2.path); err != nil {
		t.Fatal(err)
	}
	col.waitFor(t, "the end of the removed cgroup's UDP flow", func(evs []observe.Event) bool {
		for _, ev := range evs {
			if ev.Op == netcap.OpEnd && ev.Src == in.DNSUDP {
				return true
			}
		}
		return false
	})
	nt.mu.Lock()
	left := len(nt.watches)
	nt.mu.Unlock()
	if left != 0 {
		t.Errorf("%d watches left after the cgroup was removed", left)
	}
	if err := nt.UnwatchNet(cg2.path); err != nil {
		t.Errorf("unwatch after removal: %v", err)
	}
}

// TestNetUpdatesSumToTotals checks the periodic records of a long flow:
// their counters are deltas that add up to the flow's total.
func TestNetUpdatesSumToTotals(t *testing.T) {
	nt := openNet(t, NetConfig{Poll: 10 * time.Millisecond,
		Flows: netcap.FlowConfig{CloseLinger: 100 * time.Millisecond, IdleTimeout: time.Minute, Interim: 20 * time.Millisecond}})
	n := newTestNet(t)
	n.servers(t)
	cg := newCgroup(t)
	col := &netCollector{}
	if err := nt.WatchNet(cg.path, "test", col); err != nil {
		t.Fatal(err)
	}
	// The transfer stops half-way until an interim record of it is out,
	// however fast the link is.
	dst := serverAddr.String() + ":9000"
	cgID, err := CgroupID(cg.path)
	if err != nil {
		t.Fatal(err)
	}
	// While the connection is open, its owner is one lookup away (the
	// daemon asks it of each connection a jail opens to it).
	var ownerPid int32
	var ownerComm string
	in := runPausingHelper(t, cg, helperJob{Netns: n.jailNS, Send: 40_000_000, Recv: 40_000_000, Pause: true}, func() {
		col.waitFor(t, "an interim record of the paused transfer", func(evs []observe.Event) bool {
			for _, ev := range evs {
				if ev.Type == observe.TypeNet && ev.Dst == dst && ev.Op == netcap.OpUpdate {
					src, dst := netip.MustParseAddrPort(ev.Src), netip.MustParseAddrPort(ev.Dst)
					var ok bool
					if ownerPid, ownerComm, ok = nt.Owner(cgID, unix.IPPROTO_TCP, src, dst); !ok {
						t.Errorf("no owner for the open flow %s → %s", src, dst)
					}
					if _, _, ok := nt.Owner(cgID, unix.IPPROTO_UDP, src, dst); ok {
						t.Errorf("an owner for a UDP flow that is not there")
					}
					return true
				}
			}
			return false
		})
	})
	// The helper is this binary: its comm is the name, as the kernel
	// keeps it (15 bytes).
	comm := filepath.Base(os.Args[0])
	comm = comm[:min(len(comm), 15)]
	if ownerPid != int32(in.Pid) || ownerComm != comm {
		t.Errorf("owner %d %q, want the helper %d %q", ownerPid, ownerComm, in.Pid, comm)
	}
	if err := nt.UnwatchNet(cg.path); err != nil {
		t.Fatal(err)
	}
	f := flowTotals(col.snapshot())[flowID{"tcp", in.Xfer, dst}]
	if f == nil {
		t.Fatal("no records of the transfer")
	}
	t.Logf("records: %v", f.ops)
	if len(f.ops) < 2 || f.ops[0] != netcap.OpUpdate {
		t.Errorf("records %v: want updates before the final one", f.ops)
	}
	if last := f.ops[len(f.ops)-1]; last != netcap.OpClose && last != netcap.OpEnd {
		t.Errorf("final record %q", last)
	}
	// Payload plus at least 40 bytes of headers per packet (IPv4 + TCP).
	if f.bytesOut < 40_000_008+40*f.pktsOut || f.bytesIn < 40_000_000+40*f.pktsIn {
		t.Errorf("summed records: out %d bytes / %d packets, in %d / %d: less than the payload and headers",
			f.bytesOut, f.pktsOut, f.bytesIn, f.pktsIn)
	}
}
