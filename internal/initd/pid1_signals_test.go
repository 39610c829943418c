package initd_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/testenv"
)

// pid1 is a built init running as PID 1 of a new pid and mount namespace.
type pid1 struct {
	c       *initclient.Client
	pid     int // init's host pid
	ctl     string
	exited  chan struct{}
	waitErr error // unshare's exit, once exited is closed
	stderr  string
}

// startPID1 builds init and runs it as PID 1 of a new namespace until it
// is ready; the namespace is killed when the test ends.
func startPID1(t *testing.T) *pid1 {
	t.Helper()
	testenv.RequireRoot(t)
	unshare := testenv.RequireTool(t, "unshare")
	bin := buildInit(t)
	dir := t.TempDir()
	p := &pid1{ctl: filepath.Join(dir, "run"), exited: make(chan struct{}), stderr: filepath.Join(dir, "stderr")}
	if err := os.Mkdir(p.ctl, 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := initproto.InitConfig{JailID: "signals", DefaultUser: "root", Workspace: "/", Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin"}}
	data, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(p.ctl, initproto.ConfigName), data, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(unshare, "--pid", "--fork", "--kill-child=SIGKILL", "--mount", "--mount-proc", "--propagation", "private",
		bin, "init", "--control-dir", p.ctl)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	errFile, err := os.Create(p.stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer errFile.Close()
	cmd.Stderr = errFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.waitErr = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		select {
		case <-p.exited:
			return
		default:
		}
		if p.pid > 0 {
			syscall.Kill(p.pid, syscall.SIGKILL) // takes the namespace down
		}
		cmd.Process.Kill()
		<-p.exited
	})
	ready := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(stdout).ReadString('\n')
		ready <- l
	}()
	select {
	case l := <-ready:
		if l != initproto.ReadyLine {
			t.Fatalf("readiness line %q; stderr %s", l, readFile(p.stderr))
		}
	case <-p.exited:
		t.Fatalf("init exited before readiness: %v; stderr %s", p.waitErr, readFile(p.stderr))
	case <-time.After(30 * time.Second):
		t.Fatalf("no readiness line; stderr %s", readFile(p.stderr))
	}
	waitFor(t, 5*time.Second, "init's host pid", func() bool {
		if c := childrenOf(cmd.Process.Pid); len(c) == 1 {
			p.pid = c[0]
		}
		return p.pid > 0
	})
	p.c = initclient.New(initclient.UnixSocket(filepath.Join(p.ctl, initproto.SocketName)))
	return p
}

// execResult is the end of a command started by startCmd.
type execResult struct {
	st  initproto.ExitStatus
	err error
}

// startCmd runs `sh -c script` through init in the background, waits for
// its first output line (which must be "ready") and returns the command's
// remaining output lines and its end.
func (p *pid1) startCmd(t *testing.T, script string) (<-chan string, <-chan execResult) {
	t.Helper()
	lw := &lineWriter{lines: make(chan string, 16)}
	done := make(chan execResult, 1)
	go func() {
		st, err := p.c.Exec(context.Background(), initproto.ExecRequest{Argv: []string{"sh", "-c", script}}, nil, lw, nil)
		done <- execResult{st, err}
	}()
	select {
	case l := <-lw.lines:
		if l != "ready" {
			t.Fatalf("the command said %q", l)
		}
	case r := <-done:
		t.Fatalf("the command ended before it was ready: %+v %v", r.st, r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("the command did not start")
	}
	return lw.lines, done
}

// waitExit waits for init to exit and requires a clean exit.
func (p *pid1) waitExit(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case <-p.exited:
		if p.waitErr != nil {
			t.Fatalf("init exited with %v; stderr %s", p.waitErr, readFile(p.stderr))
		}
	case <-time.After(within):
		t.Fatalf("init did not exit within %v", within)
	}
}

// TestPID1ForwardsHUPAndINT sends init SIGHUP and then SIGINT: the
// SIGHUP reaches the running command, which carries on, and init keeps
// serving; the SIGINT reaches the command too, and init then shuts down
// cleanly once the command has exited.
func TestPID1ForwardsHUPAndINT(t *testing.T) {
	p := startPID1(t)
	lines, done := p.startCmd(t, `trap 'echo got-hup' HUP; trap 'echo got-int; exit 5' INT; echo ready; while :; do sleep 0.05; done`)

	if err := syscall.Kill(p.pid, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-lines:
		if l != "got-hup" {
			t.Fatalf("after SIGHUP the command said %q", l)
		}
	case r := <-done:
		t.Fatalf("the command ended on SIGHUP: %+v %v", r.st, r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("the command did not get SIGHUP")
	}
	if err := p.c.Ping(context.Background()); err != nil {
		t.Fatalf("init stopped serving after SIGHUP: %v", err)
	}
	select {
	case <-p.exited:
		t.Fatalf("init exited on SIGHUP: %v", p.waitErr)
	default:
	}

	if err := syscall.Kill(p.pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || r.st.Code != 5 || r.st.Signal != "" {
			t.Fatalf("the command after SIGINT: %+v %v", r.st, r.err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the command did not end after SIGINT")
	}
	if l := <-lines; l != "got-int" {
		t.Fatalf("after SIGINT the command said %q", l)
	}
	p.waitExit(t, 15*time.Second)
	if log := readFile(filepath.Join(p.ctl, initproto.LogName)); !strings.Contains(log, "interrupt: shutting down") {
		t.Fatalf("init.log does not record the SIGINT shutdown:\n%s", log)
	}
}

// TestPID1KillsTermIgnorersAfterGrace sends init SIGTERM while a command
// and a background process ignore it: init waits its grace period (10 s)
// for them, then kills the command (the client sees SIGKILL) and exits
// cleanly, and nothing of the jail is left.
func TestPID1KillsTermIgnorersAfterGrace(t *testing.T) {
	const grace = 10 * time.Second // initd.shutdownGrace
	p := startPID1(t)
	// A background process that ignores SIGTERM, left by a finished command.
	var out strings.Builder
	st, err := p.c.Exec(context.Background(), initproto.ExecRequest{Argv: []string{"sh", "-c", `(trap '' TERM INT; exec sleep 1001) >/dev/null 2>&1 & echo $!`}}, nil, &out, nil)
	if err != nil || st.Code != 0 {
		t.Fatalf("starting the background process: %+v %v", st, err)
	}
	nsPid, _ := strconv.Atoi(strings.TrimSpace(out.String()))
	bg := hostPid(p.pid, nsPid)
	if bg == 0 {
		t.Fatalf("background process %q not found", out.String())
	}
	// A running command that ignores SIGTERM.
	_, done := p.startCmd(t, `trap '' TERM INT; echo ready; exec sleep 1000`)

	start := time.Now()
	if err := syscall.Kill(p.pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		el := time.Since(start)
		if r.err != nil || r.st.Signal != "SIGKILL" {
			t.Fatalf("the command that ignores SIGTERM: %+v %v, want it killed by init (SIGKILL)", r.st, r.err)
		}
		if el < grace-time.Second {
			t.Fatalf("the command was killed %v after SIGTERM, before the %v grace period", el, grace)
		}
	case <-time.After(grace + 15*time.Second):
		t.Fatalf("the command that ignores SIGTERM still runs %v after SIGTERM", grace+15*time.Second)
	}
	p.waitExit(t, 15*time.Second)
	waitFor(t, 5*time.Second, "the background process to be gone", func() bool {
		_, err := os.Stat("/proc/" + strconv.Itoa(bg))
		return os.IsNotExist(err)
	})
	if log := readFile(filepath.Join(p.ctl, initproto.LogName)); !strings.Contains(log, "commands killed after") {
		t.Fatalf("init.log does not record the kill after the grace period:\n%s", log)
	}
}
