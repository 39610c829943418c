package integration

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/model"
)

// TestProcessLevelControlDir: a process-level jail's commands run under a
// Landlock domain narrower than its init's: init's control directory (its
// config, its log, the terminal recordings) is out of their reach, though
// it belongs to the jail's user, while the workspace is theirs.
func TestProcessLevelControlDir(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, map[string]any{"isolation": map[string]any{"level": "process"}})
	ctl := filepath.Join(d.dir, "jails", j.ID, "run")
	logBefore, err := os.ReadFile(filepath.Join(ctl, "init.log"))
	if err != nil {
		t.Fatal(err)
	}
	out := d.mustSh(t, j.ID, `
ls `+ctl+` >/dev/null 2>&1 && echo LISTED || echo no-list
cat `+ctl+`/init.json >/dev/null 2>&1 && echo READ || echo no-read
(echo forged >> `+ctl+`/init.log) 2>/dev/null && echo WROTE || echo no-write
mkdir `+ctl+`/recordings/x 2>/dev/null && echo MADE || echo no-mkdir
echo mine > ./workspace-file && cat ./workspace-file
stat -c %u `+ctl)
	if want := "no-list\nno-read\nno-write\nno-mkdir\nmine\n"; !strings.HasPrefix(out, want) {
		t.Errorf("a command of a process-level jail and init's control directory:\n%s\nwant\n%s<owner uid>", out, want)
	}
	if uid := strings.TrimSpace(strings.TrimPrefix(out, "no-list\nno-read\nno-write\nno-mkdir\nmine\n")); uid == "0" {
		t.Errorf("the control directory belongs to root: the test proves nothing")
	}
	logAfter, err := os.ReadFile(filepath.Join(ctl, "init.log"))
	if err != nil || !bytes.HasPrefix(logAfter, logBefore) || bytes.Contains(logAfter, []byte("forged")) {
		t.Errorf("init's log was changed from inside the jail: %v", err)
	}
}

// TestProcessLevelRecovery: process-level jails outlive a daemon killed
// with SIGKILL; the next daemon re-adopts the one still running (its
// files, its background process, its network policy, observation) and
// records the one whose init died meanwhile as stopped.
func TestProcessLevelRecovery(t *testing.T) {
	d := newDaemon(t)
	spec := map[string]any{"isolation": map[string]any{"level": "process"}}
	running, doomed := d.createJail(t, spec), d.createJail(t, spec)
	d.mustSh(t, running.ID, "echo before > state; setsid -f sleep 3007 >/dev/null 2>&1 </dev/null")
	d.kill()
	if err := syscall.Kill(running.Pid, 0); err != nil {
		t.Fatalf("the jail's init (pid %d) died with the daemon: %v", running.Pid, err)
	}
	if err := syscall.Kill(doomed.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := d.restart(); err != nil {
		t.Fatal(err)
	}
	if got := d.getJail(t, running.ID); got.Status != "running" || got.Pid != running.Pid {
		t.Errorf("the running jail after the restart: %s pid %d (%s), want running pid %d", got.Status, got.Pid, got.Error, running.Pid)
	}
	if got := d.getJail(t, doomed.ID); got.Status == "running" {
		t.Errorf("a jail whose init died while the daemon was down is reported running")
	}
	if out := d.mustSh(t, running.ID, "cat state; pgrep -fx 'sleep 3007' >/dev/null && echo alive; cat /etc/hostname > /dev/null"); out != "before\nalive\n" {
		t.Errorf("the re-adopted jail: %q", out)
	}
	var find func(ps []*model.Process) bool
	find = func(ps []*model.Process) bool {
		for _, p := range ps {
			if slices.Equal(p.Argv, []string{"cat", "/etc/hostname"}) || find(p.Children) {
				return true
			}
		}
		return false
	}
	err := waitFor(15*time.Second, func() error {
		var tree model.ProcessTree
		d.api.want(t, http.StatusOK, "GET", "/jails/"+running.ID+"/processes", nil, &tree)
		if !find(tree.Roots) {
			return fmt.Errorf("no cat /etc/hostname among %d processes", tree.Total)
		}
		return nil
	})
	if err != nil {
		t.Errorf("the re-adopted jail is not observed: %v", err)
	}
}
