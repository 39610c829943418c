package oci

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/testenv"
)

// startStray starts, through a shell that stays its parent, a process
// whose command line names the runtime's state directory and container id
// as a runtime process's does; newPidNS puts both in a pid namespace of
// their own. It returns the stray's host pid.
func startStray(t *testing.T, r *Runtime, id string, newPidNS bool) int {
	t.Helper()
	pidFile := t.TempDir() + "/pid"
	// The inner shell runs `sleep; :`, so it stays a shell and keeps its
	// command line; the outer one is its parent.
	inner := `sh -c 'sleep 60; :' runtime --root ` + r.rc.Root + ` checkpoint ` + id
	cmd := exec.Command("sh", "-c", inner+` & echo $! > `+pidFile+`; wait`)
	// A process group of its own: the cleanup ends the sleeps too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if newPidNS {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWPID
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(pidFile)
		if err == nil && strings.HasSuffix(string(b), "\n") {
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatal(err)
			}
			if newPidNS {
				// $! is the pid in the new namespace: find the host pid
				// among the outer shell's children.
				return hostChild(t, cmd.Process.Pid)
			}
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stray did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// hostChild returns the host pid of parent's only child.
func hostChild(t *testing.T, parent int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(parent) + "/task/" + strconv.Itoa(parent) + "/children")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) != 1 {
		t.Fatalf("pid %d has children %q, want one", parent, f)
	}
	pid, _ := strconv.Atoi(f[0])
	return pid
}

// TestStrays: a runtime process acting on the container that this
// process did not start is found (and killed by KillStrays); a process
// in another pid namespace (a jail's, whose command line may take long to
// read) is not looked at, even with the same command line.
func TestStrays(t *testing.T) {
	testenv.RequireRoot(t)
	r := NewRuntime("runc", t.TempDir()+"/run")
	const id = "strays-test"
	stray := startStray(t, r, id, false)
	jailed := startStray(t, r, id, true)

	got := r.Strays(id, "checkpoint")
	if !slices.Contains(got, stray) {
		t.Errorf("Strays = %v, want it to hold %d", got, stray)
	}
	if slices.Contains(got, jailed) {
		t.Errorf("Strays = %v holds %d, a process of another pid namespace", got, jailed)
	}
	if got := r.Strays(id, "restore"); len(got) > 0 {
		t.Errorf("Strays for restore = %v, want none", got)
	}
	if got := r.Strays("other", ""); len(got) > 0 {
		t.Errorf("Strays of another container = %v, want none", got)
	}
	if err := r.KillStrays(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if alive(stray) {
		t.Errorf("the stray %d still runs after KillStrays", stray)
	}
	if !alive(jailed) {
		t.Errorf("KillStrays killed %d, of another pid namespace", jailed)
	}
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && i+2 < len(b) && b[i+2] != 'Z'
}
