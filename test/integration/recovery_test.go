package integration

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRecovery SIGKILLs the daemon while jails run, restarts it on the
// same data dir, and checks that running jails are re-adopted with their
// processes and their network policy, stopped and created ones stay so, a
// jail whose init died meanwhile is not reported running, and destroying
// them all afterwards leaves nothing on the host.
func TestRecovery(t *testing.T) {
	d := newDaemon(t)
	base := baseline(t, d)
	running := d.createJail(t, nil)
	d.putFile(t, running.ID, "/workspace/state", []byte("before the crash"))
	sleepPid := strings.TrimSpace(d.mustSh(t, running.ID, "nohup sleep 3000 >/dev/null 2>&1 & echo $!"))
	if _, err := strconv.Atoi(sleepPid); err != nil {
		t.Fatalf("the background sleep's pid: %q", sleepPid)
	}
	stopped := d.createJail(t, nil)
	d.api.want(t, http.StatusOK, "POST", "/jails/"+stopped.ID+"/stop", map[string]any{"timeout_s": 0}, nil)
	created := d.createJail(t, map[string]any{"start": false})
	doomed := d.createJail(t, nil)

	d.kill()
	// The jails outlive the daemon.
	if err := syscall.Kill(running.Pid, 0); err != nil {
		t.Fatalf("the running jail's init (pid %d) died with the daemon: %v", running.Pid, err)
	}
	// One jail dies while the daemon is down.
	if doomed.Pid == 0 {
		t.Fatalf("a running jail without a pid: %+v", doomed)
	}
	if err := syscall.Kill(doomed.Pid, syscall.SIGKILL); err != nil {
		t.Fatalf("killing the doomed jail's init: %v", err)
	}

	if err := d.restart(); err != nil {
		t.Fatalf("restarting the daemon: %v", err)
	}
	want := map[string]string{running.ID: "running", stopped.ID: "stopped", created.ID: "created"}
	for id, status := range want {
		if got := d.getJail(t, id); got.Status != status {
			t.Errorf("jail %s after the restart: %s (%s), want %s", id, got.Status, got.Error, status)
		}
	}
	if got := d.getJail(t, running.ID); got.Pid != running.Pid {
		t.Errorf("the re-adopted jail's pid: %d, want %d", got.Pid, running.Pid)
	}
	if got := d.getJail(t, doomed.ID); got.Status == "running" {
		t.Errorf("a jail whose init died while the daemon was down is reported running")
	}

	// The re-adopted jail serves exec, with its state and processes.
	out := d.mustSh(t, running.ID, "cat /workspace/state; echo; kill -0 "+sleepPid+" && echo alive")
	if out != "before the crash\nalive\n" {
		t.Errorf("the re-adopted jail: %q", out)
	}
	res := d.exec(t, running.ID, execReq{Cmd: []string{"sh", "-c", "echo streamed"}})
	if res.Stdout != "streamed\n" {
		t.Errorf("exec after the restart: %s", &res)
	}
	if r := d.api.do(t, "POST", "/jails/"+stopped.ID+"/exec", execReq{Cmd: []string{"true"}}); r.status != http.StatusConflict {
		t.Errorf("exec in the stopped jail after the restart: want 409, got %s", r)
	}
	// Stopped and failed jails start again.
	for _, id := range []string{stopped.ID, created.ID, doomed.ID} {
		d.api.want(t, http.StatusOK, "POST", "/jails/"+id+"/start", nil, nil)
		if out := d.mustSh(t, id, "echo up"); out != "up\n" {
			t.Errorf("jail %s after a start: %q", id, out)
		}
	}
	// A graceful restart keeps running jails too.
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	if err := d.restart(); err != nil {
		t.Fatalf("restarting after SIGTERM: %v", err)
	}
	if got := d.getJail(t, running.ID); got.Status != "running" {
		t.Errorf("after a graceful restart: %s", got.Status)
	}
	if out := d.mustSh(t, running.ID, "kill -0 "+sleepPid+" && echo alive"); out != "alive\n" {
		t.Errorf("the background process after a graceful restart: %q", out)
	}
	// The re-adopted jail is under its network policy again: the
	// daemon's proxy answers it and refuses a name outside the policy.
	if out := d.mustSh(t, running.ID, "curl -s -m 5 -o /dev/null -w '%{http_code}' http://not-allowed.example/"); out != "403" {
		t.Errorf("a refused request from the re-adopted jail: %q, want 403 from the policy proxy", out)
	}
	// Destroying the jails that outlived two daemons leaves nothing: no
	// mount, loop device, cgroup, netns, process, veth, route or nft chain.
	for _, id := range []string{running.ID, stopped.ID, created.ID, doomed.ID} {
		d.api.want(t, http.StatusNoContent, "DELETE", "/jails/"+id, nil, nil)
	}
	expectClean(t, d, base, "destroying re-adopted jails")
}

// TestDataDirInUse: a second `agentjail serve` on the data dir of a
// running daemon (with a jail network of its own, so only the data dir is
// shared) and an `agentjail teardown` of it both refuse at once, naming the
// daemon that holds it; the daemon's jail keeps running, and its ready jail
// still serves a create.
func TestDataDirInUse(t *testing.T) {
	d := newDaemon(t, "--warm-jails", "1")
	j := d.createJail(t, nil)
	want := fmt.Sprintf("data dir %s is in use by another agentjail daemon (pid %d)", d.dir, d.pid)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, binPath, append([]string{"serve", "--data-dir", d.dir, "--addr", "127.0.0.1:0"}, netFlags()...)...).CombinedOutput()
	if err == nil || ctx.Err() != nil || !strings.Contains(string(out), want) {
		t.Fatalf("a second daemon on the data dir: %v (context: %v)\n%s\nwant an exit saying %q", err, ctx.Err(), out, want)
	}
	if out, err := d.teardown(); err == nil || !strings.Contains(out, want) {
		t.Fatalf("teardown of the data dir in use: %v\n%s\nwant a refusal saying %q", err, out, want)
	}
	if res := d.exec(t, j.ID, execReq{Cmd: []string{"true"}}); res.ExitCode != 0 {
		t.Fatalf("the daemon's jail after both: %s", &res)
	}
	d.createJail(t, nil)
}

// TestAddressInUse: a daemon whose API address is taken exits at once,
// saying so, before it makes anything in its data dir (no storage pool, no
// jail).
func TestAddressInUse(t *testing.T) {
	requireEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, binPath, append([]string{"serve", "--data-dir", dir, "--addr", ln.Addr().String()}, netFlags()...)...).CombinedOutput()
	want := fmt.Sprintf("listen on %s: ", ln.Addr())
	if err == nil || ctx.Err() != nil || !strings.Contains(string(out), want) || !strings.Contains(string(out), "address already in use") {
		t.Fatalf("a daemon on an address in use: %v (context: %v)\n%s\nwant an exit saying %q…address already in use", err, ctx.Err(), out, want)
	}
	for _, made := range []string{"storage.img", "pool", "jails"} {
		if _, err := os.Stat(filepath.Join(dir, made)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the failed start left %s in its data dir (%v)", made, err)
		}
	}
}
