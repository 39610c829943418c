package integration

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The wire types of snapshots, spelled out from the documented contract.

type snapshotInfo struct {
	ID           string  `json:"id"`
	Name         string  `json:"name"`
	JailID       string  `json:"jail_id"`
	Mode         string  `json:"mode"`
	DiskBytes    int64   `json:"disk_bytes"`
	ProcessBytes int64   `json:"process_bytes"`
	DurationMs   float64 `json:"duration_ms"`
	FrozenMs     float64 `json:"frozen_ms"`
}

type lineage struct {
	Kind string `json:"kind"`
	ID   string `json:"id"`
}

type fsChange struct {
	Path string `json:"path"`
	Kind string `json:"kind"`
	Type string `json:"type"`
	Diff string `json:"diff"`
}

type fsDiff struct {
	Changes []fsChange `json:"changes"`
}

// Jail processes run as the jail's user in their own session (setsid -f):
// CRIU cannot restore a process whose session leader exited while it has
// children of its own.
const counterScript = `setsid -f sh -c 'i=0; while :; do i=$((i+1)); echo $i > /workspace/count; sleep 0.1; done' >/dev/null 2>&1 </dev/null`

func snapJail(t *testing.T, d *daemon) jailInfo {
	t.Helper()
	return d.createJail(t, nil)
}

func (d *daemon) takeSnapshot(t testing.TB, id, mode string) snapshotInfo {
	t.Helper()
	var s snapshotInfo
	d.api.want(t, http.StatusCreated, "POST", "/jails/"+id+"/snapshot", map[string]any{"mode": mode}, &s)
	t.Cleanup(func() {
		if r, err := d.api.send("DELETE", "/snapshots/"+s.ID, nil); err == nil && r.status != http.StatusNoContent && r.status != http.StatusNotFound {
			t.Errorf("DELETE /snapshots/%s: %s", s.ID, r)
		}
	})
	return s
}

func (d *daemon) restoreSnapshot(t testing.TB, sid string) jailInfo {
	t.Helper()
	var j jailInfo
	d.api.want(t, http.StatusCreated, "POST", "/snapshots/"+sid+"/restore", map[string]any{"name": uniqueName(t)}, &j)
	t.Cleanup(func() { d.destroy(t, j.ID) })
	return j
}

func (d *daemon) branch(t testing.TB, sid string, n int) []jailInfo {
	t.Helper()
	var out struct {
		Jails []jailInfo `json:"jails"`
	}
	d.api.want(t, http.StatusCreated, "POST", "/snapshots/"+sid+"/branch", map[string]any{"count": n, "name_prefix": uniqueName(t)}, &out)
	for _, j := range out.Jails {
		t.Cleanup(func() { d.destroy(t, j.ID) })
	}
	if len(out.Jails) != n {
		t.Fatalf("branch: want %d jails, got %d", n, len(out.Jails))
	}
	return out.Jails
}

// count reads the counter of a jail (the writer truncates the file before
// each number, so a read can find it empty: an error then).
func (d *daemon) count(t testing.TB, id string) (int, error) {
	t.Helper()
	out := d.shAs(t, id, "root", "cat /workspace/count")
	n, err := strconv.Atoi(strings.TrimSpace(out.Stdout))
	if err != nil {
		return 0, fmt.Errorf("jail %s: counter %q: %v", id, out.Stdout, err)
	}
	return n, nil
}

// waitCounting waits until the jail's counter exceeds after and returns it.
func (d *daemon) waitCounting(t testing.TB, id string, after int) int {
	t.Helper()
	var n int
	err := waitFor(10*time.Second, func() error {
		var err error
		if n, err = d.count(t, id); err != nil {
			return err
		}
		if n > after {
			return nil
		}
		return fmt.Errorf("counter of %s stays at %d", id, n)
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func changed(d fsDiff, kind, path string) bool {
	for _, c := range d.Changes {
		if c.Kind == kind && c.Path == path {
			return true
		}
	}
	return false
}

func TestSnapshotCounterRestoreAndBranches(t *testing.T) {
	d := shared(t)
	j := snapJail(t, d)
	if res := d.shAs(t, j.ID, "", counterScript); res.ExitCode != 0 {
		t.Fatalf("starting the counter: %s", &res)
	}
	before := d.waitCounting(t, j.ID, 3)
	snap := d.takeSnapshot(t, j.ID, "full")
	if snap.Mode != "full" || snap.ProcessBytes == 0 || snap.DiskBytes == 0 {
		t.Fatalf("snapshot record: %+v", snap)
	}
	t.Logf("snapshot: %.0f ms, frozen %.0f ms, %d bytes of process images", snap.DurationMs, snap.FrozenMs, snap.ProcessBytes)

	r := d.restoreSnapshot(t, snap.ID)
	if got := d.getJail(t, r.ID); got.Status != "running" {
		t.Fatalf("restored jail: %+v", got)
	}
	var parent struct {
		Parent *lineage `json:"parent"`
	}
	d.api.want(t, http.StatusOK, "GET", "/jails/"+r.ID, nil, &parent)
	if parent.Parent == nil || parent.Parent.Kind != "snapshot" || parent.Parent.ID != snap.ID {
		t.Fatalf("restored jail's parent: %+v", parent.Parent)
	}
	first := d.waitCounting(t, r.ID, 0)
	if first < before {
		t.Fatalf("restored counter %d is below the value before the snapshot (%d): it did not continue", first, before)
	}
	d.waitCounting(t, r.ID, first)

	// Three branches count on their own while the original keeps counting.
	bs := d.branch(t, snap.ID, 3)
	orig := d.waitCounting(t, j.ID, 0)
	for _, b := range bs {
		d.waitCounting(t, b.ID, d.waitCounting(t, b.ID, 0))
	}
	d.waitCounting(t, j.ID, orig)
	d.mustSh(t, bs[0].ID, "echo only-here > /workspace/marker")
	for _, other := range []string{bs[1].ID, bs[2].ID, j.ID} {
		if res := d.shAs(t, other, "", "test ! -e /workspace/marker"); res.ExitCode != 0 {
			t.Fatalf("the marker written in branch %s shows in %s", bs[0].ID, other)
		}
	}
	var df fsDiff
	d.api.want(t, http.StatusOK, "GET", "/diff?from="+bs[1].ID+"&to="+bs[0].ID+"&text=true", nil, &df)
	for _, c := range df.Changes {
		switch {
		case c.Path == "/workspace/marker" && c.Kind == "added":
			if !strings.Contains(c.Diff, "+only-here") {
				t.Errorf("text diff of the marker: %q", c.Diff)
			}
		case c.Path == "/workspace/count" && c.Kind == "modified":
		default:
			t.Errorf("unexpected change between branches: %+v", c)
		}
	}
	if !changed(df, "added", "/workspace/marker") {
		t.Fatalf("diff between branches lacks the marker: %+v", df)
	}
	var sd fsDiff
	d.api.want(t, http.StatusOK, "GET", "/snapshots/"+snap.ID+"/diff", nil, &sd)
	if changed(sd, "added", "/workspace/marker") {
		t.Fatalf("the original's diff shows a branch's marker: %+v", sd)
	}
}

func TestSnapshotPythonStateFdAndChildren(t *testing.T) {
	d := shared(t)
	j := snapJail(t, d)
	script := `
import os, time
log = open("/workspace/log", "a")
child = os.fork()
if child == 0:
    while True:
        time.sleep(0.05)
state = {}
i = 0
while True:
    i += 1
    state[i] = i * i
    log.write("%d %d %d\n" % (len(state), sum(state.values()), child))
    log.flush()
    time.sleep(0.05)
`
	d.putFile(t, j.ID, "/workspace/state.py", []byte(script))
	if res := d.shAs(t, j.ID, "", `setsid -f python3 /workspace/state.py >/dev/null 2>&1 </dev/null`); res.ExitCode != 0 {
		t.Fatalf("starting python: %s", &res)
	}
	if err := waitFor(10*time.Second, func() error {
		out := d.shAs(t, j.ID, "root", "wc -l < /workspace/log")
		if n, _ := strconv.Atoi(strings.TrimSpace(out.Stdout)); n < 5 {
			return fmt.Errorf("log has %q lines", out.Stdout)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	snap := d.takeSnapshot(t, j.ID, "full")
	r := d.restoreSnapshot(t, snap.ID)
	// The restored process appends to the same (copied) file through its
	// restored descriptor: every line continues the state exactly.
	var lines []string
	if err := waitFor(10*time.Second, func() error {
		out := d.mustSh(t, r.ID, "cat /workspace/log")
		lines = strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) < 10 {
			return fmt.Errorf("restored log has %d lines", len(lines))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	child := ""
	for i, l := range lines {
		f := strings.Fields(l)
		n, _ := strconv.Atoi(f[0])
		sum, _ := strconv.Atoi(f[1])
		if n != i+1 || sum != n*(n+1)*(2*n+1)/6 {
			t.Fatalf("line %d of the restored log is %q: the state did not continue", i+1, l)
		}
		if child == "" {
			child = f[2]
		} else if f[2] != child {
			t.Fatalf("child pid changed in line %d: %q", i+1, l)
		}
	}
	if res := d.shAs(t, r.ID, "root", "kill -0 "+child); res.ExitCode != 0 {
		t.Fatalf("the child process (pid %s) did not survive the restore: %s", child, &res)
	}
}

func TestSnapshotUnderLoadIsConsistent(t *testing.T) {
	d := shared(t)
	j := snapJail(t, d)
	// A busy writer: every number once, in order, as fast as it can.
	if res := d.shAs(t, j.ID, "", `setsid -f sh -c 'i=0; while :; do i=$((i+1)); echo $i >> /workspace/seq; done' >/dev/null 2>&1 </dev/null`); res.ExitCode != 0 {
		t.Fatalf("starting the writer: %s", &res)
	}
	d.waitSh(t, j.ID, "test -s /workspace/seq", 10*time.Second, "the writer has not written yet")
	snap := d.takeSnapshot(t, j.ID, "full")
	r := d.restoreSnapshot(t, snap.ID)
	if err := waitFor(10*time.Second, func() error {
		// The restored writer carries on from its own number: the file
		// has neither a gap nor a repeat where the snapshot was taken.
		out := d.mustSh(t, r.ID, `awk 'NR != $1 { print "line " NR ": " $0; exit 1 } END { print NR }' /workspace/seq`)
		n, err := strconv.Atoi(strings.TrimSpace(out))
		if err != nil {
			t.Fatalf("restored file disagrees with the restored process: %s", out)
		}
		if n < 100 {
			return fmt.Errorf("only %d lines", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestSnapshotWhileSpawning snapshots a jail whose shell starts programs
// in a tight loop. dash starts each with vfork(), and the child tries the
// directories of $PATH in turn (sleep is in the fourth), so the freeze
// often catches the shell waiting for a child that has not exec'd yet;
// every snapshot must still succeed, and the restored loop carry on.
func TestSnapshotWhileSpawning(t *testing.T) {
	d := shared(t)
	j := snapJail(t, d)
	loop := `setsid -f sh -c 'i=0; while :; do sleep 0; i=$((i+1)); echo $i > /workspace/spawns; done' >/dev/null 2>&1 </dev/null`
	if res := d.shAs(t, j.ID, "", loop); res.ExitCode != 0 {
		t.Fatalf("starting the loop: %s", &res)
	}
	d.waitSh(t, j.ID, "test -s /workspace/spawns", 10*time.Second, "the loop has not started a program yet")
	var snap snapshotInfo
	for range 8 {
		snap = d.takeSnapshot(t, j.ID, "full")
	}
	r := d.restoreSnapshot(t, snap.ID)
	spawns := func() int {
		n, _ := strconv.Atoi(strings.TrimSpace(d.shAs(t, r.ID, "root", "cat /workspace/spawns").Stdout))
		return n
	}
	first := spawns()
	d.waitSh(t, r.ID, fmt.Sprintf(`test "$(cat /workspace/spawns)" -gt %d`, first+10), 10*time.Second, "the restored loop does not go on")
}

// TestSnapshotAcrossDaemonUpgrade: a jail started by one daemon binary is
// snapshotted and restored by another (an upgrade, with the jail running
// through it), and a snapshot taken before the upgrade still restores.
// Both restored jails run the init binary their processes were dumped
// from.
func TestSnapshotAcrossDaemonUpgrade(t *testing.T) {
	d := newDaemon(t)
	j := d.createJail(t, nil)
	if res := d.shAs(t, j.ID, "", counterScript); res.ExitCode != 0 {
		t.Fatalf("starting the counter: %s", &res)
	}
	before := d.takeSnapshot(t, j.ID, "full")
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	// The upgrade: a binary with other contents (bytes after the ELF
	// image change its digest, not its code).
	data, err := os.ReadFile(binPath)
	if err != nil {
		t.Fatal(err)
	}
	d.bin = filepath.Join(t.TempDir(), "agentjail")
	if err := os.WriteFile(d.bin, append(data, []byte("upgrade")...), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := d.restart(); err != nil {
		t.Fatal(err)
	}
	n := d.waitCounting(t, j.ID, 0)
	after := d.takeSnapshot(t, j.ID, "full")
	for _, s := range []snapshotInfo{before, after} {
		r := d.restoreSnapshot(t, s.ID)
		d.waitCounting(t, r.ID, d.waitCounting(t, r.ID, 0))
	}
	d.waitCounting(t, j.ID, n)
}

// TestSnapshotRestoredRecord: a restored jail's record starts with the
// processes the restore brought back (op "restored", parents first: init,
// then the counter's shell with its command line, user and directory) and
// holds nothing of what CRIU did in the jail's cgroup to restore them.
func TestSnapshotRestoredRecord(t *testing.T) {
	d := shared(t)
	j := snapJail(t, d)
	if res := d.shAs(t, j.ID, "", "cd /tmp && "+counterScript); res.ExitCode != 0 {
		t.Fatalf("starting the counter: %s", &res)
	}
	d.waitCounting(t, j.ID, 0)
	snap := d.takeSnapshot(t, j.ID, "full")
	r := d.restoreSnapshot(t, snap.ID)
	d.waitCounting(t, r.ID, d.waitCounting(t, r.ID, 0))
	stopJail(t, d, r.ID)

	procs := readEvents(t, d, r.ID, "processes.jsonl")
	if len(procs) == 0 || procs[0].Op != "restored" || procs[0].Pid != 1 || procs[0].Exe != "/.agentjail/agentjail" {
		t.Fatalf("the record does not start with init restored: %+v", procs[:min(len(procs), 3)])
	}
	seen := map[int]bool{}
	var shell *procEvent
	for i := range procs {
		ev := &procs[i]
		if ev.Op != "restored" {
			break
		}
		if ev.Pid != 1 && !seen[ev.Ppid] {
			t.Errorf("restored pid %d comes before its parent %d", ev.Pid, ev.Ppid)
		}
		seen[ev.Pid] = true
		if ev.Comm == "sh" && len(ev.Argv) == 3 && strings.Contains(ev.Argv[2], "/workspace/count") {
			shell = ev
		}
	}
	if shell == nil || shell.Exe != "/usr/bin/dash" || shell.Cwd != "/tmp" || shell.UID != 1000 {
		t.Fatalf("the counter's shell is not among the restored processes as it ran: %+v", shell)
	}
	for _, file := range []string{"processes.jsonl", "syscalls.jsonl", "filesystem.jsonl"} {
		for _, ev := range readEvents(t, d, r.ID, file) {
			if strings.HasPrefix(ev.Comm, "criu") || strings.Contains(ev.Path, ".criu") {
				t.Fatalf("%s holds CRIU's doing: %+v", file, ev)
			}
		}
	}
}

// TestSnapshotBranchServices: in branched jails the file API and terminal
// sessions work as in any jail, each branch on its own files, and a file
// written before the snapshot is in every branch.
func TestSnapshotBranchServices(t *testing.T) {
	d := shared(t)
	j := snapJail(t, d)
	if res := d.shAs(t, j.ID, "", counterScript); res.ExitCode != 0 {
		t.Fatalf("starting the counter: %s", &res)
	}
	d.putFile(t, j.ID, "/workspace/before.txt", []byte("before the snapshot"))
	snap := d.takeSnapshot(t, j.ID, "full")
	bs := d.branch(t, snap.ID, 2)
	for i, b := range bs {
		base := "/jails/" + b.ID + "/files/workspace/"
		if r := d.api.want(t, http.StatusOK, "GET", base+"before.txt", nil, nil); string(r.body) != "before the snapshot" {
			t.Fatalf("branch %d: before.txt: %s", i, r)
		}
		d.putFile(t, b.ID, "/workspace/mine.txt", []byte(b.ID))
		term := dialTerm(t, d, b.ID, url.Values{"cmd": {"sh"}}).start()
		term.send(t, "cat /workspace/mine.txt; echo; echo sum-$((40+2))\r")
		term.waitText(t, b.ID)
		term.waitText(t, "sum-42")
		term.send(t, "exit 5\r")
		if code, _ := term.waitExit(t); code != 5 {
			t.Fatalf("branch %d: terminal shell exit %d", i, code)
		}
	}
	if r := d.api.want(t, http.StatusOK, "GET", "/jails/"+bs[0].ID+"/files/workspace/mine.txt", nil, nil); string(r.body) != bs[0].ID {
		t.Fatalf("branch 0 sees another branch's file: %s", r)
	}
	if r := d.api.do(t, "GET", "/jails/"+j.ID+"/files/workspace/mine.txt", nil); r.status != http.StatusNotFound {
		t.Fatalf("the original sees a branch's file: %s", r)
	}
}

// TestSnapshotWithoutCRIU: a daemon without a working CRIU (here one
// given that is not CRIU) says why in /health, answers a process snapshot
// with 501 and that reason, and still takes, restores and deletes
// filesystem-only snapshots.
func TestSnapshotWithoutCRIU(t *testing.T) {
	d := newDaemon(t, "--criu", "/bin/false")
	var h struct {
		Checks map[string]struct {
			OK      bool   `json:"ok"`
			Message string `json:"message"`
		} `json:"checks"`
	}
	d.api.want(t, http.StatusOK, "GET", "/health", nil, &h)
	ck, ok := h.Checks["checkpoint"]
	if !ok || ck.OK || !strings.Contains(ck.Message, "/bin/false") {
		t.Fatalf("/health checkpoint check: %+v", h.Checks)
	}
	j := d.createJail(t, nil)
	r := d.api.do(t, "POST", "/jails/"+j.ID+"/snapshot", map[string]any{})
	if r.status != http.StatusNotImplemented || !strings.Contains(r.errorMessage(), "/bin/false") {
		t.Fatalf("process snapshot without CRIU: want 501 with the reason, got %s", r)
	}
	d.putFile(t, j.ID, "/workspace/kept.txt", []byte("kept"))
	s := d.takeSnapshot(t, j.ID, "fs")
	rj := d.restoreSnapshot(t, s.ID)
	if out := d.mustSh(t, rj.ID, "cat /workspace/kept.txt"); out != "kept" {
		t.Fatalf("restored fs-only snapshot: %q", out)
	}
}

func TestSnapshotUndumpableFailsAndJailRuns(t *testing.T) {
	d := shared(t)
	j := snapJail(t, d)
	if res := d.shAs(t, j.ID, "", counterScript); res.ExitCode != 0 {
		t.Fatalf("starting the counter: %s", &res)
	}
	// A process already traced by another (strace): CRIU cannot seize it.
	holder := `setsid -f strace -o /dev/null sleep 3600 >/dev/null 2>&1 </dev/null`
	if res := d.shAs(t, j.ID, "", holder); res.ExitCode != 0 {
		t.Fatalf("starting the traced process: %s", &res)
	}
	d.waitSh(t, j.ID, "pgrep -f '^sleep 3600$'", 10*time.Second, "traced sleep not running yet")
	before := d.waitCounting(t, j.ID, 0)
	r := d.api.do(t, "POST", "/jails/"+j.ID+"/snapshot", map[string]any{})
	if r.status != http.StatusUnprocessableEntity || !strings.Contains(r.errorMessage(), "pid ") {
		t.Fatalf("want 422 naming the process, got %s", r)
	}
	t.Logf("error: %s", r.errorMessage())
	if got := d.getJail(t, j.ID); got.Status != "running" {
		t.Fatalf("jail after a failed snapshot: %+v", got)
	}
	d.waitCounting(t, j.ID, before)
}

// TestSnapshotFailingDumpLeavesNoDiskCopy makes CRIU fail after the action
// script started copying the jail's disk beside the dump: a deleted file
// larger than CRIU saves of deleted files (1 MiB), held open, fails the
// dump of the process's files, which CRIU dumps after it started the
// script at network-lock. The snapshot fails with a 422 naming the
// process; CRIU waited for the copy, so the daemon's clean-up finds it and
// nothing of the snapshot stays (no disk copy in the pool, no snapshot
// directory); the jail's disk is thawed and takes writes.
func TestSnapshotFailingDumpLeavesNoDiskCopy(t *testing.T) {
	d := shared(t)
	j := snapJail(t, d)
	holder := `setsid -f python3 -c 'import os, time
f = open("/workspace/big", "wb")
f.write(os.urandom(4 << 20))
f.flush()
os.unlink("/workspace/big")
time.sleep(3600)' >/dev/null 2>&1 </dev/null`
	if res := d.shAs(t, j.ID, "", holder); res.ExitCode != 0 {
		t.Fatalf("starting the holder of a deleted file: %s", &res)
	}
	d.waitSh(t, j.ID, "test ! -e /workspace/big && pgrep -f time.sleep", 10*time.Second, "deleted file not held yet")
	dirs := []string{filepath.Join(d.dir, "pool", "snapshots"), filepath.Join(d.dir, "snapshots")}
	var before [][]string
	for _, dir := range dirs {
		before = append(before, dirNames(dir))
	}
	r := d.api.do(t, "POST", "/jails/"+j.ID+"/snapshot", map[string]any{})
	if r.status != http.StatusUnprocessableEntity || !strings.Contains(r.errorMessage(), "ghost") {
		t.Fatalf("want 422 about the deleted file CRIU cannot save, got %s", r)
	}
	t.Logf("error: %s", r.errorMessage())
	for i, dir := range dirs {
		if after := dirNames(dir); strings.Join(after, " ") != strings.Join(before[i], " ") {
			t.Errorf("%s held %v before the failed snapshot and %v after", dir, before[i], after)
		}
	}
	res := d.exec(t, j.ID, execReq{Cmd: []string{"sh", "-c", "echo written > /workspace/after && cat /workspace/after"}, TimeoutMs: 10_000})
	if res.ExitCode != 0 || res.Stdout != "written\n" {
		t.Fatalf("writing to the jail's disk after the failed snapshot: %s", &res)
	}
}

func TestSnapshotFSOnly(t *testing.T) {
	d := shared(t)
	j := snapJail(t, d)
	d.mustSh(t, j.ID, "echo one > /workspace/a; mkdir /workspace/dir; echo x > /workspace/dir/f")
	snap := d.takeSnapshot(t, j.ID, "fs")
	if snap.ProcessBytes != 0 {
		t.Fatalf("fs snapshot has process images: %+v", snap)
	}
	d.mustSh(t, j.ID, "echo two >> /workspace/a; rm -r /workspace/dir; echo b > /workspace/b")
	var df fsDiff
	d.api.want(t, http.StatusOK, "GET", "/snapshots/"+snap.ID+"/diff", nil, &df)
	want := []fsChange{{Path: "/workspace/a", Kind: "modified"}, {Path: "/workspace/b", Kind: "added"}, {Path: "/workspace/dir", Kind: "deleted"}}
	if len(df.Changes) != len(want) {
		t.Fatalf("diff: want %v, got %+v", want, df.Changes)
	}
	for i, w := range want {
		if df.Changes[i].Path != w.Path || df.Changes[i].Kind != w.Kind {
			t.Fatalf("diff change %d: want %v, got %+v", i, w, df.Changes[i])
		}
	}
	r := d.restoreSnapshot(t, snap.ID)
	if out := d.mustSh(t, r.ID, "cat /workspace/a /workspace/dir/f; test ! -e /workspace/b && echo nob"); out != "one\nx\nnob\n" {
		t.Fatalf("restored fs snapshot holds %q", out)
	}
}

func TestSnapshotDeleteLeavesNothing(t *testing.T) {
	d := newDaemon(t)
	j := snapJail(t, d)
	d.shAs(t, j.ID, "", counterScript)
	d.waitCounting(t, j.ID, 0)
	var s snapshotInfo
	d.api.want(t, http.StatusCreated, "POST", "/jails/"+j.ID+"/snapshot", map[string]any{}, &s)
	var r jailInfo
	d.api.want(t, http.StatusCreated, "POST", "/snapshots/"+s.ID+"/restore", map[string]any{}, &r)
	// The snapshot survives its jail.
	d.api.want(t, http.StatusNoContent, "DELETE", "/jails/"+j.ID, nil, nil)
	d.api.want(t, http.StatusOK, "GET", "/snapshots/"+s.ID, nil, nil)
	d.api.want(t, http.StatusNoContent, "DELETE", "/jails/"+r.ID, nil, nil)
	d.api.want(t, http.StatusNoContent, "DELETE", "/snapshots/"+s.ID, nil, nil)
	d.api.want(t, http.StatusNotFound, "GET", "/snapshots/"+s.ID, nil, nil)
	for _, dir := range []string{filepath.Join(d.dir, "snapshots"), filepath.Join(d.dir, "pool", "snapshots"), filepath.Join(d.dir, "jails")} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 0 {
			t.Errorf("%s still holds %d entries (%s)", dir, len(entries), entries[0].Name())
		}
	}
	// The pool and its warm disks stay while the daemon runs; nothing of
	// the jails or the snapshot may.
	for _, l := range d.leftovers() {
		if strings.Contains(l, "/jails/") || strings.Contains(l, "snapshots") || strings.Contains(l, "snapmnt") ||
			strings.HasPrefix(l, "netns ") || strings.HasPrefix(l, "cgroup ") || strings.HasPrefix(l, "process ") {
			t.Errorf("left behind: %s", l)
		}
	}
}
