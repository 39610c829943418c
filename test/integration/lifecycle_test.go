package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// faultRuntime is an OCI runtime for a test daemon (serve --runtime): a
// shell script in front of the real runc that, while the test asks for it,
// makes one runc verb fail, hold until released, or start a container
// whose init cannot read its configuration (so it dies before it is
// ready). Every other call goes to runc unchanged.
type faultRuntime struct {
	dir  string // control dir: one file per verb holds the fault
	path string // the script
}

// faultScript is the runtime script; CTL and REAL are replaced.
const faultScript = `#!/bin/sh
# runc, with the fault the test wrote to CTL/<verb> (fail, hold, noconfig,
# die).
ctl='CTL'
real='REAL'
verb=
bundle=
pidfile=
prev=
for a in "$@"; do
	case "$prev" in
	--bundle|-b) bundle=$a ;;
	--pid-file) pidfile=$a ;;
	esac
	if [ -z "$verb" ]; then
		case "$a" in
		create|start|kill|delete|state|run|exec|checkpoint|restore|pause|resume|update|ps|list|events|features) verb=$a ;;
		esac
	fi
	prev=$a
done
if [ -n "$verb" ] && [ -f "$ctl/$verb" ]; then
	case "$(cat "$ctl/$verb")" in
	fail)
		echo "agentjail-it: injected failure of runc $verb" >&2
		exit 1 ;;
	noconfig)
		# The container starts, and its init finds no configuration.
		rm -f "$bundle/run/init.json" ;;
	die)
		# The container is made, and its process dies before it starts.
		"$real" "$@" || exit
		kill -9 "$(cat "$pidfile")"
		exit 0 ;;
	hold)
		: >"$ctl/$verb.held"
		i=0
		while [ ! -e "$ctl/$verb.release" ] && [ "$i" -lt 1200 ]; do
			sleep 0.05
			i=$((i + 1))
		done ;;
	esac
fi
exec "$real" "$@"
`

// newFaultRuntime writes the script; it is removed when the test ends.
func newFaultRuntime(t *testing.T) *faultRuntime {
	t.Helper()
	real, err := exec.LookPath("runc")
	if err != nil {
		t.Fatalf("the fault runtime wraps runc: %v", err)
	}
	dir, err := os.MkdirTemp("", "agentjail-it-runtime-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ctl := filepath.Join(dir, "ctl")
	if err := os.Mkdir(ctl, 0o700); err != nil {
		t.Fatal(err)
	}
	script := strings.NewReplacer("CTL", ctl, "REAL", real).Replace(faultScript)
	path := filepath.Join(dir, "runc")
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return &faultRuntime{dir: ctl, path: path}
}

// set makes verb behave as fault ("fail", "hold", "noconfig", "die")
// until clear.
func (f *faultRuntime) set(t *testing.T, verb, fault string) {
	t.Helper()
	for _, n := range []string{verb + ".held", verb + ".release"} {
		if err := os.Remove(filepath.Join(f.dir, n)); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(f.dir, verb), []byte(fault), 0o644); err != nil {
		t.Fatal(err)
	}
}

// clear ends the fault of verb, releasing a held call.
func (f *faultRuntime) clear(t *testing.T, verb string) {
	t.Helper()
	if err := os.Remove(filepath.Join(f.dir, verb)); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.dir, verb+".release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// held reports whether a call of verb is being held.
func (f *faultRuntime) held(verb string) bool {
	_, err := os.Stat(filepath.Join(f.dir, verb+".held"))
	return err == nil
}

// listed reports whether GET /jails lists a jail named name.
func (d *daemon) listed(t *testing.T, name string) bool {
	t.Helper()
	var list struct {
		Jails []jailInfo `json:"jails"`
	}
	d.api.want(t, http.StatusOK, "GET", "/jails", nil, &list)
	for _, j := range list.Jails {
		if j.Name == name {
			return true
		}
	}
	return false
}

// TestCleanupFailedCreateLate makes creates fail after the jail's disk,
// root overlay, network namespace and network attachment exist: the
// runtime refuses to create the container, the container exists (with its
// cgroup) and its process dies before it is started, or the container
// starts and its init dies before it is ready. Each create answers an
// error with a message, the jail is not listed, its name is free again,
// and the host holds nothing more than before.
func TestCleanupFailedCreateLate(t *testing.T) {
	rt := newFaultRuntime(t)
	d := newDaemon(t, "--runtime", rt.path)
	base := baseline(t, d)
	cases := []struct {
		name, verb, fault string
		// logged is what the daemon's log must say about the failure.
		logged string
	}{
		{"runtime create fails", "create", "fail", "injected failure of runc create"},
		{"container process dies before its start", "create", "die", "the container process exited before it started"},
		{"init dies before ready", "create", "noconfig", "init exited before it was ready"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			name := uniqueName(t)
			rt.set(t, c.verb, c.fault)
			r := d.api.do(t, "POST", "/jails", map[string]any{"name": name})
			rt.clear(t, c.verb)
			if r.status == http.StatusCreated {
				var j jailInfo
				_ = json.Unmarshal(r.body, &j)
				d.destroy(t, j.ID)
				t.Fatalf("the create succeeded although runc %s was made to %s: %s", c.verb, c.fault, r)
			}
			if r.status/100 != 4 && r.status/100 != 5 {
				t.Errorf("want a 4xx or 5xx, got %s", r)
			}
			if r.errorMessage() == "" {
				t.Errorf("no JSON error message: %s", r)
			}
			// The log goes through the harness's pipe: it may lag.
			if err := waitFor(10*time.Second, func() error {
				if !strings.Contains(d.logTail(), c.logged) {
					return fmt.Errorf("the daemon's log does not say %q:\n%s", c.logged, d.logTail())
				}
				return nil
			}); err != nil {
				t.Error(err)
			}
			if d.listed(t, name) {
				t.Errorf("GET /jails lists the jail whose create failed")
			}
			if r := d.api.do(t, "GET", "/jails/"+name, nil); r.status != http.StatusNotFound {
				t.Errorf("GET /jails/%s after its failed create: want 404, got %s", name, r)
			}
			expectClean(t, d, base, "a create that failed late ("+c.name+")")
			// The name is free, and the next create works.
			j := d.createJail(t, map[string]any{"name": name})
			if j.Name != name {
				t.Fatalf("a create with name %q made %q", name, j.Name)
			}
			if out := d.mustSh(t, j.ID, "echo up"); out != "up\n" {
				t.Errorf("a jail created after the failure: %q", out)
			}
			d.api.want(t, http.StatusNoContent, "DELETE", "/jails/"+j.ID, nil, nil)
			expectClean(t, d, base, "the jail made after the failed create")
		})
	}

	// A created jail whose start fails late: the start answers an error,
	// the jail is listed in state error with the reason, the failed start
	// left nothing running (no processes, no cgroup), a later start works,
	// and DELETE takes everything away.
	t.Run("start of a created jail fails", func(t *testing.T) {
		j := d.createJail(t, map[string]any{"start": false})
		rt.set(t, "create", "die")
		r := d.api.do(t, "POST", "/jails/"+j.ID+"/start", nil)
		rt.clear(t, "create")
		if r.status/100 != 4 && r.status/100 != 5 || r.errorMessage() == "" {
			t.Fatalf("a start whose runtime fails: want an error with a message, got %s", r)
		}
		got := d.getJail(t, j.ID)
		if got.Status != "error" || got.Error == "" || got.Pid != 0 {
			t.Errorf("after a failed start the jail is %+v, want status error with the reason", got)
		}
		if !d.listed(t, j.Name) {
			t.Errorf("a jail whose start failed is not listed")
		}
		for _, p := range jailProcs() {
			if strings.Contains(p, jailCgroupOf(j.ID)) {
				t.Errorf("a process of the failed start survived: %s", p)
			}
		}
		for _, c := range jailCgroups() {
			if strings.HasSuffix(c, jailCgroupOf(j.ID)) {
				t.Errorf("the failed start left its cgroup: %s", c)
			}
		}
		d.api.want(t, http.StatusOK, "POST", "/jails/"+j.ID+"/start", nil, nil)
		if out := d.mustSh(t, j.ID, "echo up"); out != "up\n" {
			t.Errorf("the jail started after a failed start: %q", out)
		}
		d.api.want(t, http.StatusNoContent, "DELETE", "/jails/"+j.ID, nil, nil)
		expectClean(t, d, base, "destroying a jail whose start once failed")
	})
}

// TestLifecycleTransitions holds a jail in the middle of a start and of a
// stop (the runtime call is held) and checks that, while the jail is
// starting or stopping, exec, files, start and stop answer 409 at once
// with a message instead of running or queueing, and that the transition
// then completes.
func TestLifecycleTransitions(t *testing.T) {
	rt := newFaultRuntime(t)
	d := newDaemon(t, "--runtime", rt.path)
	j := d.createJail(t, map[string]any{"start": false})
	base := "/jails/" + j.ID

	// during checks the requests that must be refused in state.
	during := func(t *testing.T, state string) {
		t.Helper()
		for _, rq := range []struct {
			method, path string
			body         any
		}{
			{"POST", base + "/exec", execReq{Cmd: []string{"true"}}},
			{"GET", base + "/files/workspace", nil},
			{"POST", base + "/start", nil},
			{"POST", base + "/stop", map[string]any{"timeout_s": 0}},
		} {
			start := time.Now()
			r := d.api.do(t, rq.method, rq.path, rq.body)
			if r.status != http.StatusConflict || r.errorMessage() == "" {
				t.Errorf("%s %s while the jail is %s: want 409 with a message, got %s", rq.method, rq.path, state, r)
			} else if !strings.Contains(r.errorMessage(), state) {
				t.Errorf("%s %s while the jail is %s: the message does not say so: %q", rq.method, rq.path, state, r.errorMessage())
			}
			if el := time.Since(start); el > 10*time.Second {
				t.Errorf("%s %s while the jail is %s took %v: it waited for the transition", rq.method, rq.path, state, el)
			}
		}
		if got := d.getJail(t, j.ID); got.Status != state {
			t.Errorf("the refused requests changed the jail: %s, want %s", got.Status, state)
		}
	}
	// inState waits until GET shows the jail in state.
	inState := func(t *testing.T, state string) {
		t.Helper()
		if err := waitFor(30*time.Second, func() error {
			if got := d.getJail(t, j.ID).Status; got != state {
				return fmt.Errorf("the jail is %s, not %s", got, state)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("starting", func(t *testing.T) {
		rt.set(t, "create", "hold")
		t.Cleanup(func() { rt.clear(t, "create") })
		done := make(chan *response, 1)
		go func() {
			r, _ := d.api.send("POST", base+"/start", nil)
			done <- r
		}()
		inState(t, "starting")
		if err := waitFor(30*time.Second, func() error {
			if !rt.held("create") {
				return fmt.Errorf("runc create is not being held")
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		during(t, "starting")
		rt.clear(t, "create")
		r := <-done
		if r == nil || r.status != http.StatusOK {
			t.Fatalf("the held start, once released: %v", r)
		}
		if got := d.getJail(t, j.ID); got.Status != "running" {
			t.Fatalf("after the start: %s (%s)", got.Status, got.Error)
		}
		if out := d.mustSh(t, j.ID, "echo up"); out != "up\n" {
			t.Errorf("exec after the start: %q", out)
		}
	})

	t.Run("stopping", func(t *testing.T) {
		if got := d.getJail(t, j.ID); got.Status != "running" {
			t.Fatalf("the jail is %s, not running", got.Status)
		}
		rt.set(t, "kill", "hold")
		t.Cleanup(func() { rt.clear(t, "kill") })
		done := make(chan *response, 1)
		go func() {
			r, _ := d.api.send("POST", base+"/stop", map[string]any{"timeout_s": 5})
			done <- r
		}()
		inState(t, "stopping")
		if err := waitFor(30*time.Second, func() error {
			if !rt.held("kill") {
				return fmt.Errorf("runc kill is not being held")
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		during(t, "stopping")
		rt.clear(t, "kill")
		r := <-done
		if r == nil || r.status != http.StatusOK {
			t.Fatalf("the held stop, once released: %v", r)
		}
		if got := d.getJail(t, j.ID); got.Status != "stopped" {
			t.Fatalf("after the stop: %s (%s)", got.Status, got.Error)
		}
		d.api.want(t, http.StatusOK, "POST", base+"/start", nil, nil)
		if out := d.mustSh(t, j.ID, "echo up"); out != "up\n" {
			t.Errorf("exec after a start: %q", out)
		}
	})
}

// TestLifecycleIllegalTransitionsSayWhy makes the transitions the state
// machine has no arrow for: each answers 409 with a message naming the
// jail's state, and the jail stays in it.
func TestLifecycleIllegalTransitionsSayWhy(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, map[string]any{"start": false})
	base := "/jails/" + j.ID
	refused := func(state, method, path string, body any) {
		t.Helper()
		r := d.api.do(t, method, path, body)
		if r.status != http.StatusConflict {
			t.Errorf("%s %s of a %s jail: want 409, got %s", method, path, state, r)
			return
		}
		if msg := r.errorMessage(); !strings.Contains(msg, j.Name) || !strings.Contains(msg, state) {
			t.Errorf("%s %s of a %s jail: the message does not name the jail and its state: %q", method, path, state, msg)
		}
		if got := d.getJail(t, j.ID); got.Status != state {
			t.Errorf("%s %s of a %s jail changed it to %s", method, path, state, got.Status)
		}
	}
	run := execReq{Cmd: []string{"true"}}
	refused("created", "POST", base+"/exec", run)
	refused("created", "POST", base+"/exec/stream", run)
	refused("created", "PUT", base+"/files/workspace/x", "x")
	refused("created", "POST", base+"/stop", nil)
	d.api.want(t, http.StatusOK, "POST", base+"/start", nil, nil)
	refused("running", "POST", base+"/start", nil)
	d.api.want(t, http.StatusOK, "POST", base+"/stop", map[string]any{"timeout_s": 0}, nil)
	refused("stopped", "POST", base+"/stop", nil)
	refused("stopped", "POST", base+"/exec", run)
	refused("stopped", "GET", base+"/files/workspace", nil)
}
