// Package netpolicy gives each jail exactly the network its policy allows
// and records every connection the jail makes.
//
// The daemon owns a bridge without ports (default "aj0"; this kernel has
// no bridges) holding the daemon address (the first host of the jail subnet, default 10.88.0.1), one veth
// pair per attached jail (host side "ajv<hash of the id>", jail side
// "eth0" with a /32 address and a default route via the daemon address),
// and one nftables table (inet "agentjail"). Jails are routed, not
// bridged: every packet a jail sends enters the host through its own veth,
// so the kernel knows which jail sent it, a jail cannot spoof another's
// address, and jail-to-jail traffic passes the forward hook where
// inter-jail rules apply.
//
// In the kernel (one table: a shared part made once, and each jail's own
// chains, sets and counters, added and removed with the jail in a
// transaction of their own):
// a jail reaches only the daemon's DNS and proxies on the daemon address;
// its TCP 80/443 to anywhere outside the jail subnet is redirected to the
// transparent proxy, which decides by the Host header or TLS SNI; its DNS
// to any server is redirected to the daemon's resolver, which answers
// NXDOMAIN for names outside the policy. In bridge mode, IP/CIDR rules
// also let the jail connect directly (masqueraded). Everything else is
// refused with a TCP reset or an ICMP administratively-prohibited error,
// and logged (nflog) so the refusal appears in the record.
//
// The daemon side listens on the daemon address only: DNS (53), the
// transparent HTTP and TLS proxies, an explicit HTTP proxy (absolute URI
// and CONNECT, 3128) and SOCKS5 (CONNECT, 1080). With TLS inspection the
// proxy terminates TLS with leaf certificates of the daemon's CA (made
// once, DataDir/ca), records each request, and adds credential headers
// bound to the destination host.
package netpolicy

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/errdefs"
	jailnetns "github.com/agentjail/agentjail/internal/netns"
)

// Network modes (the jail config's network.mode).
const (
	// ModeNone leaves the jail with loopback only.
	ModeNone = "none"
	// ModeIsolated (the default) gives the jail loopback plus the policy
	// egress path: the daemon's DNS and proxies, nothing else.
	ModeIsolated = "isolated"
	// ModeBridge adds direct, masqueraded connections to what IP/CIDR
	// rules allow.
	ModeBridge = "bridge"
	// ModeHost shares the host's network (no policy); only with
	// Options.AllowHostMode.
	ModeHost = "host"
)

// Resolver resolves host names for the daemon's DNS and proxies.
// *net.Resolver implements it.
type Resolver interface {
	// LookupNetIP returns the addresses of host; network is "ip", "ip4"
	// or "ip6".
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Options configure a Manager.
type Options struct {
	// DataDir holds the CA (DataDir/ca/ca.pem and ca-key.pem, the key
	// 0600), made on first use.
	DataDir string
	// Subnet is the jail network (default 10.88.0.0/16, IPv4). Its first
	// host is the daemon address.
	Subnet string
	// Prefix names what the manager owns (default "aj"): the dummy
	// interface <prefix>0, the veths <prefix>v<hash>, and the nftables
	// table "agentjail" (for the default prefix) or "agentjail_<prefix>".
	// Two managers on one host need distinct prefixes and subnets.
	Prefix string
	// AllowHostMode permits ModeHost.
	AllowHostMode bool
	// Resolver resolves names upstream (default net.DefaultResolver).
	Resolver Resolver
	// UpstreamRoots verifies upstream servers of inspected TLS
	// connections (default: the system roots).
	UpstreamRoots *x509.CertPool
	// Owner, when set, names the process in the jail that owns the socket
	// with local address src (proto "tcp" or "udp") and remote address
	// dst as the jail addressed it (before any redirection; not valid
	// when unknown): its pid as seen in the jail and its comm (0, "" when
	// unknown). It is asked when a connection reaches the daemon and when
	// a record has no owner yet, so it must be cheap whatever the jail
	// holds.
	Owner func(jailID, proto string, src, dst netip.AddrPort) (pid int, comm string)
	// Record receives every connection attempt, DNS answer and HTTP
	// request, allowed or refused. It is called from many goroutines and
	// must not block for long.
	Record func(jailID string, ev ConnEvent)
	// Log receives operational messages (default slog.Default()).
	Log *slog.Logger
	// Secrets returns the daemon's secret called name, for credentials
	// that name one (false when the daemon has none of that name). Nil:
	// no secrets.
	Secrets func(name string) (string, bool)
}

// Jail is what Attach needs to know about a jail.
type Jail struct {
	ID   string
	Name string
	// NetnsPath is the jail's network namespace (a bind mount). Unused in
	// ModeHost.
	NetnsPath string
	// Mode is one of the Mode constants ("" is ModeIsolated).
	Mode   string
	Policy Policy
}

// Attachment is what the jail needs to use its network.
type Attachment struct {
	// IP is the jail's address (invalid in ModeNone and ModeHost).
	IP netip.Addr
	// Gateway is the daemon address: DNS server and proxy host.
	Gateway netip.Addr
	// Interface is the host side of the jail's veth.
	Interface string
	// Env are the variables to set in the jail (proxies; with TLS
	// inspection or credentials, the CA bundle variables).
	Env map[string]string
	// ResolvConf is the content of the jail's /etc/resolv.conf.
	ResolvConf string
	// CAPEM is the daemon CA certificate to install in the jail's trust
	// store, and CAPath where Env expects it inside the jail.
	CAPEM  []byte
	CAPath string
	// HostNetwork is true in ModeHost: the jail must use the host's
	// network namespace, and no policy applies.
	HostNetwork bool
}

// JailCAPath is where the jail is expected to find the daemon CA alone.
const JailCAPath = "/etc/ssl/certs/agentjail-ca.pem"

// JailTrustStore is the jail's system bundle (OpenSSL's default file on
// Debian and Ubuntu), where the jail is expected to find the daemon CA
// besides the roots its rootfs brings: hosts the proxy does not inspect
// still present their own certificates.
const JailTrustStore = "/etc/ssl/certs/ca-certificates.crt"

// servicePorts are the daemon's ports on the daemon address.
type servicePorts struct {
	DNS, HTTP, TLS, Proxy, SOCKS int
}

func (p servicePorts) tcp() []int { return []int{p.DNS, p.HTTP, p.TLS, p.Proxy, p.SOCKS} }

var defaultPorts = servicePorts{DNS: 53, HTTP: 15001, TLS: 15002, Proxy: 3128, SOCKS: 1080}

// jailState is one attached jail.
type jailState struct {
	// mode changes (UpdateMode) with the manager's mu held.
	id, name, mode string
	veth           string
	ip             netip.Addr
	netnsPath      string
	netnsIno       uint64

	mu     sync.Mutex
	policy *compiledPolicy
	limits *limiter
	up     *upstream
	// dns admits and counts the jail's DNS queries (set at attach).
	dns *dnsState

	// limited names the rate limit the jail is over while the kernel
	// refuses its direct connections ("" otherwise); relief re-checks
	// the budget when it should have refilled. Both guarded by the
	// manager's mu.
	limited string
	relief  *time.Timer
	// conns counts the jail's connections the daemon holds open.
	conns atomic.Int64
	// learned are the addresses the daemon's DNS gave the jail, by
	// address (bridge mode; see direct.go). Guarded by the manager's mu.
	learned map[netip.Addr]learnedNames
}

func (js *jailState) pol() *compiledPolicy {
	js.mu.Lock()
	defer js.mu.Unlock()
	return js.policy
}

// Manager attaches policies to jails' network namespaces. Its methods are
// safe for concurrent use.
type Manager struct {
	// lock is the host-wide lock of o.Prefix, held while the manager lives.
	lock    *os.File
	o       Options
	log     *slog.Logger
	subnet  netip.Prefix
	daemon  netip.Addr
	dummy   string
	table   string
	group   uint16
	ports   servicePorts
	ca      *authority
	closing chan struct{}
	wg      sync.WaitGroup

	srv *services

	mu    sync.Mutex // guards jails, byIP, the prune timer and the kernel state
	jails map[string]*jailState
	byIP  map[netip.Addr]*jailState
	// installed are each jail's objects in the table, as last synced.
	installed map[string]*jailObjs
	// lastTx is the number of messages of the last transaction on the
	// table that syncLocked made.
	lastTx int
	// pruner takes expired learned addresses out of the jails' sets at
	// pruneAt (see direct.go).
	pruner  *time.Timer
	pruneAt time.Time
	// now is the clock of learned addresses (time.Now; tests move it).
	now func() time.Time

	hostMu    sync.Mutex
	hostAddrs []netip.Prefix
	hostAt    time.Time

	// conns counts the connections of every jail the daemon's proxies
	// and DNS hold open; maxConns bounds it (see conns.go).
	conns    atomic.Int64
	maxConns int64
}

func (o *Options) defaults() (netip.Prefix, error) {
	if o.Subnet == "" {
		o.Subnet = "10.88.0.0/16"
	}
	if o.Prefix == "" {
		o.Prefix = "aj"
	}
	if len(o.Prefix) > 5 {
		return netip.Prefix{}, errdefs.Invalidf("prefix %q: longer than 5 characters", o.Prefix)
	}
	if o.Resolver == nil {
		o.Resolver = net.DefaultResolver
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	p, err := netip.ParsePrefix(o.Subnet)
	if err != nil || !p.Addr().Is4() || p.Bits() > 24 {
		return netip.Prefix{}, errdefs.Invalidf("subnet %q: want an IPv4 CIDR of /24 or wider", o.Subnet)
	}
	return p.Masked(), nil
}

func tableName(prefix string) string {
	if prefix == "aj" {
		return "agentjail"
	}
	return "agentjail_" + prefix
}

// New sets up the daemon side: the bridge with the daemon
// address, an empty nftables table, the CA, and the DNS server and
// proxies listening on the daemon address. Leftovers of a previous run
// with the same Options (veths, table) are removed first. It fails, having
// released what it made, if any of that cannot be done (root is needed).
func New(ctx context.Context, o Options) (*Manager, error) {
	subnet, err := o.defaults()
	if err != nil {
		return nil, err
	}
	if o.DataDir == "" {
		return nil, errdefs.Invalidf("data dir: empty")
	}
	m := &Manager{
		o: o, log: o.Log, subnet: subnet, daemon: subnet.Addr().Next(),
		dummy: o.Prefix + "0", table: tableName(o.Prefix), ports: defaultPorts,
		closing: make(chan struct{}), now: time.Now, maxConns: connBudget(),
		jails: map[string]*jailState{}, byIP: map[netip.Addr]*jailState{}, installed: map[string]*jailObjs{},
	}
	h := fnv.New32a()
	h.Write([]byte(o.Prefix))
	m.group = uint16(0x6a00 | h.Sum32()&0xff)
	if m.lock, err = lockPrefix(o.Prefix); err != nil {
		return nil, err
	}
	locked := true
	defer func() {
		if locked {
			m.lock.Close()
		}
	}()
	if m.ca, err = loadOrCreateCA(filepath.Join(o.DataDir, "ca")); err != nil {
		return nil, err
	}
	if err := teardown(o.Prefix); err != nil {
		return nil, err
	}
	if err := m.setupDummy(); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			m.stopServices()
			_ = teardown(o.Prefix)
		}
	}()
	// Services first: binding the nflog group settles the group number
	// the table's log rules use.
	if err := m.startServices(ctx); err != nil {
		return nil, err
	}
	if err := m.ruleset().applyBase(); err != nil {
		return nil, err
	}
	m.wg.Add(1)
	go m.pollBytes()
	ok, locked = true, false
	return m, nil
}

// lockDir holds the host-wide locks of the network prefixes in use.
const lockDir = "/run/agentjail"

// lockPrefix takes the host-wide lock of prefix, so that two daemons never
// manage (and tear down) the same interfaces and table.
func lockPrefix(prefix string) (*os.File, error) {
	if err := os.MkdirAll(lockDir, 0o755); err != nil {
		return nil, fmt.Errorf("lock dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(lockDir, "net-"+prefix+".lock"), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("network lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, errdefs.Conflictf("another agentjail daemon owns the jail network %q on this host; give this one its own --net-prefix and --subnet", prefix)
		}
		return nil, fmt.Errorf("network lock: %w", err)
	}
	return f, nil
}

func (m *Manager) setupDummy() error {
	d := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: m.dummy}}
	if err := netlink.LinkAdd(d); err != nil {
		return fmt.Errorf("creating interface %s: %w", m.dummy, err)
	}
	link, err := netlink.LinkByName(m.dummy)
	if err != nil {
		return fmt.Errorf("interface %s: %w", m.dummy, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: m.daemon.AsSlice(), Mask: net.CIDRMask(32, 32)}}
	if err := netlink.AddrReplace(link, addr); err != nil {
		netlink.LinkDel(link)
		return fmt.Errorf("address %s on %s: %w", m.daemon, m.dummy, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		netlink.LinkDel(link)
		return fmt.Errorf("bringing up %s: %w", m.dummy, err)
	}
	return nil
}

// Teardown removes everything a manager with Options o owns on this host:
// its nftables table, its veths and its bridge. It is for crash
// recovery and uninstalling; it does not stop a running Manager (use
// Close). It is idempotent.
func Teardown(o Options) error {
	if _, err := o.defaults(); err != nil {
		return err
	}
	lock, err := lockPrefix(o.Prefix)
	if err != nil {
		return err
	}
	defer lock.Close()
	return teardown(o.Prefix)
}

func teardown(prefix string) error {
	var errs []error
	if err := deleteTable(tableName(prefix)); err != nil && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, err)
	}
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("listing interfaces: %w", err)
	}
	for _, l := range links {
		n := l.Attrs().Name
		if n == prefix+"0" || strings.HasPrefix(n, prefix+"v") && len(n) == len(prefix)+9 {
			if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
				errs = append(errs, fmt.Errorf("deleting interface %s: %w", n, err))
			}
		}
	}
	return errors.Join(errs...)
}

// vethName is the host side of a jail's veth: the prefix, "v" and eight
// hex digits of a hash of the id.
func vethName(prefix, id string) string {
	h := fnv.New32a()
	h.Write([]byte(id))
	return fmt.Sprintf("%sv%08x", prefix, h.Sum32())
}

// Attach gives the jail its network according to j.Mode and applies
// j.Policy. Attaching an id that is attached already is a conflict;
// attaching a namespace that still holds an eth0 (a jail recovered after
// a daemon restart) replaces it. On error nothing is left behind.
func (m *Manager) Attach(ctx context.Context, j Jail) (Attachment, error) {
	if j.ID == "" {
		return Attachment{}, errdefs.Invalidf("jail id: empty")
	}
	if j.Mode == "" {
		j.Mode = ModeIsolated
	}
	cp, err := compile(j.Policy)
	if err != nil {
		return Attachment{}, fmt.Errorf("jail %s network policy: %w", j.ID, err)
	}
	switch j.Mode {
	case ModeNone:
		return Attachment{ResolvConf: "# no network\n"}, nil
	case ModeHost:
		if !m.o.AllowHostMode {
			return Attachment{}, errdefs.Forbiddenf("network mode %q: the daemon was not started with host networking allowed", ModeHost)
		}
		return Attachment{HostNetwork: true}, nil
	case ModeIsolated, ModeBridge:
	default:
		return Attachment{}, errdefs.Invalidf("network mode %q: want none, isolated, bridge or host", j.Mode)
	}
	if j.NetnsPath == "" {
		return Attachment{}, errdefs.Invalidf("jail %s: netns path empty", j.ID)
	}
	var st unix.Stat_t
	if err := unix.Stat(j.NetnsPath, &st); err != nil {
		return Attachment{}, errdefs.Wrap(errdefs.ErrNotFound, err, "jail %s netns %s", j.ID, j.NetnsPath)
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.jails[j.ID]; ok {
		return Attachment{}, errdefs.Conflictf("jail %s: network already attached", j.ID)
	}
	ip, err := m.allocIP()
	if err != nil {
		return Attachment{}, err
	}
	js := &jailState{id: j.ID, name: j.Name, mode: j.Mode, veth: vethName(m.o.Prefix, j.ID),
		ip: ip, netnsPath: j.NetnsPath, netnsIno: st.Ino, policy: cp}
	js.limits = newLimiter(j.Policy.RequestsPerMinute, j.Policy.BytesPerHour)
	js.dns = newDNSState(j.Policy.DNSQueriesPerSecond)
	js.up = m.newUpstream(js)
	if err := m.plumb(js); err != nil {
		js.up.closeIdle(true)
		return Attachment{}, fmt.Errorf("jail %s network: %w", j.ID, err)
	}
	m.jails[j.ID] = js
	m.byIP[ip] = js
	if err := m.syncLocked(j.ID); err != nil {
		delete(m.jails, j.ID)
		delete(m.byIP, ip)
		m.unplumb(js)
		js.up.closeIdle(true)
		return Attachment{}, fmt.Errorf("jail %s network: %w", j.ID, err)
	}
	return m.attachment(js, cp), nil
}

// Env returns the environment Attach gives a jail of mode mode under
// policy p (Attachment.Env), without attaching anything: a jail's
// processes can be set up with it while its network is being attached.
func (m *Manager) Env(mode string, p Policy) map[string]string {
	if mode != "" && mode != ModeIsolated && mode != ModeBridge {
		return nil
	}
	proxy := fmt.Sprintf("http://%s:%d", m.daemon, m.ports.Proxy)
	env := map[string]string{
		"HTTP_PROXY": proxy, "HTTPS_PROXY": proxy, "http_proxy": proxy, "https_proxy": proxy,
		"ALL_PROXY": fmt.Sprintf("socks5h://%s:%d", m.daemon, m.ports.SOCKS),
		"NO_PROXY":  "localhost,127.0.0.1,::1",
	}
	env["all_proxy"] = env["ALL_PROXY"]
	env["no_proxy"] = env["NO_PROXY"]
	if p.TLSInspection || len(p.Credentials) > 0 {
		// These variables replace a client's roots, so they name the full
		// bundle; node's adds to its own.
		for _, k := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "GIT_SSL_CAINFO", "CURL_CA_BUNDLE"} {
			env[k] = JailTrustStore
		}
		env["NODE_EXTRA_CA_CERTS"] = JailCAPath
	}
	return env
}

func (m *Manager) attachment(js *jailState, cp *compiledPolicy) Attachment {
	return Attachment{
		IP: js.ip, Gateway: m.daemon, Interface: js.veth, Env: m.Env(js.mode, cp.src),
		ResolvConf: fmt.Sprintf("nameserver %s\noptions ndots:0\n", m.daemon),
		CAPEM:      m.ca.certPEM, CAPath: JailCAPath,
	}
}

// allocIP returns the lowest free jail address. m.mu is held.
func (m *Manager) allocIP() (netip.Addr, error) {
	for a := m.daemon.Next(); m.subnet.Contains(a); a = a.Next() {
		if _, used := m.byIP[a]; !used && a.Next().IsValid() && m.subnet.Contains(a.Next()) {
			return a, nil
		}
	}
	return netip.Addr{}, errdefs.Unavailablef("jail subnet %s: no free address", m.subnet)
}

// plumb makes the veth pair, addresses and routes of js.
func (m *Manager) plumb(js *jailState) (err error) {
	ns, err := netns.GetFromPath(js.netnsPath)
	if err != nil {
		return fmt.Errorf("opening netns %s: %w", js.netnsPath, err)
	}
	defer ns.Close()
	nh, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink in netns %s: %w", js.netnsPath, err)
	}
	defer nh.Close()
	if old, err := nh.LinkByName("eth0"); err == nil {
		if err := nh.LinkDel(old); err != nil {
			return fmt.Errorf("removing stale eth0 in %s: %w", js.netnsPath, err)
		}
	}
	if old, err := netlink.LinkByName(js.veth); err == nil {
		netlink.LinkDel(old)
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: js.veth}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("creating veth %s: %w", js.veth, err)
	}
	defer func() {
		if err != nil {
			m.unplumb(js)
		}
	}()
	host, err := netlink.LinkByName(js.veth)
	if err != nil {
		return fmt.Errorf("veth %s: %w", js.veth, err)
	}
	if err := writeSysctl("net/ipv6/conf/"+js.veth+"/disable_ipv6", "1"); err != nil {
		return err
	}
	if err := writeSysctl("net/ipv4/conf/"+js.veth+"/forwarding", "1"); err != nil {
		return err
	}
	if err := ensureForwarding(js.mode, js.policy); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("bringing up %s: %w", js.veth, err)
	}
	hostRoute := &netlink.Route{LinkIndex: host.Attrs().Index, Scope: netlink.SCOPE_LINK,
		Dst: &net.IPNet{IP: js.ip.AsSlice(), Mask: net.CIDRMask(32, 32)}, Src: m.daemon.AsSlice()}
	if err := netlink.RouteReplace(hostRoute); err != nil {
		return fmt.Errorf("route to %s via %s: %w", js.ip, js.veth, err)
	}
	if err := jailnetns.Do(js.netnsPath, func() error {
		return writeSysctl("net/ipv6/conf/all/disable_ipv6", "1")
	}); err != nil {
		return err
	}
	peer, err := nh.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("eth0 in %s: %w", js.netnsPath, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: js.ip.AsSlice(), Mask: net.CIDRMask(32, 32)}}
	if err := nh.AddrReplace(peer, addr); err != nil {
		return fmt.Errorf("address %s on eth0: %w", js.ip, err)
	}
	if err := nh.LinkSetUp(peer); err != nil {
		return fmt.Errorf("bringing up eth0 in %s: %w", js.netnsPath, err)
	}
	gw := &net.IPNet{IP: m.daemon.AsSlice(), Mask: net.CIDRMask(32, 32)}
	if err := nh.RouteReplace(&netlink.Route{LinkIndex: peer.Attrs().Index, Scope: netlink.SCOPE_LINK, Dst: gw}); err != nil {
		return fmt.Errorf("route to %s in %s: %w", m.daemon, js.netnsPath, err)
	}
	if err := nh.RouteReplace(&netlink.Route{LinkIndex: peer.Attrs().Index, Gw: m.daemon.AsSlice()}); err != nil {
		return fmt.Errorf("default route in %s: %w", js.netnsPath, err)
	}
	return nil
}

// unplumb deletes the jail's veth pair (its routes go with it).
func (m *Manager) unplumb(js *jailState) {
	if l, err := netlink.LinkByName(js.veth); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			m.log.Warn("deleting veth", "veth", js.veth, "err", err)
		}
	}
}

// Update replaces the policy of an attached jail. New connections obey
// it at once; the rate-limit budgets carry over when the limits are
// unchanged.
func (m *Manager) Update(ctx context.Context, jailID string, p Policy) error {
	return m.UpdateMode(ctx, jailID, "", p)
}

// UpdateMode is Update that also moves the jail to mode, ModeIsolated or
// ModeBridge ("" keeps its mode): its kernel objects change in the same
// transaction. A jail moved to bridge mode connects directly to a name it
// resolves from then on.
func (m *Manager) UpdateMode(ctx context.Context, jailID, mode string, p Policy) error {
	if mode != "" && mode != ModeIsolated && mode != ModeBridge {
		return errdefs.Invalidf("jail %s network mode %q: an attached jail moves between %s and %s only", jailID, mode, ModeIsolated, ModeBridge)
	}
	cp, err := compile(p)
	if err != nil {
		return fmt.Errorf("jail %s network policy: %w", jailID, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	js, ok := m.jails[jailID]
	if !ok {
		return errdefs.NotFoundf("jail %s: no network attached", jailID)
	}
	oldMode := js.mode
	if mode == "" {
		mode = oldMode
	}
	if err := ensureForwarding(mode, cp); err != nil {
		return fmt.Errorf("jail %s network policy: %w", jailID, err)
	}
	js.mode = mode
	js.mu.Lock()
	old := js.policy
	js.policy = cp
	if old.src.RequestsPerMinute != p.RequestsPerMinute || old.src.BytesPerHour != p.BytesPerHour {
		js.limits = newLimiter(p.RequestsPerMinute, p.BytesPerHour)
		js.limited = "" // a fresh budget
	}
	if old.src.DNSQueriesPerSecond != p.DNSQueriesPerSecond {
		js.dns.setRate(p.DNSQueriesPerSecond)
	}
	js.mu.Unlock()
	if err := m.syncLocked(jailID); err != nil {
		js.mode = oldMode
		js.mu.Lock()
		js.policy = old
		js.mu.Unlock()
		return fmt.Errorf("jail %s network policy: %w", jailID, err)
	}
	js.up.closeIdle(false)
	return nil
}

// Rename changes the name an attached jail is known by to other jails'
// inter-jail rules, and replaces its policy (which may name it). New
// connections obey both at once. When the policy is unchanged and no
// attached jail has inter-jail rules, the kernel table does not depend on
// the name and is left as it is.
func (m *Manager) Rename(ctx context.Context, jailID, name string, p Policy) error {
	m.mu.Lock()
	js, ok := m.jails[jailID]
	if !ok {
		m.mu.Unlock()
		return errdefs.NotFoundf("jail %s: no network attached", jailID)
	}
	old := js.name
	js.name = name
	same := reflect.DeepEqual(js.pol().src, p)
	for _, o := range m.jails {
		if len(o.pol().src.InterJail) > 0 {
			same = false
			break
		}
	}
	m.mu.Unlock()
	if same {
		return nil
	}
	if err := m.Update(ctx, jailID, p); err != nil {
		m.mu.Lock()
		js.name = old
		m.mu.Unlock()
		return err
	}
	return nil
}

// Detach removes the jail's veth, routes, kernel rules and state. It is
// idempotent: detaching an unknown id succeeds.
func (m *Manager) Detach(ctx context.Context, jailID string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	js, ok := m.jails[jailID]
	if !ok {
		// A jail of a previous daemon run may still own a veth.
		if l, err := netlink.LinkByName(vethName(m.o.Prefix, jailID)); err == nil {
			if err := netlink.LinkDel(l); err != nil {
				return fmt.Errorf("jail %s: deleting veth: %w", jailID, err)
			}
		}
		return nil
	}
	delete(m.jails, jailID)
	delete(m.byIP, js.ip)
	if js.relief != nil {
		js.relief.Stop()
	}
	err := m.syncLocked(jailID)
	m.unplumb(js)
	js.up.closeIdle(true)
	if err != nil {
		return fmt.Errorf("jail %s network: %w", jailID, err)
	}
	return nil
}

// Close stops the daemon's services and removes everything the manager
// made (veths, bridge, table). Jails still attached lose their
// network.
func (m *Manager) Close() error {
	select {
	case <-m.closing:
		return nil
	default:
	}
	close(m.closing)
	m.stopServices()
	m.mu.Lock()
	if m.pruner != nil {
		m.pruner.Stop()
	}
	for id, js := range m.jails {
		js.up.closeIdle(true)
		delete(m.jails, id)
	}
	m.byIP = map[netip.Addr]*jailState{}
	m.mu.Unlock()
	m.wg.Wait()
	err := teardown(m.o.Prefix)
	m.lock.Close()
	return err
}

// ruleset returns the shared settings of the table's rules.
func (m *Manager) ruleset() *ruleset {
	rs := &ruleset{table: m.table, prefix: m.o.Prefix + "v", subnet: m.subnet, daemon: m.daemon,
		group: m.group, ports: m.ports}
	for _, p := range protectedRanges {
		if p.Addr().Is4() {
			rs.protected = append(rs.protected, p)
		}
	}
	return rs
}

// syncLocked brings the objects of the jails ids in the kernel table to
// their current state in one transaction: the objects of an attached jail
// are added or changed, those of a detached one removed. The chains of
// inter-jail rules of the other jails change only where a rule relates
// them to one of ids. Nothing else in the table is touched; if the
// transaction fails, the table is as it was. m.mu is held.
func (m *Manager) syncLocked(ids ...string) error {
	rs := m.ruleset()
	for _, id := range slices.Sorted(maps.Keys(m.jails)) {
		js := m.jails[id]
		rs.jails = append(rs.jails, jailRules{id: js.id, name: js.name, veth: js.veth, ip: js.ip, mode: js.mode,
			policy: js.pol(), limited: js.limited})
	}
	want := map[string]*jailObjs{}
	// Objects of jails detached by an earlier transaction that failed.
	for id := range m.installed {
		if m.jails[id] == nil {
			want[id] = nil
		}
	}
	interJail := slices.ContainsFunc(rs.jails, func(j jailRules) bool { return len(j.policy.src.InterJail) > 0 })
	var extra []netip.Prefix
	for _, id := range ids {
		want[id] = nil
	}
	for _, jr := range rs.jails {
		if _, ok := want[jr.id]; ok {
			if jr.mode == ModeBridge {
				if extra == nil {
					extra = m.extraProtected()
				}
				jr.direct = directSets(jr.id, jr.policy, m.jails[jr.id].learned, extra, m.now())
			}
			want[jr.id] = rs.objects(jr)
			continue
		}
		old := m.installed[jr.id]
		from := chainFromOf + jr.id
		if old == nil || !interJail && len(old.chain(from)) == fromTail {
			continue // no inter-jail rules now, nor any left in its chain
		}
		if f := rs.fromRules(jr); !reflect.DeepEqual(old.chain(from), f) {
			want[jr.id] = old.withChain(from, f)
		}
	}
	c, err := nftables.New(nftables.WithSockOptions(bigBuffers))
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	x := &tx{c: c, t: &nftables.Table{Name: m.table, Family: nftables.TableFamilyINet}}
	for _, id := range slices.Sorted(maps.Keys(want)) {
		if err := x.change(m.installed[id], want[id]); err != nil {
			return err
		}
	}
	if x.msgs == 0 {
		return nil
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: table %s: %w", m.table, err)
	}
	m.lastTx = x.msgs
	for id, o := range want {
		if o == nil {
			delete(m.installed, id)
		} else {
			m.installed[id] = o
		}
	}
	return nil
}

// jailByAddr returns the attached jail with address a.
func (m *Manager) jailByAddr(a netip.Addr) *jailState {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.byIP[a.Unmap()]
}

// extraProtected returns the protected ranges known at run time: the
// jail subnet and the host's own addresses (cached for a few seconds).
func (m *Manager) extraProtected() []netip.Prefix {
	m.hostMu.Lock()
	defer m.hostMu.Unlock()
	if time.Since(m.hostAt) > 5*time.Second {
		m.hostAddrs = m.hostAddrs[:0]
		addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
		if err != nil {
			m.log.Warn("listing host addresses", "err", err)
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok {
				ip = ip.Unmap()
				m.hostAddrs = append(m.hostAddrs, netip.PrefixFrom(ip, ip.BitLen()))
			}
		}
		m.hostAt = time.Now()
	}
	return append([]netip.Prefix{m.subnet}, m.hostAddrs...)
}

// decide evaluates the jail's current policy for t.
func (m *Manager) decide(js *jailState, t Target) Decision {
	return js.pol().decide(t, m.extraProtected())
}

// ensureForwarding turns on the host's IPv4 forwarding when a jail needs
// it: in bridge mode for its direct connections, and for ingress rules,
// since connections from other hosts arrive on the host's own interfaces,
// which forward nothing while it is off. The table decides what passes.
func ensureForwarding(mode string, cp *compiledPolicy) error {
	if mode != ModeBridge && len(cp.ingress) == 0 {
		return nil
	}
	return writeSysctl("net/ipv4/ip_forward", "1")
}

func writeSysctl(name, value string) error {
	if err := os.WriteFile("/proc/sys/"+name, []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s: %w", strings.ReplaceAll(name, "/", "."), err)
	}
	return nil
}
