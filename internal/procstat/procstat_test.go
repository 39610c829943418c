package procstat

import (
	"os"
	"os/exec"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParse(t *testing.T) {
	for line, want := range map[string]Stat{
		"1 (init) S 0 1 1 0 -1":             {State: 'S', PPID: 0},
		"42 (a) b) T 7 42 42 0 -1 4194560":  {State: 'T', PPID: 7},
		"9 (sp ace)\n) t 12 9 9":            {State: 't', PPID: 12},
		"5 ((sh)) Z 3 5 5 0 -1 4228108 0 0": {State: 'Z', PPID: 3},
	} {
		got, err := parse([]byte(line))
		if err != nil || got != want {
			t.Errorf("%q: %+v %v, want %+v", line, got, err, want)
		}
	}
	for _, bad := range []string{"", "1 init S 0", "1 (x)", "1 (x) S", "1 (x) S x", "1 (x) SS 2"} {
		if got, err := parse([]byte(bad)); err == nil {
			t.Errorf("%q parsed as %+v", bad, got)
		}
	}
}

// TestReadLiveProcess reads a child's parent (this process) and sees it
// stopped after SIGSTOP.
func TestReadLiveProcess(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	st, err := Read(cmd.Process.Pid)
	if err != nil || st.PPID != os.Getpid() || st.Stopped() {
		t.Fatalf("running child: %+v %v (parent %d)", st, err, os.Getpid())
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(cmd.Process.Pid, &ws, unix.WUNTRACED, nil); err != nil || !ws.Stopped() {
		t.Fatalf("wait for the stop: %v %v", ws, err)
	}
	if st, err = Read(cmd.Process.Pid); err != nil || !st.Stopped() {
		t.Fatalf("stopped child: %+v %v", st, err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if _, err := Read(cmd.Process.Pid); err == nil {
		t.Fatal("a reaped process still reads")
	}
}
