package jail

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/backend"
)

// Bounds of the look-up of a socket's owner through /proc, which the
// daemon makes only when the network tracer does not know the flow: a jail
// may hold sockets and descriptors by the hundred thousand, and the look-up
// runs for each connection that reaches the daemon.
const (
	// ownerTableLines bounds the lines of the jail's socket table read.
	ownerTableLines = 8192
	// ownerFds bounds the descriptors of the jail's processes examined.
	ownerFds = 4096
)

// socketOwner finds the process of a jail that owns the socket bound to
// src, connected to (or sending to) dst: first in the network tracer's
// flow table (one lookup), else the socket's inode from the jail's own
// /proc/net table (seen through its init), then the jail's processes
// holding that inode, within the bounds above. It returns the pid as seen
// in the jail and the comm, or 0, "".
func (m *Manager) socketOwner(jailID, proto string, src, dst netip.AddrPort) (int, string) {
	m.mu.Lock()
	e := m.jails[jailID]
	m.mu.Unlock()
	if e == nil {
		return 0, ""
	}
	if dst.IsValid() && m.netTracer != nil {
		e.mu.RLock()
		o := e.obs
		e.mu.RUnlock()
		num := uint8(unix.IPPROTO_TCP)
		if proto == "udp" {
			num = unix.IPPROTO_UDP
		}
		if o != nil {
			if id := o.netCgroupID.Load(); id != 0 {
				if pid, comm, ok := m.netTracer.Owner(id, num, src, dst); ok {
					return int(pid), comm
				}
			}
		}
	}
	b, err := m.backendOf(e)
	if err != nil {
		return 0, ""
	}
	obs, ok := b.(backend.Observable)
	if !ok {
		return 0, ""
	}
	initPid := e.snapshot().Pid
	if initPid == 0 {
		return 0, ""
	}
	inode := socketInode(initPid, proto, src)
	if inode == "" {
		return 0, ""
	}
	target := "socket:[" + inode + "]"
	pids, err := obs.Pids(m.instance(e))
	if err != nil {
		return 0, ""
	}
	budget := ownerFds
	for _, pid := range pids {
		p := strconv.Itoa(pid)
		d, err := os.Open("/proc/" + p + "/fd")
		if err != nil {
			continue
		}
		names, _ := d.Readdirnames(budget)
		d.Close()
		budget -= len(names)
		for _, fd := range names {
			if l, err := os.Readlink("/proc/" + p + "/fd/" + fd); err == nil && l == target {
				return jailPid(p), readComm(p)
			}
		}
		if budget <= 0 {
			break
		}
	}
	return 0, ""
}

// socketInode looks src up in /proc/PID/net/{tcp,udp}[6] of the jail's
// network namespace and returns the socket's inode ("" when not found).
func socketInode(initPid int, proto string, src netip.AddrPort) string {
	file := proto
	if src.Addr().Is6() && !src.Addr().Is4In6() {
		file += "6"
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", initPid, file))
	if err != nil {
		return ""
	}
	defer f.Close()
	want := procNetAddr(src)
	sc := bufio.NewScanner(f)
	for n := 0; n < ownerTableLines && sc.Scan(); n++ {
		fields := strings.Fields(sc.Text())
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		if len(fields) >= 10 && fields[1] == want {
			return fields[9]
		}
	}
	return ""
}

// procNetAddr formats an IPv4 address and port as /proc/net/tcp does
// (the address in host byte order, little-endian here).
func procNetAddr(ap netip.AddrPort) string {
	a := ap.Addr().Unmap()
	if !a.Is4() {
		b := a.As16()
		var out strings.Builder
		for i := 0; i < 16; i += 4 {
			fmt.Fprintf(&out, "%08X", binary.LittleEndian.Uint32(b[i:i+4]))
		}
		return fmt.Sprintf("%s:%04X", out.String(), ap.Port())
	}
	b := a.As4()
	return fmt.Sprintf("%s:%04X", strings.ToUpper(hex.EncodeToString([]byte{b[3], b[2], b[1], b[0]})), ap.Port())
}

// jailPid returns the pid of host pid p as seen in its own (the jail's)
// pid namespace: the last field of NSpid.
func jailPid(p string) int {
	data, err := os.ReadFile("/proc/" + p + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				n, _ := strconv.Atoi(f[len(f)-1])
				return n
			}
		}
	}
	return 0
}

func readComm(p string) string {
	data, _ := os.ReadFile("/proc/" + p + "/comm")
	return strings.TrimSpace(string(data))
}
