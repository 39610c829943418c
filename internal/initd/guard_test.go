package initd

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/testenv"
)

// DumpableEnv makes the test binary print its dumpable flag and exit (see
// TestMain).
const DumpableEnv = "AGENTJAIL_TEST_DUMPABLE"

// PrintDumpable prints the calling process's dumpable flag.
func PrintDumpable() int {
	v, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	if err != nil {
		return 1
	}
	os.Stdout.WriteString(strconv.Itoa(v))
	return 0
}

// TestWithoutReadOverride starts copies of the test binary and reads back
// each one's dumpable flag as it starts: a binary its starter cannot read
// starts non-dumpable, which withoutReadOverride achieves for root; the
// calling process keeps its capabilities.
func TestWithoutReadOverride(t *testing.T) {
	testenv.RequireRoot(t)
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	unreadable, readable := filepath.Join(dir, "unreadable"), filepath.Join(dir, "readable")
	if err := os.WriteFile(unreadable, self, 0o111); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(readable, self, 0o755); err != nil {
		t.Fatal(err)
	}
	dumpable := func(path string, start func(func() (int, error)) (int, error)) string {
		t.Helper()
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		pid, err := start(func() (int, error) {
			return syscall.ForkExec(path, []string{path}, &syscall.ProcAttr{
				Env:   []string{DumpableEnv + "=1"},
				Files: []uintptr{0, w.Fd(), 2},
			})
		})
		w.Close()
		if err != nil {
			t.Fatalf("start %s: %v", path, err)
		}
		out, _ := io.ReadAll(r)
		var ws syscall.WaitStatus
		if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil || ws.ExitStatus() != 0 {
			t.Fatalf("%s: %v, %v", path, err, ws)
		}
		return string(out)
	}
	plain := func(f func() (int, error)) (int, error) { return f() }
	for _, tc := range []struct {
		name, path string
		start      func(func() (int, error)) (int, error)
		want       string
	}{
		{"unreadable without the override", unreadable, withoutReadOverride, "0"},
		{"unreadable with the override", unreadable, plain, "1"},
		{"readable without the override", readable, withoutReadOverride, "1"},
	} {
		if got := dumpable(tc.path, tc.start); got != tc.want {
			t.Errorf("%s: dumpable %q, want %q", tc.name, got, tc.want)
		}
	}
	// Every thread left keeps CAP_DAC_OVERRIDE (the dropping thread ended).
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		st, err := os.ReadFile("/proc/self/task/" + task.Name() + "/status")
		if err != nil {
			continue // the thread ended
		}
		for _, l := range bytes.Split(st, []byte("\n")) {
			if v, ok := bytes.CutPrefix(l, []byte("CapEff:")); ok {
				caps, err := strconv.ParseUint(strings.TrimSpace(string(v)), 16, 64)
				if err != nil {
					t.Fatal(err)
				}
				if caps&(1<<unix.CAP_DAC_OVERRIDE) == 0 {
					t.Errorf("thread %s (pid %d) lost CAP_DAC_OVERRIDE: CapEff %s", task.Name(), os.Getpid(), v)
				}
			}
		}
	}
}
