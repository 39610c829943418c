package conformance

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/internal/model"
)

// snapshots: a filesystem snapshot (FSSnapshot) restores the files as
// they were and diffs against the jail; a process snapshot (Checkpoint)
// restores and branches running processes that carry on from where they
// were. What the level does not declare is refused naming it.
func (h *harness) snapshots(t *testing.T) {
	t.Run("filesystem", h.snapshotFS)
	t.Run("processes", h.snapshotProcesses)
}

// snap takes a snapshot of jail id, deleted when the test ends.
func (h *harness) snap(t *testing.T, id, mode string) (*client.Snapshot, error) {
	s, err := h.Client.Snapshot(callCtx(t), id, client.SnapshotRequest{Mode: mode})
	if err == nil {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			defer cancel()
			if err := h.Client.DeleteSnapshot(ctx, s.ID); err != nil && !client.IsNotFound(err) {
				t.Errorf("delete snapshot %s: %v", s.ID, err)
			}
		})
	}
	return s, err
}

// adopt destroys jail id when the test ends.
func (h *harness) adopt(t *testing.T, id string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		if err := h.Client.Destroy(ctx, id); err != nil && !client.IsNotFound(err) {
			t.Errorf("destroy jail %s: %v", id, err)
		}
	})
}

func (h *harness) snapshotFS(t *testing.T) {
	j := h.jail(t, nil)
	ws := j.Config.Isolation.Filesystem.WorkspaceRoot
	h.sh(t, j.ID, "echo before > "+ws+"/state")
	s, err := h.snap(t, j.ID, model.SnapshotFS)
	if !h.caps.FSSnapshot {
		h.refused(t, "snapshot a jail", err)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	h.sh(t, j.ID, "echo after > "+ws+"/state; echo new > "+ws+"/added")
	r, err := h.Client.Restore(callCtx(t), s.ID, uniqueName(t))
	if err != nil {
		t.Fatal(err)
	}
	h.adopt(t, r.ID)
	if got := h.sh(t, r.ID, "cat "+ws+"/state; test ! -e "+ws+"/added && echo no-added"); got != "before\nno-added\n" {
		t.Errorf("the restored jail holds %q, want the files as snapshotted", got)
	}
	d, err := h.Client.SnapshotDiff(callCtx(t), s.ID, false)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{}
	for _, c := range d.Changes {
		kinds[c.Path] = c.Kind
	}
	if kinds[ws+"/state"] != "modified" || kinds[ws+"/added"] != "added" {
		t.Errorf("diff of the snapshot against its jail: %+v", d.Changes)
	}
}

// counter is a background process writing an increasing number to the
// workspace every 100 ms.
const counter = `setsid -f sh -c 'i=0; while :; do i=$((i+1)); echo $i > %s/count; sleep 0.1; done' >/dev/null 2>&1 </dev/null`

func (h *harness) snapshotProcesses(t *testing.T) {
	j := h.jail(t, nil)
	ws := j.Config.Isolation.Filesystem.WorkspaceRoot
	h.sh(t, j.ID, fmt.Sprintf(counter, ws))
	before := h.counting(t, j.ID, ws, 2)
	s, err := h.snap(t, j.ID, model.SnapshotFull)
	if !h.caps.Checkpoint {
		h.refused(t, "snapshot a jail's processes", err)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	r, err := h.Client.Restore(callCtx(t), s.ID, uniqueName(t))
	if err != nil {
		t.Fatal(err)
	}
	h.adopt(t, r.ID)
	if n := h.counting(t, r.ID, ws, 0); n < before {
		t.Errorf("the restored counter starts at %d, below %d before the snapshot: it did not carry on", n, before)
	}
	bs, err := h.Client.Branch(callCtx(t), s.ID, client.BranchRequest{Count: 2, NamePrefix: uniqueName(t)})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bs {
		h.adopt(t, b.ID)
	}
	for _, b := range bs {
		h.counting(t, b.ID, ws, h.counting(t, b.ID, ws, 0))
	}
	h.sh(t, bs[0].ID, "echo here > "+ws+"/only-in-0")
	for _, other := range []string{bs[1].ID, j.ID, r.ID} {
		if res := h.run(t, other, client.ExecRequest{Cmd: []string{"test", "-e", ws + "/only-in-0"}}); res.ExitCode == 0 {
			t.Errorf("a file written in one branch shows in %s", other)
		}
	}
}

// counting waits until jail id's counter exceeds after and returns it.
func (h *harness) counting(t *testing.T, id, ws string, after int) int {
	t.Helper()
	var n int
	err := waitFor(15*time.Second, func() error {
		res, err := h.Client.Exec(callCtx(t), id, client.ExecRequest{Cmd: []string{"cat", ws + "/count"}})
		if err != nil {
			return err
		}
		if n, err = strconv.Atoi(strings.TrimSpace(res.Stdout)); err != nil {
			return fmt.Errorf("count file: %q", res.Stdout)
		}
		if n <= after {
			return fmt.Errorf("the counter of %s stays at %d", id, n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
