package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ptraceAttack is the attack of a jail's root on its init: PTRACE_ATTACH
// (16) and PTRACE_SEIZE (0x4206) on pid 1 and on every shim, opening
// /proc/1/mem for writing, and SIGSTOP to pid 1. It prints one line per
// attempt: what, the return value and errno.
const ptraceAttack = `
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
targets = [1] + [int(p) for p in os.listdir('/proc') if p.isdigit() and
                 b'--shim' in open('/proc/%s/cmdline' % p, 'rb').read()]
for pid in targets:
    for req, name in ((16, 'attach'), (0x4206, 'seize')):
        r = libc.ptrace(req, pid, None, None)
        print('%s %d %d %d' % (name, pid, r, ctypes.get_errno()))
try:
    os.open('/proc/1/mem', os.O_RDWR)
    print('mem 1 0 0')
except OSError as e:
    print('mem 1 -1 %d' % e.errno)
try:
    os.kill(1, signal.SIGSTOP)
    print('sigstop 1 0 0')
except OSError as e:
    print('sigstop 1 -1 %d' % e.errno)
`

// TestInitCannotBeTraced runs the real attack of issue 16 (ctypes
// ptrace(PTRACE_ATTACH, 1)) as root and as the default user, and as root in
// a jail restored from a snapshot: every attempt on init and its shims is
// refused, and the jail keeps answering.
func TestInitCannotBeTraced(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, nil)
	// A command in flight keeps a shim busy; the idle pool holds others.
	d.mustSh(t, j.ID, "true")
	// A jail restored from a snapshot keeps the protection (CRIU restores
	// the dumpable flag).
	restored := d.restoreSnapshot(t, d.takeSnapshot(t, j.ID, "full").ID)
	for _, tc := range []struct{ id, user string }{{j.ID, "root"}, {j.ID, ""}, {restored.ID, "root"}} {
		id, user := tc.id, tc.user
		res := d.exec(t, id, execReq{Cmd: []string{"python3", "-c", ptraceAttack}, User: user, TimeoutMs: 30_000})
		if res.ExitCode != 0 {
			t.Fatalf("attack as %q: %s", user, &res)
		}
		t.Logf("attack as %q:\n%s", user, res.Stdout)
		shims := 0
		for _, l := range strings.Split(strings.TrimSpace(res.Stdout), "\n") {
			var what string
			var pid, ret, errno int
			if _, err := fmt.Sscanf(l, "%s %d %d %d", &what, &pid, &ret, &errno); err != nil {
				t.Fatalf("attack output %q: %v", l, err)
			}
			if what == "attach" && pid != 1 {
				shims++
			}
			switch what {
			case "attach", "seize":
				if ret != -1 || (errno != int(syscall.EPERM) && errno != int(syscall.EACCES)) {
					t.Errorf("as %q: ptrace %s of pid %d returned %d (errno %d)", user, what, pid, ret, errno)
				}
			case "mem":
				if ret != -1 {
					t.Errorf("as %q: /proc/1/mem opened for writing", user)
				}
			}
		}
		if shims == 0 {
			t.Errorf("as %q: no shim was attacked", user)
		}
		// Init ignores the SIGSTOP (PID 1 of its namespace) and answers.
		start := time.Now()
		if out := d.mustSh(t, id, "echo alive"); out != "alive\n" {
			t.Fatalf("after the attack: %q", out)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("an exec after the attack took %v", took)
		}
		if got := d.getJail(t, id); got.Status != "running" {
			t.Fatalf("after the attack the jail is %s (%s)", got.Status, got.Error)
		}
	}
	// Commands stay debuggable: the flag is init's and the shims', not
	// inherited through exec.
	if res := d.shAs(t, j.ID, "root", "strace -o /dev/null true && echo traced"); res.Stdout != "traced\n" {
		t.Errorf("strace of a command in the jail: %s", &res)
	}
}

// TestUnresponsiveInit stops a jail's init from the host (SIGSTOP): calls
// fail within the liveness deadline with 504 jail_unresponsive, then at
// once; the jail is reported unresponsive in its status and events; once
// resumed it answers again; stopped again, it can still be stopped and
// destroyed.
func TestUnresponsiveInit(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, nil)
	d.mustSh(t, j.ID, "true")
	pid := d.getJail(t, j.ID).Pid
	if pid <= 0 {
		t.Fatalf("no init pid: %+v", j)
	}
	stop := func() {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	cont := func() { _ = syscall.Kill(pid, syscall.SIGCONT) }
	t.Cleanup(cont)

	stop()
	// The first call waits for the liveness check (LivenessAfter +
	// PingTimeout, 7 s) and no longer.
	start := time.Now()
	r := d.api.do(t, "POST", "/jails/"+j.ID+"/exec", execReq{Cmd: []string{"true"}})
	first := time.Since(start)
	var e apiError
	if r.status != http.StatusGatewayTimeout || json.Unmarshal(r.body, &e) != nil || e.Error.Code != "jail_unresponsive" {
		t.Fatalf("exec on a stopped init: %s", r)
	}
	t.Logf("first call: %v, %s", first, e.Error.Message)
	if first > 10*time.Second {
		t.Errorf("the first call took %v", first)
	}
	// The jail says so; later calls fail at once.
	if err := waitFor(5*time.Second, func() error {
		if got := d.getJail(t, j.ID); got.Status != "unresponsive" {
			return fmt.Errorf("status %q", got.Status)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, call := range []struct{ method, path string }{
		{"POST", "/jails/" + j.ID + "/exec"},
		{"GET", "/jails/" + j.ID + "/files/etc/hostname"},
		{"GET", "/jails/" + j.ID + "/files/workspace"},
	} {
		start := time.Now()
		var body any
		if call.method == "POST" {
			body = execReq{Cmd: []string{"true"}}
		}
		r := d.api.do(t, call.method, call.path, body)
		if took := time.Since(start); r.status != http.StatusGatewayTimeout || took > time.Second {
			t.Errorf("%s %s on an unresponsive jail: %s after %v", call.method, call.path, r, took)
		}
	}

	// Resumed, it answers again and says so.
	cont()
	if err := waitFor(10*time.Second, func() error {
		if got := d.getJail(t, j.ID); got.Status != "running" {
			return fmt.Errorf("status %q", got.Status)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	d.mustSh(t, j.ID, "true")
	ev := string(d.api.want(t, http.StatusOK, "GET", "/jails/"+j.ID+"/events?type=jail&follow=false", nil, nil).body)
	if !strings.Contains(ev, `"op":"unresponsive"`) || !strings.Contains(ev, `"op":"responsive"`) {
		t.Errorf("jail events: %s", ev)
	}

	// Stopped again: stop and destroy still work, within their own bounds.
	stop()
	if r := d.api.do(t, "POST", "/jails/"+j.ID+"/exec", execReq{Cmd: []string{"true"}}); r.status != http.StatusGatewayTimeout {
		t.Fatalf("exec on a stopped init: %s", r)
	}
	start = time.Now()
	d.api.want(t, http.StatusOK, "POST", "/jails/"+j.ID+"/stop", map[string]any{"timeout_s": 2}, nil)
	t.Logf("stop took %v", time.Since(start))
	if got := d.getJail(t, j.ID); got.Status != "stopped" {
		t.Fatalf("after stop: %s (%s)", got.Status, got.Error)
	}
	d.api.want(t, http.StatusNoContent, "DELETE", "/jails/"+j.ID, nil, nil)
}

// shimRaceAttack is a jail root racing init's new shims: it attaches
// (PTRACE_SEIZE) to each process as soon as its pid is handed out (pids of
// a namespace come in order, /proc/sys/kernel/ns_last_pid names the last),
// so it reaches a new shim in the moments between its execve and its first
// instructions. It stops each process it caught (PTRACE_INTERRUPT) and
// lets it go on, handing back a signal the stop intercepted, and prints
// how many shims it caught and how many other processes (the commands the
// shims start, which stay debuggable).
const shimRaceAttack = `
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
SEIZE, INTERRUPT, DETACH, WALL = 0x4206, 0x4207, 17, 0x40000000
me = os.getpid()
shims, others = 0, set()
open('/tmp/race-ready', 'w').close()
while not os.path.exists('/tmp/race-stop'):
    last = int(open('/proc/sys/kernel/ns_last_pid').read())
    for pid in range(last - 1, last + 3):
        if pid <= 1 or pid == me or libc.ptrace(SEIZE, pid, None, None) != 0:
            continue
        try:
            cmd = open('/proc/%d/cmdline' % pid, 'rb').read()
        except OSError:
            cmd = b''
        sig = 0
        if libc.ptrace(INTERRUPT, pid, None, None) == 0:
            try:
                _, st = os.waitpid(pid, WALL)
                if os.WIFSTOPPED(st) and os.WSTOPSIG(st) != signal.SIGTRAP:
                    sig = os.WSTOPSIG(st)
            except ChildProcessError:
                pass
        libc.ptrace(DETACH, pid, None, sig or None)
        if b'--shim' in cmd:
            shims += 1
            print('caught shim %d' % pid)
        else:
            others.add(pid)
print('shims %d others %d' % (shims, len(others)))
`

// TestNewShimsCannotBeTraced races init's shim pool: while a jail's root
// attaches to every new process the moment it exists, the jail runs
// commands that each leave a process behind (the shim stays with it, so
// init starts a new shim for the next). No shim may ever be attached, not
// even in the moments before it could protect itself; the commands the
// shims start are caught (the race is won), and the jail keeps answering.
func TestNewShimsCannotBeTraced(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, nil)
	type result struct {
		res execResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		resp, err := d.api.send("POST", "/jails/"+j.ID+"/exec", execReq{Cmd: []string{"python3", "-c", shimRaceAttack}, User: "root", TimeoutMs: 300_000})
		switch {
		case err != nil:
			r.err = err
		case resp.status != http.StatusOK:
			r.err = fmt.Errorf("the attack's exec: %s", resp)
		default:
			r.err = json.Unmarshal(resp.body, &r.res)
		}
		done <- r
	}()
	d.waitSh(t, j.ID, "test -e /tmp/race-ready", time.Minute, "the attack ready")
	// Each command leaves a process behind: its shim stays with it, so the
	// next command needs a new shim.
	const commands = 150
	for i := 0; i < commands; i++ {
		if res := d.shAs(t, j.ID, "root", "sleep 0.1 &"); res.ExitCode != 0 {
			t.Fatalf("command %d beside the attack: %s", i, &res)
		}
	}
	d.mustSh(t, j.ID, "touch /tmp/race-stop")
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.res.ExitCode != 0 {
		t.Fatalf("the attack: %s", &r.res)
	}
	t.Logf("the attack: %s", r.res.Stdout)
	var shims, others int
	lines := strings.Split(strings.TrimSpace(r.res.Stdout), "\n")
	if _, err := fmt.Sscanf(lines[len(lines)-1], "shims %d others %d", &shims, &others); err != nil {
		t.Fatalf("the attack's summary %q: %v", lines[len(lines)-1], err)
	}
	if shims != 0 {
		t.Errorf("the attack attached to %d new shims", shims)
	}
	if others == 0 {
		t.Errorf("the attack caught none of the %d commands: the race was never run", commands)
	}
}
