package initclient_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/treetest"
)

// rawConn is a keep-alive control connection driven frame by frame.
type rawConn struct {
	t  *testing.T
	nc net.Conn
	r  *bufio.Reader
}

func dialKeepAlive(t *testing.T, sock string) *rawConn {
	t.Helper()
	nc, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(30 * time.Second))
	rc := &rawConn{t: t, nc: nc, r: bufio.NewReader(nc)}
	rc.send(initproto.MsgKeepAlive, nil)
	if typ, payload := rc.read(); typ != initproto.MsgOK {
		t.Fatalf("keep-alive answered %s %s", typ, payload)
	}
	return rc
}

func (rc *rawConn) send(typ initproto.MsgType, v any) {
	rc.t.Helper()
	var err error
	if v == nil {
		err = initproto.WriteFrame(rc.nc, typ, nil)
	} else {
		err = initproto.WriteJSON(rc.nc, typ, v)
	}
	if err != nil {
		rc.t.Fatalf("send %s: %v", typ, err)
	}
}

func (rc *rawConn) read() (initproto.MsgType, []byte) {
	rc.t.Helper()
	typ, payload, err := initproto.ReadFrame(rc.r, nil)
	if err != nil {
		rc.t.Fatalf("read: %v", err)
	}
	return typ, payload
}

// run reads an exec's answer up to its Exit, returning the frame types
// seen in order, the output and the exit status.
func (rc *rawConn) run() ([]initproto.MsgType, string, initproto.ExitStatus) {
	rc.t.Helper()
	var types []initproto.MsgType
	var out strings.Builder
	for {
		typ, payload := rc.read()
		types = append(types, typ)
		switch typ {
		case initproto.MsgStdout, initproto.MsgStderr:
			out.Write(payload)
		case initproto.MsgExit:
			var st initproto.ExitStatus
			if err := json.Unmarshal(payload, &st); err != nil {
				rc.t.Fatal(err)
			}
			return types, out.String(), st
		case initproto.MsgError:
			rc.t.Fatalf("exec answered an error: %s", payload)
		}
	}
}

// TestBriefExecFrames: a brief exec on a keep-alive connection is answered
// with its output and Exit (carrying the pid) and no Started, and the
// connection takes the next request right after Exit, with no Release; an
// exec that is not brief still starts with Started and ends with the
// client's Release.
func TestBriefExecFrames(t *testing.T) {
	e := newEnv(t)
	rc := dialKeepAlive(t, e.sock)
	for i := range 3 {
		rc.send(initproto.MsgExec, initproto.ExecRequest{Argv: []string{"sh", "-c", "echo run $0; exit 4", strings.Repeat("x", i+1)}, Brief: true})
		types, out, st := rc.run()
		if types[0] == initproto.MsgStarted {
			t.Fatalf("brief exec %d answered Started first: %v", i, types)
		}
		if out != "run "+strings.Repeat("x", i+1)+"\n" || st.Code != 4 || st.Pid <= 0 {
			t.Fatalf("brief exec %d: output %q, status %+v; want its output, code 4 and its pid", i, out, st)
		}
	}
	// A program that cannot start is answered the same way.
	rc.send(initproto.MsgExec, initproto.ExecRequest{Argv: []string{"/no/such/program"}, Brief: true})
	if types, out, st := rc.run(); types[0] == initproto.MsgStarted || st.Code != 127 || !strings.Contains(out, "/no/such/program") {
		t.Fatalf("brief exec of a missing program: frames %v, output %q, status %+v", types, out, st)
	}
	rc.send(initproto.MsgExec, initproto.ExecRequest{Argv: []string{"echo", "plain"}})
	types, out, st := rc.run()
	if types[0] != initproto.MsgStarted || out != "plain\n" || st.Code != 0 {
		t.Fatalf("exec that is not brief: frames %v, output %q, status %+v; want Started first", types, out, st)
	}
	rc.send(initproto.MsgRelease, nil)
	rc.send(initproto.MsgStat, initproto.PathRequest{Path: "/etc/passwd"})
	if typ, payload := rc.read(); typ != initproto.MsgOK {
		t.Fatalf("stat after the released exec: %s %s", typ, payload)
	}
	// Brief applies only where nothing is sent while the command runs.
	nc, err := net.Dial("unix", e.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	plain := &rawConn{t: t, nc: nc, r: bufio.NewReader(nc)}
	plain.send(initproto.MsgExec, initproto.ExecRequest{Argv: []string{"cat"}, Brief: true, Stdin: true})
	if typ, payload := plain.read(); typ != initproto.MsgError || !strings.Contains(string(payload), "brief") {
		t.Fatalf("brief exec with a stdin stream answered %s %s, want an error", typ, payload)
	}
}

// TestBriefExecHangUp: half-closing a brief exec's connection kills the
// command's whole tree and still gets its exit; a frame sent while a
// brief exec runs breaks the protocol and kills it too.
func TestBriefExecHangUp(t *testing.T) {
	e := newEnv(t)
	for _, how := range []string{"half-close", "frame"} {
		t.Run(how, func(t *testing.T) {
			rc := dialKeepAlive(t, e.sock)
			rc.send(initproto.MsgExec, initproto.ExecRequest{Argv: []string{"sh", "-c", treetest.Script}, Brief: true})
			var out string
			for strings.Count(out, "\n") < 4 {
				typ, payload := rc.read()
				if typ != initproto.MsgStdout {
					t.Fatalf("frame %s %q before the tree was up, want its output", typ, payload)
				}
				out += string(payload)
			}
			pids := treetest.ParsePids(t, strings.Fields(out))
			if how == "half-close" {
				if err := rc.nc.(*net.UnixConn).CloseWrite(); err != nil {
					t.Fatal(err)
				}
			} else {
				rc.send(initproto.MsgRelease, nil)
			}
			start := time.Now()
			_, _, st := rc.run()
			if st.Signal != "SIGKILL" {
				t.Fatalf("exit after the %s: %+v, want killed", how, st)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("the kill took %v", d)
			}
			treetest.Gone(t, pids)
			if how == "frame" {
				// The connection is not fit for another request: init closes it.
				rc.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
				if _, err := rc.r.ReadByte(); err != io.EOF {
					t.Fatalf("after a protocol break the connection read %v, want EOF", err)
				}
			}
		})
	}
}

// TestBriefExecOlderInit: through an init that predates brief execs (it
// ignores the field, answers Started and waits for Release), the client
// runs exec after exec on one keep-alive connection with the right output.
func TestBriefExecOlderInit(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sock := filepath.Join(e.dir, "older.sock")
	var rewritten atomic.Int64
	serveConns(t, sock, func(nc net.Conn) {
		up, err := net.Dial("unix", e.sock)
		if err != nil {
			return
		}
		defer up.Close()
		go func() { _, _ = io.Copy(nc, up) }()
		// Client to init: each Exec loses its brief field.
		r := bufio.NewReader(nc)
		for {
			typ, payload, err := initproto.ReadFrame(r, nil)
			if err != nil {
				return
			}
			if typ == initproto.MsgExec {
				var req initproto.ExecRequest
				if json.Unmarshal(payload, &req) == nil && req.Brief {
					req.Brief = false
					rewritten.Add(1)
					payload, _ = json.Marshal(req)
				}
			}
			if initproto.WriteFrame(up, typ, payload) != nil {
				return
			}
		}
	})
	var dials atomic.Int64
	c := initclient.NewKeepAlive(countingDialer(sock, &dials), 2)
	defer c.Close()
	for i := range 5 {
		var out bytes.Buffer
		st, err := c.Exec(ctx, initproto.ExecRequest{Argv: []string{"sh", "-c", "echo older $0; exit 2", strings.Repeat("y", i+1)}}, nil, &out, nil)
		if err != nil || st.Code != 2 || out.String() != "older "+strings.Repeat("y", i+1)+"\n" {
			t.Fatalf("exec %d through an older init: %+v, %v, %q", i, st, err, out.String())
		}
	}
	if n := rewritten.Load(); n != 5 {
		t.Fatalf("the client asked for %d brief execs, want 5", n)
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("the client connected %d times for 5 execs through an older init, want once", n)
	}
}
