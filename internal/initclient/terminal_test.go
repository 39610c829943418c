package initclient_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/asciicast"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/initproto"
)

// screen collects a terminal's output in the background.
type screen struct {
	t    *initclient.Terminal
	mu   sync.Mutex
	buf  bytes.Buffer
	done chan struct{}
	err  error
}

func watch(t *initclient.Terminal) *screen {
	s := &screen{t: t, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			b, err := t.Next()
			if err != nil {
				s.mu.Lock()
				s.err = err
				s.mu.Unlock()
				return
			}
			s.mu.Lock()
			s.buf.Write(b)
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *screen) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// waitText waits until the output contains text.
func (s *screen) waitText(tb testing.TB, text string) {
	tb.Helper()
	waitFor(tb, 20*time.Second, "output "+strconvQuote(text)+" (have "+strconvQuote(s.String())+")", func() bool {
		return strings.Contains(s.String(), text)
	})
}

// wait waits for the end of the stream and returns the exit status.
func (s *screen) wait(tb testing.TB) initproto.ExitStatus {
	tb.Helper()
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		tb.Fatalf("the session did not end; output %q", s.String())
	}
	if !errors.Is(s.err, io.EOF) {
		tb.Fatalf("stream ended with %v; output %q", s.err, s.String())
	}
	st, ok := s.t.Exit()
	if !ok {
		tb.Fatal("no exit status")
	}
	return st
}

// inSession reports whether a process named comm runs in session sid.
func inSession(sid int, comm string) bool {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		st := string(b)
		open, close := strings.IndexByte(st, '('), strings.LastIndexByte(st, ')')
		if open < 0 || close < open {
			continue
		}
		f := strings.Fields(st[close+1:])
		if st[open+1:close] == comm && len(f) > 3 && f[3] == strconv.Itoa(sid) {
			return true
		}
	}
	return false
}

func strconvQuote(s string) string {
	if len(s) > 400 {
		s = "…" + s[len(s)-400:]
	}
	return `"` + s + `"`
}

func startTerm(tb testing.TB, e *testEnv, argv []string, opts initproto.PTYOptions) *initclient.Terminal {
	tb.Helper()
	term, err := e.c.StartTerminal(context.Background(), initproto.ExecRequest{Argv: argv, PTY: &opts})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { term.Close() })
	return term
}

func TestTerminalBasics(t *testing.T) {
	e := newEnv(t)
	term := startTerm(t, e, []string{"sh", "-c", `stty size; tty; echo "TERM=$TERM"; read x; echo "got:$x"; exit 7`}, initproto.PTYOptions{Rows: 33, Cols: 101})
	info := term.Session()
	if info.ID == "" || info.Pid <= 0 || info.Rows != 33 || info.Cols != 101 || !info.Recording {
		t.Fatalf("session info %+v", info)
	}
	s := watch(term)
	s.waitText(t, "33 101")
	s.waitText(t, "TERM=xterm-256color")
	if !strings.Contains(s.String(), "/dev/pts/") {
		t.Fatalf("the command has no terminal: %q", s.String())
	}
	list, err := e.c.Sessions(context.Background())
	if err != nil || len(list) != 1 || list[0].ID != info.ID || list[0].Attached != 1 {
		t.Fatalf("sessions: %+v %v", list, err)
	}
	if err := term.Input([]byte("hello\r")); err != nil {
		t.Fatal(err)
	}
	s.waitText(t, "got:hello")
	if st := s.wait(t); st.Code != 7 {
		t.Fatalf("exit %+v", st)
	}
	// The recording is complete, with output and the resize-free header.
	cast := filepath.Join(e.dir, "recordings", info.ID+".cast")
	waitFor(t, 5*time.Second, "the recording", func() bool { _, err := os.Stat(cast); return err == nil })
	f, err := os.Open(cast)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rd, err := asciicast.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	if h := rd.Header(); h.Width != 101 || h.Height != 33 || h.JailID != "test" || h.SessionID != info.ID || h.Env["TERM"] != "xterm-256color" {
		t.Fatalf("header %+v", h)
	}
	var out strings.Builder
	for {
		ev, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Code == asciicast.Input {
			t.Fatalf("input recorded although not asked: %+v", ev)
		}
		if ev.Code == asciicast.Output {
			out.WriteString(ev.Data)
		}
	}
	if !strings.Contains(out.String(), "got:hello") {
		t.Fatalf("recorded output %q", out.String())
	}
	if list, _ := e.c.Sessions(context.Background()); len(list) != 0 {
		t.Fatalf("ended session still listed: %+v", list)
	}
}

func TestTerminalAttachResizeSignal(t *testing.T) {
	e := newEnv(t)
	script := `trap 'echo WINCH; stty size' WINCH; echo ready; while :; do sleep 0.05; done`
	first := startTerm(t, e, []string{"bash", "-c", script}, initproto.PTYOptions{Rows: 24, Cols: 80})
	s1 := watch(first)
	s1.waitText(t, "ready")
	id := first.Session().ID
	// Detach: the session keeps running; reattach gets the history.
	first.Close()
	<-s1.done
	second, err := e.c.AttachTerminal(context.Background(), initproto.AttachRequest{Session: id})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	s2 := watch(second)
	s2.waitText(t, "ready")
	ro, err := e.c.AttachTerminal(context.Background(), initproto.AttachRequest{Session: id, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	s3 := watch(ro)
	// A read-only attachment cannot resize; the other can, and both see it.
	if err := ro.Resize(50, 150); err != nil {
		t.Fatal(err)
	}
	if err := second.Resize(40, 120); err != nil {
		t.Fatal(err)
	}
	s2.waitText(t, "40 120")
	s3.waitText(t, "40 120")
	if strings.Contains(s2.String(), "50 150") {
		t.Fatalf("a read-only attachment resized: %q", s2.String())
	}
	if err := second.Signal("SIGTERM"); err != nil {
		t.Fatal(err)
	}
	if st := s2.wait(t); st.Signal != "SIGTERM" {
		t.Fatalf("exit %+v", st)
	}
	if st := s3.wait(t); st.Signal != "SIGTERM" {
		t.Fatalf("read-only exit %+v", st)
	}
	if _, err := e.c.AttachTerminal(context.Background(), initproto.AttachRequest{Session: id}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("attach to an ended session: %v", err)
	}
}

func TestTerminalCtrlC(t *testing.T) {
	e := newEnv(t)
	term := startTerm(t, e, []string{"bash", "--norc", "--noprofile", "-i"}, initproto.PTYOptions{})
	s := watch(term)
	if err := term.Input([]byte("sleep 100\r")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "sleep to run in the session", func() bool {
		return inSession(term.Session().Pid, "sleep")
	})
	if err := term.Input([]byte{3}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "sleep to be interrupted", func() bool {
		return !inSession(term.Session().Pid, "sleep")
	})
	if err := term.Input([]byte("echo after=$?\r")); err != nil {
		t.Fatal(err)
	}
	s.waitText(t, "after=130")
	if err := term.Input([]byte("exit 3\r")); err != nil {
		t.Fatal(err)
	}
	if st := s.wait(t); st.Code != 3 {
		t.Fatalf("exit %+v", st)
	}
}

func TestTerminalInputRecording(t *testing.T) {
	e := newEnv(t)
	term := startTerm(t, e, []string{"bash", "--norc", "--noprofile", "-c", `read -s -p "pw: " pw; echo; echo "len=${#pw}"; read -p "name: " n; echo "hi $n"`},
		initproto.PTYOptions{RecordInput: true})
	s := watch(term)
	s.waitText(t, "pw: ")
	if err := term.Input([]byte("hunter2-secret\r")); err != nil {
		t.Fatal(err)
	}
	s.waitText(t, "name: ")
	if err := term.Input([]byte("visible-name\r")); err != nil {
		t.Fatal(err)
	}
	s.waitText(t, "hi visible-name")
	s.wait(t)
	data := mustRead(t, filepath.Join(e.dir, "recordings", term.Session().ID+".cast"))
	if strings.Contains(data, "hunter2") {
		t.Fatalf("the password is in the recording:\n%s", data)
	}
	if !strings.Contains(data, `"i", "visible-name\r"`) {
		t.Fatalf("the typed name is not recorded as input:\n%s", data)
	}
}

// skipNoticeRE matches init's notice to a viewer that skipped output.
var skipNoticeRE = regexp.MustCompile(`\[agentjail: this viewer skipped (\d+) bytes`)

// TestTerminalSlowClient: an attachment that never reads neither blocks
// the session nor the attachment that reads.
func TestTerminalSlowClient(t *testing.T) {
	e := newEnv(t)
	term := startTerm(t, e, []string{"sh", "-c", "read x; head -c 40000000 /dev/zero | tr '\\0' x; echo; echo END"}, initproto.PTYOptions{})
	s := watch(term)
	// A raw connection that attaches and then never reads.
	conn, err := netDial(e.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := initproto.WriteJSON(conn, initproto.MsgAttach, initproto.AttachRequest{Session: term.Session().ID}); err != nil {
		t.Fatal(err)
	}
	if typ, _, err := initproto.ReadFrame(conn, nil); err != nil || typ != initproto.MsgStarted {
		t.Fatalf("attach: %v %v", typ, err)
	}
	start := time.Now()
	if err := term.Input([]byte("go\r")); err != nil {
		t.Fatal(err)
	}
	st := s.wait(t)
	if st.Code != 0 || !strings.Contains(s.String(), "END") {
		t.Fatalf("exit %+v, tail %q", st, strconvQuote(s.String()))
	}
	// The reading client gets every byte, unless it did not keep up
	// itself (a loaded machine): then it is told how many it skipped.
	n, skipped := strings.Count(s.String(), "x"), 0
	for _, m := range skipNoticeRE.FindAllStringSubmatch(s.String(), -1) {
		k, _ := strconv.Atoi(m[1])
		skipped += k
	}
	if n+skipped < 40000000 {
		t.Fatalf("the reading client got %d of 40000000 bytes and was told of %d skipped", n, skipped)
	}
	t.Logf("40 MB through the terminal in %v with a stalled attachment", time.Since(start))
}
