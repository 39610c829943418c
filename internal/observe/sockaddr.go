package observe

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"strconv"
)

// Sockaddr renders a struct sockaddr as a syscall event's Addr: "ip:port",
// "[ip6]:port", "unix:path" ("unix:@name" for the abstract namespace) or
// "family:N"; "" when b is too short to hold a family.
func Sockaddr(b []byte) string {
	if len(b) < 2 {
		return ""
	}
	family := binary.LittleEndian.Uint16(b)
	switch family {
	case 2: // AF_INET
		if len(b) >= 8 {
			ip := netip.AddrFrom4([4]byte(b[4:8]))
			return netip.AddrPortFrom(ip, binary.BigEndian.Uint16(b[2:4])).String()
		}
	case 10: // AF_INET6
		if len(b) >= 24 {
			ip := netip.AddrFrom16([16]byte(b[8:24]))
			return netip.AddrPortFrom(ip, binary.BigEndian.Uint16(b[2:4])).String()
		}
	case 1: // AF_UNIX
		p := b[2:]
		if len(p) == 0 {
			return "unix:"
		}
		if p[0] == 0 {
			return "unix:@" + upToNUL(p[1:])
		}
		return "unix:" + upToNUL(p)
	}
	return "family:" + strconv.Itoa(int(family))
}

// upToNUL returns b up to its first NUL.
func upToNUL(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}
