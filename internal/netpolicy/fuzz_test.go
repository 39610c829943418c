package netpolicy

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
)

// FuzzPolicyFromConfig decodes arbitrary network sections of a jail's
// config. One that the config's validation accepts (what a create or
// PUT /network checks before doing anything) compiles into the policy the
// daemon enforces: nothing is refused later, halfway through making the
// jail. Decisions on arbitrary targets do not panic and name their rule.
func FuzzPolicyFromConfig(f *testing.F) {
	for _, seed := range []string{
		`{"mode":"isolated","allowed_egress":[{"destination":"pypi.org","ports":[443]},{"destination":"*.github.com"},{"destination":"10.0.0.0/8","protocol":"udp"}]}`,
		`{"mode":"bridge","blocked_egress":[{"destination":"evil.example"}],"always_allow":[{"destination":"1.1.1.1","ports":[53],"protocol":"any"}]}`,
		`{"mode":"isolated","allowed_ingress":[{"source":"192.168.0.0/16","ports":[8080]}]}`,
		`{"mode":"isolated","inter_agent_rules":[{"from":"web-*","to":"db","ports":[5432],"allow":true}],"allow_inter_agent":true}`,
		`{"mode":"isolated","credentials":[{"host":"api.example.com","header":"Authorization","value":"Bearer x"}]}`,
		`{"mode":"isolated","routes":[{"host":"model.internal","url":"http://127.0.0.1:8080/v1"}]}`,
		`{"mode":"isolated","limits":{"requests_per_minute":60,"bytes_per_hour":1000000,"dns_queries_per_second":10}}`,
		`{"mode":"isolated","allowed_egress":[{"destination":"bad host!"}]}`,
		`{"mode":"isolated","allowed_ingress":[{"source":"example.com"}]}`,
		`{"mode":"isolated","inter_agent_rules":[{"from":"[","to":"x"}]}`,
	} {
		f.Add([]byte(seed), "example.com", []byte{10, 0, 0, 1}, uint16(443), false)
	}
	h := config.Host{NofileMax: 1 << 20, CPUs: 2, Levels: []string{config.LevelContainer}, NetworkModes: []string{config.NetIsolated, config.NetNone, config.NetBridge}}
	f.Fuzz(func(t *testing.T, doc []byte, host string, ip []byte, port uint16, udp bool) {
		var c config.Config
		if err := config.DecodeJSON(doc, &c.Isolation.Network); err != nil {
			return
		}
		c.ApplyDefaults()
		if err := c.Validate(h); err != nil {
			if !errors.Is(err, errdefs.ErrUnprocessable) {
				t.Fatalf("validation error without ErrUnprocessable: %v", err)
			}
			return
		}
		p := FromConfig("jail", c.Isolation.Network)
		cp, err := compile(p)
		if err != nil {
			t.Fatalf("the config's validation accepts %s, the policy refuses it: %v", doc, err)
		}
		tg := Target{Host: host, Port: int(port), Proto: ProtoTCP}
		if udp {
			tg.Proto = ProtoUDP
		}
		if a, ok := netip.AddrFromSlice(ip); ok {
			tg.IP = a
		}
		if d := cp.decide(tg, nil); d.Rule == "" {
			t.Fatalf("%+v: a decision without its rule", tg)
		}
	})
}

// FuzzSOCKSHandshake feeds arbitrary bytes from a jail to the SOCKS5
// handshake: it returns (the bytes end, the connection closes), and what
// it accepts is a CONNECT to a port with either an address or a host name
// in the form policy rules name hosts (lower case, no final dot, valid
// labels).
func FuzzSOCKSHandshake(f *testing.F) {
	f.Add([]byte{5, 1, 0, 5, 1, 0, 3, 11, 'E', 'x', 'a', 'm', 'p', 'l', 'e', '.', 'c', 'o', '.', 1, 187})
	f.Add([]byte{5, 1, 0, 5, 1, 0, 1, 10, 0, 0, 1, 0, 80})
	f.Add([]byte{5, 1, 0, 5, 1, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1, 0, 22})
	f.Add([]byte{5, 1, 0, 5, 1, 0, 3, 9, '1', '2', '7', '.', '0', '.', '0', '.', '1', 0, 22})
	f.Add([]byte{5, 2, 1, 2})
	f.Add([]byte{5, 1, 0, 5, 2, 0, 1, 1, 2, 3, 4, 0, 80})
	f.Add([]byte{5, 1, 0, 5, 1, 0, 9})
	f.Add([]byte{4, 1, 0, 80, 1, 2, 3, 4, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		jail, daemon := net.Pipe()
		defer daemon.Close()
		go func() {
			defer jail.Close()
			go io.Copy(io.Discard, jail)
			jail.Write(in)
		}()
		daemon.SetDeadline(time.Now().Add(5 * time.Second))
		host, addr, port, err := socksHandshake(daemon)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the handshake waited for more than the %d bytes given", len(in))
		}
		if err != nil {
			return
		}
		if port < 1 || port > 65535 || (host == "") == !addr.IsValid() || (host != "" && addr.IsValid()) {
			t.Fatalf("accepted host %q addr %v port %d", host, addr, port)
		}
		if n, err := config.NormalizeHost(host); host != "" && (err != nil || n != host) {
			t.Fatalf("host %q is not a normalized host name (%q, %v)", host, n, err)
		}
	})
}
