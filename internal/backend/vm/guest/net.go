package guest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/backend/vm/vmproto"
	"github.com/agentjail/agentjail/internal/netpolicy"
)

// configureNet brings loopback up and gives the virtio-net interface the
// jail's address and default route (n nil: the interface stays down).
// Addresses and routes it had (before a restore) are replaced.
func configureNet(n *vmproto.Net) error {
	// The jail network is IPv4 only, as in a container's namespace.
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/all/disable_ipv6", []byte("1"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("disable IPv6: %w", err)
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("network links: %w", err)
	}
	var eth netlink.Link
	for _, l := range links {
		if l.Type() == "device" && l.Attrs().Name != "lo" {
			eth = l
			break
		}
	}
	if eth == nil {
		if n == nil {
			return nil
		}
		return errors.New("the machine has no network interface")
	}
	addrs, _ := netlink.AddrList(eth, unix.AF_INET)
	for _, a := range addrs {
		_ = netlink.AddrDel(eth, &a)
	}
	if n == nil {
		return netlink.LinkSetDown(eth)
	}
	if mac, err := net.ParseMAC(n.MAC); err == nil && eth.Attrs().HardwareAddr.String() != mac.String() {
		if err := netlink.LinkSetDown(eth); err != nil {
			return fmt.Errorf("link down: %w", err)
		}
		if err := netlink.LinkSetHardwareAddr(eth, mac); err != nil {
			return fmt.Errorf("mac %s: %w", mac, err)
		}
	}
	// Neighbours learnt on an earlier link (before a restore, or before
	// the daemon made the link again) are stale.
	if neighs, err := netlink.NeighList(eth.Attrs().Index, unix.AF_INET); err == nil {
		for _, nb := range neighs {
			_ = netlink.NeighDel(&nb)
		}
	}
	if n.MTU > 0 {
		if err := netlink.LinkSetMTU(eth, n.MTU); err != nil {
			return fmt.Errorf("mtu: %w", err)
		}
	}
	if err := netlink.LinkSetUp(eth); err != nil {
		return fmt.Errorf("link up: %w", err)
	}
	ipnet := &net.IPNet{IP: n.Addr.Addr().AsSlice(), Mask: net.CIDRMask(n.Addr.Bits(), n.Addr.Addr().BitLen())}
	if err := netlink.AddrAdd(eth, &netlink.Addr{IPNet: ipnet}); err != nil {
		return fmt.Errorf("address %s: %w", n.Addr, err)
	}
	if n.Gateway.IsValid() {
		// The address is a /32: the gateway is reached on the link.
		gw := &net.IPNet{IP: n.Gateway.AsSlice(), Mask: net.CIDRMask(n.Gateway.BitLen(), n.Gateway.BitLen())}
		if err := netlink.RouteReplace(&netlink.Route{LinkIndex: eth.Attrs().Index, Scope: netlink.SCOPE_LINK, Dst: gw}); err != nil {
			return fmt.Errorf("route to %s: %w", n.Gateway, err)
		}
		r := &netlink.Route{LinkIndex: eth.Attrs().Index, Gw: n.Gateway.AsSlice()}
		if err := netlink.RouteReplace(r); err != nil {
			return fmt.Errorf("default route via %s: %w", n.Gateway, err)
		}
	}
	return nil
}

// writeNetFiles writes resolv.conf and the daemon's CA into the root.
func writeNetFiles(r *vmproto.Resume) error {
	if r.ResolvConf != "" {
		if err := replaceFile("/etc/resolv.conf", []byte(r.ResolvConf)); err != nil {
			return fmt.Errorf("resolv.conf: %w", err)
		}
	}
	if len(r.CAPEM) == 0 {
		return nil
	}
	if r.CAPath != "" {
		if err := os.MkdirAll(filepath.Dir(r.CAPath), 0o755); err != nil {
			return err
		}
		if err := replaceFile(r.CAPath, r.CAPEM); err != nil {
			return fmt.Errorf("CA: %w", err)
		}
	}
	bundle, err := os.ReadFile(netpolicy.JailTrustStore)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("trust store: %w", err)
	}
	if bytes.Contains(bundle, bytes.TrimSpace(r.CAPEM)) {
		return nil
	}
	if len(bundle) > 0 && bundle[len(bundle)-1] != '\n' {
		bundle = append(bundle, '\n')
	}
	if err := os.MkdirAll(filepath.Dir(netpolicy.JailTrustStore), 0o755); err != nil {
		return err
	}
	return replaceFile(netpolicy.JailTrustStore, append(bundle, r.CAPEM...))
}

// replaceFile replaces path (a symlink too) with a regular file holding
// data.
func replaceFile(path string, data []byte) error {
	tmp := path + ".agentjail-new"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
