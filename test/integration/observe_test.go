package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// procEvent is a "proc" line of processes.jsonl / the event stream.
type procEvent struct {
	Type     string   `json:"type"`
	Seq      uint64   `json:"seq"`
	Op       string   `json:"op"`
	Pid      int      `json:"pid"`
	Ppid     int      `json:"ppid"`
	Comm     string   `json:"comm"`
	Exe      string   `json:"exe"`
	Argv     []string `json:"argv"`
	Cwd      string   `json:"cwd"`
	UID      int      `json:"uid"`
	ExitCode *int     `json:"exit_code"`
	Signal   int      `json:"signal"`
	Path     string   `json:"path"`
	Bytes    int64    `json:"bytes"`
	NR       int      `json:"nr"`
	Name     string   `json:"name"`
}

// readEvents reads one of a jail's JSONL files from the daemon's data dir
// once the daemon has flushed it (a stopped jail's files are complete).
func readEvents(tb testing.TB, d *daemon, id, file string) []procEvent {
	tb.Helper()
	f, err := os.Open(filepath.Join(d.dir, "jails", id, "events", file))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var out []procEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var ev procEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			tb.Fatalf("%s: bad line %q: %v", file, sc.Text(), err)
		}
		out = append(out, ev)
	}
	return out
}

// stopJail stops a jail so that its event files are complete.
func stopJail(tb testing.TB, d *daemon, id string) {
	tb.Helper()
	d.api.want(tb, http.StatusOK, "POST", "/jails/"+id+"/stop", map[string]any{"timeout_s": 5}, nil)
}

// TestObserveProcessTreeMatchesStrace runs a shell pipeline in a jail and
// compares every exec (argv) and exit code the daemon recorded with what
// `strace -f -e trace=process` reports for the same script.
func TestObserveProcessTreeMatchesStrace(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, nil)
	const script = `echo abc | tr a-c x-z | cat >/dev/null; (exit 3); sh -c 'exit 5'; /bin/true; ls /nonexistent 2>/dev/null; echo done`
	res := d.shAs(t, j.ID, "", "sh -c "+shellQuote(script))
	if res.ExitCode != 0 {
		t.Fatalf("workload: %s", &res)
	}
	// The same script under strace, in the same jail.
	// -ff writes one file per process, so no line is split by another
	// process's ("<unfinished ...>"); each line gets its pid back here.
	st := d.shAs(t, j.ID, "", "mkdir -p /tmp/st && strace -ff -q -s 4096 -e trace=process -o /tmp/st/t sh -c "+shellQuote(script)+
		`; for f in /tmp/st/t.*; do sed "s/^/${f##*.} /" "$f"; done`)
	if st.ExitCode != 0 {
		t.Fatalf("strace run: %s", &st)
	}
	stopJail(t, d, j.ID)

	// What strace saw: execve argv lists and exit codes, per process.
	execRE := regexp.MustCompile(`^(\d+)\s+execve\("[^"]*", \[(.*)\], .*= 0$`)
	exitRE := regexp.MustCompile(`^(\d+)\s+\+\+\+ exited with (\d+) \+\+\+$`)
	var straceExecs []string
	straceExit := map[int]int{}
	straceExecOf := map[int]string{}
	for _, line := range strings.Split(st.Stdout, "\n") {
		if m := execRE.FindStringSubmatch(line); m != nil {
			argv := strings.ReplaceAll(m[2], `"`, "")
			pid, _ := strconv.Atoi(m[1])
			straceExecs = append(straceExecs, argv)
			straceExecOf[pid] = argv
		} else if m := exitRE.FindStringSubmatch(line); m != nil {
			pid, _ := strconv.Atoi(m[1])
			code, _ := strconv.Atoi(m[2])
			straceExit[pid] = code
		}
	}
	if len(straceExecs) < 5 {
		t.Fatalf("strace saw too few execs (%d): %s", len(straceExecs), st.Stdout)
	}
	var straceResults []string
	for pid, argv := range straceExecOf {
		straceResults = append(straceResults, fmt.Sprintf("%s => %d", argv, straceExit[pid]))
	}

	// What the daemon recorded for the first (untraced) run: the processes
	// below the `sh -c script` exec'd by the first exec request.
	evs := readEvents(t, d, j.ID, "processes.jsonl")
	root := -1
	for _, ev := range evs {
		if ev.Op == "exec" && len(ev.Argv) == 3 && ev.Argv[0] == "sh" && ev.Argv[2] == script {
			root = ev.Pid
			break
		}
	}
	if root < 0 {
		t.Fatalf("the workload's sh -c was not recorded")
	}
	inTree := map[int]bool{root: true}
	var ourExecs, ourResults []string
	execOf := map[int]string{}
	exitOf := map[int]int{}
	for _, ev := range evs {
		switch ev.Op {
		case "fork":
			if inTree[ev.Ppid] {
				inTree[ev.Pid] = true
			}
		case "exec":
			if inTree[ev.Pid] {
				a := strings.Join(ev.Argv, ", ")
				ourExecs = append(ourExecs, a)
				execOf[ev.Pid] = a
			}
		case "exit":
			if inTree[ev.Pid] && ev.ExitCode != nil {
				exitOf[ev.Pid] = *ev.ExitCode
			}
		}
	}
	for pid, argv := range execOf {
		ourResults = append(ourResults, fmt.Sprintf("%s => %d", argv, exitOf[pid]))
	}
	sort.Strings(straceExecs)
	sort.Strings(ourExecs)
	sort.Strings(straceResults)
	sort.Strings(ourResults)
	if !slices.Equal(straceExecs, ourExecs) {
		t.Errorf("execs differ:\nstrace: %q\nours:   %q", straceExecs, ourExecs)
	}
	if !slices.Equal(straceResults, ourResults) {
		t.Errorf("exit codes differ:\nstrace: %q\nours:   %q", straceResults, ourResults)
	}
}

// TestObserveLeavesOutPlumbing checks that a jail's syscall record holds
// its commands and not the jail's own plumbing: no syscall of init's
// command shims, and a command's record starts with its execve, not with
// the shim's set-up of the child. A program of the jail's user that runs
// the shim binary itself is recorded in full. Init's own calls serving the
// execs are left out; those it makes for the files API are recorded.
func TestObserveLeavesOutPlumbing(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, nil)
	for range 3 {
		if res := d.exec(t, j.ID, execReq{Cmd: []string{"true"}}); res.ExitCode != 0 {
			t.Fatalf("exec true: %s", &res)
		}
	}
	const uploaded = "/workspace/written-through-the-api.txt"
	d.putFile(t, j.ID, uploaded, []byte("hello"))
	fake := d.shAs(t, j.ID, "", "/.agentjail/agentjail init --shim </dev/null; echo ran")
	if !strings.Contains(fake.Stdout, "ran") {
		t.Fatalf("running the shim binary: %s", &fake)
	}
	stopJail(t, d, j.ID)

	commands, shims, fakes := map[int]bool{}, map[int]bool{}, map[int]bool{}
	for _, ev := range readEvents(t, d, j.ID, "processes.jsonl") {
		switch {
		case ev.Op != "exec":
		case slices.Equal(ev.Argv, []string{"true"}):
			commands[ev.Pid] = true
		case slices.Contains(ev.Argv, "--shim") && ev.Ppid == 1:
			shims[ev.Pid] = true
		case slices.Contains(ev.Argv, "--shim"):
			fakes[ev.Pid] = true
		}
	}
	if len(commands) != 3 || len(shims) == 0 || len(fakes) != 1 {
		t.Fatalf("recorded execs: %d of true (want 3), %d shims, %d shim binaries run by the user (want 1)", len(commands), len(shims), len(fakes))
	}
	first := map[int]string{}
	calls := map[int]int{}
	initFileCalls := 0
	for _, ev := range readEvents(t, d, j.ID, "syscalls.jsonl") {
		if shims[ev.Pid] {
			t.Errorf("syscall %s of shim %d recorded", ev.Name, ev.Pid)
		}
		if ev.Pid == 1 {
			// Pipes and descriptor passing are how init hands a command
			// to a shim; no file operation makes them.
			if ev.Name == "pipe2" || ev.Name == "sendmsg" {
				t.Errorf("init's %s serving an exec recorded", ev.Name)
			}
			if strings.Contains(ev.Path, path.Base(uploaded)) {
				initFileCalls++
			}
		}
		if _, ok := first[ev.Pid]; !ok {
			first[ev.Pid] = ev.Name
		}
		calls[ev.Pid]++
	}
	for pid := range commands {
		if first[pid] != "execve" || calls[pid] < 5 {
			t.Errorf("command %d: first recorded syscall %q (want execve), %d in all", pid, first[pid], calls[pid])
		}
	}
	for pid := range fakes {
		if calls[pid] < 5 {
			t.Errorf("the shim binary run by the user (pid %d): %d syscalls recorded", pid, calls[pid])
		}
	}
	if initFileCalls == 0 {
		t.Errorf("no syscall of init on %s recorded: the files API's write is missing from the record", uploaded)
	}
}

// TestObserveFsDiffMatchesDiffR changes files in a jail and compares the
// daemon's fs diff with `diff -rq` between the lower tree and the merged
// view, and the recorded write byte counts with what was written.
func TestObserveFsDiffMatchesDiffR(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, nil)
	res := d.shAs(t, j.ID, "root", `set -e
python3 -c 'open("/workspace/data.bin","wb").write(b"x"*123457)'
echo changed >> /etc/motd
rm /etc/issue.net 2>/dev/null || rm -f /etc/debian_version
mkdir -p /opt/tool/bin && printf 'y%.0s' $(seq 1 4096) > /opt/tool/bin/run
chmod 0600 /etc/hostname 2>/dev/null || true`)
	if res.ExitCode != 0 {
		t.Fatalf("workload: %s", &res)
	}
	var diff struct {
		Changes []struct {
			Path string `json:"path"`
			Kind string `json:"kind"`
			Type string `json:"type"`
			Size int64  `json:"size"`
		} `json:"changes"`
	}
	d.api.want(t, http.StatusOK, "GET", "/jails/"+j.ID+"/fs/diff", nil, &diff)

	lower := filepath.Join(d.dir, "rootfs", "host")
	merged := filepath.Join(d.dir, "jails", j.ID, "rootfs", "merged")
	out, _ := exec.Command("diff", "-rq", "--no-dereference", lower, merged).CombinedOutput()
	var fromDiff []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		switch {
		case strings.HasPrefix(line, "Files "):
			// Files LOWER/x and MERGED/x differ
			p := strings.TrimPrefix(strings.Fields(line)[1], lower)
			fromDiff = append(fromDiff, "modified "+p)
		case strings.HasPrefix(line, "Only in "+merged):
			rest := strings.TrimPrefix(line, "Only in "+merged)
			dir, name, _ := strings.Cut(rest, ": ")
			fromDiff = append(fromDiff, "added "+filepath.Join("/", dir, name))
		case strings.HasPrefix(line, "Only in "+lower):
			rest := strings.TrimPrefix(line, "Only in "+lower)
			dir, name, _ := strings.Cut(rest, ": ")
			fromDiff = append(fromDiff, "deleted "+filepath.Join("/", dir, name))
		}
	}
	// diff -r names an added or deleted directory once; the daemon also
	// lists what is inside: keep its top-level entries, and leave out
	// mode-only changes (diff -q compares contents) and agentjail's own
	// mount points.
	var ours []string
	var sizes = map[string]int64{}
	for _, c := range diff.Changes {
		sizes[c.Path] = c.Size
		covered := false
		for _, o := range ours {
			_, p, _ := strings.Cut(o, " ")
			if strings.HasPrefix(c.Path, p+"/") {
				covered = true
			}
		}
		if covered || (c.Kind == "modified" && c.Type == "dir") {
			continue
		}
		if c.Kind == "modified" && c.Path == "/etc/hostname" {
			continue // chmod only
		}
		ours = append(ours, c.Kind+" "+c.Path)
	}
	sort.Strings(ours)
	sort.Strings(fromDiff)
	if !slices.Equal(ours, fromDiff) {
		t.Errorf("fs diff differs from diff -rq:\nours:    %q\ndiff -r: %q", ours, fromDiff)
	}
	if sizes["/workspace/data.bin"] != 123457 {
		t.Errorf("size of /workspace/data.bin in the diff: %d", sizes["/workspace/data.bin"])
	}

	// fanotify's view of the files written agrees with the syscall record.
	var rep struct {
		FileCheck *struct {
			Written int      `json:"written"`
			Missing []string `json:"missing"`
		} `json:"file_check"`
	}
	d.api.want(t, http.StatusOK, "GET", "/jails/"+j.ID+"/report", nil, &rep)
	if rep.FileCheck == nil || rep.FileCheck.Written < 3 || len(rep.FileCheck.Missing) != 0 {
		t.Errorf("fanotify cross-check: %+v", rep.FileCheck)
	}

	stopJail(t, d, j.ID)
	var written int64
	for _, ev := range readEvents(t, d, j.ID, "filesystem.jsonl") {
		if ev.Path == "/workspace/data.bin" && ev.Op == "write" {
			written += ev.Bytes
		}
	}
	if written != 123457 {
		t.Errorf("recorded writes to /workspace/data.bin: %d bytes, want 123457", written)
	}
}

// TestObserveOnlyItsOwnJail runs a marked command in one jail and on the
// host at the same time and checks that neither appears in another jail's
// record, and that the SSE stream serves the recent past with a type
// filter and resumes after a sequence number.
func TestObserveOnlyItsOwnJail(t *testing.T) {
	d := shared(t)
	a := d.createJail(t, nil)
	b := d.createJail(t, nil)
	host := exec.Command("bash", "-c", "exec -a marker-host-x1 sleep 1")
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	d.shAs(t, b.ID, "", "bash -c 'exec -a marker-jail-b sleep 0.2'")
	d.shAs(t, a.ID, "", "echo in-a")
	if err := host.Wait(); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	body := sse(t, ctx, d, "/jails/"+a.ID+"/events?follow=false")
	if strings.Contains(body, "marker-jail-b") || strings.Contains(body, "marker-host-x1") {
		t.Fatalf("jail %s's events contain another jail's or the host's process", a.Name)
	}
	if !strings.Contains(body, `"in-a"`) && !strings.Contains(body, "echo in-a") {
		t.Fatalf("jail %s's own command is missing from its events", a.Name)
	}
	// Type filter and resumption.
	procs := sse(t, ctx, d, "/jails/"+a.ID+"/events?follow=false&type=proc")
	ids := regexp.MustCompile(`(?m)^id: (\d+)$`).FindAllStringSubmatch(procs, -1)
	if len(ids) < 3 || strings.Contains(procs, "event: syscall") {
		t.Fatalf("type=proc stream: %d events, or other types in it", len(ids))
	}
	mid := ids[len(ids)/2][1]
	rest := sse(t, ctx, d, "/jails/"+a.ID+"/events?follow=false&type=proc&since="+mid)
	first := regexp.MustCompile(`(?m)^id: (\d+)$`).FindStringSubmatch(rest)
	if first == nil {
		t.Fatalf("nothing after %s", mid)
	}
	n1, _ := strconv.ParseUint(first[1], 10, 64)
	n0, _ := strconv.ParseUint(mid, 10, 64)
	if n1 <= n0 {
		t.Fatalf("since=%s resumed at %d", mid, n1)
	}
	var rep struct {
		Lost        map[string]uint64 `json:"lost"`
		Observation struct {
			OK bool `json:"ok"`
		} `json:"observation"`
		Syscalls []struct {
			Name  string `json:"name"`
			Count uint64 `json:"count"`
		} `json:"syscalls"`
	}
	d.api.want(t, http.StatusOK, "GET", "/jails/"+a.ID+"/report", nil, &rep)
	if !rep.Observation.OK || len(rep.Syscalls) == 0 || rep.Lost["kernel"] != 0 {
		t.Fatalf("report: observation %v, %d syscalls, lost %v", rep.Observation.OK, len(rep.Syscalls), rep.Lost)
	}
}

// sse reads a whole (non-following) event stream.
func sse(tb testing.TB, ctx context.Context, d *daemon, path string) string {
	tb.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+d.addr+path, nil)
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+d.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		tb.Fatalf("GET %s: %s", path, resp.Status)
	}
	var sb strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		sb.WriteString(sc.Text())
		sb.WriteByte('\n')
		if sc.Text() == "event: end" {
			sc.Scan()
			break
		}
	}
	return sb.String()
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// TestNetworkRecordNamesTheProcess makes refused requests from a jail (a
// name outside the default-deny policy through the proxy variables, and a
// direct connection to an address) and checks each is in the network log
// with its verdict; the proxied one names the process that made it (a
// kernel-refused attempt names it only while its socket still exists when
// the record is made: the syscall stream's connect event always does).
func TestNetworkRecordNamesTheProcess(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, nil)
	res := d.shAs(t, j.ID, "", `curl -s -m 5 -o /dev/null -w '%{http_code}' http://not-allowed.example/; echo; python3 -c '
import socket
s = socket.socket()
s.settimeout(5)
print(s.connect_ex(("192.0.2.10", 22)))'`)
	lines := strings.Fields(res.Stdout)
	if len(lines) != 2 || lines[0] != "403" || lines[1] == "0" {
		t.Fatalf("refused requests: %s", &res)
	}
	// The kernel's refusal reaches the record through NFLOG, after the
	// connect has failed: poll for it.
	var body string
	var sawCurl, sawPython bool
	err := waitFor(10*time.Second, func() error {
		body = string(d.api.do(t, "GET", "/jails/"+j.ID+"/network/log", nil).body)
		sawCurl, sawPython = refusedRecords(body)
		if !sawCurl || !sawPython {
			return errors.New("records missing")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("network log lacks the refused requests (curl with its pid %v, direct connection %v):\n%s", sawCurl, sawPython, body)
	}
}

// refusedRecords reports whether a network log holds the refused proxied
// request of curl (with its pid) and the refused direct connection.
func refusedRecords(log string) (sawCurl, sawPython bool) {
	for _, line := range strings.Split(log, "\n") {
		var ev struct {
			Comm    string `json:"comm"`
			Pid     int    `json:"pid"`
			Host    string `json:"host"`
			Dst     string `json:"dst"`
			Verdict string `json:"verdict"`
		}
		if json.Unmarshal([]byte(line), &ev) != nil || ev.Verdict != "block" {
			continue
		}
		if ev.Comm == "curl" && ev.Pid > 0 && ev.Host == "not-allowed.example" {
			sawCurl = true
		}
		if strings.HasPrefix(ev.Dst, "192.0.2.10:22") {
			sawPython = true
		}
	}
	return sawCurl, sawPython
}

// TestEventFileBound floods the record of a jail whose event files are
// bounded at 1 MiB (50 000 stat calls, each naming a path, which are not
// coalesced: about 12 MB of syscall lines): the syscall file stays
// within the bound, the report counts what it left out and says why, the
// other files go on (a later command is in the process record), the jail
// runs on, and once it stops the file counts what it left out.
func TestEventFileBound(t *testing.T) {
	d := shared(t)
	const bound = 1 << 20
	j := d.createJail(t, map[string]any{"tracing": map[string]any{"max_file_bytes": bound}})
	d.mustSh(t, j.ID, "python3 -c 'import os\nfor i in range(50000):\n    try: os.stat(\"/none/%d\" % i)\n    except OSError: pass'")
	d.mustSh(t, j.ID, "bash -c 'exec -a marker-after-flood true'")

	var rep reportObservation
	if err := waitFor(30*time.Second, func() error {
		d.api.want(t, http.StatusOK, "GET", "/jails/"+j.ID+"/report", nil, &rep)
		if rep.Lost["limit"] == 0 {
			return fmt.Errorf("lost %v", rep.Lost)
		}
		return nil
	}); err != nil {
		t.Fatalf("the report does not count the events past the bound: %v", err)
	}
	if rep.Observation.OK || !strings.Contains(rep.Observation.Message, "syscalls.jsonl") || !strings.Contains(rep.Observation.Message, "bound") {
		t.Errorf("observation: %+v", rep.Observation)
	}
	if err := waitFor(30*time.Second, func() error {
		if p := eventFiles(t, d, j.ID)["processes.jsonl"]; !bytes.Contains(p, []byte("marker-after-flood")) {
			return fmt.Errorf("the command after the flood is not in the process record")
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	if got := d.getJail(t, j.ID); got.Status != "running" {
		t.Fatalf("the jail past its bound: %+v", got)
	}
	d.api.want(t, http.StatusOK, "POST", "/jails/"+j.ID+"/stop", nil, nil)
	files := eventFiles(t, d, j.ID)
	if n := len(files["syscalls.jsonl"]); n > bound+200 {
		t.Errorf("syscalls.jsonl holds %d bytes, its bound is %d", n, bound)
	}
	if reported := wholeEventFiles(t, d, j.ID); reported < rep.Lost["limit"] {
		t.Errorf("the files report %d lost events, the report counted %d past the bound", reported, rep.Lost["limit"])
	}
}
