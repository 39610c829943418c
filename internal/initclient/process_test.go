package initclient_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/initproto"
)

// readUntil reads p's output until it holds want (stdout and stderr
// apart) or the command ends.
func readUntil(t *testing.T, p *initclient.Process, want string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errb strings.Builder
	for !strings.Contains(out.String(), want) {
		typ, b, err := p.Next()
		if err != nil {
			return out.String(), errb.String(), err
		}
		if typ == initproto.MsgStderr {
			errb.Write(b)
		} else {
			out.Write(b)
		}
	}
	return out.String(), errb.String(), nil
}

// TestDetachedOutlivesConnection: a detached command keeps running when
// its connection closes; a new attachment sees only new output, feeds
// stdin with MsgInput, and gets the exit; after the exit an attach by pid
// still reports it.
func TestDetachedOutlivesConnection(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	p, err := e.c.StartProcess(ctx, initproto.ExecRequest{
		Argv:  []string{"sh", "-c", `echo first; echo oops >&2; while read l; do echo "got $l"; done; echo bye; exit 4`},
		Stdin: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	pid := p.Started().Pid
	if pid <= 0 {
		t.Fatalf("started: %+v", p.Started())
	}
	out, errs, err := readUntil(t, p, "first\n")
	if err != nil || out != "first\n" {
		t.Fatalf("first output %q %q: %v", out, errs, err)
	}
	p.Close() // detach: the command keeps running
	list, err := e.c.List(ctx)
	if err != nil || len(list) != 1 || list[0].Pid != pid {
		t.Fatalf("list after detaching: %+v, %v", list, err)
	}
	a, err := e.c.AttachProcess(ctx, pid, false)
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.c.AttachProcess(ctx, pid, false) // a second subscriber
	if err != nil {
		t.Fatal(err)
	}
	if err := e.c.Input(ctx, pid, []byte("one\n"), false); err != nil {
		t.Fatal(err)
	}
	for _, x := range []*initclient.Process{a, b} {
		if out, _, err := readUntil(t, x, "got one\n"); err != nil || out != "got one\n" {
			t.Fatalf("after input: %q, %v (the output before attaching must not be replayed)", out, err)
		}
	}
	b.Close()
	if err := e.c.Input(ctx, pid, nil, true); err != nil {
		t.Fatal(err)
	}
	out, _, err = readUntil(t, a, "never")
	if !errors.Is(err, io.EOF) || out != "bye\n" {
		t.Fatalf("end: %q, %v", out, err)
	}
	if st, ok := a.Exit(); !ok || st.Code != 4 || st.Pid != pid {
		t.Fatalf("exit: %+v %v", st, ok)
	}
	late, err := e.c.AttachProcess(ctx, pid, false)
	if err != nil {
		t.Fatalf("attach after the end: %v", err)
	}
	if _, _, err := late.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("late attach: %v", err)
	}
	if st, _ := late.Exit(); st.Code != 4 {
		t.Fatalf("late attach exit: %+v", st)
	}
	late.Close()
	// A client may close the input of a command that ended on its own.
	if err := e.c.Input(ctx, pid, nil, true); err != nil {
		t.Fatalf("closing the input of an ended command: %v", err)
	}
	if err := e.c.Input(ctx, pid, []byte("late\n"), false); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("input to an ended command: %v, want a conflict", err)
	}
	if _, err := e.c.AttachProcess(ctx, 999999, false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("attach to an unknown pid: %v", err)
	}
	if err := e.c.Input(ctx, 999999, []byte("x"), false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("input to an unknown pid: %v", err)
	}
}

// TestDetachedClosedInput: input to a running command that closed its
// stdin is refused as a conflict (as a shell pipeline's writer gets a
// broken pipe), not held until the wait for a slow reader runs out.
func TestDetachedClosedInput(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	p, err := e.c.StartProcess(ctx, initproto.ExecRequest{
		Argv:  []string{"sh", "-c", `exec 0<&-; echo closed; exec sleep 60`},
		Stdin: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	pid := p.Started().Pid
	if out, _, err := readUntil(t, p, "closed\n"); err != nil {
		t.Fatalf("%q, %v", out, err)
	}
	start := time.Now()
	if err := e.c.Input(ctx, pid, []byte("x\n"), false); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("input after the command closed its stdin: %v, want a conflict", err)
	}
	if d := time.Since(start); d >= initproto.MaxInputWait {
		t.Fatalf("the refusal took %v: it waited for a reader", d)
	}
	if err := e.c.Signal(ctx, pid, "SIGKILL"); err != nil {
		t.Fatal(err)
	}
}

// TestDetachedKillAndNoStdin: signals reach a detached command by pid;
// input to one started without stdin is refused.
func TestDetachedKillAndNoStdin(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	p, err := e.c.StartProcess(ctx, initproto.ExecRequest{Argv: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	pid := p.Started().Pid
	if err := e.c.Input(ctx, pid, []byte("x"), false); !errors.Is(err, errdefs.ErrUnprocessable) {
		t.Fatalf("input without stdin: %v", err)
	}
	if err := e.c.Signal(ctx, pid, "SIGKILL"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the kill: %v", err)
	}
	if st, _ := p.Exit(); st.Signal != "SIGKILL" {
		t.Fatalf("exit: %+v", st)
	}
}

// TestTerminalByPid: a terminal session is fed and resized by pid, and
// attached by pid without its scrollback.
func TestTerminalByPid(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	p, err := e.c.StartProcess(ctx, initproto.ExecRequest{Argv: []string{"sh"}, PTY: &initproto.PTYOptions{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatal(err)
	}
	pid := p.Started().Pid
	if p.Started().Session == nil {
		t.Fatalf("no session: %+v", p.Started())
	}
	if err := e.c.SetSize(ctx, pid, 30, 100); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Input(ctx, pid, []byte("stty size; echo mark-$((40+2))\n"), false); err != nil {
		t.Fatal(err)
	}
	if out, _, err := readUntil(t, p, "mark-42"); err != nil || !strings.Contains(out, "30 100") {
		t.Fatalf("terminal output %q: %v", out, err)
	}
	p.Close()
	a, err := e.c.AttachProcess(ctx, pid, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.c.Input(ctx, pid, []byte("exit 7\n"), false); err != nil {
		t.Fatal(err)
	}
	out, _, err := readUntil(t, a, "never")
	if !errors.Is(err, io.EOF) || strings.Contains(out, "mark-42") {
		t.Fatalf("attach without scrollback: %q, %v", out, err)
	}
	if st, _ := a.Exit(); st.Code != 7 {
		t.Fatalf("exit: %+v", st)
	}
}

// TestWatch: a recursive watch reports creates, writes, renames and
// removes relative to the watched directory, in directories made after
// it started too; a missing directory is ErrNotFound.
func TestWatch(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dir := filepath.Join(e.root, "w")
	mustMkdir(t, dir, 0o755)
	w, err := e.c.Watch(ctx, "/w", true)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	next := func() initproto.WatchEvent {
		t.Helper()
		ev, err := w.Next()
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	mustMkdir(t, filepath.Join(dir, "sub"), 0o755)
	if ev := next(); ev != (initproto.WatchEvent{Name: "sub", Op: initproto.WatchCreate}) {
		t.Fatalf("mkdir: %+v", ev)
	}
	mustWrite(t, filepath.Join(dir, "sub", "f"), "x", 0o644)
	if ev := next(); ev != (initproto.WatchEvent{Name: "sub/f", Op: initproto.WatchCreate}) {
		t.Fatalf("create in the new subdirectory: %+v", ev)
	}
	if ev := next(); ev != (initproto.WatchEvent{Name: "sub/f", Op: initproto.WatchWrite}) {
		t.Fatalf("write: %+v", ev)
	}
	if err := os.Remove(filepath.Join(dir, "sub", "f")); err != nil {
		t.Fatal(err)
	}
	if ev := next(); ev != (initproto.WatchEvent{Name: "sub/f", Op: initproto.WatchRemove}) {
		t.Fatalf("remove: %+v", ev)
	}
	if _, err := e.c.Watch(ctx, "/missing", false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("watch of a missing directory: %v", err)
	}
	mustWrite(t, filepath.Join(e.root, "file"), "x", 0o644)
	if _, err := e.c.Watch(ctx, "/file", false); !errors.Is(err, errdefs.ErrUnprocessable) {
		t.Fatalf("watch of a file: %v", err)
	}
}
