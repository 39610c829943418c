package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// forkFill forks children that wait until they are killed, until fork
// fails; it prints the number of children it made and the error.
const forkFill = `
import os, signal, sys, time
kids = []
err = ""
while len(kids) < 10000:
    try:
        pid = os.fork()
    except OSError as ex:
        err = str(ex)
        break
    if pid == 0:
        os.close(1); os.close(2)
        signal.pause()
        os._exit(0)
    kids.append(pid)
print(len(kids), err)
sys.stdout.flush()
`

// forkEnd kills and reaps forkFill's children.
const forkEnd = `
for k in kids:
    os.kill(k, signal.SIGKILL)
for k in kids:
    os.waitpid(k, 0)
`

// forkCounter fills the jail with children and ends them at once.
const forkCounter = forkFill + forkEnd

// holder fills the jail with children and ends them once /tmp/release
// exists.
const holder = forkFill + `
while not os.path.exists("/tmp/release"):
    time.sleep(0.05)
` + forkEnd

// TestLimitPids caps a fork bomb at pids_limit, while the daemon and a
// second jail keep answering, during the bomb and after it.
func TestLimitPids(t *testing.T) {
	d := shared(t)
	const limit = 48
	j := d.createJail(t, map[string]any{"isolation": map[string]any{"resources": map[string]any{"pids_limit": limit}}})
	other := d.createJail(t, nil)

	t.Run("counted", func(t *testing.T) {
		res := d.exec(t, j.ID, execReq{Cmd: []string{"python3", "-c", forkCounter}, TimeoutMs: 60_000})
		if res.ExitCode != 0 {
			t.Fatalf("fork counter: %s", &res)
		}
		var n int
		var errText string
		fmt.Sscanf(res.Stdout, "%d", &n)
		_, errText, _ = strings.Cut(strings.TrimSpace(res.Stdout), " ")
		if n >= limit || n == 0 {
			t.Errorf("made %d children with pids_limit %d: %s", n, limit, &res)
		}
		if !strings.Contains(errText, "Resource temporarily unavailable") {
			t.Errorf("fork failed with %q, want EAGAIN", errText)
		}
	})

	t.Run("bomb", func(t *testing.T) {
		// The jail's own machinery (init and its helpers) holds some of
		// the pids at rest; the bomb's must all go again.
		d.mustSh(t, j.ID, "true")
		atRest, err := cgroupCount("pids", j.ID, "pids.current")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan *response, 1)
		go func() {
			r, _ := d.api.send("POST", "/jails/"+j.ID+"/exec", execReq{
				// The parent needs no fork to wait: the timeout, not a
				// failed fork, ends the exec and must kill the whole tree.
				Cmd:       []string{"python3", "-c", "import subprocess, time\nsubprocess.Popen(['sh', '-c', 'b() { b | b & }; b'])\ntime.sleep(120)"},
				TimeoutMs: 8000,
			})
			done <- r
		}()
		// While the bomb runs: the jail sits at its limit, the daemon and
		// another jail answer.
		if err := waitFor(20*time.Second, func() error {
			n, err := cgroupCount("pids", j.ID, "pids.current")
			if err != nil {
				return err
			}
			if n < limit-4 {
				return fmt.Errorf("pids.current %d", n)
			}
			return nil
		}); err != nil {
			t.Errorf("the bomb did not fill the jail: %v", err)
		}
		for range 5 {
			start := time.Now()
			d.api.want(t, http.StatusOK, "GET", "/health", nil, nil)
			res := d.exec(t, other.ID, execReq{Cmd: []string{"echo", "alive"}, TimeoutMs: 10_000})
			if res.Stdout != "alive\n" {
				t.Errorf("the other jail: %s", &res)
			}
			if el := time.Since(start); el > 5*time.Second {
				t.Errorf("the daemon took %v to answer during the bomb", el)
			}
			n, err := cgroupCount("pids", j.ID, "pids.current")
			if err != nil {
				t.Fatal(err)
			}
			if n > limit {
				t.Errorf("pids.current %d is above pids_limit %d", n, limit)
			}
			st := d.getJail(t, j.ID).Stats
			if st == nil || st.Pids > limit || st.PidsLimit != limit {
				t.Errorf("stats during the bomb: %+v (pids_limit %d)", st, limit)
			}
		}
		r := <-done
		if r == nil || r.status != http.StatusOK {
			t.Fatalf("the bomb's exec: %v", r)
		}
		if !strings.Contains(string(r.body), `"timed_out":true`) {
			t.Errorf("the bomb's exec did not time out: %s", r)
		}
		// The timeout killed the whole tree: the jail recovers.
		if err := waitFor(20*time.Second, func() error {
			n, err := cgroupCount("pids", j.ID, "pids.current")
			if err != nil {
				return err
			}
			if n > atRest+2 {
				return fmt.Errorf("pids.current still %d (%d at rest)", n, atRest)
			}
			return nil
		}); err != nil {
			t.Errorf("after the timeout: %v", err)
		}
		if out := d.mustSh(t, j.ID, "echo ok"); out != "ok\n" {
			t.Errorf("the jail after the bomb: %q", out)
		}
		stillServes(t, d, other, "the fork bomb")
	})

	t.Run("full", func(t *testing.T) {
		// A command holds every task the jail may have; meanwhile execs,
		// terminals and file calls come at once. Init and the command's
		// shim need threads for that and can make none: they must have
		// made them before.
		held := make(chan *response, 1)
		go func() {
			r, _ := d.api.send("POST", "/jails/"+j.ID+"/exec", execReq{Cmd: []string{"python3", "-c", holder}, TimeoutMs: 120_000})
			held <- r
		}()
		if err := waitFor(30*time.Second, func() error {
			n, err := cgroupCount("pids", j.ID, "pids.current")
			if err != nil {
				return err
			}
			if n < limit {
				return fmt.Errorf("pids.current %d", n)
			}
			return nil
		}); err != nil {
			t.Fatalf("the holder did not fill the jail: %v", err)
		}
		data := bytes.Repeat([]byte("0123456789abcdef"), 1<<17) // 2 MiB
		var wg sync.WaitGroup
		errs := make(chan string, 64)
		call := func(what string, check func() string) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if e := check(); e != "" {
					errs <- what + ": " + e
				}
			}()
		}
		for i := range 6 {
			call(fmt.Sprintf("exec %d", i), func() string {
				r, err := d.api.send("POST", "/jails/"+j.ID+"/exec", execReq{Cmd: []string{"echo", "hi"}, TimeoutMs: 20_000})
				if err != nil {
					return err.Error()
				}
				var res execResult
				if r.status != http.StatusOK || json.Unmarshal(r.body, &res) != nil {
					return r.String()
				}
				// Refused as a shell's fork would be, or run when a task was
				// free for a moment.
				if (res.ExitCode != 126 || !strings.Contains(res.Stderr, "resource temporarily unavailable")) && res.Stdout != "hi\n" {
					return res.String()
				}
				return ""
			})
		}
		for i := range 8 {
			path := fmt.Sprintf("/files/tmp/full-%d", i)
			call("write and read "+path, func() string {
				if r, err := d.api.send("PUT", "/jails/"+j.ID+path, data); err != nil || r.status != http.StatusCreated {
					return fmt.Sprint(r, err)
				}
				r, err := d.api.send("GET", "/jails/"+j.ID+path, nil)
				if err != nil || r.status != http.StatusOK || !bytes.Equal(r.body, data) {
					return fmt.Sprint("read back: ", r, err)
				}
				return ""
			})
			call("list /usr/bin", func() string {
				if r, err := d.api.send("GET", "/jails/"+j.ID+"/files/usr/bin", nil); err != nil || r.status != http.StatusOK {
					return fmt.Sprint(r, err)
				}
				return ""
			})
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Errorf("in a full jail, %s", e)
		}
		d.putFile(t, j.ID, "/tmp/release", nil)
		r := <-held
		if r == nil || r.status != http.StatusOK {
			t.Fatalf("the holder's exec: %v", r)
		}
		var res execResult
		if err := json.Unmarshal(r.body, &res); err != nil || res.ExitCode != 0 || !strings.Contains(res.Stdout, "Resource temporarily unavailable") {
			t.Errorf("the holder's exec did not end as it should: %s", r)
		}
		if out := d.mustSh(t, j.ID, "echo ok"); out != "ok\n" {
			t.Errorf("the jail after it was full: %q", out)
		}
	})
}

// stillServes checks, after an attack on another jail, that the daemon
// answers and that other (created before the attack) runs commands and
// writes to its disk.
func stillServes(t *testing.T, d *daemon, other jailInfo, attack string) {
	t.Helper()
	d.api.want(t, http.StatusOK, "GET", "/health", nil, nil)
	if got := d.getJail(t, other.ID); got.Status != "running" {
		t.Errorf("after %s the other jail is %s (%s)", attack, got.Status, got.Error)
	}
	res := d.exec(t, other.ID, execReq{Cmd: []string{"sh", "-c", "echo alive > /workspace/alive && cat /workspace/alive"}, TimeoutMs: 10_000})
	if res.ExitCode != 0 || res.Stdout != "alive\n" {
		t.Errorf("after %s the other jail's exec: %s", attack, &res)
	}
}

// TestLimitSmallPids runs commands in a jail with a small pids_limit: the
// limit is the whole jail's (init and its shims included), and a pipeline
// fits in the smallest limit allowed.
func TestLimitSmallPids(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, map[string]any{"isolation": map[string]any{"resources": map[string]any{"pids_limit": 32}}})
	for range 3 {
		res := d.exec(t, j.ID, execReq{Cmd: []string{"sh", "-c", "echo a | cat | cat"}})
		if res.Stdout != "a\n" {
			t.Fatalf("a pipeline of 3 in a jail with pids_limit 32: %s", &res)
		}
	}
}

// cgroupCount reads one number from a jail's v1 cgroup file.
func cgroupCount(controller, id, file string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(cgroupRoot, controller, jailCgroupOf(id), file))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// TestLimitMemory OOM-kills a memory hog, says so in the exec result and
// the stats, and leaves the jail running; the daemon and a second jail
// keep answering.
func TestLimitMemory(t *testing.T) {
	d := shared(t)
	const limit = 64 << 20
	j := d.createJail(t, map[string]any{"isolation": map[string]any{"resources": map[string]any{"memory_bytes": limit}}})
	other := d.createJail(t, nil)
	before := d.getJail(t, j.ID).Stats
	if before == nil {
		t.Fatal("GET /jails/{id} of a running jail has no stats")
	}
	res := d.exec(t, j.ID, execReq{
		Cmd:       []string{"python3", "-c", "a = []\nwhile True: a.append(b'x' * (1 << 20))"},
		TimeoutMs: 60_000,
	})
	if !res.OOMKilled {
		t.Errorf("oom_killed is false: %s", &res)
	}
	if !strings.Contains(res.Signal, "KILL") && res.Signal != "9" {
		t.Errorf("signal %q, want SIGKILL: %s", res.Signal, &res)
	}
	if res.TimedOut {
		t.Errorf("the hog ran into its timeout instead of the memory limit: %s", &res)
	}
	after := d.getJail(t, j.ID)
	if after.Status != "running" {
		t.Fatalf("the jail is %s after the OOM kill (%s)", after.Status, after.Error)
	}
	if after.Stats == nil || after.Stats.OOMKills <= before.OOMKills {
		t.Errorf("stats.oom_kills did not increase: before %+v after %+v", before, after.Stats)
	}
	if out := d.mustSh(t, j.ID, "echo ok"); out != "ok\n" {
		t.Errorf("the jail after the OOM kill: %q", out)
	}

	// Many processes, each smaller than init (whose mapped binary the OOM
	// score counts), fill the limit together: the kernel must pick them,
	// not init, whose end would end the jail.
	// A command has its score from its first instruction: cat reads it
	// right after the exec.
	for range 20 {
		res := d.exec(t, j.ID, execReq{Cmd: []string{"cat", "/proc/self/oom_score_adj", "/proc/1/oom_score_adj"}})
		if res.Stdout != "500\n1\n" {
			t.Fatalf("oom_score_adj of a command and of init: %q (%s), want 500 and 1", res.Stdout, &res)
		}
	}
	// The shims that start commands keep init's score: each raises its
	// own only while it forks one. The sh's own shim may still be at it.
	shims := d.mustSh(t, j.ID, `for p in /proc/[0-9]*; do
	  [ "${p#/proc/}" = "$PPID" ] && continue
	  tr '\0' ' ' < $p/cmdline 2>/dev/null | grep -q -- '--shi[m]' && echo "${p#/proc/} $(cat $p/oom_score_adj)"
	done; :`)
	t.Logf("shims: %q", shims)
	if shims == "" {
		t.Error("no idle shim in the jail to check")
	}
	for _, l := range strings.Split(strings.TrimSpace(shims), "\n") {
		if !strings.HasSuffix(l, " 1") {
			t.Errorf("a shim's pid and oom_score_adj: %q, want 1", l)
		}
	}
	res = d.exec(t, j.ID, execReq{Cmd: []string{"python3", "-c", smallHogs}, TimeoutMs: 60_000})
	if !res.OOMKilled && !strings.HasPrefix(res.Stdout, "killed ") || strings.HasPrefix(res.Stdout, "killed 0") {
		t.Errorf("no small hog was OOM-killed: %s", &res)
	}
	if after := d.getJail(t, j.ID); after.Status != "running" {
		t.Fatalf("the jail is %s after its small hogs met the limit (%s)", after.Status, after.Error)
	}
	if out := d.mustSh(t, j.ID, "echo ok"); out != "ok\n" {
		t.Errorf("the jail after its small hogs met the limit: %q", out)
	}
	stillServes(t, d, other, "the memory hog")
}

// smallHogs forks 24 children that each touch 6 MiB and wait 3 s, and
// prints how many of them were killed.
const smallHogs = `
import os, time
kids = []
for i in range(24):
    pid = os.fork()
    if pid == 0:
        b = bytearray(6 << 20)
        for j in range(0, len(b), 4096):
            b[j] = 1
        time.sleep(3)
        os._exit(0)
    kids.append(pid)
n = 0
for k in kids:
    _, st = os.waitpid(k, 0)
    if os.WIFSIGNALED(st):
        n += 1
print("killed", n)
`

// TestLimitDisk fills the jail's disk: ENOSPC, and the host's disk gives
// the jail no more than its limit; the daemon and a second jail keep
// answering, and the second jail can still write.
func TestLimitDisk(t *testing.T) {
	d := shared(t)
	const limit = 128 << 20
	j := d.createJail(t, map[string]any{"isolation": map[string]any{"resources": map[string]any{"disk_bytes": limit}}})
	other := d.createJail(t, nil)
	// What the jail can take from the host is what the pool's image
	// grows by; the host's free space, which anything else on the host
	// changes too, is only logged.
	pool := filepath.Join(d.dir, "storage.img")
	allocated := func() int64 {
		var st unix.Stat_t
		if err := unix.Stat(pool, &st); err != nil {
			t.Fatal(err)
		}
		return st.Blocks * 512
	}
	free := func() int64 {
		var st unix.Statfs_t
		if err := unix.Statfs(d.dir, &st); err != nil {
			t.Fatal(err)
		}
		return int64(st.Bavail) * st.Bsize
	}
	baseline(t, d) // the pool's warm disks settle
	unix.Sync()
	before, freeBefore := allocated(), free()
	for i, c := range []struct{ user, path string }{{"", "/workspace/fill"}, {"root", "/var/fill"}} {
		res := d.shAs(t, j.ID, c.user, "dd if=/dev/zero of="+c.path+" bs=1M count=1024 conv=fsync")
		if res.ExitCode == 0 {
			t.Errorf("writing 1 GiB to %s on a %d MiB disk succeeded: %s", c.path, limit>>20, &res)
		}
		if !strings.Contains(res.Stderr, "No space left on device") {
			t.Errorf("dd to %s: want ENOSPC: %s", c.path, &res)
		}
		unix.Sync()
		grew := allocated() - before
		t.Logf("after filling %s: the pool image grew by %d MiB, the host's free space fell by %d MiB", c.path, grew>>20, (freeBefore-free())>>20)
		// Space freed in the jail and written again may take the pool a
		// while to give back: allow one disk's worth for the refill.
		if allowed := int64(limit+limit/4) * int64(i+1); grew > allowed {
			t.Errorf("the pool image grew by %d MiB for a %d MiB disk (fill %d)", grew>>20, limit>>20, i+1)
		}
		st := d.getJail(t, j.ID).Stats
		if st == nil || st.DiskLimitBytes == 0 || st.DiskUsedBytes > st.DiskLimitBytes || st.DiskLimitBytes > limit {
			t.Errorf("disk stats: %+v (disk_bytes %d)", st, limit)
		}
		stillServes(t, d, other, "filling "+c.path)
		d.shAs(t, j.ID, c.user, "rm -f "+c.path)
	}
	if out := d.mustSh(t, j.ID, "echo ok > /workspace/ok && cat /workspace/ok"); out != "ok\n" {
		t.Errorf("the jail after filling its disk: %q", out)
	}
}

// TestLimitNofile applies nofile_limit, and refuses one above the daemon's
// own hard limit with a 422 that says why.
func TestLimitNofile(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, map[string]any{"isolation": map[string]any{"resources": map[string]any{"nofile_limit": 256}}})
	for _, user := range []string{"", "root"} {
		res := d.shAs(t, j.ID, user, "ulimit -Sn; ulimit -Hn")
		if res.Stdout != "256\n256\n" {
			t.Errorf("as %q: ulimit -n: %s", user, &res)
		}
	}
	hard, err := daemonNofileHard(d.pid)
	if err != nil {
		t.Fatal(err)
	}
	r := d.api.do(t, "POST", "/jails", map[string]any{
		"name":      uniqueName(t),
		"isolation": map[string]any{"resources": map[string]any{"nofile_limit": hard + 1}},
	})
	if r.status != http.StatusUnprocessableEntity {
		t.Fatalf("nofile_limit %d above the daemon's hard limit %d: want 422, got %s", hard+1, hard, r)
	}
	msg := r.errorMessage()
	if !strings.Contains(msg, "isolation.resources.nofile_limit") || !strings.Contains(msg, strconv.FormatUint(hard, 10)) {
		t.Errorf("the 422 does not name the field and the daemon's limit: %q", msg)
	}
}

// daemonNofileHard reads the daemon's RLIMIT_NOFILE hard limit.
func daemonNofileHard(pid int) (uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "Max open files"); ok {
			fields := strings.Fields(rest)
			if len(fields) >= 2 {
				return strconv.ParseUint(fields[1], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no 'Max open files' in /proc/%d/limits", pid)
}

// TestLimitCPUQuota applies cpu_quota: two busy loops for 2 s of wall time
// get at most the quota's share of the CPU.
func TestLimitCPUQuota(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, map[string]any{"isolation": map[string]any{"resources": map[string]any{"cpu_quota": 20000, "cpu_period": 100000}}})
	res := d.shAs(t, j.ID, "", "timeout 2 sh -c 'while :; do :; done' & timeout 2 sh -c 'while :; do :; done' & wait")
	if res.ExitCode != 0 {
		t.Fatalf("busy loops: %s", &res)
	}
	st := d.getJail(t, j.ID).Stats
	if st == nil {
		t.Fatal("GET /jails/{id} of a running jail has no stats")
	}
	// 0.2 CPU for ~2 s is ~0.4 s of CPU time (unlimited: up to 4 s).
	if st.CPUTimeNs == 0 || st.CPUTimeNs > uint64(time.Second) {
		t.Errorf("cpu_time_ns %d after 2 s of two busy loops under a 20%% quota", st.CPUTimeNs)
	}
}
