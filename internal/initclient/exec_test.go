package initclient_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/testenv"
	"github.com/agentjail/agentjail/internal/treetest"
)

// run execs a command and returns stdout, stderr and the status.
func run(t *testing.T, c *initclient.Client, req initproto.ExecRequest, stdin io.Reader) (string, string, initproto.ExitStatus) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	st, err := c.Exec(ctx, req, stdin, &out, &errb)
	if err != nil {
		t.Fatalf("exec %q: %v", req.Argv, err)
	}
	return out.String(), errb.String(), st
}

func TestExecArgvEnvCwd(t *testing.T) {
	e := newEnv(t)
	out, _, st := run(t, e.c, initproto.ExecRequest{
		Argv: []string{"sh", "-c", `printf '%s|' "$0" "$1" "$HOME" "$USER" "$LOGNAME" "$BASE" "$EXTRA" "$LANG"; pwd`, "a b", "c"},
		Env:  []string{"EXTRA=x=y", "BASE=overridden"},
	}, nil)
	want := "a b|c|/home/agent|agent|agent|overridden|x=y|C.UTF-8|" + e.ws + "\n"
	if out != want || st.Code != 0 || st.Signal != "" {
		t.Fatalf("got %q (status %+v), want %q", out, st, want)
	}
	if st.Pid <= 0 || st.DurationNs <= 0 {
		t.Fatalf("status lacks pid or duration: %+v", st)
	}
	sub := filepath.Join(e.ws, "sub")
	mustMkdir(t, sub, 0o755)
	out, _, _ = run(t, e.c, initproto.ExecRequest{Argv: []string{"pwd"}, Cwd: sub}, nil)
	if out != sub+"\n" {
		t.Fatalf("cwd: got %q", out)
	}
	_, _, st = run(t, e.c, initproto.ExecRequest{Argv: []string{"sh", "-c", "exit 3"}}, nil)
	if st.Code != 3 {
		t.Fatalf("exit code: %+v", st)
	}
}

// TestExecOnlyStdio checks that a command inherits no descriptor but its
// stdio (no control socket of the shim, no pipe of another command).
func TestExecOnlyStdio(t *testing.T) {
	e := newEnv(t)
	// ls itself opens the directory as 3.
	out, _, st := run(t, e.c, initproto.ExecRequest{Argv: []string{"ls", "/proc/self/fd"}}, strings.NewReader(""))
	if st.Code != 0 || strings.Join(strings.Fields(out), " ") != "0 1 2 3" {
		t.Fatalf("open descriptors: %q (%+v)", out, st)
	}
}

func TestExecUsers(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct{ user, want string }{
		{"", "1000 1000 1000"},
		{"agent", "1000 1000 1000"},
		{"tester", "4321 4321 4321 5555"},
		{"4321", "4321 4321 4321 5555"},
		{"root", "0 0 0"},
		{"7777", "7777 7777 7777"}, // a uid without a passwd entry
	} {
		out, _, st := run(t, e.c, initproto.ExecRequest{Argv: []string{"sh", "-c", `echo $(id -u) $(id -g) $(id -G)`}, User: tc.user}, nil)
		if strings.TrimSpace(out) != tc.want || st.Code != 0 {
			t.Errorf("user %q: got %q (%+v), want %q", tc.user, out, st, tc.want)
		}
	}
	_, err := e.c.Exec(context.Background(), initproto.ExecRequest{Argv: []string{"true"}, User: "nosuchuser"}, nil, nil, nil)
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "nosuchuser") {
		t.Fatalf("unknown user: %v", err)
	}
}

// TestExecUsersFollowAccountFiles: init remembers resolved users, yet a
// change to /etc/passwd or /etc/group (written in place with the same
// size, or replaced) is what the very next exec runs with.
func TestExecUsersFollowAccountFiles(t *testing.T) {
	e := newEnv(t)
	ids := func() string {
		t.Helper()
		out, _, st := run(t, e.c, initproto.ExecRequest{Argv: []string{"sh", "-c", `echo $(id -u) $(id -G)`}, User: "tester"}, nil)
		if st.Code != 0 {
			t.Fatalf("id as tester: %+v", st)
		}
		return strings.TrimSpace(out)
	}
	if got := ids(); got != "4321 4321 5555" {
		t.Fatalf("tester: %q", got)
	}
	passwd := filepath.Join(e.root, "etc/passwd")
	// Same size, same file: only the content (and the change time) moves.
	f, err := os.OpenFile(passwd, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(strings.Replace(testPasswd, "tester:x:4321:4321", "tester:x:4322:4321", 1)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if got := ids(); got != "4322 4321 5555" {
		t.Errorf("after tester's uid changed in place: %q", got)
	}
	// A new /etc/group (renamed over the old one) drops tester from extra.
	tmp := filepath.Join(e.root, "etc/group.new")
	mustWrite(t, tmp, strings.Replace(testGroup, "tester,other", "other", 1), 0o644)
	if err := os.Rename(tmp, filepath.Join(e.root, "etc/group")); err != nil {
		t.Fatal(err)
	}
	if got := ids(); got != "4322 4321" {
		t.Errorf("after tester left group extra: %q", got)
	}
}

func TestExecStdinStreaming(t *testing.T) {
	e := newEnv(t)
	data := make([]byte, 5<<20)
	rand.Read(data)
	var out bytes.Buffer
	st, err := e.c.Exec(context.Background(), initproto.ExecRequest{Argv: []string{"cat"}}, bytes.NewReader(data), &out, nil)
	if err != nil || st.Code != 0 {
		t.Fatalf("cat: %v %+v", err, st)
	}
	if !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("cat returned %d bytes, want %d identical", out.Len(), len(data))
	}
	// A nil stdin is empty.
	got, _, st := run(t, e.c, initproto.ExecRequest{Argv: []string{"wc", "-c"}}, nil)
	if strings.TrimSpace(got) != "0" || st.Code != 0 {
		t.Fatalf("nil stdin: %q %+v", got, st)
	}
	// Interactive: each line is answered before the next is sent.
	pr, pw := io.Pipe()
	lw := newLineWriter()
	done := make(chan error, 1)
	go func() {
		_, err := e.c.Exec(context.Background(), initproto.ExecRequest{Argv: []string{"sh", "-c", "while read l; do echo got-$l; done"}}, pr, lw, nil)
		done <- err
	}()
	for i, w := range []string{"one", "two"} {
		io.WriteString(pw, w+"\n")
		if l := waitLines(t, lw, 1, 10*time.Second); l[0] != "got-"+w {
			t.Fatalf("line %d: %q", i, l[0])
		}
	}
	pw.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestExecLargeOutput(t *testing.T) {
	e := newEnv(t)
	var out, errb countWriter
	st, err := e.c.Exec(context.Background(), initproto.ExecRequest{
		Argv: []string{"sh", "-c", "head -c 30000000 /dev/zero; head -c 3000000 /dev/zero >&2"},
	}, nil, &out, &errb)
	if err != nil || st.Code != 0 {
		t.Fatalf("%v %+v", err, st)
	}
	if out.n != 30000000 || errb.n != 3000000 {
		t.Fatalf("stdout %d bytes, stderr %d bytes", out.n, errb.n)
	}
}

type countWriter struct{ n int }

func (w *countWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }

func TestExecSignalsAndStartFailures(t *testing.T) {
	e := newEnv(t)
	_, errOut, st := run(t, e.c, initproto.ExecRequest{Argv: []string{"sh", "-c", "echo oops >&2; kill -TERM $$"}}, nil)
	if st.Signal != "SIGTERM" || st.Code != 143 || errOut != "oops\n" {
		t.Fatalf("signal: %+v stderr %q", st, errOut)
	}
	_, errOut, st = run(t, e.c, initproto.ExecRequest{Argv: []string{"no-such-command-here"}}, nil)
	if st.Code != 127 || !strings.Contains(errOut, "no-such-command-here: command not found") {
		t.Fatalf("not found: %+v %q", st, errOut)
	}
	_, errOut, st = run(t, e.c, initproto.ExecRequest{Argv: []string{"/no/such/file"}}, nil)
	if st.Code != 127 || !strings.Contains(errOut, "/no/such/file") {
		t.Fatalf("missing path: %+v %q", st, errOut)
	}
	script := filepath.Join(e.ws, "notexec.sh")
	mustWrite(t, script, "#!/bin/sh\necho hi\n", 0o644)
	_, errOut, st = run(t, e.c, initproto.ExecRequest{Argv: []string{script}}, nil)
	if st.Code != 126 || !strings.Contains(errOut, "permission denied") {
		t.Fatalf("not executable: %+v %q", st, errOut)
	}
	_, _, st = run(t, e.c, initproto.ExecRequest{Argv: []string{e.ws}}, nil)
	if st.Code != 126 {
		t.Fatalf("directory: %+v", st)
	}
	// Executable by its owner only: root may run it, tester may not.
	own := filepath.Join(e.ws, "own.sh")
	mustWrite(t, own, "#!/bin/sh\necho ran\n", 0o700)
	if out, _, st := run(t, e.c, initproto.ExecRequest{Argv: []string{own}, User: "root"}, nil); out != "ran\n" || st.Code != 0 {
		t.Fatalf("root: %q %+v", out, st)
	}
	if _, _, st := run(t, e.c, initproto.ExecRequest{Argv: []string{own}, User: "tester"}, nil); st.Code != 126 {
		t.Fatalf("tester: %+v", st)
	}
}

func TestExecBadRequests(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, tc := range []struct {
		req  initproto.ExecRequest
		kind error
	}{
		{initproto.ExecRequest{}, errdefs.ErrInvalid},
		{initproto.ExecRequest{Argv: []string{"true"}, Cwd: "relative"}, errdefs.ErrInvalid},
		{initproto.ExecRequest{Argv: []string{"true"}, Cwd: "/no/such/dir"}, errdefs.ErrUnprocessable},
		{initproto.ExecRequest{Argv: []string{"true"}, Cwd: "/etc/passwd"}, errdefs.ErrUnprocessable},
		{initproto.ExecRequest{Argv: []string{"true"}, Cwd: "/root", User: "tester"}, errdefs.ErrUnprocessable},
		{initproto.ExecRequest{Argv: []string{"tr\x00ue"}}, errdefs.ErrInvalid},
		{initproto.ExecRequest{Argv: []string{"true"}, Env: []string{"NOEQUALS"}}, errdefs.ErrInvalid},
	} {
		_, err := e.c.Exec(ctx, tc.req, nil, nil, nil)
		if !errors.Is(err, tc.kind) {
			t.Errorf("%+v: got %v, want kind %v", tc.req, err, tc.kind)
		}
	}
}

func TestExecTimeoutKillsTree(t *testing.T) {
	e := newEnv(t)
	lw := newLineWriter()
	start := time.Now()
	st, err := e.c.Exec(context.Background(), initproto.ExecRequest{Argv: []string{"sh", "-c", treetest.Script}, TimeoutMs: 1500}, nil, lw, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !st.TimedOut || st.Signal != "SIGKILL" {
		t.Fatalf("status %+v", st)
	}
	if d := time.Since(start); d < 1500*time.Millisecond || d > 10*time.Second {
		t.Fatalf("timed out after %v", d)
	}
	pids := treetest.ParsePids(t, strings.Fields(lw.String()))
	if len(pids) != 4 {
		t.Fatalf("want 4 pids, got %v", pids)
	}
	// Exec returns only after the shim reaped the whole tree.
	for _, p := range pids {
		if treetest.Alive(p) {
			t.Errorf("pid %d survived the timeout", p)
		}
	}
}

func TestExecCancelKillsTree(t *testing.T) {
	e := newEnv(t)
	lw := newLineWriter()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		st  initproto.ExitStatus
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := e.c.Exec(ctx, initproto.ExecRequest{Argv: []string{"sh", "-c", treetest.Script}}, nil, lw, nil)
		done <- result{st, err}
	}()
	pids := treetest.ParsePids(t, waitLines(t, lw, 4, 10*time.Second))
	for _, p := range pids {
		if !treetest.Alive(p) {
			t.Fatalf("pid %d is not running", p)
		}
	}
	cancel()
	r := <-done
	if !errors.Is(r.err, context.Canceled) {
		t.Fatalf("exec returned %v", r.err)
	}
	if r.st.Signal != "SIGKILL" {
		t.Fatalf("status %+v", r.st)
	}
	treetest.Gone(t, pids)
}

func TestExecWriterErrorKills(t *testing.T) {
	e := newEnv(t)
	boom := errors.New("writer failed")
	st, err := e.c.Exec(context.Background(), initproto.ExecRequest{Argv: []string{"sh", "-c", "echo first; exec sleep 1000"}}, nil, failWriter{boom}, nil)
	if !errors.Is(err, boom) || st.Signal != "SIGKILL" {
		t.Fatalf("got %v, %+v", err, st)
	}
}

type failWriter struct{ err error }

func (w failWriter) Write([]byte) (int, error) { return 0, w.err }

func TestExecDisconnectKillsTree(t *testing.T) {
	e := newEnv(t)
	conn := execTreeRaw(t, e)
	pids := treetest.Pids(t, conn)
	conn.Close()
	treetest.Gone(t, pids)
	waitFor(t, 5*time.Second, "the process table to empty", func() bool {
		l, err := e.c.List(context.Background())
		return err == nil && len(l) == 0
	})
}

// TestExecDisconnectPendingStdinKillsTree: a client that sent more input
// than a command reads, then went away, gets the command tree killed too
// (its unread input is still queued on the connection).
func TestExecDisconnectPendingStdinKillsTree(t *testing.T) {
	e := newEnv(t)
	conn := execTreeRaw(t, e)
	// The tree never reads its input: this fills the pipe and the
	// connection, until the connection closes.
	flood := treetest.NewFlood(conn)
	pids := treetest.Pids(t, conn)
	conn.Close()
	<-flood.Done()
	treetest.Gone(t, pids)
}

// execTreeRaw starts treetest.Script, with stdin, speaking the protocol
// directly on a connection of its own, which it returns.
func execTreeRaw(t *testing.T, e *testEnv) net.Conn {
	t.Helper()
	conn, err := netDial(e.sock)
	if err != nil {
		t.Fatal(err)
	}
	treetest.Start(t, conn)
	return conn
}

func TestSignalKillList(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	type result struct {
		st  initproto.ExitStatus
		err error
	}
	start := func(argv ...string) chan result {
		ch := make(chan result, 1)
		go func() {
			st, err := e.c.Exec(ctx, initproto.ExecRequest{Argv: argv, TimeoutMs: 60000}, nil, nil, nil)
			ch <- result{st, err}
		}()
		return ch
	}
	r1 := start("sleep", "1001")
	r2 := start("sleep", "1002")
	var procs []initproto.ProcessInfo
	waitFor(t, 10*time.Second, "two listed processes", func() bool {
		var err error
		procs, err = e.c.List(ctx)
		return err == nil && len(procs) == 2
	})
	sort.Slice(procs, func(i, j int) bool { return procs[i].Argv[1] < procs[j].Argv[1] })
	if procs[0].Argv[1] != "1001" || procs[0].User != "agent" || procs[0].Cwd != e.ws || procs[0].TimeoutMs != 60000 {
		t.Fatalf("list: %+v", procs)
	}
	if err := e.c.Signal(ctx, procs[0].Pid, "TERM"); err != nil {
		t.Fatal(err)
	}
	if r := <-r1; r.err != nil || r.st.Signal != "SIGTERM" || r.st.Pid != procs[0].Pid {
		t.Fatalf("signalled: %+v %v", r.st, r.err)
	}
	if err := e.c.Kill(ctx, procs[1].Pid); err != nil {
		t.Fatal(err)
	}
	if r := <-r2; r.err != nil || r.st.Signal != "SIGKILL" || r.st.TimedOut {
		t.Fatalf("killed: %+v %v", r.st, r.err)
	}
	if err := e.c.Signal(ctx, 999999, "TERM"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown pid: %v", err)
	}
	if err := e.c.Signal(ctx, procs[0].Pid, "NOTASIGNAL"); !errors.Is(err, errdefs.ErrInvalid) && !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("bad signal: %v", err)
	}
}

// TestExecLeftoversLinger checks that a background process outliving its
// command keeps running after the exec ends, and is killed at shutdown.
func TestExecLeftoversLinger(t *testing.T) {
	e := newEnv(t)
	out, _, st := run(t, e.c, initproto.ExecRequest{Argv: []string{"sh", "-c", "sleep 1000 >/dev/null 2>&1 & echo $!"}}, nil)
	if st.Code != 0 {
		t.Fatalf("%+v", st)
	}
	pid := treetest.ParsePids(t, strings.Fields(out))[0]
	if !treetest.Alive(pid) {
		t.Fatalf("background pid %d died with its command", pid)
	}
	// Other commands still run (on another shim).
	if o, _, _ := run(t, e.c, initproto.ExecRequest{Argv: []string{"echo", "ok"}}, nil); o != "ok\n" {
		t.Fatalf("%q", o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	treetest.Gone(t, []int{pid})
}

func TestUnavailableAndLongSocketPath(t *testing.T) {
	testenv.RequireRoot(t)
	err := initclient.New(initclient.UnixSocket(filepath.Join(t.TempDir(), "missing.sock"))).Ping(context.Background())
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("missing socket: %v", err)
	}
	e := newEnv(t)
	long := filepath.Join(e.dir, strings.Repeat("d", 60), strings.Repeat("e", 60))
	mustMkdir(t, long, 0o700)
	if err := os.Symlink(e.sock, filepath.Join(long, "init.sock")); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(long, "init.sock")
	if len(p) <= 108 {
		t.Fatalf("path %q is not long enough", p)
	}
	if err := initclient.New(initclient.UnixSocket(p)).Ping(context.Background()); err != nil {
		t.Fatalf("long path: %v", err)
	}
}

func TestExecLargeArgv(t *testing.T) {
	e := newEnv(t)
	arg := strings.Repeat("a", 100000) // under the kernel's per-argument limit
	out, _, st := run(t, e.c, initproto.ExecRequest{Argv: []string{"sh", "-c", `echo $(( ${#1} + ${#2} + ${#3} ))`, "_", arg, arg, arg}}, nil)
	if strings.TrimSpace(out) != "300000" || st.Code != 0 {
		t.Fatalf("large argv: %q %+v", out, st)
	}
	var env []string
	for i := range 12 {
		env = append(env, "BIG"+strings.Repeat("X", i)+"="+strings.Repeat("v", 100000))
	}
	if _, err := e.c.Exec(context.Background(), initproto.ExecRequest{Argv: []string{"true"}, Env: env}, nil, nil, nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("oversized environment: %v", err)
	}
	// The server still works after refusing it.
	if o, _, _ := run(t, e.c, initproto.ExecRequest{Argv: []string{"echo", "ok"}}, nil); o != "ok\n" {
		t.Fatalf("%q", o)
	}
}

// TestIdleShimsDrainAndFill: emptying the pool ends the idle shims (a
// checkpoint then has fewer processes to dump), commands still run, and
// filling starts them again.
func TestIdleShimsDrainAndFill(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if st, err := e.c.Exec(ctx, initproto.ExecRequest{Argv: []string{"/bin/true"}}, nil, nil, nil); err != nil || st.Code != 0 {
		t.Fatalf("exec: %v %+v", err, st)
	}
	waitFor(t, 10*time.Second, "two idle shims", func() bool { return len(shimChildren(t)) == 2 })
	before := shimChildren(t)
	if err := e.c.SetIdleShims(ctx, false); err != nil {
		t.Fatal(err)
	}
	// The answer comes once they have exited.
	for _, pid := range before {
		if treetest.Alive(pid) {
			t.Fatalf("idle shim %d still exists after the pool was emptied", pid)
		}
	}
	if got := shimChildren(t); len(got) != 0 {
		t.Fatalf("shims after emptying the pool: %v", got)
	}
	if err := e.c.SetIdleShims(ctx, true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the pool to fill again", func() bool { return len(shimChildren(t)) == 2 })

	// A drain right after a command, while the pool refills, also waits
	// for the shims being started: none is left when init answers.
	for range 3 {
		if st, err := e.c.Exec(ctx, initproto.ExecRequest{Argv: []string{"/bin/true"}}, nil, nil, nil); err != nil || st.Code != 0 {
			t.Fatalf("exec: %v %+v", err, st)
		}
		if err := e.c.SetIdleShims(ctx, false); err != nil {
			t.Fatal(err)
		}
		if got := shimChildren(t); len(got) != 0 {
			t.Fatalf("shims after emptying a refilling pool: %v", got)
		}
	}
	if err := e.c.SetIdleShims(ctx, true); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if st, err := e.c.Exec(ctx, initproto.ExecRequest{Argv: []string{"/bin/echo", "again"}}, nil, &out, nil); err != nil || st.Code != 0 || out.String() != "again\n" {
		t.Fatalf("exec after refilling: %v %+v %q", err, st, out.String())
	}
}

// TestReadyForCheckpointClosesConnections: a connection init accepted is
// a socket of the daemon's network namespace, which a checkpoint of the
// jail cannot save. Readying init for a checkpoint (the call made right
// before one) reports a connection that stays open, and once it has
// closed, returns with no accepted connection left open in init.
func TestReadyForCheckpointClosesConnections(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	other, err := net.Dial("unix", e.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	waitFor(t, 10*time.Second, "init to accept the connection", func() bool { return acceptedConns(t, e.sock) == 1 })
	if ans, err := e.c.ReadyForCheckpoint(ctx); err != nil || ans.OpenConnections != 1 || ans.Terminals != 0 {
		t.Fatalf("ready for a checkpoint beside an open connection: %+v, %v; want 1 open", ans, err)
	}
	other.Close()
	if ans, err := e.c.ReadyForCheckpoint(ctx); err != nil || ans.OpenConnections != 0 {
		t.Fatalf("ready for a checkpoint: %+v, %v; want none open", ans, err)
	}
	if n := acceptedConns(t, e.sock); n != 0 {
		t.Fatalf("init still holds %d accepted connections when it says it is ready for a checkpoint", n)
	}
}

// acceptedConns counts the connections init has accepted on its socket
// and not closed: in /proc/net/unix they carry the listener's path, but
// not its listening flag.
func acceptedConns(t *testing.T, sock string) int {
	t.Helper()
	data, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(data), "\n")[1:] {
		f := strings.Fields(line)
		// Num RefCount Protocol Flags Type St Inode Path
		if len(f) == 8 && f[7] == sock && f[3] != "00010000" {
			n++
		}
	}
	return n
}

// shimChildren lists this process's shim children (the test binary
// re-executed as `init --shim`), zombies excluded.
func shimChildren(t *testing.T) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	self := os.Getpid()
	var pids []int
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[0] == "Z" || f[1] != strconv.Itoa(self) {
			continue
		}
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(string(cmd), "--shim") {
			pids = append(pids, pid)
		}
	}
	return pids
}
