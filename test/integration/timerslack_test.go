package integration

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/agentjail/agentjail/internal/timerslack"
)

// TestTimerSlack: the daemon and each jail's init and shims run with the
// coarse timer slack (internal/timerslack), and every process of the
// jail's user with the ordinary one: a command, what it leaves running,
// and that process again in a branch restored by CRIU.
func TestTimerSlack(t *testing.T) {
	d := shared(t)
	coarse := strconv.FormatInt(timerslack.Coarse.Nanoseconds(), 10)
	ordinary := strconv.FormatInt(timerslack.Ordinary.Nanoseconds(), 10)
	if got := slackOf(t, d.pid); got != coarse {
		t.Errorf("the daemon's timer slack is %s ns, want %s", got, coarse)
	}
	j := d.createJail(t, nil)
	if got := strings.TrimSpace(d.mustSh(t, j.ID, "cat /proc/self/timerslack_ns")); got != ordinary {
		t.Errorf("a command's timer slack is %s ns, want %s", got, ordinary)
	}
	d.mustSh(t, j.ID, "setsid -f sleep 1000 >/dev/null 2>&1 </dev/null")

	// check looks at every process in jail id's cgroup: agentjail's own
	// (init, the shims) must have own, the user's ordinary.
	check := func(id, own string) {
		t.Helper()
		var inits, sleeps int
		for _, pid := range cgroupProcs(t, id) {
			cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if err != nil || len(cmdline) == 0 {
				// Gone meanwhile, or exited and not yet reaped (a shim
				// that left its command's leftovers to init).
				continue
			}
			argv := strings.Split(string(cmdline), "\x00")
			want := ordinary
			switch {
			case len(argv) > 1 && strings.HasSuffix(argv[0], "agentjail") && argv[1] == "init":
				want = own
				inits++
			case argv[0] == "sleep":
				sleeps++
			}
			if got := slackOf(t, pid); got != want && got != gone {
				t.Errorf("jail %s: %q (pid %d) has timer slack %s ns, want %s", id, argv, pid, got, want)
			}
		}
		if inits == 0 || sleeps != 1 {
			t.Errorf("jail %s: %d of agentjail's processes and %d sleep in its cgroup, want init and one sleep", id, inits, sleeps)
		}
	}
	check(j.ID, coarse)
	// CRIU gives every restored process the slack of the restore.
	s := d.takeSnapshot(t, j.ID, "full")
	b := d.branch(t, s.ID, 1)[0]
	check(b.ID, ordinary)

	// gVisor's sandbox runs the jail's code: its timers are the jail's.
	g := d.createJail(t, map[string]any{"isolation": map[string]any{"level": "gvisor"}})
	procs := cgroupProcs(t, g.ID)
	if len(procs) == 0 {
		t.Fatalf("no process in gVisor jail %s's cgroup", g.ID)
	}
	for _, pid := range procs {
		if got := slackOf(t, pid); got != ordinary {
			t.Errorf("gVisor jail %s: pid %d has timer slack %s ns, want %s", g.ID, pid, got, ordinary)
		}
	}
}

// cgroupProcs lists the processes in jail id's pids cgroup.
func cgroupProcs(t *testing.T, id string) []int {
	t.Helper()
	pids, err := pidsInCgroupOf("pids", id)
	if err != nil {
		t.Fatal(err)
	}
	return pids
}

// gone is slackOf's answer for a process reaped meanwhile.
const gone = "gone"

// slackOf reads process pid's timer slack.
func slackOf(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/timerslack_ns", pid))
	if errors.Is(err, fs.ErrNotExist) {
		return gone
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
