package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/internal/model"
)

// observation: with an observer declared, what a command does shows in
// the jail's record (its process with argv and exit code, its syscalls,
// the file it wrote: each that the observers record); without, the report
// says the jail is not observed.
func (h *harness) observation(t *testing.T) {
	j := h.jail(t, nil)
	ws := j.Config.Isolation.Filesystem.WorkspaceRoot
	h.sh(t, j.ID, "cat /etc/hostname > /dev/null; echo observed > "+ws+"/observed.txt")
	if len(h.caps.Observers) == 0 {
		rep, err := h.Client.Report(callCtx(t), j.ID)
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := json.Marshal(rep); !strings.Contains(string(b), "cannot be observed") {
			t.Errorf("the report of an unobserved jail does not say so: %s", b)
		}
		return
	}
	// What the level's observers record: everything, unless a backend
	// observer declares the types it records.
	records := func(typ string) bool {
		return has(h.caps.Observers, model.ObserverKernel) || len(h.caps.BackendEvents) == 0 || has(h.caps.BackendEvents, typ)
	}
	if !records("proc") {
		t.Errorf("the level declares observers %v that record no processes", h.caps.Observers)
	}
	err := waitFor(15*time.Second, func() error {
		tree, err := h.Client.Processes(callCtx(t), j.ID)
		if err != nil {
			return err
		}
		if p := findProc(tree.Roots, []string{"cat", "/etc/hostname"}); p == nil {
			return fmt.Errorf("no process cat /etc/hostname in %d recorded", tree.Total)
		} else if p.ExitCode == nil || *p.ExitCode != 0 {
			return fmt.Errorf("cat /etc/hostname recorded without its exit: %+v", p)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	want := map[string]bool{}
	if records("syscall") {
		want["syscall by cat"] = false
	}
	if records("file") {
		want["write of observed.txt"] = false
	}
	if len(want) == 0 {
		return
	}
	err = waitFor(15*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := h.Client.Events(ctx, j.ID, 0, []string{"syscall", "file"}, false, func(ev client.Event) error {
			var e struct {
				Comm string `json:"comm"`
				Path string `json:"path"`
				Op   string `json:"op"`
			}
			if json.Unmarshal(ev.Data, &e) != nil {
				return nil
			}
			if ev.Type == "syscall" && e.Comm == "cat" {
				want["syscall by cat"] = true
			}
			if ev.Type == "file" && e.Path == ws+"/observed.txt" && e.Op != "open" && e.Op != "read" {
				want["write of observed.txt"] = true
			}
			return nil
		})
		if err != nil {
			return err
		}
		var missing []string
		for k, ok := range want {
			if !ok {
				missing = append(missing, k)
			}
		}
		if len(missing) > 0 {
			return errors.New("no event: " + strings.Join(missing, ", "))
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

// findProc finds the process with argv in the tree.
func findProc(ps []*model.Process, argv []string) *model.Process {
	for _, p := range ps {
		if slices.Equal(p.Argv, argv) {
			return p
		}
		if q := findProc(p.Children, argv); q != nil {
			return q
		}
	}
	return nil
}
