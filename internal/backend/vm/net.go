package vm

import (
	"fmt"
	"os"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/netns"
)

// Names of the links in a vm jail's network namespace: the daemon's
// policed network attaches jailLink (the jail side of its veth, with the
// jail's address), the machine's virtio-net interface is tapLink.
const (
	jailLink = "eth0"
	tapLink  = "tap0"
)

// tapIn makes the machine's tap device in the network namespace at
// nsPath and splices it to the jail's link there: every frame arriving on
// one leaves through the other (tc mirred redirects), so the guest's
// interface, which takes the link's MAC address, is on the policed
// network exactly as a container's eth0 is. It returns the open tap (the
// device goes away when the last descriptor of it closes, i.e. with the
// machine), the MAC address and MTU for the guest.
func tapIn(nsPath string) (tap *os.File, mac string, mtu int, err error) {
	err = netns.Do(nsPath, func() error {
		eth, err := netlink.LinkByName(jailLink)
		if err != nil {
			return fmt.Errorf("the jail's link: %w", err)
		}
		if old, err := netlink.LinkByName(tapLink); err == nil {
			// A tap of an earlier run whose machine is gone but not yet
			// reaped, or a persistent leftover.
			if err := netlink.LinkDel(old); err != nil {
				return fmt.Errorf("remove the old %s: %w", tapLink, err)
			}
		}
		tap, err = openTap(tapLink)
		if err != nil {
			return err
		}
		t, err := netlink.LinkByName(tapLink)
		if err != nil {
			return fmt.Errorf("%s: %w", tapLink, err)
		}
		mtu = eth.Attrs().MTU
		if err := netlink.LinkSetMTU(t, mtu); err != nil {
			return fmt.Errorf("%s mtu: %w", tapLink, err)
		}
		if err := netlink.LinkSetUp(t); err != nil {
			return fmt.Errorf("%s up: %w", tapLink, err)
		}
		for _, l := range [][2]netlink.Link{{eth, t}, {t, eth}} {
			if err := redirect(l[0], l[1]); err != nil {
				return err
			}
		}
		mac = eth.Attrs().HardwareAddr.String()
		return nil
	})
	if err != nil && tap != nil {
		tap.Close()
		tap = nil
	}
	return tap, mac, mtu, err
}

// redirect sends every frame arriving on from out through to.
func redirect(from, to netlink.Link) error {
	ingress := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{
		LinkIndex: from.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS,
	}}
	// A fresh qdisc: the filters of an earlier one (to a link made again
	// since) go with it.
	_ = netlink.QdiscDel(ingress)
	if err := netlink.QdiscAdd(ingress); err != nil {
		return fmt.Errorf("ingress qdisc on %s: %w", from.Attrs().Name, err)
	}
	f := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: from.Attrs().Index, Parent: netlink.MakeHandle(0xffff, 0),
			Priority: 1, Protocol: unix.ETH_P_ALL,
		},
		Actions: []netlink.Action{netlink.NewMirredAction(to.Attrs().Index)},
	}
	if err := netlink.FilterReplace(f); err != nil {
		return fmt.Errorf("redirect %s to %s: %w", from.Attrs().Name, to.Attrs().Name, err)
	}
	return nil
}

// openTap creates the non-persistent tap device name in the calling
// thread's network namespace and returns its descriptor.
func openTap(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	var req struct {
		name  [unix.IFNAMSIZ]byte
		flags uint16
		_     [22]byte
	}
	copy(req.name[:], name)
	req.flags = unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req))); errno != 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("create tap %s: %w", name, errno)
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun"), nil
}
