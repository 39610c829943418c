package integration

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// readyJails lists the ids of the daemon's ready jails (those of its warm
// pool not handed out): jail directories with the pool's marker.
func readyJails(t *testing.T, d *daemon) []string {
	t.Helper()
	marks, err := filepath.Glob(filepath.Join(d.dir, "jails", "*", "warm"))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range marks {
		ids = append(ids, filepath.Base(filepath.Dir(m)))
	}
	return ids
}

// TestWarmPool: a create of the default configuration is served by a
// ready jail, which becomes the caller's: the requested name, host name
// and HOSTNAME, the only jail the API lists; the pool refills. A create
// that differs from the default, or asks not to start, gets a jail of its
// own; a taken name is a 409 that costs the pool nothing. A daemon that
// stops destroys its ready jails.
func TestWarmPool(t *testing.T) {
	d := newDaemon(t, "--warm-jails", "2")
	d.waitWarm(t)
	ready := readyJails(t, d)
	if len(ready) != 2 {
		t.Fatalf("ready jails on disk: %v, want 2", ready)
	}
	if h := d.health(t); h.Jails != 0 {
		t.Errorf("health counts %d jails before any create; ready jails are not the API's", h.Jails)
	}
	var list struct {
		Jails []jailInfo `json:"jails"`
	}
	d.api.want(t, http.StatusOK, "GET", "/jails", nil, &list)
	if len(list.Jails) != 0 {
		t.Errorf("GET /jails lists %d jails before any create", len(list.Jails))
	}

	var j jailInfo
	d.api.want(t, http.StatusCreated, "POST", "/jails", map[string]any{"name": "warm-taker"}, &j)
	if !slices.Contains(ready, j.ID) {
		t.Fatalf("jail %s was not one of the ready jails %v", j.ID, ready)
	}
	if j.Name != "warm-taker" || j.Status != "running" || time.Since(j.CreatedAt) > time.Minute {
		t.Errorf("taken jail: name %q status %q created_at %v", j.Name, j.Status, j.CreatedAt)
	}
	if got := d.mustSh(t, j.ID, `echo "$(hostname) $HOSTNAME"`); got != "warm-taker warm-taker\n" {
		t.Errorf("host name and HOSTNAME in the taken jail: %q", got)
	}
	if got := d.getJail(t, "warm-taker"); got.ID != j.ID {
		t.Errorf("GET /jails/warm-taker is %s, want %s", got.ID, j.ID)
	}
	d.api.want(t, http.StatusOK, "GET", "/jails", nil, &list)
	if len(list.Jails) != 1 || list.Jails[0].ID != j.ID {
		t.Errorf("GET /jails after one create: %+v", list.Jails)
	}
	if _, err := os.Stat(filepath.Join(d.dir, "jails", j.ID, "warm")); !os.IsNotExist(err) {
		t.Errorf("the taken jail still carries the pool's marker: %v", err)
	}
	h := d.health(t)
	if h.Warm == nil || h.Warm.Taken != 1 || h.Jails != 1 {
		t.Fatalf("health after one create from the pool: jails %d, warm %+v", h.Jails, h.Warm)
	}

	// A taken name: 409, and the pool does not lose a jail to it.
	d.waitWarm(t)
	r := d.api.want(t, http.StatusConflict, "POST", "/jails", map[string]any{"name": "warm-taker"}, nil)
	if !strings.Contains(r.errorMessage(), "warm-taker") {
		t.Errorf("conflict message: %q", r.errorMessage())
	}
	if h := d.health(t); h.Warm.Ready != 2 || h.Warm.Taken != 1 {
		t.Errorf("after a refused name: warm %+v, want 2 ready and 1 taken", h.Warm)
	}

	// Not the default configuration, or not started: a jail of its own.
	var own, created jailInfo
	d.api.want(t, http.StatusCreated, "POST", "/jails", map[string]any{"name": "own-env", "env": map[string]string{"A": "1"}}, &own)
	d.api.want(t, http.StatusCreated, "POST", "/jails", map[string]any{"name": "not-started", "start": false}, &created)
	if slices.Contains(ready, own.ID) || slices.Contains(ready, created.ID) {
		t.Errorf("a create that differs from the default was served from the pool")
	}
	if created.Status != "created" {
		t.Errorf("start:false gave a %s jail", created.Status)
	}
	if got := d.mustSh(t, own.ID, `echo "$A $(hostname) $HOSTNAME"`); got != "1 own-env own-env\n" {
		t.Errorf("jail with its own configuration: %q", got)
	}
	if h := d.health(t); h.Warm.Taken != 1 {
		t.Errorf("creates that differ from the default took from the pool: %+v", h.Warm)
	}

	// Without a name, the taken jail is named after its id.
	var anon jailInfo
	d.api.want(t, http.StatusCreated, "POST", "/jails", map[string]any{}, &anon)
	if anon.Name != "jail-"+anon.ID[:6] {
		t.Errorf("unnamed jail from the pool is named %q (id %s)", anon.Name, anon.ID)
	}

	for _, id := range []string{j.ID, own.ID, created.ID, anon.ID} {
		d.destroy(t, id)
	}
	d.waitWarm(t)
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	left, err := os.ReadDir(filepath.Join(d.dir, "jails"))
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Errorf("a stopped daemon left jail directories: %v", left)
	}
}

// TestWarmPoolCrash: a daemon restarted after SIGKILL keeps the jail its
// pool handed out and releases the ready jails the dead one left.
func TestWarmPoolCrash(t *testing.T) {
	d := newDaemon(t, "--warm-jails", "2")
	d.waitWarm(t)
	var j jailInfo
	d.api.want(t, http.StatusCreated, "POST", "/jails", map[string]any{"name": "kept"}, &j)
	d.waitWarm(t)
	ready := readyJails(t, d)
	if len(ready) != 2 {
		t.Fatalf("ready jails: %v", ready)
	}
	d.kill()
	d.flags = append(d.flags, "--warm-jails", "0")
	if err := d.restart(); err != nil {
		t.Fatal(err)
	}
	if got := d.mustSh(t, "kept", "hostname"); got != "kept\n" {
		t.Errorf("the handed-out jail after the restart: hostname %q", got)
	}
	for _, id := range ready {
		if _, err := os.Stat(filepath.Join(d.dir, "jails", id)); !os.IsNotExist(err) {
			t.Errorf("ready jail %s of the dead daemon is still on disk: %v", id, err)
		}
	}
	var held []string
	err := waitFor(15*time.Second, func() error {
		inv := takeInventory(d.dir)
		held = held[:0]
		for _, item := range slices.Concat(inv.Cgroups, inv.Procs, inv.Netns, inv.Mounts) {
			for _, id := range ready {
				if strings.Contains(item, id) {
					held = append(held, item)
				}
			}
		}
		if len(held) > 0 {
			return os.ErrExist
		}
		return nil
	})
	if err != nil {
		t.Errorf("the ready jails of the dead daemon still hold:\n  %s", strings.Join(held, "\n  "))
	}
	var h healthInfo
	d.api.want(t, http.StatusOK, "GET", "/health", nil, &h)
	if h.Jails != 1 || h.Warm != nil {
		out, _ := json.Marshal(h)
		t.Errorf("health after the restart: %s", out)
	}
}
