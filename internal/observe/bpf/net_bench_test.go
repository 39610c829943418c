package bpf

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// TestBenchNet measures what the network programs cost the jail's traffic
// over a veth (no loopback): a bulk TCP transfer each way from a process in
// the cgroup, without and with the cgroup watched (best of alternating
// runs), and the programs' own run time per packet timed by the kernel.
//
//	AGENTJAIL_BENCH=1 go test -run BenchNet -v ./internal/observe/bpf/
func TestBenchNet(t *testing.T) {
	requireBench(t)
	bulk := int64(envInt("AGENTJAIL_BENCH_NET_BYTES", 200_000_000))
	const runs = 6

	nt := openNet(t, NetConfig{Flows: testFlows})
	n := newTestNet(t)
	n.servers(t)
	cg := newCgroup(t)

	run := func(watched bool) float64 {
		if watched {
			if err := nt.WatchNet(cg.path, "bench", &netCollector{}); err != nil {
				t.Fatal(err)
			}
		}
		r := runHelper(t, cg, helperJob{Netns: n.jailNS, Send: bulk, Recv: bulk})
		if watched {
			if err := nt.UnwatchNet(cg.path); err != nil {
				t.Fatal(err)
			}
		}
		return float64(r.XferNS)
	}
	xferOff, xferOn := math.Inf(1), math.Inf(1)
	for i := range runs {
		first := i%2 == 0 // alternate the order
		a := run(first)
		b := run(!first)
		if first {
			a, b = b, a
		}
		xferOff, xferOn = math.Min(xferOff, a), math.Min(xferOn, b)
	}

	// The programs' own cost per packet, timed by the kernel over a million
	// runs (BPF_PROG_TEST_RUN) on a TCP segment of a flow already in the
	// table, against an empty cgroup_skb program. The test run's socket
	// belongs to this process's cgroup, watched here for the purpose.
	self := selfCgroup(t)
	if err := nt.objs.NetWatched.Update(self, &netobsNetWatch{}, ebpf.UpdateNoExist); err != nil {
		t.Fatal(err)
	}
	defer nt.objs.NetWatched.Delete(self)
	empty, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.CGroupSKB, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer empty.Close()
	seg := tcpSegment(100)
	perRun := map[string]time.Duration{}
	// The reader's poll drops flows of cgroups it has no watch for, as this
	// one: hold it off until the runs are counted.
	nt.mu.Lock()
	defer nt.mu.Unlock()
	for name, p := range map[string]*ebpf.Program{"egress": nt.objs.SkbEgress, "ingress": nt.objs.SkbIngress, "empty": empty} {
		ret, d, err := p.Benchmark(seg, 1_000_000, nil)
		if err != nil || ret != 1 {
			t.Fatalf("test run of %s: %d, %v", name, ret, err)
		}
		perRun[name] = d
	}
	var accounted uint64
	nt.scanFlows(func(k *netobsFlowKey, v *netobsFlowVal) {
		if k.Cgroup == self {
			accounted += v.Pkts[dirOut] + v.Pkts[dirIn]
			nt.objs.Flows.Delete(k)
		}
	})
	if accounted == 0 {
		t.Errorf("the test runs were not accounted")
	}

	mb := float64(2*bulk) / 1e6
	t.Logf("bulk TCP %d MB each way: %.0f MB/s unwatched, %.0f MB/s watched (%.3f× the time)",
		bulk/1e6, mb/time.Duration(xferOff).Seconds(), mb/time.Duration(xferOn).Seconds(), xferOn/xferOff)
	t.Logf("program run time per packet (BPF_PROG_TEST_RUN, 1M runs): egress %v, ingress %v, empty program %v",
		perRun["egress"], perRun["ingress"], perRun["empty"])
}

// selfCgroup returns the id of this process's cgroup v2 directory.
func selfCgroup(t *testing.T) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			id, err := CgroupID(filepath.Join("/sys/fs/cgroup/unified", p))
			if err != nil {
				t.Fatal(err)
			}
			return id
		}
	}
	t.Fatal("no cgroup v2 line in /proc/self/cgroup")
	return 0
}

// tcpSegment returns an Ethernet frame holding an IPv4 TCP segment (ACK)
// with payload bytes of data.
func tcpSegment(payload int) []byte {
	b := make([]byte, 14+20+20+payload)
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ip := b[14:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+20+payload))
	ip[8], ip[9] = 64, 6
	copy(ip[12:], jailAddr.AsSlice())
	copy(ip[16:], serverAddr.AsSlice())
	tcp := ip[20:]
	binary.BigEndian.PutUint16(tcp[0:], 40000)
	binary.BigEndian.PutUint16(tcp[2:], xferPort)
	tcp[12], tcp[13] = 5<<4, 0x10
	return b
}
