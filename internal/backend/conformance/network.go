package conformance

import (
	"strconv"
	"strings"
	"testing"

	"github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/internal/config"
)

// network: each mode the level declares keeps the jail to what its policy
// allows, a policy update takes effect for the next connection, and a
// running jail moves between isolated and bridge mode.
func (h *harness) network(t *testing.T) {
	for _, mode := range []string{config.NetNone, config.NetIsolated, config.NetBridge} {
		t.Run(mode, func(t *testing.T) {
			if !has(h.caps.NetworkModes, mode) {
				t.Skipf("the %s level does not declare network mode %s", h.Level, mode)
			}
			if h.Internet.Addr == "" {
				t.Fatal("the harness was given no Internet to reach")
			}
			j := h.jail(t, func(c *client.Config) {
				c.Isolation.Network = client.Network{Mode: mode}
				if mode != config.NetNone {
					c.Isolation.Network.AllowedEgress = []config.EgressRule{{Destination: h.Internet.Allowed}}
				}
			})
			direct := h.directConnect(t, j.ID)
			allowed, other := h.curl(t, j.ID, h.Internet.Allowed), h.curl(t, j.ID, h.Internet.Other)
			if direct != "refused" {
				t.Errorf("a direct connection to %s:7, which no rule allows: %s", h.Internet.Addr, direct)
			}
			if other == "200" {
				t.Errorf("%s, which no rule allows, answered", h.Internet.Other)
			}
			if mode == config.NetNone {
				if allowed == "200" {
					t.Errorf("a jail in mode none reached %s", h.Internet.Allowed)
				}
				return
			}
			if allowed != "200" {
				t.Fatalf("%s, which the policy allows, answered %q", h.Internet.Allowed, allowed)
			}
			n := j.Config.Isolation.Network
			n.AllowedEgress = append(n.AllowedEgress, config.EgressRule{Destination: h.Internet.Other})
			if _, err := h.Client.UpdateNetwork(callCtx(t), j.ID, n); err != nil {
				t.Fatal(err)
			}
			if got := h.curl(t, j.ID, h.Internet.Other); got != "200" {
				t.Errorf("%s after the policy allowed it: %q", h.Internet.Other, got)
			}
			n.AllowedEgress = n.AllowedEgress[:1]
			if _, err := h.Client.UpdateNetwork(callCtx(t), j.ID, n); err != nil {
				t.Fatal(err)
			}
			if got := h.curl(t, j.ID, h.Internet.Other); got == "200" {
				t.Errorf("%s still answers after the policy revoked it", h.Internet.Other)
			}
			if mode != config.NetIsolated || !has(h.caps.NetworkModes, config.NetBridge) {
				return
			}
			// The running jail moves to bridge mode, where its policy
			// allows direct connections, and back.
			n.Mode = config.NetBridge
			n.AllowedEgress = append(n.AllowedEgress, config.EgressRule{Destination: h.Internet.Addr, Ports: []int{7}})
			if _, err := h.Client.UpdateNetwork(callCtx(t), j.ID, n); err != nil {
				t.Fatal(err)
			}
			if got := h.directConnect(t, j.ID); !strings.HasPrefix(got, "connected") {
				t.Errorf("a direct connection the policy allows, after the move to bridge mode: %s", got)
			}
			n.Mode = config.NetIsolated
			if _, err := h.Client.UpdateNetwork(callCtx(t), j.ID, n); err != nil {
				t.Fatal(err)
			}
			if got := h.directConnect(t, j.ID); got != "refused" {
				t.Errorf("a direct connection after the move back to isolated mode: %s", got)
			}
		})
	}
}

// curl fetches http://name/ in jail id the way a program in the jail
// would (its environment's proxy, if any) and returns the HTTP status, or
// curl's failure.
func (h *harness) curl(t *testing.T, id, name string) string {
	t.Helper()
	res := h.run(t, id, client.ExecRequest{Cmd: []string{"curl", "-s", "-m", "8", "-o", "/dev/null", "-w", "%{http_code}", "http://" + name + "/"}})
	if res.ExitCode != 0 {
		return "curl exit " + strings.TrimSpace(res.Stdout+" "+res.Stderr) + " " + strconv.Itoa(res.ExitCode)
	}
	return res.Stdout
}

// directConnect opens a TCP connection from jail id straight to the
// Internet's echo port, bypassing any proxy: "refused" when it fails.
func (h *harness) directConnect(t *testing.T, id string) string {
	t.Helper()
	res := h.run(t, id, client.ExecRequest{Cmd: []string{"python3", "-c", `
import socket, sys
try:
    c = socket.create_connection((sys.argv[1], 7), timeout=4)
    c.sendall(b"ping")
    print("connected, echo " + repr(c.recv(4)))
except OSError as e:
    print("refused")
`, h.Internet.Addr}})
	return strings.TrimSpace(res.Stdout + res.Stderr)
}
