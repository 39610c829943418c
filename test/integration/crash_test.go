package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// crashRounds is how many times TestCrash goes through its scenarios:
// $AGENTJAIL_CRASH_ROUNDS (make soak sets more), else 1.
func crashRounds(t *testing.T) int {
	v := os.Getenv("AGENTJAIL_CRASH_ROUNDS")
	if v == "" {
		return 1
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("AGENTJAIL_CRASH_ROUNDS=%q: want a number of rounds", v)
	}
	return n
}

// TestCrash SIGKILLs the daemon in the middle of what users do most — 20
// creates at once, a streaming exec, a snapshot, a branch of five, a
// terminal session — restarts it on the same data dir each time, and
// checks what the new daemon holds: every jail that was running is
// adopted with its processes, a jail still being made is released, the
// events written before the kill are all there, a snapshot is complete
// and restorable or absent, nothing the dead daemon started is still at
// work; and in the end, nothing of it all is left on the host.
func TestCrash(t *testing.T) {
	requireEnv(t)
	rt := newFaultRuntime(t)
	d := newDaemon(t, "--runtime", rt.path)
	base := baseline(t, d)
	for round := range crashRounds(t) {
		for _, s := range []struct {
			name string
			run  func(t *testing.T, d *daemon, rt *faultRuntime)
		}{
			{"creates", crashDuringCreates},
			{"exec-stream", crashDuringExecStream},
			{"snapshot-before-dump", func(t *testing.T, d *daemon, rt *faultRuntime) { crashDuringSnapshot(t, d, rt, false) }},
			{"snapshot-during-dump", func(t *testing.T, d *daemon, rt *faultRuntime) { crashDuringSnapshot(t, d, rt, true) }},
			{"branch-held", func(t *testing.T, d *daemon, rt *faultRuntime) { crashDuringBranch(t, d, rt, false) }},
			{"branch-finishing", func(t *testing.T, d *daemon, rt *faultRuntime) { crashDuringBranch(t, d, rt, true) }},
			{"terminal", crashDuringTerminal},
		} {
			if !t.Run(fmt.Sprintf("%s-%d", s.name, round), func(t *testing.T) { s.run(t, d, rt) }) {
				return
			}
		}
	}
	d.destroyAll(t)
	expectClean(t, d, base, "jails and snapshots made across daemon crashes")
}

// crashRestart SIGKILLs the daemon and starts a new one on its data dir.
func (d *daemon) crashRestart(t *testing.T) {
	t.Helper()
	d.kill()
	if err := d.restart(); err != nil {
		t.Fatalf("restarting after the kill: %v", err)
	}
}

// checkAfterCrash checks the invariants of a restarted daemon: no jail is
// left half-way (starting or stopping), every running jail answers, the
// jails and snapshots on disk are the listed ones, and no runtime or CRIU
// process of the dead daemon is still at work.
func (d *daemon) checkAfterCrash(t *testing.T) {
	t.Helper()
	var list struct {
		Jails []jailInfo `json:"jails"`
	}
	d.api.want(t, http.StatusOK, "GET", "/jails", nil, &list)
	var ids []string
	for _, j := range list.Jails {
		ids = append(ids, j.ID)
		switch j.Status {
		case "running":
			if out := d.mustSh(t, j.ID, "echo up"); out != "up\n" {
				t.Errorf("jail %s after the crash: %q", j.Name, out)
			}
		case "stopped", "created":
		default:
			t.Errorf("jail %s is %s after the restart (%s)", j.Name, j.Status, j.Error)
		}
	}
	if dirs := dirNames(filepath.Join(d.dir, "jails")); !sameSet(dirs, ids) {
		t.Errorf("jail directories %v, listed jails %v", dirs, ids)
	}
	var snaps struct {
		Snapshots []snapshotInfo `json:"snapshots"`
	}
	d.api.want(t, http.StatusOK, "GET", "/snapshots", nil, &snaps)
	var sids, imgs []string
	for _, s := range snaps.Snapshots {
		sids = append(sids, s.ID)
		imgs = append(imgs, s.ID+".img")
	}
	if dirs := dirNames(filepath.Join(d.dir, "snapshots")); !sameSet(dirs, sids) {
		t.Errorf("snapshot directories %v, listed snapshots %v", dirs, sids)
	}
	if files := dirNames(filepath.Join(d.dir, "pool", "snapshots")); !sameSet(files, imgs) {
		t.Errorf("snapshot images %v, listed snapshots %v", files, sids)
	}
	var helpers []string
	_ = waitFor(10*time.Second, func() error {
		if helpers = helperProcs(d.dir); len(helpers) > 0 {
			return fmt.Errorf("helpers")
		}
		return nil
	})
	if len(helpers) > 0 {
		t.Errorf("processes of the dead daemon are still at work: %q", helpers)
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// destroyAll deletes every jail and snapshot of the daemon.
func (d *daemon) destroyAll(t *testing.T) {
	t.Helper()
	var list struct {
		Jails []jailInfo `json:"jails"`
	}
	d.api.want(t, http.StatusOK, "GET", "/jails", nil, &list)
	for _, j := range list.Jails {
		d.api.want(t, http.StatusNoContent, "DELETE", "/jails/"+j.ID, nil, nil)
	}
	var snaps struct {
		Snapshots []snapshotInfo `json:"snapshots"`
	}
	d.api.want(t, http.StatusOK, "GET", "/snapshots", nil, &snaps)
	for _, s := range snaps.Snapshots {
		d.api.want(t, http.StatusNoContent, "DELETE", "/snapshots/"+s.ID, nil, nil)
	}
}

// crashDuringCreates: 20 creates at once, the daemon killed once five
// have answered. The answered ones are adopted, running, with the pid they
// answered; of the others, each is running (it was made, the answer was
// lost) or gone.
func crashDuringCreates(t *testing.T, d *daemon, _ *faultRuntime) {
	type result struct {
		name string
		j    jailInfo
		ok   bool
	}
	var answered atomic.Int64
	results := make([]result, 20)
	var wg sync.WaitGroup
	for i := range results {
		results[i].name = uniqueName(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := d.api.send("POST", "/jails", map[string]any{"name": results[i].name})
			if err == nil && r.status == http.StatusCreated && json.Unmarshal(r.body, &results[i].j) == nil {
				results[i].ok = true
				answered.Add(1)
			}
		}()
	}
	if err := waitFor(2*time.Minute, func() error {
		if n := answered.Load(); n < 5 {
			return fmt.Errorf("%d creates answered", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	d.kill()
	wg.Wait()
	if err := d.restart(); err != nil {
		t.Fatal(err)
	}
	d.checkAfterCrash(t)
	adopted, made, gone := 0, 0, 0
	for _, r := range results {
		got := d.api.do(t, "GET", "/jails/"+r.name, nil)
		var j jailInfo
		_ = json.Unmarshal(got.body, &j)
		switch {
		case r.ok && (got.status != http.StatusOK || j.Status != "running" || j.Pid != r.j.Pid):
			t.Errorf("jail %s answered 201 (pid %d) before the kill; after it: %s", r.name, r.j.Pid, got)
		case r.ok:
			adopted++
		case got.status == http.StatusOK && j.Status == "running":
			made++
		case got.status == http.StatusNotFound:
			gone++
		default:
			t.Errorf("jail %s, whose create did not answer: %s", r.name, got)
		}
	}
	t.Logf("20 creates, killed after %d answered: %d adopted, %d made without an answer, %d released", answered.Load(), adopted, made, gone)
	d.destroyAll(t)
}

// eventFiles reads a jail's event files.
func eventFiles(t *testing.T, d *daemon, id string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	dir := filepath.Join(d.dir, "jails", id, "events")
	for _, name := range dirNames(dir) {
		if strings.HasSuffix(name, ".jsonl") {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			out[name] = b
		}
	}
	return out
}

// waitRecorded waits until the jail's process events hold s.
func waitRecorded(t *testing.T, d *daemon, id, s string) {
	t.Helper()
	path := filepath.Join(d.dir, "jails", id, "events", "processes.jsonl")
	if err := waitFor(20*time.Second, func() error {
		if b, _ := os.ReadFile(path); !bytes.Contains(b, []byte(s)) {
			return fmt.Errorf("%s does not record %q", path, s)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// crashDuringExecStream: the daemon is killed while a command streams
// its output. The jail is adopted with its pid; the streaming command,
// whose client went away, is ended by the jail's init; the event files
// hold everything written before the kill, whole lines only, and go on.
func crashDuringExecStream(t *testing.T, d *daemon, _ *faultRuntime) {
	j := d.createJail(t, nil)
	d.mustSh(t, j.ID, "echo marker-before-crash")
	waitRecorded(t, d, j.ID, "marker-before-crash")
	before := eventFiles(t, d, j.ID)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		body, _ := json.Marshal(execReq{Cmd: []string{"sh", "-c", "for i in $(seq 1000); do echo line-$i; sleep 0.1; done"}})
		req, _ := http.NewRequestWithContext(ctx, "POST", d.api.base+"/jails/"+j.ID+"/exec/stream", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+d.token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	for seen := 0; seen < 3; {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the stream ended before the kill")
			}
			if strings.Contains(l, "line-") {
				seen++
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the stream gives no output")
		}
	}
	d.crashRestart(t)
	for range lines { // the stream ends with the daemon
	}
	d.checkAfterCrash(t)
	if got := d.getJail(t, j.ID); got.Status != "running" || got.Pid != j.Pid {
		t.Fatalf("the jail after the crash: %s pid %d, want running pid %d", got.Status, got.Pid, j.Pid)
	}
	d.waitSh(t, j.ID, "! pgrep -f 'echo line-[$]i'", 20*time.Second, "the streaming command outlived its client")

	d.mustSh(t, j.ID, "echo marker-after-crash")
	waitRecorded(t, d, j.ID, "marker-after-crash")
	after := eventFiles(t, d, j.ID)
	for name, old := range before {
		// What was read may end in a line being written then.
		old = old[:bytes.LastIndexByte(old, '\n')+1]
		now := after[name]
		if !bytes.HasPrefix(now, old) {
			t.Errorf("%s lost what it held before the crash (%d bytes then, %d now)", name, len(old), len(now))
		}
		for i, l := range bytes.Split(bytes.TrimSuffix(now, []byte("\n")), []byte("\n")) {
			if len(l) > 0 && !json.Valid(l) {
				t.Errorf("%s line %d is not whole: %q", name, i+1, l)
				break
			}
		}
	}
}

// criuAtWork reports whether a CRIU process works for the daemon: a child
// of its runtime (whose command line names the data dir).
func criuAtWork(d *daemon) bool {
	runtimes := map[string]bool{}
	for _, h := range helperProcs(d.dir) {
		pid, _, _ := strings.Cut(h, " ")
		runtimes[pid] = true
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		comm, err := os.ReadFile("/proc/" + e.Name() + "/comm")
		if err != nil || strings.TrimSpace(string(comm)) != "criu" {
			continue
		}
		if st, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil {
			s := string(st)
			if f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]); len(f) > 1 && runtimes[f[1]] {
				return true
			}
		}
	}
	return false
}

// crashDuringSnapshot: the daemon is killed while a snapshot of a busy
// jail is being taken, before the runtime starts the dump (during, with
// duringDump). The dump the dead daemon started finishes without it. The
// new daemon waits for it, and then the snapshot is gone (it was never
// complete), the jail runs on, neither frozen nor its disk, and the next
// snapshot is taken and restores.
func crashDuringSnapshot(t *testing.T, d *daemon, rt *faultRuntime, duringDump bool) {
	j := d.createJail(t, nil)
	if res := d.shAs(t, j.ID, "", counterScript); res.ExitCode != 0 {
		t.Fatalf("starting the counter: %s", &res)
	}
	d.waitCounting(t, j.ID, 0)
	rt.set(t, "checkpoint", "hold")
	answered := make(chan *response, 1)
	go func() {
		r, _ := d.api.send("POST", "/jails/"+j.ID+"/snapshot", map[string]any{})
		answered <- r
	}()
	if err := waitFor(time.Minute, func() error {
		if !rt.held("checkpoint") {
			return fmt.Errorf("the checkpoint has not reached the runtime")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if duringDump {
		rt.clear(t, "checkpoint")
		if err := waitFor(30*time.Second, func() error {
			if !criuAtWork(d) {
				return fmt.Errorf("no CRIU at work")
			}
			return nil
		}); err != nil {
			t.Logf("the dump ended before it was seen: %v", err)
		}
		d.kill()
	} else {
		d.kill()
		rt.clear(t, "checkpoint") // the runtime goes on, without the daemon
	}
	if r := <-answered; r != nil {
		t.Logf("the snapshot request answered before the kill: %s", r)
	}
	if err := d.restart(); err != nil {
		t.Fatal(err)
	}
	d.checkAfterCrash(t)
	var snaps struct {
		Snapshots []snapshotInfo `json:"snapshots"`
	}
	d.api.want(t, http.StatusOK, "GET", "/jails/"+j.ID+"/snapshots", nil, &snaps)
	if len(snaps.Snapshots) != 0 {
		t.Errorf("the interrupted snapshot is listed: %+v", snaps.Snapshots)
	}
	n := d.waitCounting(t, j.ID, 0)
	d.waitCounting(t, j.ID, n)
	d.mustSh(t, j.ID, "echo written > /workspace/after-crash")
	s := d.takeSnapshot(t, j.ID, "full")
	r := d.restoreSnapshot(t, s.ID)
	d.waitCounting(t, r.ID, d.waitCounting(t, r.ID, 0))
}

// restoresAtWork counts the runtime processes restoring jails for d.
func restoresAtWork(d *daemon) int {
	n := 0
	for _, h := range helperProcs(d.dir) {
		if strings.Contains(h, " restore ") {
			n++
		}
	}
	return n
}

// crashDuringBranch: the daemon is killed while a branch of five is being
// made: with every restore held before the runtime starts (all five are
// released by the new daemon), or once the first branch runs (each is
// adopted running, or released).
func crashDuringBranch(t *testing.T, d *daemon, rt *faultRuntime, finishing bool) {
	j := d.createJail(t, nil)
	if res := d.shAs(t, j.ID, "", counterScript); res.ExitCode != 0 {
		t.Fatalf("starting the counter: %s", &res)
	}
	d.waitCounting(t, j.ID, 0)
	snap := d.takeSnapshot(t, j.ID, "full")
	names := make([]string, 5)
	for i := range names {
		names[i] = uniqueName(t)
	}
	rt.set(t, "restore", "hold")
	go d.api.send("POST", "/snapshots/"+snap.ID+"/branch", map[string]any{"names": names})
	if err := waitFor(time.Minute, func() error {
		if n := restoresAtWork(d); n < 5 {
			return fmt.Errorf("%d restores reached the runtime", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if finishing {
		rt.clear(t, "restore")
		if err := waitFor(time.Minute, func() error {
			for _, n := range names {
				if j := d.api.do(t, "GET", "/jails/"+n, nil); j.status == http.StatusOK && strings.Contains(string(j.body), `"status":"running"`) {
					return nil
				}
			}
			return fmt.Errorf("no branch runs yet")
		}); err != nil {
			t.Fatal(err)
		}
	}
	d.crashRestart(t)
	rt.clear(t, "restore")
	d.checkAfterCrash(t)
	adopted := 0
	for _, n := range names {
		r := d.api.do(t, "GET", "/jails/"+n, nil)
		switch {
		case r.status == http.StatusNotFound:
		case r.status == http.StatusOK && strings.Contains(string(r.body), `"status":"running"`) && finishing:
			adopted++
			d.waitCounting(t, n, d.waitCounting(t, n, 0))
		default:
			t.Errorf("branch %s after the crash: %s", n, r)
		}
	}
	t.Logf("a branch of 5 killed %s: %d adopted, %d released", map[bool]string{false: "with every restore held", true: "once one ran"}[finishing], adopted, 5-adopted)
	d.destroyAll(t)
}

// crashDuringTerminal: the daemon is killed while a terminal session is
// attached. The session lives on in the jail: the new daemon lists it, a
// client attaches to it and types.
func crashDuringTerminal(t *testing.T, d *daemon, _ *faultRuntime) {
	j := d.createJail(t, nil)
	term := dialTerm(t, d, j.ID, url.Values{"cmd": {"sh"}}).start()
	term.send(t, "echo before-$((6*7))\r")
	term.waitText(t, "before-42")
	d.crashRestart(t)
	d.checkAfterCrash(t)
	var list struct {
		Terminals []termInfo `json:"terminals"`
	}
	if err := waitFor(10*time.Second, func() error {
		d.api.want(t, http.StatusOK, "GET", "/jails/"+j.ID+"/terminals", nil, &list)
		if len(list.Terminals) == 1 && list.Terminals[0].ID == term.session.ID {
			return nil
		}
		return fmt.Errorf("terminals: %+v", list.Terminals)
	}); err != nil {
		t.Fatal(err)
	}
	re := dialTerm(t, d, j.ID, url.Values{"session": {term.session.ID}}).start()
	re.waitText(t, "before-42")
	re.send(t, "echo after-$((6*7))\r")
	re.waitText(t, "after-42")
	re.send(t, "exit 7\r")
	if code, _ := re.waitExit(t); code != 7 {
		t.Errorf("the terminal's shell after the crash: exit %d", code)
	}
}
