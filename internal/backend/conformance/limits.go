package conformance

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/model"
)

// limits: each limit the level declares holds against a command that
// tries to exceed it, and the jail keeps serving afterwards.
func (h *harness) limits(t *testing.T) {
	for _, l := range []struct {
		name string
		test func(t *testing.T)
	}{
		{model.LimitMemory, h.limitMemory},
		{model.LimitPids, h.limitPids},
		{model.LimitCPU, h.limitCPU},
		{model.LimitDisk, h.limitDisk},
	} {
		t.Run(l.name, func(t *testing.T) {
			if !has(h.caps.Limits, l.name) {
				t.Skipf("the %s level does not declare the %s limit", h.Level, l.name)
			}
			l.test(t)
		})
	}
}

// stillServes checks that jail id runs commands.
func (h *harness) stillServes(t *testing.T, id string) {
	t.Helper()
	if got := h.sh(t, id, "echo alive"); got != "alive\n" {
		t.Errorf("after the limit was hit the jail answers %q", got)
	}
}

func (h *harness) limitMemory(t *testing.T) {
	j := h.jail(t, func(c *client.Config) {
		c.Isolation.Resources.MemoryBytes = 64 * config.MiB
		c.Isolation.Resources.MemorySwapBytes = 64 * config.MiB
	})
	// Touch 256 MiB, a page at a time.
	res := h.run(t, j.ID, client.ExecRequest{Cmd: []string{"python3", "-c",
		"b = bytearray(256 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('allocated')"}})
	if strings.Contains(res.Stdout, "allocated") || res.ExitCode == 0 {
		t.Fatalf("256 MiB allocated under a 64 MiB limit: %+v", res)
	}
	if !res.OOMKilled && !strings.Contains(res.Stderr, "MemoryError") {
		t.Errorf("the hog ended without an OOM kill or a MemoryError: %+v", res)
	}
	h.stillServes(t, j.ID)
}

func (h *harness) limitPids(t *testing.T) {
	const limit = 48
	j := h.jail(t, func(c *client.Config) { c.Isolation.Resources.PidsLimit = limit })
	// Fork 200 sleepers; count how many started.
	res := h.run(t, j.ID, client.ExecRequest{Cmd: []string{"python3", "-c", `
import os, time
kids = []
for i in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    kids.append(pid)
print(len(kids))
for k in kids:
    os.kill(k, 9)
for k in kids:
    os.waitpid(k, 0)
`}})
	n, err := strconv.Atoi(strings.TrimSpace(res.Stdout))
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("the fork loop: %+v", res)
	}
	if n >= limit {
		t.Errorf("%d processes forked under a pids limit of %d", n, limit)
	}
	h.stillServes(t, j.ID)
}

func (h *harness) limitCPU(t *testing.T) {
	// A quarter of one CPU.
	j := h.jail(t, func(c *client.Config) {
		c.Isolation.Resources.CPUPeriod = 100_000
		c.Isolation.Resources.CPUQuota = 25_000
	})
	// The jail's CPU time as the host accounts it (a level with a kernel
	// of its own may count a throttled process's time as its own).
	cpu := func() float64 {
		got, err := h.Client.Get(callCtx(t), j.ID)
		if err != nil || got.Stats == nil {
			t.Fatalf("the jail's stats: %+v %v", got, err)
		}
		return float64(got.Stats.CPUTimeNs) / 1e9
	}
	before, begin := cpu(), time.Now()
	res := h.run(t, j.ID, client.ExecRequest{Cmd: []string{"python3", "-c", `
import time
end = time.monotonic() + 2
while time.monotonic() < end:
    pass
print(time.process_time())
`}})
	inside, err := strconv.ParseFloat(strings.TrimSpace(res.Stdout), 64)
	if err != nil {
		t.Fatalf("the busy loop: %+v", res)
	}
	used, wall := cpu()-before, time.Since(begin).Seconds()
	// At most 25 % of the exec's wall time (the busy loop's 2 s and the
	// interpreter's start, which an emulated machine makes long), with
	// room for the period's rounding and the exec's own work.
	if used > 0.4*wall {
		t.Errorf("a busy loop used %.2f s of CPU in %.2f s under a quota of 25 %%", used, wall)
	}
	t.Logf("busy loop under 25 %% of a CPU: %.2f s of CPU in %.2f s (%.2f s by the jail's own account)", used, wall, inside)
}

func (h *harness) limitDisk(t *testing.T) {
	j := h.jail(t, func(c *client.Config) { c.Isolation.Resources.DiskBytes = 96 * config.MiB })
	ws := j.Config.Isolation.Filesystem.WorkspaceRoot
	res := h.run(t, j.ID, client.ExecRequest{Cmd: []string{"sh", "-c", "dd if=/dev/zero of=" + ws + "/fill bs=1M count=200 2>&1; echo exit $?"}})
	if !strings.Contains(res.Stdout, "No space left") {
		t.Errorf("writing 200 MiB under a 96 MiB disk: %s", res.Stdout)
	}
	h.sh(t, j.ID, "rm -f "+ws+"/fill")
	h.stillServes(t, j.ID)
}
