package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// backgroundJobs are the ways agents start work that outlives the command
// that started it. Each leaves processes whose session and process group
// leader (the command's shell) has exited.
var backgroundJobs = []string{
	"sleep 1000 &",
	"nohup python3 -m http.server 8000 >/dev/null 2>&1 &",
	// A daemon that left its parent's session and then forked.
	"setsid sh -c 'sleep 2000 &'",
	"sh -c '(sleep 3000 &); exit'",
	// A loop in the background of a command, writing as it goes.
	`i=0; while :; do i=$((i+1)); echo $i > /workspace/count; sleep 0.1; done >/dev/null 2>&1 &`,
}

// jobsRE picks the background jobs out of `ps -eo sid,pgid,args`.
var jobsRE = regexp.MustCompile(`(?m)^\s*(\d+)\s+(\d+)\s+(sleep [0-9]+|python3 -m http.server 8000)$`)

// jobs returns the background jobs of a jail as "sid pgid args" lines,
// sorted.
func (d *daemon) jobs(t testing.TB, id string) []string {
	t.Helper()
	out := d.shAs(t, id, "root", "ps -eo sid=,pgid=,args=").Stdout
	var lines []string
	for _, m := range jobsRE.FindAllStringSubmatch(out, -1) {
		lines = append(lines, m[1]+" "+m[2]+" "+m[3])
	}
	sort.Strings(lines)
	return lines
}

// serves waits until the jail's web server on port 8000 answers.
func (d *daemon) serves(t testing.TB, id string) {
	t.Helper()
	d.waitSh(t, id, "curl -sf -m 2 -o /dev/null http://127.0.0.1:8000/", 20*time.Second, "the web server on port 8000 does not answer")
}

// TestSnapshotBackgroundJobs: a jail whose commands left background jobs
// behind (`cmd &`, `nohup cmd &`, a dev server, a daemon that left its
// session, a loop) snapshots, restores and branches: every job comes back
// with its session and process group, the server answers on its port, the
// loop carries on, and the original runs on.
func TestSnapshotBackgroundJobs(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, nil)
	for _, cmd := range backgroundJobs {
		d.mustSh(t, j.ID, cmd)
	}
	d.serves(t, j.ID)
	n := d.waitCounting(t, j.ID, 0)
	want := d.jobs(t, j.ID)
	if len(want) != 4 {
		t.Fatalf("the jail's background jobs: %q", want)
	}
	for _, l := range want {
		// Their session leaders are gone: none is its own leader.
		f := strings.Fields(l)
		if res := d.shAs(t, j.ID, "root", "kill -0 "+f[0]); res.ExitCode == 0 {
			t.Fatalf("the session leader %s of %q is alive; the test needs it gone", f[0], l)
		}
	}

	snap := d.takeSnapshot(t, j.ID, "full")
	jails := append([]jailInfo{d.restoreSnapshot(t, snap.ID)}, d.branch(t, snap.ID, 2)...)
	for _, r := range jails {
		if got := d.jobs(t, r.ID); strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("jail %s made from the snapshot has the jobs %q, want %q", r.Name, got, want)
		}
		d.serves(t, r.ID)
		d.waitCounting(t, r.ID, d.waitCounting(t, r.ID, 0))
	}
	d.waitCounting(t, j.ID, n)
	d.serves(t, j.ID)
}

// TestSnapshotTerminalJob: a job left running by a terminal session that
// ended (its shell exited; the job still holds the terminal) is in the
// snapshot, and in the jail restored from it.
func TestSnapshotTerminalJob(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, nil)
	term := dialTerm(t, d, j.ID, url.Values{"cmd": {"sh"}}).start()
	term.send(t, "sleep 4000 & echo started-$((6*7))\r")
	term.waitText(t, "started-42")
	term.send(t, "exit\r")
	term.waitExit(t)
	d.waitSh(t, j.ID, "pgrep -x sleep", 10*time.Second, "the terminal's job is gone")
	snap := d.takeSnapshot(t, j.ID, "full")
	r := d.restoreSnapshot(t, snap.ID)
	if res := d.shAs(t, r.ID, "root", "pgrep -x sleep"); res.ExitCode != 0 {
		t.Fatalf("the terminal's job is not in the restored jail: %s", &res)
	}
}

// TestSnapshotBranchNames: branching two snapshots of the same name makes
// jails of distinct names without being asked; a branch may name its jails
// (a list, or a prefix); names are checked before any jail is made.
func TestSnapshotBranchNames(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, nil)
	name := uniqueName(t)
	var snaps []snapshotInfo
	for range 2 {
		var s snapshotInfo
		d.api.want(t, http.StatusCreated, "POST", "/jails/"+j.ID+"/snapshot", map[string]any{"name": name, "mode": "fs"}, &s)
		t.Cleanup(func() { d.api.do(t, "DELETE", "/snapshots/"+s.ID, nil) })
		snaps = append(snaps, s)
	}
	branch := func(sid string, body map[string]any, want int) []jailInfo {
		t.Helper()
		var out struct {
			Jails []jailInfo `json:"jails"`
		}
		r := d.api.do(t, "POST", "/snapshots/"+sid+"/branch", body)
		if r.status != want {
			t.Fatalf("branch %v: want HTTP %d, got %s", body, want, r)
		}
		if want == http.StatusCreated {
			if err := json.Unmarshal(r.body, &out); err != nil {
				t.Fatalf("branch %v: %v", body, err)
			}
			for _, b := range out.Jails {
				t.Cleanup(func() { d.destroy(t, b.ID) })
			}
		}
		return out.Jails
	}
	seen := map[string]bool{}
	for _, s := range snaps {
		for _, b := range branch(s.ID, map[string]any{"count": 2}, http.StatusCreated) {
			if seen[b.Name] || !strings.HasPrefix(b.Name, name+"-") {
				t.Errorf("branch name %q: taken before, or not after the snapshot %q", b.Name, name)
			}
			seen[b.Name] = true
		}
	}
	named := []string{uniqueName(t), uniqueName(t)}
	got := branch(snaps[0].ID, map[string]any{"names": named}, http.StatusCreated)
	if len(got) != 2 || got[0].Name != named[0] || got[1].Name != named[1] {
		t.Errorf("branches named %q: got %+v", named, got)
	}
	before := d.jailCount(t)
	for _, c := range []struct {
		body map[string]any
		want int
	}{
		{map[string]any{"names": []string{uniqueName(t), named[1]}}, http.StatusConflict},
		{map[string]any{"names": []string{"x-dup", "x-dup"}}, http.StatusBadRequest},
		{map[string]any{"names": []string{uniqueName(t), "-bad"}}, http.StatusUnprocessableEntity},
		{map[string]any{"names": []string{uniqueName(t)}, "name_prefix": "p"}, http.StatusBadRequest},
		{map[string]any{"names": []string{uniqueName(t)}, "count": 2}, http.StatusBadRequest},
		{map[string]any{"count": 33}, http.StatusBadRequest},
	} {
		branch(snaps[0].ID, c.body, c.want)
	}
	if after := d.jailCount(t); after != before {
		t.Errorf("refused branches changed the number of jails: %d, then %d", before, after)
	}
}

// jailCount is the number of jails GET /jails lists.
func (d *daemon) jailCount(t testing.TB) int {
	t.Helper()
	var list struct {
		Jails []jailInfo `json:"jails"`
	}
	d.api.want(t, http.StatusOK, "GET", "/jails", nil, &list)
	return len(list.Jails)
}

// echoClient runs in a jail: it keeps one TCP connection to echo.test:7
// through the daemon's SOCKS5 proxy ($ALL_PROXY) and logs to
// /workspace/conn-MODE.log. In mode "write" it sends a numbered line every
// 50 ms and reads it back ("echo N" per answer); in mode "read" it sends
// nothing and waits in a read. When the connection fails it logs "closed
// KIND: ...", connects again and logs "reconnected".
const echoClient = `
import os, socket, sys, time
from urllib.parse import urlparse

mode = sys.argv[1]
proxy = urlparse(os.environ["ALL_PROXY"])
log = open("/workspace/conn-%s.log" % mode, "a", buffering=1)

def exactly(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise EOFError("end of stream")
        b += c
    return b

def connect():
    s = socket.create_connection((proxy.hostname, proxy.port), timeout=5)
    s.sendall(b"\x05\x01\x00")
    if exactly(s, 2) != b"\x05\x00":
        raise OSError("socks: no method")
    host = b"echo.test"
    s.sendall(b"\x05\x01\x00\x03" + bytes([len(host)]) + host + (7).to_bytes(2, "big"))
    head = exactly(s, 4)
    if head[1] != 0:
        raise OSError("socks: refused %d" % head[1])
    if head[3] == 1:
        exactly(s, 4 + 2)
    elif head[3] == 4:
        exactly(s, 16 + 2)
    else:
        exactly(s, exactly(s, 1)[0] + 2)
    s.settimeout(None)
    return s

s = connect()
log.write("connected\n")
n = 0
while True:
    n += 1
    line = b"ping %d\n" % n
    try:
        if mode == "read":
            exactly(s, 1)
            raise OSError("unexpected data")
        s.sendall(line)
        if exactly(s, len(line)) != line:
            raise OSError("wrong echo")
        log.write("echo %d\n" % n)
    except Exception as e:
        log.write("closed %s: %s\n" % (type(e).__name__, e))
        s.close()
        while True:
            try:
                s = connect()
                break
            except OSError:
                time.sleep(0.1)
        log.write("reconnected\n")
    time.sleep(0.05)
`

// connLog reads a jail's /workspace/conn-MODE.log.
func (d *daemon) connLog(t testing.TB, id, mode string) []string {
	t.Helper()
	return strings.Split(strings.TrimSpace(d.shAs(t, id, "root", "cat /workspace/conn-"+mode+".log").Stdout), "\n")
}

// lastEcho is the number of the last answered line in a connection log
// (0 when none).
func lastEcho(log []string) int {
	for i := len(log) - 1; i >= 0; i-- {
		if n, ok := strings.CutPrefix(log[i], "echo "); ok {
			v, _ := strconv.Atoi(n)
			return v
		}
	}
	return 0
}

// waitEchoes waits until the jail's echo client has had answers past after.
func (d *daemon) waitEchoes(t testing.TB, id string, after int) []string {
	t.Helper()
	var log []string
	if err := waitFor(20*time.Second, func() error {
		log = d.connLog(t, id, "write")
		if lastEcho(log) <= after {
			return fmt.Errorf("jail %s: no echo past %d: %q", id, after, log[max(0, len(log)-3):])
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return log
}

// TestSnapshotListenerAndConnection: a jail with a listening TCP server
// (a dev server) and established connections (to a host outside, through
// the daemon's proxy) snapshots and branches. The server answers in the
// original and in every branch. The original's connections carry on
// through the snapshot untouched. In each branch every connection comes
// back closed: a client waiting in a read sees the end of the stream, one
// that writes gets EPIPE, and both connect again through the branch's own
// network.
func TestSnapshotListenerAndConnection(t *testing.T) {
	requireEnv(t)
	in := newTestInternet(t, "echo.test")
	d := newDaemon(t, "--hosts-file", in.hosts)
	j := d.createJail(t, map[string]any{"isolation": map[string]any{"network": map[string]any{
		"mode": "isolated", "allowed_egress": []map[string]any{{"destination": "echo.test", "ports": []int{7}}},
	}}})
	d.putFile(t, j.ID, "/workspace/echo.py", []byte(echoClient))
	d.mustSh(t, j.ID, "nohup python3 -m http.server 8000 >/dev/null 2>&1 &"+
		" for m in read write; do nohup python3 /workspace/echo.py $m >/workspace/echo-$m.err 2>&1 & done")
	d.serves(t, j.ID)
	d.waitEchoes(t, j.ID, 3)
	d.waitSh(t, j.ID, "grep -qx connected /workspace/conn-read.log", 10*time.Second, "the reading client has not connected")

	snap := d.takeSnapshot(t, j.ID, "full")
	atSnap := lastEcho(d.connLog(t, j.ID, "write"))
	// The writing client is caught writing or sleeping (EPIPE), or, when
	// the snapshot came while its echo was on the way, waiting in a read
	// (the end of the stream).
	eof, epipe := "closed EOFError: end of stream", "closed BrokenPipeError: [Errno 32] Broken pipe"
	wantClosed := map[string][]string{"read": {eof}, "write": {epipe, eof}}
	for _, b := range d.branch(t, snap.ID, 2) {
		d.serves(t, b.ID)
		d.waitEchoes(t, b.ID, 0)
		d.waitSh(t, b.ID, "grep -qx reconnected /workspace/conn-read.log", 10*time.Second, "the reading client has not connected again")
		for mode, want := range wantClosed {
			log := d.connLog(t, b.ID, mode)
			closed := slices.IndexFunc(log, func(l string) bool { return slices.Contains(want, l) })
			if closed < 0 || !slices.Contains(log[closed:], "reconnected") {
				t.Errorf("branch %s, %s client: want one of %q, then a new connection; log %q", b.Name, mode, want, log)
			}
		}
	}
	d.waitEchoes(t, j.ID, atSnap+20)
	for _, mode := range []string{"read", "write"} {
		for _, l := range d.connLog(t, j.ID, mode) {
			if strings.HasPrefix(l, "closed") {
				t.Errorf("the original's %s connection broke: %q", mode, l)
			}
		}
	}
	d.serves(t, j.ID)
}

// TestSnapshotRestoreFailureLeavesNothing: a snapshot whose process
// images were damaged on disk (a task's core image emptied) cannot be
// restored; a restore and a branch of three answer 422 with CRIU's reason
// naming the process, and the failed jails leave nothing on the host.
func TestSnapshotRestoreFailureLeavesNothing(t *testing.T) {
	d := newDaemon(t)
	base := baseline(t, d)
	j := d.createJail(t, nil)
	d.mustSh(t, j.ID, "sleep 1000 &")
	pid := strings.TrimSpace(d.mustSh(t, j.ID, "pgrep -x sleep"))
	snap := d.takeSnapshot(t, j.ID, "full")
	core := filepath.Join(d.dir, "snapshots", snap.ID, "criu", "core-"+pid+".img")
	if err := os.Truncate(core, 0); err != nil {
		t.Fatalf("damaging the snapshot: %v", err)
	}
	before := d.jailCount(t)
	for _, req := range []struct{ path, what string }{
		{"/snapshots/" + snap.ID + "/restore", "restore"},
		{"/snapshots/" + snap.ID + "/branch", "branch"},
	} {
		body := map[string]any{}
		if req.what == "branch" {
			body["count"] = 3
		}
		r := d.api.do(t, "POST", req.path, body)
		if r.status != http.StatusUnprocessableEntity || !strings.Contains(r.errorMessage(), `"sleep 1000"`) {
			t.Errorf("%s of a damaged snapshot: want 422 naming the sleep, got %s", req.what, r)
		}
		t.Logf("%s: %s", req.what, r.errorMessage())
	}
	if after := d.jailCount(t); after != before {
		t.Errorf("failed restores left jails: %d, then %d", before, after)
	}
	d.api.want(t, http.StatusNoContent, "DELETE", "/jails/"+j.ID, nil, nil)
	d.api.want(t, http.StatusNoContent, "DELETE", "/snapshots/"+snap.ID, nil, nil)
	expectClean(t, d, base, "failed restores")
}
