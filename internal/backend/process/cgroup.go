package process

import (
	"fmt"

	ocgroups "github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/manager"

	"github.com/agentjail/agentjail/internal/cgroups"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
)

// cgroup is a process-level jail's cgroup, which the backend owns (there
// is no runtime to do it): made with the jail's limits in every
// hierarchy, v1 and unified alike (runc's cgroup manager), before init is
// placed in it.
type cgroup struct {
	m ocgroups.Manager
}

// newCgroup makes the cgroup at path with r's limits.
func newCgroup(path string, r config.Resources) (*cgroup, error) {
	pids := r.PidsLimit
	res := &ocgroups.Resources{
		Memory: r.MemoryBytes, PidsLimit: &pids,
		CpuShares: r.CPUShares, CpuPeriod: r.CPUPeriod, CpuQuota: r.CPUQuota,
		SkipDevices: true,
	}
	if cgroups.SwapAccounting() {
		res.MemorySwap = r.MemorySwapBytes
	} else if r.MemorySwapBytes > r.MemoryBytes {
		return nil, errdefs.Unprocessablef("isolation.resources.memory_swap_bytes: %d exceeds memory_bytes %d, but this host does not account swap (no memory.memsw); set it equal to memory_bytes", r.MemorySwapBytes, r.MemoryBytes)
	}
	m, err := manager.New(&ocgroups.Cgroup{Path: path, Resources: res})
	if err != nil {
		return nil, fmt.Errorf("cgroup %s: %w", path, err)
	}
	c := &cgroup{m: m}
	if err := m.Apply(-1); err != nil {
		return nil, fmt.Errorf("cgroup %s: %w", path, err)
	}
	if err := m.Set(res); err != nil {
		c.destroy()
		return nil, fmt.Errorf("cgroup %s: limits: %w", path, err)
	}
	return c, nil
}

// apply moves process pid into the cgroup, in every hierarchy.
func (c *cgroup) apply(pid int) error {
	if err := c.m.Apply(pid); err != nil {
		return fmt.Errorf("cgroup: place init (pid %d): %w", pid, err)
	}
	return nil
}

func (c *cgroup) destroy() error { return c.m.Destroy() }
