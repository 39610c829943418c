package integration

import (
	"context"
	"path/filepath"
	"testing"

	ajclient "github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/internal/backend/conformance"
	"github.com/agentjail/agentjail/internal/testenv"
)

// TestConformance runs the conformance harness for every isolation level
// the daemon offers, on one daemon that offers them all (the none level
// included: its harness is lifecycle and exec only). A level the daemon
// knows but cannot run here fails under CI=true, where setup has
// installed what every level needs.
func TestConformance(t *testing.T) {
	requireEnv(t)
	in := newTestInternet(t, "allowed.test", "other.test")
	d := newDaemon(t, "--hosts-file", in.hosts, "--unsafe-none-level")
	c := ajclient.New("http://"+d.addr, d.token)
	h, err := c.Health(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range h.Levels {
		t.Run(l.Name, func(t *testing.T) {
			if !l.Available {
				testenv.Need(t, "the "+l.Name+" level ("+l.Reason+")")
			}
			conformance.Run(t, conformance.Target{
				Client:      c,
				Level:       l.Name,
				DaemonPid:   d.pid,
				DaemonFiles: map[string]string{filepath.Join(d.dir, "api-token"): d.token + "\n"},
				Internet:    conformance.Internet{Addr: in.addr, Allowed: "allowed.test", Other: "other.test"},
			})
		})
	}
}
