package integration

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	ajclient "github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/testenv"
)

// TestVMBranch snapshots a vm-level jail while a process of it runs and
// after it changed a file, branches the snapshot three ways, and checks
// that every branch carries the process on (its counter keeps growing
// from where it was) and sees the file, that the branches are apart, and
// that destroying them all leaves no QEMU process, tap device, disk or
// socket of theirs on the host.
func TestVMBranch(t *testing.T) {
	d := newDaemon(t)
	c := ajclient.New("http://"+d.addr, d.token)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if !levelAvailable(t, c, config.LevelVM) {
		return
	}
	j, err := c.Create(ctx, ajclient.CreateRequest{Name: "vm-origin", Config: ajclient.Config{Isolation: ajclient.Isolation{Level: config.LevelVM}}})
	if err != nil {
		t.Fatal(err)
	}
	sh := func(id, script string) string {
		t.Helper()
		res, err := c.Exec(ctx, id, ajclient.ExecRequest{Cmd: []string{"sh", "-c", script}, TimeoutMs: 60_000})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("%q in %s: %+v %v", script, id, res, err)
		}
		return res.Stdout
	}
	// count reads id's counter (-1 before its first write).
	count := func(id string) int {
		t.Helper()
		out := strings.TrimSpace(sh(id, "cat /workspace/count 2>/dev/null || true"))
		if out == "" {
			return -1
		}
		n, err := strconv.Atoi(out)
		if err != nil {
			t.Fatalf("the counter of %s: %v", id, err)
		}
		return n
	}
	// waitAbove waits until id's counter passes n and returns it.
	waitAbove := func(id string, n int) int {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			m := count(id)
			if m > n {
				return m
			}
			if time.Now().After(deadline) {
				t.Fatalf("the counter of %s stays at %d (not above %d)", id, m, n)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	// The counter replaces its file whole (a reader never sees it empty).
	sh(j.ID, `setsid -f sh -c 'i=0; while :; do i=$((i+1)); echo $i > /workspace/count.new; mv /workspace/count.new /workspace/count; sleep 0.1; done' >/dev/null 2>&1 </dev/null`)
	sh(j.ID, "echo changed-before-the-snapshot > /workspace/changed.txt")
	waitAbove(j.ID, 2)
	snap, err := c.Snapshot(ctx, j.ID, ajclient.SnapshotRequest{Mode: model.SnapshotFull})
	if err != nil {
		t.Fatal(err)
	}
	at := waitAbove(j.ID, 0) // the origin runs on
	t.Logf("snapshot: frozen %.0f ms, machine state %d bytes", snap.FrozenMs, snap.ProcessBytes)
	begin := time.Now()
	branches, err := c.Branch(ctx, snap.ID, ajclient.BranchRequest{Count: 3, NamePrefix: "vm-branch"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("3 branches in %v", time.Since(begin))
	if len(branches) != 3 {
		t.Fatalf("%d branches, want 3", len(branches))
	}
	for i, b := range branches {
		if got := sh(b.ID, "cat /workspace/changed.txt"); got != "changed-before-the-snapshot\n" {
			t.Errorf("branch %d sees %q in the changed file", i, got)
		}
		first := count(b.ID)
		if first > at+1000 {
			t.Errorf("branch %d's counter %d is not where the snapshot left it (about %d)", i, first, at)
		}
		waitAbove(b.ID, first)
	}
	sh(branches[0].ID, "echo only-here > /workspace/only-in-0")
	for _, id := range []string{branches[1].ID, branches[2].ID, j.ID} {
		if res, err := c.Exec(ctx, id, ajclient.ExecRequest{Cmd: []string{"test", "-e", "/workspace/only-in-0"}}); err != nil || res.ExitCode == 0 {
			t.Errorf("a file written in one branch shows in %s (%+v %v)", id, res, err)
		}
	}

	// Destroying everything leaves nothing of the machines behind.
	pids := []int{j.Pid}
	for _, b := range branches {
		pids = append(pids, b.Pid)
	}
	// No machine's memory is offered to the host's same-page merging
	// (which a daemon may allow restored container jails): merged pages
	// would let one jail's machine time what another's holds.
	for _, pid := range pids {
		smaps, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(smaps), "\n") {
			if strings.HasPrefix(l, "VmFlags:") && slices.Contains(strings.Fields(l), "mg") {
				t.Errorf("machine pid %d has mergeable memory (%s)", pid, l)
				break
			}
		}
	}
	for _, id := range append([]string{j.ID}, branches[0].ID, branches[1].ID, branches[2].ID) {
		if err := c.Destroy(ctx, id); err != nil {
			t.Fatalf("destroy %s: %v", id, err)
		}
	}
	if err := c.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if s := procState(strconv.Itoa(pid)); s != "" && s != "Z" {
			t.Errorf("the machine of a destroyed jail (pid %d) still runs (%s)", pid, s)
		}
	}
	for _, dir := range []string{"jails", "pool/disks", "run/netns"} {
		ents, _ := os.ReadDir(filepath.Join(d.dir, dir))
		if len(ents) > 0 {
			t.Errorf("%s still holds %d entries after every jail was destroyed", dir, len(ents))
		}
	}
	if socks, _ := filepath.Glob(filepath.Join(d.dir, "jails", "*", "vm", "*.sock")); len(socks) > 0 {
		t.Errorf("sockets left: %v", socks)
	}
	// Taps live in the jails' network namespaces, which are gone; the
	// daemon's shutdown checks that none of its processes, cgroups,
	// mounts or links is left.
}

// levelAvailable reports whether the daemon offers level; under CI=true a
// missing level fails the test (setup installs every level's needs).
func levelAvailable(t testing.TB, c *ajclient.Client, level string) bool {
	t.Helper()
	h, err := c.Health(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range h.Levels {
		if l.Name == level {
			if !l.Available {
				testenv.Need(t, "the "+level+" level ("+l.Reason+")")
				return false
			}
			return true
		}
	}
	t.Fatalf("the daemon does not know level %s", level)
	return false
}
