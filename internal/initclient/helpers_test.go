package initclient_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/initd"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/testenv"
)

// TestMain lets the test binary serve as the shim: the server re-runs
// /proc/self/exe with "init --shim".
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "init" {
		os.Exit(initd.Main(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// testEnv is a server on a temporary root with a client.
type testEnv struct {
	dir     string // world-searchable temp dir
	root    string // the file-operation root
	outside string // a directory next to the root, never to be touched
	ws      string // the commands' workspace (host path)
	sock    string
	srv     *initd.Server
	c       *initclient.Client
}

const (
	testPasswd = "root:x:0:0:root:/root:/bin/sh\n" +
		"agent:x:1000:1000::/home/agent:/bin/sh\n" +
		"tester:x:4321:4321::/home/tester:/bin/sh\n"
	testGroup = "root:x:0:\nagent:x:1000:\ntester:x:4321:\nextra:x:5555:tester,other\n"
	secret    = "TOP-SECRET-OUTSIDE"
)

// newEnv starts a server whose root holds /etc/passwd and /etc/group with
// the users root, agent (1000, the default) and tester (4321, also in
// group extra 5555). blocked are the jail's blocked paths.
func newEnv(t testing.TB, blocked ...string) *testEnv {
	t.Helper()
	return newEnvRecording(t, true, blocked...)
}

// newEnvRecording is newEnv with terminal recording on or off.
func newEnvRecording(t testing.TB, record bool, blocked ...string) *testEnv {
	t.Helper()
	testenv.RequireRoot(t)
	dir := t.TempDir()
	// Let unprivileged test users reach the workspace.
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	e := &testEnv{
		dir:     dir,
		root:    filepath.Join(dir, "root"),
		outside: filepath.Join(dir, "outside"),
		ws:      filepath.Join(dir, "ws"),
		sock:    filepath.Join(dir, "init.sock"),
	}
	mustMkdir(t, filepath.Join(e.root, "etc"), 0o755)
	mustWrite(t, filepath.Join(e.root, "etc/passwd"), testPasswd, 0o644)
	mustWrite(t, filepath.Join(e.root, "etc/group"), testGroup, 0o644)
	mustMkdir(t, e.outside, 0o755)
	mustWrite(t, filepath.Join(e.outside, "secret"), secret, 0o644)
	mustMkdir(t, e.ws, 0o777)
	if err := os.Chmod(e.ws, 0o777); err != nil {
		t.Fatal(err)
	}
	recordDir := ""
	if record {
		recordDir = filepath.Join(dir, "recordings")
	}
	srv, err := initd.NewServer(initd.Options{
		Config: initproto.InitConfig{
			JailID:       "test",
			IdleShims:    2,
			DefaultUser:  "agent",
			Workspace:    e.ws,
			Env:          []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "BASE=base"},
			BlockedPaths: blocked,
		},
		Root:      e.root,
		RecordDir: recordDir,
	})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", e.sock)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(l); err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	e.srv = srv
	e.c = initclient.NewKeepAlive(initclient.UnixSocket(e.sock), 4)
	t.Cleanup(func() { e.c.Close() })
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		<-served
	})
	return e
}

func mustMkdir(t testing.TB, p string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(p, mode); err != nil {
		t.Fatal(err)
	}
}

func mustWrite(t testing.TB, p, data string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(p, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
}

func mustRead(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// lineWriter collects output and reports lines as they complete.
type lineWriter struct {
	mu    sync.Mutex
	buf   strings.Builder
	lines chan string
	part  string
}

func newLineWriter() *lineWriter { return &lineWriter{lines: make(chan string, 1024)} }

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	w.part += string(p)
	for {
		i := strings.IndexByte(w.part, '\n')
		if i < 0 {
			break
		}
		select {
		case w.lines <- w.part[:i]:
		default:
		}
		w.part = w.part[i+1:]
	}
	return len(p), nil
}

func (w *lineWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// waitLines waits for n lines, failing after the deadline.
func waitLines(t testing.TB, w *lineWriter, n int, d time.Duration) []string {
	t.Helper()
	var out []string
	timeout := time.After(d)
	for len(out) < n {
		select {
		case l := <-w.lines:
			out = append(out, l)
		case <-timeout:
			t.Fatalf("got %d of %d lines within %v: %q", len(out), n, d, out)
		}
	}
	return out
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// netDial connects to a unix socket.
func netDial(path string) (net.Conn, error) { return net.Dial("unix", path) }
