package initd_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/initd"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/testenv"
)

// dialEnv makes the test binary, run inside the jail, connect to the
// socket it names and print init's answer.
const dialEnv = "AGENTJAIL_TEST_DIAL"

func TestMain(m *testing.M) {
	if sock := os.Getenv(dialEnv); sock != "" {
		os.Exit(dialAndPrint(sock))
	}
	if os.Getenv(initd.DumpableEnv) != "" {
		os.Exit(initd.PrintDumpable())
	}
	os.Exit(m.Run())
}

// dialAndPrint sends a ping and prints the answer frame.
func dialAndPrint(sock string) int {
	c, err := net.Dial("unix", sock)
	if err != nil {
		fmt.Println("dial error:", err)
		return 1
	}
	defer c.Close()
	// A rejected peer may find the connection closed before it writes;
	// the answer is still readable.
	_ = initproto.WriteFrame(c, initproto.MsgPing, nil)
	t, p, err := initproto.ReadFrame(c, nil)
	if err != nil {
		fmt.Println("read error:", err)
		return 1
	}
	fmt.Printf("%s %s\n", t, p)
	return 0
}

// buildInit builds a binary around initd.Main.
func buildInit(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "agentjail")
	cmd := exec.Command("go", "build", "-o", bin, "./testdata/initmain")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// parentOf reads a host process's parent pid.
func parentOf(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// childrenOf lists the host pids whose parent is pid.
func childrenOf(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err == nil && parentOf(p) == pid {
			out = append(out, p)
		}
	}
	return out
}

// hostPid finds the host pid of the process with pid nsPid in the pid
// namespace of hostInit.
func hostPid(hostInit, nsPid int) int {
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", hostInit))
	if err != nil {
		return 0
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", p)); l != ns {
			continue
		}
		status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", p))
		for _, line := range strings.Split(string(status), "\n") {
			if f := strings.Fields(strings.TrimPrefix(line, "NSpid:")); strings.HasPrefix(line, "NSpid:") && len(f) >= 2 && f[len(f)-1] == strconv.Itoa(nsPid) {
				return p
			}
		}
	}
	return 0
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// lineWriter signals each complete line.
type lineWriter struct {
	part  string
	lines chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.part += string(p)
	for {
		i := strings.IndexByte(w.part, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.lines <- w.part[:i]
		w.part = w.part[i+1:]
	}
}

// TestPID1 runs the built init as PID 1 of a new pid and mount namespace.
func TestPID1(t *testing.T) {
	testenv.RequireRoot(t)
	unshare := testenv.RequireTool(t, "unshare")
	bin := buildInit(t)
	dir := t.TempDir()
	ctl := filepath.Join(dir, "run")
	if err := os.Mkdir(ctl, 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := initproto.InitConfig{JailID: "pid1", DefaultUser: "root", Workspace: "/", Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin"}}
	data, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(ctl, initproto.ConfigName), data, 0o600); err != nil {
		t.Fatal(err)
	}

	// If the test process dies, unshare gets SIGKILL and passes it on to
	// init, which takes its namespace down.
	cmd := exec.Command(unshare, "--pid", "--fork", "--kill-child=SIGKILL", "--mount", "--mount-proc", "--propagation", "private",
		bin, "init", "--control-dir", ctl)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// A file, not a pipe: Wait must not depend on who else holds it.
	stderr, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	var initPid int
	t.Cleanup(func() {
		select {
		case <-exited:
			return
		default:
		}
		if initPid == 0 {
			if c := childrenOf(cmd.Process.Pid); len(c) == 1 {
				initPid = c[0]
			}
		}
		if initPid > 0 {
			syscall.Kill(initPid, syscall.SIGKILL) // kills the whole namespace
		}
		cmd.Process.Kill()
		<-exited
	})

	// Readiness.
	ready := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(stdout).ReadString('\n')
		ready <- l
	}()
	select {
	case l := <-ready:
		if l != initproto.ReadyLine {
			t.Fatalf("readiness line %q; stderr %s", l, readFile(stderr.Name()))
		}
	case <-exited:
		t.Fatalf("init exited before readiness: %v; stderr %s", waitErr, readFile(stderr.Name()))
	case <-time.After(30 * time.Second):
		t.Fatalf("no readiness line; stderr %s", readFile(stderr.Name()))
	}
	waitFor(t, 5*time.Second, "init's host pid", func() bool {
		if c := childrenOf(cmd.Process.Pid); len(c) == 1 {
			initPid = c[0]
		}
		return initPid > 0
	})
	sock := filepath.Join(ctl, initproto.SocketName)
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("socket: %v %v", fi, err)
	}
	// After readiness init's stdio no longer holds the daemon's pipes.
	logPath := filepath.Join(ctl, initproto.LogName)
	waitFor(t, 5*time.Second, "init to redirect its stdio", func() bool {
		l1, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/1", initPid))
		l2, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/2", initPid))
		l0, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/0", initPid))
		return l1 == logPath && l2 == logPath && l0 == "/dev/null"
	})

	c := initclient.New(initclient.UnixSocket(sock))
	ctx := context.Background()
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("ping from outside the namespace: %v", err)
	}

	// A connection from inside the jail is rejected by the peer check.
	var out strings.Builder
	st, err := c.Exec(ctx, initproto.ExecRequest{Argv: []string{os.Args[0]}, Env: []string{dialEnv + "=" + sock}}, nil, &out, &out)
	if err != nil || st.Code != 0 {
		t.Fatalf("inside dial: %v %+v %s", err, st, out.String())
	}
	if !strings.HasPrefix(out.String(), "error ") || !strings.Contains(out.String(), "accepted only from outside the jail") {
		t.Fatalf("inside connection was not rejected: %s", out.String())
	}

	// Commands run as descendants of PID 1 of the namespace.
	out.Reset()
	if _, err := c.Exec(ctx, initproto.ExecRequest{Argv: []string{"sh", "-c", "echo $$; cat /proc/1/cmdline | tr '\\0' ' '"}}, nil, &out, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "init --control-dir") {
		t.Fatalf("PID 1 is not init: %q", out.String())
	}

	// A background process outlives its command; its shim leaves it to
	// init and exits (nothing but init stays with it), and init reaps it
	// on exit.
	out.Reset()
	if _, err := c.Exec(ctx, initproto.ExecRequest{Argv: []string{"sh", "-c", "sleep 1000 >/dev/null 2>&1 & echo $!"}}, nil, &out, nil); err != nil {
		t.Fatal(err)
	}
	nsPid, _ := strconv.Atoi(strings.TrimSpace(out.String()))
	sleeper := hostPid(initPid, nsPid)
	if sleeper == 0 {
		t.Fatalf("background process %d not found", nsPid)
	}
	waitFor(t, 5*time.Second, "the orphan to be reparented to init", func() bool { return parentOf(sleeper) == initPid })
	syscall.Kill(sleeper, syscall.SIGKILL)
	waitFor(t, 5*time.Second, "init to reap the orphan", func() bool {
		_, err := os.Stat("/proc/" + strconv.Itoa(sleeper))
		return os.IsNotExist(err)
	})
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("init after reaping an orphan: %v", err)
	}

	// SIGTERM: forwarded to running commands, init exits 0 after them.
	lw := &lineWriter{lines: make(chan string, 16)}
	type result struct {
		st  initproto.ExitStatus
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := c.Exec(ctx, initproto.ExecRequest{Argv: []string{"sh", "-c", `trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.05; done`}}, nil, lw, nil)
		done <- result{st, err}
	}()
	select {
	case l := <-lw.lines:
		if l != "ready" {
			t.Fatalf("command said %q", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("command did not start")
	}
	if err := syscall.Kill(initPid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || r.st.Code != 7 {
			t.Fatalf("command after SIGTERM: %+v %v", r.st, r.err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("command did not end after SIGTERM")
	}
	if l := <-lw.lines; l != "got-term" {
		t.Fatalf("command printed %q", l)
	}
	select {
	case <-exited:
		if waitErr != nil {
			t.Fatalf("init exited with %v; stderr %s", waitErr, readFile(stderr.Name()))
		}
	case <-time.After(15 * time.Second):
		t.Fatal("init did not exit after SIGTERM")
	}
	logData, _ := os.ReadFile(logPath)
	if !strings.Contains(string(logData), "serving on") || !strings.Contains(string(logData), "shutting down") {
		t.Fatalf("init.log: %s", logData)
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left behind: %v", err)
	}
}

// TestStartFailure checks that a start error goes to the original stderr
// with a non-zero exit.
func TestStartFailure(t *testing.T) {
	testenv.RequireRoot(t)
	bin := buildInit(t)
	cmd := exec.Command(bin, "init", "--control-dir", t.TempDir())
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() == 0 {
		t.Fatalf("exit: %v", err)
	}
	if stdout.Len() != 0 || !strings.Contains(stderr.String(), "read config") {
		t.Fatalf("stdout %q stderr %q", stdout.String(), stderr.String())
	}
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}
