// Package hostjail holds what the levels whose jails are host processes
// (container, process) share: the jail's cgroup, from which its usage,
// its observation point and its OOM kills are read, and its attachment to
// the daemon's policed network.
package hostjail

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/cgroups"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/netns"
	"github.com/agentjail/agentjail/internal/netpolicy"
	"github.com/agentjail/agentjail/internal/storage"
)

// Cgroup is the cgroup path of a jail, the same in every hierarchy.
type Cgroup string

// CgroupOf is the cgroup of jail id: "/agentjail-<id>", a top-level cgroup
// of its own. Jails share no parent: the scheduler weighs a parent as one
// entity against the host's other top-level groups and kernel threads, so
// jails under one would share its debt, and a quiet jail would wait while
// busy neighbours had used up the parent's share (docs/architecture.md,
// "Noisy neighbours"). A jail made by a daemon of the earlier layout,
// adopted after an upgrade, keeps its "/agentjail/<id>".
func CgroupOf(id string) Cgroup {
	if c, ok := legacy.Load(id); ok {
		return c.(Cgroup)
	}
	if c := Cgroup("/agentjail/" + id); cgroups.Exists(string(c)) {
		legacy.Store(id, c)
		return c
	}
	return Cgroup("/agentjail-" + id)
}

// legacy holds the jails found in cgroups of the earlier layout, until
// Release has removed them: a partly removed cgroup is still found.
var legacy sync.Map // id → Cgroup

// Stats reads the jail's usage from its cgroup and from its disk mounted
// at disk.
func (c Cgroup) Stats(disk string) (backend.Stats, error) {
	cs, err := cgroups.Read(string(c))
	if err != nil {
		return backend.Stats{}, err
	}
	used, total, err := storage.Usage(disk)
	if err != nil {
		return backend.Stats{}, err
	}
	return backend.Stats{
		MemoryBytes: cs.MemoryBytes, MemoryLimitBytes: cs.MemoryLimitBytes, CPUTimeNs: cs.CPUTimeNs,
		Pids: cs.Pids, PidsLimit: cs.PidsLimit, OOMKills: cs.OOMKills,
		DiskUsedBytes: used, DiskLimitBytes: total,
	}, nil
}

// Observed says where host observers attach to the jail: its unified
// cgroup directory and id, root (the host path of its root filesystem,
// "" when it is the host's own) and network interface.
func (c Cgroup) Observed(root, iface string) (backend.Observed, error) {
	id, err := cgroups.ID(string(c))
	if err != nil {
		return backend.Observed{}, err
	}
	return backend.Observed{CgroupID: id, CgroupDir: cgroups.UnifiedDir(string(c)), Root: root, NetInterface: iface}, nil
}

// Pids returns the host pids of the jail's processes.
func (c Cgroup) Pids() ([]int, error) { return cgroups.Pids(string(c)) }

// OOMKills counts the jail's processes killed for exceeding its memory.
func (c Cgroup) OOMKills() (uint64, error) { return cgroups.OOMKills(string(c)) }

// Network attaches jails' network namespaces to the daemon's policed
// network and remembers the host side of each one's link.
type Network struct {
	Net *netpolicy.Manager
	Log *slog.Logger

	ifaces sync.Map // jail id → interface
}

// Attach connects the network namespace at netnsPath (which exists) of
// the jail inst to the policed network under inst.Config's policy; mode
// none gets loopback only (a zero Attachment).
func (n *Network) Attach(ctx context.Context, inst backend.Instance, netnsPath string) (netpolicy.Attachment, error) {
	cfg := inst.Config.Isolation.Network
	if cfg.Mode == config.NetNone {
		return netpolicy.Attachment{}, nil
	}
	att, err := n.Net.Attach(ctx, netpolicy.Jail{
		ID: inst.ID, Name: inst.Name, NetnsPath: netnsPath, Mode: cfg.Mode,
		Policy: netpolicy.FromConfig(inst.Name, cfg),
	})
	if err != nil {
		return netpolicy.Attachment{}, fmt.Errorf("network: %w", err)
	}
	n.ifaces.Store(inst.ID, att.Interface)
	return att, nil
}

// Env returns the environment Attach gives the jail inst
// (netpolicy.Manager.Env), without attaching it.
func (n *Network) Env(inst backend.Instance) map[string]string {
	cfg := inst.Config.Isolation.Network
	if cfg.Mode == config.NetNone {
		return nil
	}
	return n.Net.Env(cfg.Mode, netpolicy.FromConfig(inst.Name, cfg))
}

// Detach disconnects jail id (nothing when it is not attached).
func (n *Network) Detach(ctx context.Context, id string) error {
	n.ifaces.Delete(id)
	if err := n.Net.Detach(ctx, id); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	return nil
}

// DetachLogged is Detach for cleanup paths: an error is logged.
func (n *Network) DetachLogged(ctx context.Context, id string) {
	if err := n.Detach(ctx, id); err != nil {
		n.Log.Error("detaching jail network", "jail", id, "err", err)
	}
}

// Interface is the host side of jail id's link ("" without one).
func (n *Network) Interface(id string) string {
	if v, ok := n.ifaces.Load(id); ok {
		return v.(string)
	}
	return ""
}

// Update applies inst.Config's network policy, and its mode when that is
// isolated or bridge, to the attached jail.
func (n *Network) Update(ctx context.Context, inst backend.Instance) error {
	cfg := inst.Config.Isolation.Network
	mode := ""
	if cfg.Mode == config.NetIsolated || cfg.Mode == config.NetBridge {
		mode = cfg.Mode
	}
	return n.Net.UpdateMode(ctx, inst.ID, mode, netpolicy.FromConfig(inst.Name, cfg))
}

// Rename gives the attached jail its new name on the network (nothing in
// modes none and host).
func (n *Network) Rename(ctx context.Context, inst backend.Instance) error {
	cfg := inst.Config.Isolation.Network
	if cfg.Mode == config.NetNone || cfg.Mode == config.NetHost {
		return nil
	}
	return n.Net.Rename(ctx, inst.ID, inst.Name, netpolicy.FromConfig(inst.Name, cfg))
}

// Release frees what a jail of host processes holds beside the processes
// themselves (they must be gone): its network attachment, its cgroup,
// the mounts of its root (in order), its disk mounted at disk and kept in
// pool, and its network namespace at netnsPath. It goes on past errors
// and returns them all.
func Release(ctx context.Context, n *Network, pool *storage.Pool, id string, roots []string, disk, netnsPath string) []error {
	var errs []error
	if err := n.Detach(ctx, id); err != nil {
		errs = append(errs, err)
	}
	if err := cgroups.Remove(string(CgroupOf(id))); err != nil {
		errs = append(errs, fmt.Errorf("cgroup: %w", err))
	} else {
		legacy.Delete(id)
	}
	for _, r := range roots {
		if err := storage.Unmount(r); err != nil {
			errs = append(errs, fmt.Errorf("jail root: %w", err))
		}
	}
	if err := storage.UnmountDisk(disk); err != nil {
		errs = append(errs, fmt.Errorf("jail disk: %w", err))
	}
	if err := pool.RemoveDisk(id); err != nil {
		errs = append(errs, fmt.Errorf("jail disk: %w", err))
	}
	if err := netns.Remove(netnsPath); err != nil {
		errs = append(errs, fmt.Errorf("network namespace: %w", err))
	}
	return errs
}
