package initclient_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/initproto"
)

// countingDialer dials sock and counts the connections it made.
func countingDialer(sock string, n *atomic.Int64) initclient.Dialer {
	d := initclient.UnixSocket(sock)
	return func(ctx context.Context) (net.Conn, error) {
		n.Add(1)
		return d(ctx)
	}
}

// TestKeepAliveReusesConnections: a keep-alive client runs execs and
// one-frame calls one after another on one connection, answers included
// (an error answer too), and a call that needs a connection of its own
// (an exec with stdin) still gets one.
func TestKeepAliveReusesConnections(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var dials atomic.Int64
	c := initclient.NewKeepAlive(countingDialer(e.sock, &dials), 2)
	defer c.Close()
	for i := range 20 {
		var out bytes.Buffer
		st, err := c.Exec(ctx, initproto.ExecRequest{Argv: []string{"sh", "-c", "echo \"run $0\"; exit 3", strings.Repeat("x", i)}}, nil, &out, nil)
		if err != nil || st.Code != 3 || out.String() != "run "+strings.Repeat("x", i)+"\n" {
			t.Fatalf("exec %d: %+v, %v, output %q", i, st, err, out.String())
		}
		if _, err := c.Stat(ctx, "/etc/passwd"); err != nil {
			t.Fatalf("stat: %v", err)
		}
		if err := c.Kill(ctx, 999999); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("kill of an unknown pid: %v, want not found", err)
		}
	}
	if _, err := c.Exec(ctx, initproto.ExecRequest{Argv: []string{"/no/such/program"}}, nil, nil, nil); err != nil {
		t.Fatalf("exec of a missing program: %v", err)
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("the keep-alive client connected %d times for 62 calls in a row, want once", n)
	}
	if n := acceptedConns(t, e.sock); n != 1 {
		t.Fatalf("init holds %d connections, want the one kept open", n)
	}
	var out bytes.Buffer
	st, err := c.Exec(ctx, initproto.ExecRequest{Argv: []string{"cat"}}, strings.NewReader("typed"), &out, nil)
	if err != nil || st.Code != 0 || out.String() != "typed" {
		t.Fatalf("exec with stdin: %+v, %v, %q", st, err, out.String())
	}
	if n := dials.Load(); n != 2 {
		t.Fatalf("an exec with stdin made %d connections, want one of its own", n-1)
	}
	waitFor(t, 10*time.Second, "init to close the stdin exec's connection", func() bool { return acceptedConns(t, e.sock) == 1 })
	c.Close()
	waitFor(t, 10*time.Second, "init to see the kept connection closed", func() bool { return acceptedConns(t, e.sock) == 0 })
}

// TestKeepAliveCheckpointClosesIdle: readying init for a checkpoint closes
// the connections a keep-alive client keeps (a checkpoint cannot save
// them), and the client's next call connects anew.
func TestKeepAliveCheckpointClosesIdle(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var dials atomic.Int64
	c := initclient.NewKeepAlive(countingDialer(e.sock, &dials), 4)
	defer c.Close()
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			if st, err := c.Exec(ctx, initproto.ExecRequest{Argv: []string{"sleep", "0.2"}}, nil, nil, nil); err != nil || st.Code != 0 {
				t.Errorf("exec: %+v, %v", st, err)
			}
		})
	}
	wg.Wait()
	if n := acceptedConns(t, e.sock); n < 1 {
		t.Fatalf("init holds %d connections after keep-alive execs, want those kept", n)
	}
	plain := initclient.New(initclient.UnixSocket(e.sock))
	start := time.Now()
	ans, err := plain.ReadyForCheckpoint(ctx)
	if err != nil || ans.OpenConnections != 0 {
		t.Fatalf("ready for a checkpoint beside idle keep-alive connections: %+v, %v; want none open", ans, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("readying took %v: init waited for idle connections instead of closing them", d)
	}
	if n := acceptedConns(t, e.sock); n != 0 {
		t.Fatalf("init still holds %d connections when it says it is ready for a checkpoint", n)
	}
	before := dials.Load()
	if st, err := c.Exec(ctx, initproto.ExecRequest{Argv: []string{"true"}}, nil, nil, nil); err != nil || st.Code != 0 {
		t.Fatalf("exec after the checkpoint's preparation: %+v, %v", st, err)
	}
	if dials.Load() == before {
		t.Fatal("the exec after the checkpoint's preparation did not connect anew")
	}
}

// TestKeepAliveOlderInit: an init that predates keep-alive connections
// (it answers the keep-alive request as an unknown request and closes)
// is served one connection per call, and asked only once.
func TestKeepAliveOlderInit(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sock := filepath.Join(e.dir, "old.sock")
	asked := olderInit(t, sock, e.sock, initproto.MsgKeepAlive)
	c := initclient.NewKeepAlive(initclient.UnixSocket(sock), 4)
	defer c.Close()
	for range 3 {
		var out bytes.Buffer
		if st, err := c.Exec(ctx, initproto.ExecRequest{Argv: []string{"echo", "hi"}}, nil, &out, nil); err != nil || st.Code != 0 || out.String() != "hi\n" {
			t.Fatalf("exec through an older init: %+v, %v, %q", st, err, out.String())
		}
		if _, err := c.List(ctx); err != nil {
			t.Fatalf("list through an older init: %v", err)
		}
	}
	if n := asked.Load(); n != 1 {
		t.Fatalf("the client asked an older init for keep-alive %d times, want once", n)
	}
}

// olderInit serves sock as an init that predates requests of type unknown
// would: a connection whose first frame is one gets init's answer to an
// unknown request and is closed; any other is passed to the init at
// target. It returns the count of such requests.
func olderInit(t *testing.T, sock, target string, unknown initproto.MsgType) *atomic.Int64 {
	t.Helper()
	var asked atomic.Int64
	serveConns(t, sock, func(nc net.Conn) {
		typ, payload, err := initproto.ReadFrame(nc, nil)
		if err != nil {
			return
		}
		if typ == unknown {
			asked.Add(1)
			_ = initproto.WriteJSON(nc, initproto.MsgError, initproto.Error{Kind: initproto.KindInvalid, Message: "unknown request type " + typ.String()})
			return
		}
		up, err := net.Dial("unix", target)
		if err != nil {
			return
		}
		defer up.Close()
		if err := initproto.WriteFrame(up, typ, payload); err != nil {
			return
		}
		go func() {
			_, _ = io.Copy(up, nc)
			up.(*net.UnixConn).CloseWrite()
		}()
		_, _ = io.Copy(nc, up)
	})
	return &asked
}

// serveConns listens on sock until the test ends and serves each
// connection with serve, which closes it on return.
func serveConns(t *testing.T, sock string, serve func(net.Conn)) {
	t.Helper()
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				serve(nc)
			}()
		}
	}()
}
