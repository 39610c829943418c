package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/agentjail/agentjail/internal/barepty"
	"github.com/agentjail/agentjail/internal/testenv"
)

// The terminal contract, spelled out (not imported) as the other wire
// types of this suite.

type termMessage struct {
	Type    string    `json:"type"`
	Rows    int       `json:"rows,omitempty"`
	Cols    int       `json:"cols,omitempty"`
	Signal  string    `json:"signal,omitempty"`
	ID      string    `json:"id,omitempty"`
	Session *termInfo `json:"session,omitempty"`
	Code    *int      `json:"code,omitempty"`
}

type termInfo struct {
	ID          string `json:"id"`
	Pid         int    `json:"pid"`
	Attached    int    `json:"attached"`
	Rows        int    `json:"rows"`
	Cols        int    `json:"cols"`
	RecordingID string `json:"recording_id"`
}

type recordingInfo struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// wsTerm is a WebSocket terminal client that collects output.
type wsTerm struct {
	conn    *websocket.Conn
	session termInfo

	mu      sync.Mutex
	out     bytes.Buffer
	exit    *int
	closeSt websocket.StatusCode
	done    chan struct{}
	// arrivals, when set, receives the time each output chunk arrived.
	arrivals chan time.Time
}

// dialTerm opens WS /jails/{id}/terminal with query q (the token goes as
// a query parameter unless q has a ticket).
func dialTerm(tb testing.TB, d *daemon, id string, q url.Values) *wsTerm {
	tb.Helper()
	t, err := tryDialTerm(d, id, q)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { t.conn.CloseNow() })
	return t
}

func tryDialTerm(d *daemon, id string, q url.Values) (*wsTerm, error) {
	if q.Get("ticket") == "" {
		q.Set("token", d.token)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, "ws://"+d.addr+"/jails/"+id+"/terminal?"+q.Encode(), nil)
	if err != nil {
		return nil, fmt.Errorf("dial terminal: %w", err)
	}
	conn.SetReadLimit(64 << 20)
	typ, data, err := conn.Read(ctx)
	var m termMessage
	if err != nil || typ != websocket.MessageText || json.Unmarshal(data, &m) != nil || m.Type != "session" || m.Session == nil || m.ID != m.Session.ID {
		conn.CloseNow()
		return nil, fmt.Errorf("first message: %q %v", data, err)
	}
	return &wsTerm{conn: conn, session: *m.Session, done: make(chan struct{})}, nil
}

// start reads in the background until the connection closes.
func (w *wsTerm) start() *wsTerm {
	go func() {
		defer close(w.done)
		for {
			typ, data, err := w.conn.Read(context.Background())
			if err != nil {
				w.mu.Lock()
				w.closeSt = websocket.CloseStatus(err)
				w.mu.Unlock()
				return
			}
			if typ == websocket.MessageBinary {
				w.mu.Lock()
				w.out.Write(data)
				w.mu.Unlock()
				if w.arrivals != nil {
					w.arrivals <- time.Now()
				}
				continue
			}
			var m termMessage
			if json.Unmarshal(data, &m) == nil && m.Type == "exit" {
				w.mu.Lock()
				w.exit = m.Code
				w.mu.Unlock()
			}
		}
	}()
	return w
}

func (w *wsTerm) text() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.out.String()
}

func (w *wsTerm) send(tb testing.TB, s string) {
	tb.Helper()
	if err := w.conn.Write(context.Background(), websocket.MessageBinary, []byte(s)); err != nil {
		tb.Fatalf("typing %q: %v", s, err)
	}
}

func (w *wsTerm) control(tb testing.TB, m termMessage) {
	tb.Helper()
	b, _ := json.Marshal(m)
	if err := w.conn.Write(context.Background(), websocket.MessageText, b); err != nil {
		tb.Fatalf("control %s: %v", b, err)
	}
}

// waitText waits until the output contains s.
func (w *wsTerm) waitText(tb testing.TB, s string) {
	tb.Helper()
	if err := waitFor(30*time.Second, func() error {
		if strings.Contains(w.text(), s) {
			return nil
		}
		return fmt.Errorf("no %q in the output yet", s)
	}); err != nil {
		tail := w.text()
		if len(tail) > 600 {
			tail = tail[len(tail)-600:]
		}
		tb.Fatalf("%v; output ends %q", err, tail)
	}
}

// waitExit waits for the exit message and the close, returning the code
// and the close status.
func (w *wsTerm) waitExit(tb testing.TB) (int, websocket.StatusCode) {
	tb.Helper()
	select {
	case <-w.done:
	case <-time.After(2 * time.Minute):
		tb.Fatalf("the terminal did not end; output %q", w.text())
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.exit == nil {
		tb.Fatalf("no exit message (close status %d); output %q", w.closeSt, w.out.String())
	}
	return *w.exit, w.closeSt
}

// jailHas waits until a process named comm runs in the jail.
func jailHas(tb testing.TB, d *daemon, id, comm string) {
	tb.Helper()
	d.waitSh(tb, id, "pgrep -x "+comm, 30*time.Second, "no "+comm+" process")
}

func TestTerminalWebSocket(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, nil)

	// A command that cannot start is a clear error before the upgrade.
	dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
	defer dcancel()
	q := url.Values{"cwd": {"/no/such/dir"}, "token": {d.token}}
	conn, resp, err := websocket.Dial(dctx, "ws://"+d.addr+"/jails/"+j.ID+"/terminal?"+q.Encode(), nil)
	if err == nil {
		conn.CloseNow()
		t.Fatal("a terminal in a missing directory was opened")
	}
	var body []byte
	if resp != nil {
		body, _ = io.ReadAll(resp.Body)
	}
	if resp == nil || resp.StatusCode < 400 || resp.StatusCode >= 500 || !strings.Contains(string(body), "/no/such/dir") {
		t.Fatalf("a terminal in a missing directory: %v %v %s", err, resp, body)
	}

	// python3 -i: type an expression, read its result.
	py := dialTerm(t, d, j.ID, url.Values{"cmd": {"python3", "-i"}}).start()
	py.waitText(t, ">>> ")
	py.send(t, "6*7\r")
	py.waitText(t, "42")
	py.send(t, "raise SystemExit(4)\r")
	if code, st := py.waitExit(t); code != 4 || st != 4004 {
		t.Fatalf("python exit: code %d close status %d", code, st)
	}

	// The default command is the user's login shell.
	sh := dialTerm(t, d, j.ID, url.Values{"rows": {"24"}, "cols": {"80"}}).start()
	sh.send(t, "stty size; echo TERM=$TERM\r")
	sh.waitText(t, "24 80")
	sh.waitText(t, "TERM=xterm-256color")
	sh.control(t, termMessage{Type: "resize", Rows: 40, Cols: 120})
	sh.send(t, "stty size\r")
	sh.waitText(t, "40 120")

	// Ctrl-C interrupts the foreground job, not the shell.
	sh.send(t, "sleep 100\r")
	jailHas(t, d, j.ID, "sleep")
	sh.send(t, "\x03")
	sh.send(t, "echo rc=$?\r")
	sh.waitText(t, "rc=130")

	// Detach, list, reattach: the history comes first.
	id := sh.session.ID
	sh.conn.Close(websocket.StatusNormalClosure, "detach")
	var list struct {
		Terminals []termInfo `json:"terminals"`
	}
	if err := waitFor(10*time.Second, func() error {
		d.api.want(t, http.StatusOK, "GET", "/jails/"+j.ID+"/terminals", nil, &list)
		if len(list.Terminals) == 1 && list.Terminals[0].ID == id && list.Terminals[0].Attached == 0 {
			return nil
		}
		return fmt.Errorf("terminals: %+v", list.Terminals)
	}); err != nil {
		t.Fatal(err)
	}
	// A ticket works once.
	var tk struct {
		Ticket string `json:"ticket"`
	}
	d.api.want(t, http.StatusCreated, "POST", "/jails/"+j.ID+"/terminal/ticket", nil, &tk)
	re := dialTerm(t, d, j.ID, url.Values{"session": {id}, "ticket": {tk.Ticket}}).start()
	re.waitText(t, "40 120")
	if _, err := tryDialTerm(d, j.ID, url.Values{"session": {id}, "ticket": {tk.Ticket}}); err == nil {
		t.Fatal("a ticket was accepted twice")
	}
	// A second, read-only client sees the same output and cannot type.
	ro := dialTerm(t, d, j.ID, url.Values{"session": {id}, "readonly": {"true"}}).start()
	ro.send(t, "echo typed-by-readonly\r")
	re.send(t, "echo both-$((40+2))\r")
	ro.waitText(t, "both-42")
	re.waitText(t, "both-42")
	if strings.Contains(re.text(), "typed-by-readonly") {
		t.Fatal("a read-only client could type")
	}
	re.send(t, "exit 3\r")
	if code, st := re.waitExit(t); code != 3 || st != 4003 {
		t.Fatalf("shell exit: code %d close status %d", code, st)
	}
	if code, _ := ro.waitExit(t); code != 3 {
		t.Fatalf("read-only client: exit %d", code)
	}
	// The token given in the query is never logged.
	if b, err := os.ReadFile(d.logPath); err != nil || bytes.Contains(b, []byte(d.token)) {
		t.Fatalf("the daemon's log holds the token (or cannot be read: %v)", err)
	}
}

// TestTerminalSlowClient: a client that stops reading slows neither the
// session nor its recording nor the other clients: it skips ahead and is
// told how much it skipped. Every client's account is exact: what it
// received plus what it was told it skipped is what the command wrote.
func TestTerminalSlowClient(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, nil)
	const total = 50000000
	fast := dialTerm(t, d, j.ID, url.Values{"cmd": {"sh", "-c", `read x; head -c 50000000 /dev/zero | tr '\0' x; echo; echo END`}}).start()
	stalled := dialTerm(t, d, j.ID, url.Values{"session": {fast.session.ID}}) // not read until the end
	defer stalled.conn.CloseNow()
	start := time.Now()
	fast.send(t, "go\r")
	if code, _ := fast.waitExit(t); code != 0 {
		t.Fatalf("exit %d", code)
	}
	elapsed := time.Since(start)
	got, skipped := xsAndSkipped(t, fast.text())
	// Skipped output may hold some of the few other bytes (the echo of
	// "go", the END line, when the client was behind at the end): the
	// account allows for them.
	account := func(got, skipped int) bool { return got+skipped >= total && got+skipped <= total+32 }
	if !account(got, skipped) {
		t.Fatalf("the reading client got %d bytes and was told it skipped %d, of %d", got, skipped, total)
	}
	t.Logf("50 MB in %v while another client stalled; the reading client got %d bytes and skipped %d", elapsed, got, skipped)
	// The stalled client, reading at last, learns what it skipped.
	stalled.start()
	if code, _ := stalled.waitExit(t); code != 0 {
		t.Fatalf("stalled client: exit %d", code)
	}
	got, skipped = xsAndSkipped(t, stalled.text())
	if skipped == 0 || !account(got, skipped) || got >= total {
		t.Fatalf("the stalled client got %d bytes and was told it skipped %d, of %d", got, skipped, total)
	}
	// The recording holds everything.
	var recs struct {
		Recordings []recordingInfo `json:"recordings"`
	}
	if err := waitFor(10*time.Second, func() error {
		d.api.want(t, http.StatusOK, "GET", "/jails/"+j.ID+"/recordings", nil, &recs)
		for _, r := range recs.Recordings {
			if r.ID == fast.session.RecordingID && r.Status == "complete" && r.Size > total {
				return nil
			}
		}
		return fmt.Errorf("recording %s not complete with all the output: %+v", fast.session.RecordingID, recs.Recordings)
	}); err != nil {
		t.Fatal(err)
	}
}

// skipNotice is what a terminal client is told when it skipped output.
var skipNotice = regexp.MustCompile(`\[agentjail: this viewer skipped (\d+) bytes of output it did not keep up with\]`)

// xsAndSkipped counts the x bytes a client received and the bytes its
// notices say it skipped.
func xsAndSkipped(t *testing.T, text string) (int, int) {
	skipped := 0
	for _, m := range skipNotice.FindAllStringSubmatch(text, -1) {
		n, err := strconv.Atoi(m[1])
		if err != nil {
			t.Fatal(err)
		}
		skipped += n
	}
	return strings.Count(text, "x"), skipped
}

// tmux drives programs under a real terminal on a private tmux server.
type tmux struct {
	tb     testing.TB
	socket string
	name   string
}

func newTmux(tb testing.TB, cols, rows int, env []string, command string) *tmux {
	tb.Helper()
	testenv.RequireTool(tb, "tmux")
	tm := &tmux{tb: tb, socket: fmt.Sprintf("agentjail-it-%d", os.Getpid()), name: fmt.Sprintf("t%d", nameSeq.Add(1))}
	args := []string{"new-session", "-d", "-s", tm.name, "-x", fmt.Sprint(cols), "-y", fmt.Sprint(rows)}
	for _, e := range env {
		args = append(args, "-e", e)
	}
	tm.run(append(args, command)...)
	tm.run("set-option", "-t", tm.name, "remain-on-exit", "on")
	tb.Cleanup(func() { _ = exec.Command("tmux", "-L", tm.socket, "kill-session", "-t", tm.name).Run() })
	return tm
}

func (tm *tmux) run(args ...string) string {
	tm.tb.Helper()
	out, err := exec.Command("tmux", append([]string{"-L", tm.socket}, args...)...).CombinedOutput()
	if err != nil {
		tm.tb.Fatalf("tmux %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (tm *tmux) keys(keys ...string) {
	tm.run(append([]string{"send-keys", "-t", tm.name}, keys...)...)
}

// literal types s as is.
func (tm *tmux) literal(s string) { tm.run("send-keys", "-t", tm.name, "-l", s) }

func (tm *tmux) screen() string { return tm.run("capture-pane", "-p", "-t", tm.name) }

func (tm *tmux) waitScreen(s string) {
	tm.tb.Helper()
	if err := waitFor(30*time.Second, func() error {
		if strings.Contains(tm.screen(), s) {
			return nil
		}
		return fmt.Errorf("no %q on the screen", s)
	}); err != nil {
		tm.tb.Fatalf("%v:\n%s", err, tm.screen())
	}
}

// waitPrompt waits until the screen's last non-empty line is the Python
// prompt, so the next keys are typed at it rather than ahead of it (typed
// ahead, the tty echoes them before the prompt and the screen depends on
// timing).
func (tm *tmux) waitPrompt() {
	tm.tb.Helper()
	if err := waitFor(30*time.Second, func() error {
		lines := strings.Split(strings.TrimRight(tm.screen(), "\n "), "\n")
		if strings.TrimRight(lines[len(lines)-1], " ") == ">>>" {
			return nil
		}
		return fmt.Errorf("no prompt")
	}); err != nil {
		tm.tb.Fatalf("%v:\n%s", err, tm.screen())
	}
}

// TestTerminalCLI drives `agentjail exec -t` and `agentjail attach` under
// tmux, then replays the recording and compares the screens.
func TestTerminalCLI(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, map[string]any{"recording": map[string]any{"input": true}})
	env := []string{"AGENTJAIL_ADDR=" + d.addr, "AGENTJAIL_TOKEN=" + d.token}
	live := newTmux(t, 90, 25, env, binPath+" exec -t "+j.ID+" -- python3 -i; echo CLI-EXIT=$?")
	live.waitScreen(">>>")
	live.literal("6*7")
	live.keys("Enter")
	live.waitScreen("42")
	live.keys("C-p", "C-q")
	live.waitScreen("detached from session")
	live.waitScreen("CLI-EXIT=0")

	att := newTmux(t, 90, 25, env, binPath+" attach "+j.ID+"; echo CLI-EXIT=$?")
	att.waitScreen("42") // the history
	att.waitPrompt()
	att.literal("print('x' * 3)")
	att.keys("Enter")
	att.waitScreen("xxx")
	att.waitPrompt()
	// The prompt is assembled at run time, so that it shows on the screen
	// only once getpass has turned echo off.
	att.literal("import getpass; pw = getpass.getpass('pass' + 'word:')")
	att.keys("Enter")
	att.waitScreen("password:")
	att.literal("hunter2-secret")
	att.keys("Enter")
	att.waitPrompt()
	att.literal("print(len(pw))")
	att.keys("Enter")
	att.waitScreen("14")
	att.waitPrompt()
	att.literal("raise SystemExit(5)")
	att.keys("Enter")
	att.waitScreen("CLI-EXIT=5")
	final := screenOf(att.screen(), "CLI-EXIT=5")

	var recs struct {
		Recordings []recordingInfo `json:"recordings"`
	}
	if err := waitFor(30*time.Second, func() error {
		d.api.want(t, http.StatusOK, "GET", "/jails/"+j.ID+"/recordings", nil, &recs)
		if len(recs.Recordings) == 1 && recs.Recordings[0].Status == "complete" && recs.Recordings[0].SHA256 != "" {
			return nil
		}
		return fmt.Errorf("recordings: %+v", recs.Recordings)
	}); err != nil {
		t.Fatal(err)
	}
	rid := recs.Recordings[0].ID
	cast := d.api.want(t, http.StatusOK, "GET", "/recordings/"+rid, nil, nil).body

	// Input is recorded, except at the password prompt.
	if !bytes.Contains(cast, []byte(`"i", "6"`)) && !bytes.Contains(cast, []byte(`"i", "6*7`)) {
		t.Fatalf("typed input is not in the recording:\n%s", cast)
	}
	if bytes.Contains(cast, []byte("hunter2")) {
		t.Fatalf("the password is in the recording:\n%s", cast)
	}

	// Replayed in the same terminal size, the recording ends on the same
	// screen as the live session.
	rp := newTmux(t, 90, 25, env, binPath+" replay --speed 100 --idle-limit 100ms "+rid+"; echo CLI-EXIT=$?")
	rp.waitScreen("CLI-EXIT=0")
	// The attached client's screen may also carry the CLI's own notices
	// above the session's output: compare from the first command on.
	fromFirst := func(screen string) string {
		if i := strings.Index(screen, ">>> 6*7"); i >= 0 {
			return screen[i:]
		}
		return screen
	}
	if got := screenOf(rp.screen(), "CLI-EXIT=0"); fromFirst(got) != fromFirst(final) {
		t.Fatalf("replayed screen differs from the live one:\nlive:\n%s\nreplay:\n%s", final, got)
	}

	// asciinema plays it.
	file := filepath.Join(t.TempDir(), "rec.cast")
	if err := os.WriteFile(file, cast, 0o600); err != nil {
		t.Fatal(err)
	}
	testenv.RequireTool(t, "asciinema")
	play := exec.Command("asciinema", "play", "-s", "100", "-i", "0.1", file)
	play.Stdin = nil
	var out bytes.Buffer
	play.Stdout, play.Stderr = &out, &out
	if err := play.Run(); err != nil || !strings.Contains(out.String(), "xxx") {
		t.Fatalf("asciinema play: %v\n%s", err, out.String())
	}

	// A modified recording is reported as tampered.
	stored := filepath.Join(d.dir, "jails", j.ID, "recordings", rid+".cast.zst")
	data, err := os.ReadFile(stored)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(stored, data, 0o600); err != nil {
		t.Fatal(err)
	}
	r := d.api.do(t, "GET", "/recordings/"+rid, nil)
	if r.status != http.StatusConflict || !strings.Contains(r.errorMessage(), "modified") {
		t.Fatalf("tampered recording: %s", r)
	}
	if _, stderr, code := runBin(t, env, "", "replay", rid); code == 0 || !strings.Contains(stderr, "integrity") {
		t.Fatalf("replay of a tampered recording: exit %d, %s", code, stderr)
	}
}

// screenOf returns the lines of a captured pane before the line holding
// marker, without trailing blanks.
func screenOf(pane, marker string) string {
	lines := strings.Split(pane, "\n")
	for i, l := range lines {
		if strings.Contains(l, marker) {
			lines = lines[:i]
			break
		}
	}
	for i := range lines {
		lines[i] = strings.TrimRight(lines[i], " ")
	}
	return strings.TrimRight(strings.Join(lines, "\n"), "\n")
}

// BenchmarkTerminalEcho measures a keystroke's round trip through the
// WebSocket: a byte typed, echoed by the jail's terminal, received.
func BenchmarkTerminalEcho(b *testing.B) {
	d := shared(b)
	j := d.createJail(b, nil)
	w := dialTerm(b, d, j.ID, url.Values{"cmd": {"cat"}})
	w.arrivals = make(chan time.Time, 16)
	w.start()
	// Warm up until the terminal echoes.
	w.send(b, "w")
	w.waitText(b, "w")
	for len(w.arrivals) > 0 {
		<-w.arrivals
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		w.send(b, "k")
		select {
		case t1 := <-w.arrivals:
			lat = append(lat, t1.Sub(t0))
		case <-time.After(10 * time.Second):
			b.Fatal("no echo within 10s")
		}
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	med, p99 := lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)]
	b.ReportMetric(float64(med.Microseconds())/1000, "median-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
}

// BenchmarkTerminalThroughput measures `cat` of a 100 MB file through a
// recorded session to a WebSocket client, and checks the recording is
// complete. In the same iteration the same cat of the same file (read from
// the jail's disk on the host) runs on a bare terminal (package barepty):
// x-bare is the session's throughput over the bare terminal's (target ≥ 0.8).
func BenchmarkTerminalThroughput(b *testing.B) {
	d := shared(b)
	j := d.createJail(b, map[string]any{"isolation": map[string]any{"resources": map[string]any{"disk_bytes": 2 << 30}}})
	d.mustSh(b, j.ID, "head -c 75000000 /dev/urandom | base64 -w 99 > /workspace/big && test $(stat -c %s /workspace/big) -ge 100000000")
	b.SetBytes(100_000_000)
	var received, ratios, viewer []float64
	defer func() {
		if len(received) > 0 {
			slices.Sort(received)
			b.ReportMetric(received[0], "min-received-fraction")
			slices.Sort(viewer)
			b.ReportMetric(viewer[len(viewer)/2], "viewer-MB/s")
		}
		if len(ratios) > 0 {
			slices.Sort(ratios)
			b.ReportMetric(ratios[len(ratios)/2], "x-bare")
		}
	}()
	hostCopy := filepath.Join(d.dir, "jails", j.ID, "rootfs", "upper", "workspace", "big")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		n, bare, err := barepty.Run([]string{"cat", hostCopy})
		if err != nil || n < 100_000_000 {
			b.Fatalf("bare terminal: %d bytes, %v", n, err)
		}
		b.StartTimer()
		start := time.Now()
		w := dialTerm(b, d, j.ID, url.Values{"cmd": {"cat", "/workspace/big"}}).start()
		if code, _ := w.waitExit(b); code != 0 {
			b.Fatalf("cat exit %d", code)
		}
		elapsed := time.Since(start)
		ratios = append(ratios, bare.Seconds()/elapsed.Seconds())
		// A client that falls behind is skipped ahead (the session never
		// waits for it): report what arrived, and how fast.
		received = append(received, float64(len(w.text()))/100_000_000)
		viewer = append(viewer, float64(len(w.text()))/1e6/elapsed.Seconds())
		b.StopTimer()
		var recs struct {
			Recordings []recordingInfo `json:"recordings"`
		}
		d.api.want(b, http.StatusOK, "GET", "/jails/"+j.ID+"/recordings", nil, &recs)
		found := false
		for _, r := range recs.Recordings {
			if r.ID == w.session.RecordingID {
				found = r.Status == "complete" && r.Size > 100_000_000
			}
		}
		if !found {
			b.Fatalf("recording %s incomplete: %+v", w.session.RecordingID, recs.Recordings)
		}
		b.StartTimer()
	}
}

// TestSnapshotBesideTerminal: a full snapshot cannot include a terminal
// session (CRIU cannot restore its controlling tty) nor the daemon's live
// connection to it, so it is refused with a 409 that says what to do — not
// a checkpoint error — while the terminal is attached and after it is
// detached; a snapshot of mode fs is taken meanwhile, and once the
// session's shell exits, a full snapshot is taken too.
func TestSnapshotBesideTerminal(t *testing.T) {
	requireEnv(t)
	d := shared(t)
	j := d.createJail(t, nil)
	term := dialTerm(t, d, j.ID, url.Values{"cmd": {"sh"}}).start()
	term.send(t, "echo before-$((6*7))\r")
	term.waitText(t, "before-42")
	refused := func(what string) {
		t.Helper()
		r := d.api.do(t, "POST", "/jails/"+j.ID+"/snapshot", map[string]any{"mode": "full"})
		if r.status != http.StatusConflict || !strings.Contains(string(r.body), "end the session") {
			t.Fatalf("full snapshot %s: %s, want 409 saying to end the session", what, r)
		}
	}
	refused("with a terminal attached")
	d.takeSnapshot(t, j.ID, "fs")
	term.conn.Close(websocket.StatusNormalClosure, "")
	<-term.done
	refused("with a detached terminal session")
	re := dialTerm(t, d, j.ID, url.Values{"session": {term.session.ID}}).start()
	re.send(t, "exit 3\r")
	if code, _ := re.waitExit(t); code != 3 {
		t.Fatalf("the session's shell: exit %d, want 3", code)
	}
	d.takeSnapshot(t, j.ID, "full")
}
