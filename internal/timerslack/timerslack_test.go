package timerslack

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// helperEnv makes the test binary act as a program that calls Reexec and
// reports what it runs with.
const helperEnv = "AGENTJAIL_TIMERSLACK_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helper())
	}
	os.Exit(m.Run())
}

// helper appends a line to the file named by helperEnv each time it
// starts, calls Reexec and prints its pid, its arguments, the slack of its
// main thread (/proc/self/timerslack_ns) and the slack of another thread.
func helper() int {
	f, err := os.OpenFile(os.Getenv(helperEnv), os.O_WRONLY|os.O_APPEND, 0)
	if err == nil {
		_, err = f.WriteString("start\n")
		f.Close()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := Reexec(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	main, err := os.ReadFile("/proc/self/timerslack_ns")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// With this goroutine locked to its thread, the other one runs on
	// another.
	runtime.LockOSThread()
	other := make(chan time.Duration)
	go func() {
		d, _ := get()
		other <- d
	}()
	fmt.Printf("%d %s %s %d\n", os.Getpid(), strings.Join(os.Args[1:], ","), bytes.TrimSpace(main), (<-other).Nanoseconds())
	return 0
}

func TestReexec(t *testing.T) {
	starts := t.TempDir() + "/starts"
	if err := os.WriteFile(starts, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := exec.Command(os.Args[0], "a", "b c")
	cmd.Env = append(os.Environ(), helperEnv+"="+starts)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("helper: %v\n%s", err, &out)
	}
	want := fmt.Sprintf("%d a,b c %d %d\n", cmd.Process.Pid, Coarse.Nanoseconds(), Coarse.Nanoseconds())
	if out.String() != want {
		t.Fatalf("after Reexec: pid, arguments, main thread's and another thread's slack = %q, want %q", out.String(), want)
	}
	// Started, re-executed once, and not again.
	if b, err := os.ReadFile(starts); err != nil || string(b) != "start\nstart\n" {
		t.Fatalf("the program started %q (%v), want twice", b, err)
	}
}

// coarseThread locks the test's goroutine to its thread and sets the
// thread's slack to Coarse, both until the test ends.
func coarseThread(t *testing.T) {
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	cur, err := get()
	if err != nil {
		t.Fatal(err)
	}
	if err := set(Coarse); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = set(cur) })
}

func TestReexecAlreadyCoarse(t *testing.T) {
	coarseThread(t)
	// A thread already at Coarse returns: nothing to do, no execve.
	if err := Reexec(); err != nil {
		t.Fatal(err)
	}
}

func TestOrdinary(t *testing.T) {
	coarseThread(t)
	var child []byte
	err := StartOrdinary(func() error {
		var err error
		child, err = exec.Command("cat", "/proc/self/timerslack_ns").Output()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(child)); got != strconv.FormatInt(Ordinary.Nanoseconds(), 10) {
		t.Errorf("a process started in StartOrdinary has slack %s ns, want %d", got, Ordinary.Nanoseconds())
	}
	if d, err := get(); err != nil || d != Coarse {
		t.Errorf("after StartOrdinary the thread's slack is %v (%v), want it back at %v", d, err, Coarse)
	}
}
