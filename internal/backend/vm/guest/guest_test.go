package guest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/backend/vm/vmproto"
	"github.com/agentjail/agentjail/internal/initd"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/testenv"
	"github.com/agentjail/agentjail/internal/treetest"
)

// TestMain lets the test binary serve as init's shim: init re-runs
// /proc/self/exe with "init --shim".
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "init" {
		os.Exit(initd.Main(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// TestParkKeepsSessionsApart parks a control session while the guest
// streams process events on it, then wakes a new session on the same
// port, as the daemon does when a snapshot's machine runs on (the origin,
// or a copy restored from it). Every event must reach the daemon exactly
// once, across the two sessions, and the new session must work: nothing
// of the parked session may reach the port after its answer to the park.
func TestParkKeepsSessionsApart(t *testing.T) {
	st, host := newGuest(t)

	// The jail's processes: a steady flow of events, numbered by pid.
	const total = 20000
	go func() {
		for i := 1; i <= total; i++ {
			st.events.add(vmproto.ProcEvent{Op: "exec", PID: int32(i)})
			if i%100 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
	}()
	seen := make(map[int32]int)
	record := func(sc *bufio.Scanner, until func() bool) error {
		for sc.Scan() {
			var ev vmproto.ProcEvent
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				return err
			}
			if ev.Op == vmproto.OpLost {
				t.Errorf("%d events lost", ev.Lost)
			}
			seen[ev.PID]++
			if until() {
				return nil
			}
		}
		return sc.Err()
	}

	// The first session takes some events, then parks the guest.
	first := wakeSession(t, host)
	evs := bufio.NewScanner(openStream(t, first, vmproto.KindEvents))
	if err := record(evs, func() bool { return len(seen) >= 500 }); err != nil {
		t.Fatal(err)
	}
	park := openStream(t, first, vmproto.KindPark)
	if _, err := park.Write([]byte("{}\n")); err != nil {
		t.Fatal(err)
	}
	var rep vmproto.Reply
	if err := json.NewDecoder(park).Decode(&rep); err != nil || rep.Error != "" {
		t.Fatalf("park: %+v %v", rep, err)
	}
	// The daemon hangs up: the session ends, and what reached it before
	// is read.
	first.Close()
	if err := record(evs, func() bool { return false }); err != nil && !errors.Is(err, yamux.ErrConnectionReset) {
		t.Fatal(err)
	}
	parked := len(seen)

	// The next session gets the rest, and only it.
	if err := host.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	second := wakeSession(t, host)
	defer second.Close()
	next := openStream(t, second, vmproto.KindEvents)
	done := make(chan error, 1)
	go func() { done <- record(bufio.NewScanner(next), func() bool { return len(seen) == total }) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the session after the park: %v", err)
		}
	case <-time.After(time.Minute):
		next.Close()
		<-done
		t.Fatalf("the session after the park has %d of %d events", len(seen), total)
	}
	for pid, n := range seen {
		if n != 1 {
			t.Errorf("event %d came %d times", pid, n)
		}
	}
	t.Logf("%d events before the park, %d after", parked, total-parked)
}

// TestHangUpKillsCommandWithPendingInput: the daemon runs a command
// that never reads its input and sends it more input than the pipe and
// the stream hold; then the daemon is gone (killed: the port reads
// end-of-file). Init must end the command's whole tree, though input of
// the daemon's is still queued on the stream, where no poll shows the
// hang-up behind it.
func TestHangUpKillsCommandWithPendingInput(t *testing.T) {
	testenv.RequireRoot(t)
	st, host := newGuest(t)
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	srv, err := initd.NewServer(initd.Options{
		Config: initproto.InitConfig{JailID: "test", DefaultUser: "root", Workspace: root, Env: []string{"PATH=/usr/bin:/bin"}},
		Root:   root,
	})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(st.initConns) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	close(st.booted)

	sess := wakeSession(t, host)
	defer sess.Close()
	conn := openStream(t, sess, vmproto.KindInit)
	treetest.Start(t, conn)
	flood := treetest.NewFlood(conn)
	pids := treetest.Pids(t, conn)
	// Once more than the pipe holds was sent, init's reader of the stream
	// is stuck writing to the pipe, and what follows waits on the stream.
	const pipeSize = 64 << 10
	for deadline := time.Now().Add(10 * time.Second); flood.Written() < 4*pipeSize; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d bytes of input were taken in 10s", flood.Written())
		}
	}
	host.Close()
	treetest.Gone(t, pids)
	<-flood.Done()
}

// newGuest serves a guest's control port, one end of a socket pair; the
// other end, returned, is the daemon's.
func newGuest(t *testing.T) (*g, net.Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	port := os.NewFile(uintptr(fds[0]), "port")
	hostFile := os.NewFile(uintptr(fds[1]), "host")
	host, err := net.FileConn(hostFile)
	hostFile.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Close() })
	st := &g{port: port, initConns: newChanListener(), booted: make(chan struct{}), initDone: make(chan error, 1), events: newEvents()}
	go st.servePort()
	t.Cleanup(func() { port.Close() })
	return st, host
}

// detached interrupts a session's reads when it closes, without closing
// the connection: the port is one channel that the next session takes.
type detached struct{ net.Conn }

func (d detached) Close() error { return d.SetReadDeadline(time.Unix(1, 0)) }

// wakeSession starts a session on the guest's port as the daemon does:
// the wake line, then everything up to the guest's hello line is skipped.
func wakeSession(t *testing.T, c net.Conn) *yamux.Session {
	t.Helper()
	if _, err := io.WriteString(c, vmproto.WakeLine); err != nil {
		t.Fatal(err)
	}
	var line []byte
	b := make([]byte, 1)
	for string(line) != vmproto.HelloLine {
		if b[0] == '\n' {
			line = line[:0]
		}
		if _, err := c.Read(b); err != nil {
			t.Fatalf("waiting for the hello: %v", err)
		}
		if b[0] != '\n' {
			line = append(line, b[0])
		}
	}
	// The newline that ends the hello.
	if _, err := c.Read(b); err != nil || b[0] != '\n' {
		t.Fatalf("after the hello: %q %v", b, err)
	}
	cfg := yamux.DefaultConfig()
	cfg.EnableKeepAlive = false
	cfg.LogOutput = io.Discard
	s, err := yamux.Client(detached{c}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// openStream opens a stream of kind on s.
func openStream(t *testing.T, s *yamux.Session, kind byte) net.Conn {
	t.Helper()
	c, err := s.Open()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte{kind}); err != nil {
		t.Fatal(err)
	}
	return c
}
