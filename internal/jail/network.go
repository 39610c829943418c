package jail

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentjail/agentjail/internal/atomicfile"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
)

// hostsResolver answers static entries first, then asks the host's resolver.
type hostsResolver struct {
	hosts map[string][]netip.Addr
}

// LookupNetIP implements netpolicy.Resolver.
func (r hostsResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if addrs, ok := r.hosts[strings.ToLower(strings.TrimSuffix(host, "."))]; ok {
		var out []netip.Addr
		for _, a := range addrs {
			if network == "ip" || (network == "ip4") == a.Is4() {
				out = append(out, a)
			}
		}
		if len(out) == 0 {
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
		return out, nil
	}
	return net.DefaultResolver.LookupNetIP(ctx, network, host)
}

// UpdateNetwork replaces a jail's network policy. A running jail obeys it
// for new connections at once. While it runs, its mode may move between
// isolated and bridge only.
func (m *Manager) UpdateNetwork(ctx context.Context, ref string, n config.Network) (*model.Jail, error) {
	e, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	e.op.Lock()
	defer e.op.Unlock()
	j := e.snapshot()
	if n.Mode == "" {
		n.Mode = j.Config.Isolation.Network.Mode
	}
	if cur := j.Config.Isolation.Network.Mode; n.Mode != cur && j.Status == model.StateRunning && !(attached(cur) && attached(n.Mode)) {
		return nil, errdefs.Conflictf("network.mode: jail %s runs with mode %q; a running jail moves between %q and %q only: stop it to change the mode",
			j.Name, cur, config.NetIsolated, config.NetBridge)
	}
	m.applyRegistryCache(&n)
	cfg := j.Config
	cfg.Isolation.Network = n
	b, err := m.checkConfig(&cfg)
	if err != nil {
		return nil, err
	}
	if j.Status == model.StateRunning {
		inst := m.instance(e)
		inst.Config = &cfg
		if err := b.UpdateNetwork(ctx, inst); err != nil {
			return nil, err
		}
	}
	m.setState(e, func(j *model.Jail) { j.Config = cfg })
	return e.view(), nil
}

// attached reports whether a jail of network mode mode has its own
// interface and policy (isolated or bridge), between which a running jail
// may move.
func attached(mode string) bool { return mode == config.NetIsolated || mode == config.NetBridge }

// eventFiles maps EventLog's stream names to files under events/.
var eventFiles = map[string]string{
	"network":    "network.jsonl",
	"syscalls":   "syscalls.jsonl",
	"filesystem": "filesystem.jsonl",
	"processes":  "processes.jsonl",
	"jail":       "jail.jsonl",
}

// EventLog opens one of a jail's JSONL event files.
func (m *Manager) EventLog(ctx context.Context, ref, stream string) (io.ReadCloser, error) {
	name, ok := eventFiles[stream]
	if !ok {
		return nil, errdefs.Invalidf("event stream %q: want network, syscalls, filesystem, processes or jail", stream)
	}
	e, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(filepath.Join(e.dir, "events", name))
	if errors.Is(err, os.ErrNotExist) {
		return io.NopCloser(strings.NewReader("")), nil
	}
	return f, err
}

// netSettings are the daemon's network settings kept in DATA_DIR/network.json.
type netSettings struct {
	Prefix string `json:"prefix,omitempty"`
	Subnet string `json:"subnet,omitempty"`
}

// rememberNetwork fills unset network options from DATA_DIR/network.json
// and stores the options in effect, so later starts and teardown use the
// same interfaces and table.
func rememberNetwork(dataDir string, opts *Options) error {
	path := filepath.Join(dataDir, "network.json")
	var saved netSettings
	if data, err := os.ReadFile(path); err == nil {
		if err := json.Unmarshal(data, &saved); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	if opts.NetPrefix == "" {
		opts.NetPrefix = saved.Prefix
	}
	if opts.Subnet == "" {
		opts.Subnet = saved.Subnet
	}
	data, err := json.Marshal(netSettings{Prefix: opts.NetPrefix, Subnet: opts.Subnet})
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(path, data, 0o600)
}
