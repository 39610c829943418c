package preview

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"strings"
	"time"

	"github.com/hashicorp/mdns"
	"github.com/miekg/dns"
)

// MDNSDomain is the domain the mDNS responder answers for.
const MDNSDomain = "sandbox.local"

// MDNSOptions configure the mDNS responder.
type MDNSOptions struct {
	// Iface is the interface to answer on (nil: the system's default
	// multicast interface).
	Iface *net.Interface
	// Addrs are the addresses the names resolve to: the host's, where the
	// daemon listens (nil: the IPv4 addresses of Iface, or of every
	// interface that is up, loopback excluded).
	Addrs []net.IP
	// Log receives the responder's messages (default: discarded).
	Log *log.Logger
}

// zone answers <jail>.sandbox.local and <port>-<jail>.sandbox.local for
// the jails that exist, with the host's addresses.
type zone struct {
	jails Jails
	addrs []net.IP
}

// Records implements mdns.Zone.
func (z *zone) Records(q dns.Question) []dns.RR {
	if q.Qtype != dns.TypeA && q.Qtype != dns.TypeANY {
		return nil
	}
	name := strings.TrimSuffix(strings.ToLower(q.Name), ".")
	label, ok := strings.CutSuffix(name, "."+MDNSDomain)
	if !ok || label == "" || strings.Contains(label, ".") {
		return nil
	}
	if !z.exists(label) {
		t, ok := ParseHost(label + ".localhost")
		if !ok || !z.exists(t.Jail) {
			return nil
		}
	}
	var out []dns.RR
	for _, ip := range z.addrs {
		if ip4 := ip.To4(); ip4 != nil {
			out = append(out, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: ip4})
		}
	}
	return out
}

func (z *zone) exists(jail string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := z.jails.Get(ctx, jail)
	return err == nil
}

// StartMDNS answers mDNS queries for <jail>.sandbox.local and
// <port>-<jail>.sandbox.local (any jail the daemon has) with the host's
// addresses, so that machines on the LAN reach the daemon's previews by
// name. Close stops it.
func StartMDNS(jails Jails, o MDNSOptions) (io.Closer, error) {
	addrs := o.Addrs
	if len(addrs) == 0 {
		var err error
		if addrs, err = hostAddrs(o.Iface); err != nil {
			return nil, err
		}
	}
	if len(addrs) == 0 {
		return nil, errors.New("mdns: the host has no IPv4 address to announce")
	}
	if o.Log == nil {
		o.Log = log.New(io.Discard, "", 0)
	}
	s, err := mdns.NewServer(&mdns.Config{Zone: &zone{jails: jails, addrs: addrs}, Iface: o.Iface, Logger: o.Log})
	if err != nil {
		return nil, fmt.Errorf("mdns: %w", err)
	}
	return closer(s.Shutdown), nil
}

type closer func() error

func (c closer) Close() error { return c() }

// hostAddrs lists the IPv4 addresses of iface, or of every interface that
// is up (loopback excluded).
func hostAddrs(iface *net.Interface) ([]net.IP, error) {
	ifaces := []net.Interface{}
	if iface != nil {
		ifaces = append(ifaces, *iface)
	} else {
		all, err := net.Interfaces()
		if err != nil {
			return nil, err
		}
		for _, i := range all {
			if i.Flags&net.FlagUp != 0 && i.Flags&net.FlagLoopback == 0 {
				ifaces = append(ifaces, i)
			}
		}
	}
	var out []net.IP
	for _, i := range ifaces {
		addrs, err := i.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
				out = append(out, n.IP.To4())
			}
		}
	}
	return out, nil
}
