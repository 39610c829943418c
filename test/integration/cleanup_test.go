package integration

import (
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// warmDisk reports whether an inventory item is one of the pool's warm
// disks, which the pool makes and hands out on its own.
func warmDisk(item string) bool { return strings.Contains(item, "/pool/warm/") }

// baseline waits until the host's inventory stops changing (the pool's
// warm disks settle) and returns it.
func baseline(t *testing.T, d *daemon) inventory {
	t.Helper()
	var inv inventory
	err := waitFor(30*time.Second, func() error {
		a := takeInventory(d.dir)
		time.Sleep(200 * time.Millisecond)
		inv = takeInventory(d.dir)
		if diff := d.relevant(append(inv.added(a), a.added(inv)...)); len(diff) > 0 {
			return &leakError{diff}
		}
		return nil
	})
	if err != nil {
		t.Logf("the inventory kept changing: %v", err)
	}
	return inv
}

type leakError struct{ items []string }

func (e *leakError) Error() string { return strings.Join(e.items, "\n  ") }

// expectClean fails the test if the host holds more than base.
func expectClean(t *testing.T, d *daemon, base inventory, what string) {
	t.Helper()
	if extra := waitNoLeak(d, base, 20*time.Second, warmDisk); len(extra) > 0 {
		t.Errorf("%s left behind:\n  %s", what, strings.Join(extra, "\n  "))
	}
}

// TestCleanupDestroy destroys jails in every state and checks that nothing
// of them is left on the host.
func TestCleanupDestroy(t *testing.T) {
	d := shared(t)
	base := baseline(t, d)
	for _, state := range []string{"running", "busy", "stopped", "created"} {
		t.Run(state, func(t *testing.T) {
			j := d.createJail(t, map[string]any{"start": state != "created"})
			switch state {
			case "busy":
				// Detached processes, a full-ish disk, open files, a
				// mount namespace held by a background process.
				d.mustSh(t, j.ID, "setsid sleep 3000 >/dev/null 2>&1 & (nohup sleep 3001 >/dev/null 2>&1 &); dd if=/dev/zero of=/workspace/f bs=1M count=20 2>/dev/null; exec 3</workspace/f; echo ok")
			case "stopped":
				d.api.want(t, http.StatusOK, "POST", "/jails/"+j.ID+"/stop", map[string]any{"timeout_s": 0}, nil)
				if procs, err := pidsInCgroupOf("pids", j.ID); err == nil && len(procs) > 0 {
					t.Errorf("a stopped jail still has processes: %v", procs)
				}
			}
			inv := takeInventory(d.dir)
			if (state == "running" || state == "busy") && !containsSub(inv.Procs, j.ID) {
				t.Errorf("the inventory does not see the jail's processes (cgroup naming changed?): %v", inv.Procs)
			}
			if state == "running" || state == "busy" {
				// A running jail has its veth, its host route and its
				// chains in the daemon's table; all go with it (a stopped
				// one has none).
				if added := inv.added(base); !containsSub(added, "interface: ") || !containsSub(added, "route: ") || !containsSub(added, "nft: chain j_"+j.ID) {
					t.Errorf("the inventory does not see the jail's network (veth, route, nft chains): %v", added)
				}
			}
			d.api.want(t, http.StatusNoContent, "DELETE", "/jails/"+j.ID, nil, nil)
			expectClean(t, d, base, "destroying a "+state+" jail")
			if _, err := os.Stat(d.dir + "/jails/" + j.ID); !os.IsNotExist(err) {
				t.Errorf("the jail's directory is still there: %v", err)
			}
		})
	}
}

func containsSub(list []string, sub string) bool {
	for _, s := range list {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// TestCleanupFailedCreate makes creates that fail at every stage and
// checks that each leaves nothing behind.
func TestCleanupFailedCreate(t *testing.T) {
	d := shared(t)
	base := baseline(t, d)
	emptyRoot, err := os.MkdirTemp("", "agentjail-it-emptyroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(emptyRoot) })
	cases := map[string]map[string]any{
		"dir rootfs that does not exist": {"isolation": map[string]any{"filesystem": map[string]any{"rootfs": "dir:/nonexistent/agentjail-it-root"}}},
		"unsupported level":              {"isolation": map[string]any{"level": "vm"}},
		"apparmor profile":               {"isolation": map[string]any{"process": map[string]any{"apparmor_profile": "x"}}},
		"namespace turned off":           {"isolation": map[string]any{"process": map[string]any{"namespaces": map[string]any{"pid": false}}}},
		"mount source that does not exist": {"isolation": map[string]any{"filesystem": map[string]any{
			"read_only_mounts": []map[string]any{{"source": "/nonexistent/agentjail-it-src", "target": "/mnt/src"}},
		}}},
		"unknown user":             {"isolation": map[string]any{"process": map[string]any{"user": "nosuchuser"}}},
		"memory below the minimum": {"isolation": map[string]any{"resources": map[string]any{"memory_bytes": 1 << 20}}},
		"disk above the pool":      {"isolation": map[string]any{"resources": map[string]any{"disk_bytes": 16 << 30}}},
	}
	for name, spec := range cases {
		t.Run(name, func(t *testing.T) {
			body := map[string]any{"name": uniqueName(t)}
			for k, v := range spec {
				body[k] = v
			}
			r := d.api.do(t, "POST", "/jails", body)
			switch {
			case r.status == http.StatusCreated:
				var j jailInfo
				_ = json.Unmarshal(r.body, &j)
				d.destroy(t, j.ID)
				// Some of these are allowed by design (a disk the pool can
				// hold); they must still clean up.
				t.Logf("accepted: %s", r)
			case r.status/100 != 4:
				t.Errorf("want a 4xx, got %s", r)
			case r.errorMessage() == "":
				t.Errorf("no error message: %s", r)
			default:
				t.Logf("refused: %s", r)
			}
			expectClean(t, d, base, "a failed create ("+name+")")
		})
	}
}

// TestCleanupStop checks that stopping a jail ends all of its processes,
// detached ones included, and frees its network namespace's users.
// TestStopTermsBackgroundProcesses: stopping a jail gives every process
// SIGTERM first, background ones (left by a finished command) included,
// so a daemon in the jail can finish its work; its file is there after a
// start.
func TestStopTermsBackgroundProcesses(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, nil)
	d.mustSh(t, j.ID, `setsid -f sh -c 'trap "echo term > /workspace/got-term; exit 0" TERM; touch /workspace/trapped; while :; do sleep 0.1; done' >/dev/null 2>&1 </dev/null; echo ok`)
	d.waitSh(t, j.ID, "test -e /workspace/trapped", 10*time.Second, "the background process has not set its trap")
	d.api.want(t, http.StatusOK, "POST", "/jails/"+j.ID+"/stop", map[string]any{"timeout_s": 10}, nil)
	d.api.want(t, http.StatusOK, "POST", "/jails/"+j.ID+"/start", nil, nil)
	if out := d.mustSh(t, j.ID, "cat /workspace/got-term 2>&1 || true"); strings.TrimSpace(out) != "term" {
		t.Fatalf("the background process did not get SIGTERM at the stop: %q", out)
	}
}

func TestCleanupStop(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, nil)
	d.mustSh(t, j.ID, "setsid sh -c 'trap \"\" TERM; sleep 3000' >/dev/null 2>&1 & echo ok")
	d.api.want(t, http.StatusOK, "POST", "/jails/"+j.ID+"/stop", map[string]any{"timeout_s": 1}, nil)
	for _, p := range jailProcs() {
		if strings.Contains(p, j.ID) {
			t.Errorf("a process of the stopped jail survived: %s", p)
		}
	}
	d.api.want(t, http.StatusOK, "POST", "/jails/"+j.ID+"/start", nil, nil)
	if out := d.mustSh(t, j.ID, "ps -eo args= | grep -c 'sleep 300[0]' || true"); strings.TrimSpace(out) != "0" {
		t.Errorf("a process from before the stop is back after the start: %q", out)
	}
}
