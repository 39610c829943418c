package netpolicy

import "github.com/agentjail/agentjail/internal/config"

// FromConfig maps a jail's network config (seed 002 / seed 003 keys) to the
// Policy the manager enforces for the jail called name.
func FromConfig(name string, n config.Network) Policy {
	rules := func(in []config.EgressRule) []Rule {
		out := make([]Rule, 0, len(in))
		for _, r := range in {
			proto := r.Protocol
			if proto == "any" {
				proto = ""
			}
			out = append(out, Rule{Destination: r.Destination, Ports: r.Ports, Protocol: proto})
		}
		return out
	}
	p := Policy{
		AlwaysAllow:   rules(n.AlwaysAllow),
		Allow:         rules(n.AllowedEgress),
		Block:         rules(n.BlockedEgress),
		TLSInspection: n.TLSInspection,
	}
	for _, r := range n.AllowedIngress {
		proto := r.Protocol
		if proto == "any" {
			proto = ""
		}
		p.Ingress = append(p.Ingress, Rule{Destination: r.Source, Ports: r.Ports, Protocol: proto})
	}
	for _, r := range n.InterAgentRules {
		p.InterJail = append(p.InterJail, InterJailRule{From: r.From, To: r.To, Ports: r.Ports, Allow: r.Allow})
	}
	if n.AllowInterAgent {
		p.InterJail = append(p.InterJail,
			InterJailRule{From: name, To: "*", Allow: true},
			InterJailRule{From: "*", To: name, Allow: true})
	}
	if l := n.Limits; l != nil {
		p.RequestsPerMinute, p.BytesPerHour = l.RequestsPerMinute, l.BytesPerHour
		p.DNSQueriesPerSecond, p.Connections = l.DNSQueriesPerSecond, l.Connections
	}
	for _, c := range n.Credentials {
		p.Credentials = append(p.Credentials, Credential{Host: c.Host, Header: c.Header, Value: c.Value, Secret: c.Secret})
	}
	for _, r := range n.Routes {
		p.Routes = append(p.Routes, Route{Host: r.Host, URL: r.URL})
	}
	return p
}
