package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fullableDataDir starts a daemon whose records — the jails' directories
// (their event files) and the snapshots' (their process images) — are on
// a filesystem of size bytes of their own (a tmpfs bound to DATA/jails and
// DATA/snapshots), and returns it with that filesystem's mount point. The
// storage pool stays on the host's filesystem: a full disk under a sparse
// pool fails the jails' disks too, which is not what is tested here.
func fullableDataDir(t *testing.T, size int64) (*daemon, string) {
	t.Helper()
	requireEnv(t)
	dir, err := os.MkdirTemp("", "agentjail-it-")
	if err != nil {
		t.Fatal(err)
	}
	top := dir + "-records"
	var mounted []string
	release := func() error {
		var errs []error
		for i := len(mounted) - 1; i >= 0; i-- {
			if err := unix.Unmount(mounted[i], 0); err != nil {
				errs = append(errs, fmt.Errorf("unmount %s: %w", mounted[i], err))
			}
		}
		mounted = nil
		return errors.Join(append(errs, os.RemoveAll(top))...)
	}
	setup := func() error {
		if err := os.Mkdir(top, 0o700); err != nil {
			return err
		}
		if err := unix.Mount("tmpfs", top, "tmpfs", 0, fmt.Sprintf("size=%d", size)); err != nil {
			return err
		}
		mounted = append(mounted, top)
		for _, sub := range []string{"jails", "snapshots"} {
			for _, p := range []string{filepath.Join(top, sub), filepath.Join(dir, sub)} {
				if err := os.Mkdir(p, 0o711); err != nil {
					return err
				}
			}
			if err := unix.Mount(filepath.Join(top, sub), filepath.Join(dir, sub), "", unix.MS_BIND, ""); err != nil {
				return err
			}
			mounted = append(mounted, filepath.Join(dir, sub))
		}
		return nil
	}
	if err := setup(); err != nil {
		release()
		os.RemoveAll(dir)
		t.Fatalf("a small filesystem for the daemon's records: %v", err)
	}
	d, err := startDaemon(dir)
	if err != nil {
		release()
		t.Fatalf("starting a daemon: %v", err)
	}
	t.Cleanup(func() {
		// The daemon's shutdown, with the records' filesystem unmounted
		// between the teardown and the check that nothing is left.
		errs := []error{d.stop()}
		if _, err := d.teardown(); err != nil {
			errs = append(errs, err)
		}
		errs = append(errs, release())
		if left := d.leftovers(); len(left) > 0 {
			errs = append(errs, fmt.Errorf("left behind: %v", left))
		}
		d.ids.close()
		errs = append(errs, os.RemoveAll(d.dir))
		if err := errors.Join(errs...); err != nil {
			t.Errorf("shutting down the daemon: %v\n%s", err, d.logTail())
		}
	})
	return d, top
}

// fillDisk fills the filesystem of dir with a file, and returns a function
// that removes it.
func fillDisk(t *testing.T, dir string) func() {
	t.Helper()
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	size := int64(st.Bavail) * st.Bsize
	for i := 0; i < 64 && size > 0 && unix.Fallocate(int(f.Fd()), 0, 0, size) != nil; i++ {
		size -= 1 << 20
	}
	// Whatever is left, a page at a time.
	page := make([]byte, 4096)
	for {
		if _, err := f.WriteAt(page, size); err != nil {
			break
		}
		size += int64(len(page))
	}
	if err := unix.Statfs(dir, &st); err != nil || st.Bavail > 0 {
		t.Fatalf("the disk is not full: %d blocks free (%v)", st.Bavail, err)
	}
	return func() {
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
	}
}

// reportObservation is the observation part of GET /jails/{id}/report.
type reportObservation struct {
	Observation struct {
		OK      bool   `json:"ok"`
		Message string `json:"message"`
	} `json:"observation"`
	Lost map[string]uint64 `json:"lost"`
}

// wholeEventFiles fails the test if an event file of the jail holds part
// of a line, and returns the total of the lost events the files report.
func wholeEventFiles(t *testing.T, d *daemon, id string) uint64 {
	t.Helper()
	var lost uint64
	for name, data := range eventFiles(t, d, id) {
		if len(data) > 0 && data[len(data)-1] != '\n' {
			t.Errorf("%s ends in part of a line: %q", name, data[max(0, len(data)-80):])
		}
		for i, l := range bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n")) {
			var ev struct {
				Type  string `json:"type"`
				Count uint64 `json:"count"`
			}
			if len(l) > 0 && json.Unmarshal(l, &ev) != nil {
				t.Errorf("%s line %d is not whole: %q", name, i+1, l)
				break
			}
			if ev.Type == "lost" {
				lost += ev.Count
			}
		}
	}
	return lost
}

// TestDiskFull fills the disk of the daemon's records while a busy jail is
// observed.
// The jail runs on; its report says the event files are not written, and
// why; a snapshot answers 507 and leaves nothing; the event files hold
// whole lines only. Once there is room again, the events are written
// again, the files report how many were lost, and a snapshot is taken and
// restores.
func TestDiskFull(t *testing.T) {
	d, top := fullableDataDir(t, 256<<20)
	j := d.createJail(t, nil)
	d.mustSh(t, j.ID, `i=0; while :; do i=$((i+1)); cat /etc/hostname >/dev/null; echo $i > /workspace/count; sleep 0.02; done >/dev/null 2>&1 &`)
	n := d.waitCounting(t, j.ID, 0)

	free := fillDisk(t, top)
	var rep reportObservation
	if err := waitFor(30*time.Second, func() error {
		d.api.want(t, http.StatusOK, "GET", "/jails/"+j.ID+"/report", nil, &rep)
		if rep.Observation.OK || !strings.Contains(rep.Observation.Message, "no space left on device") {
			return fmt.Errorf("observation: %+v", rep.Observation)
		}
		return nil
	}); err != nil {
		t.Fatalf("the report does not say the event files are not written: %v", err)
	}
	t.Logf("with the disk full: %s", rep.Observation.Message)
	n = d.waitCounting(t, j.ID, n)
	if got := d.getJail(t, j.ID); got.Status != "running" {
		t.Fatalf("the jail with the disk full: %+v", got)
	}
	r := d.api.do(t, "POST", "/jails/"+j.ID+"/snapshot", map[string]any{})
	var e apiError
	_ = json.Unmarshal(r.body, &e)
	if r.status != http.StatusInsufficientStorage || e.Error.Code != "no_space" {
		t.Errorf("a snapshot with the disk full: want 507 no_space, got %s", r)
	}
	for _, sub := range []string{"snapshots", "pool/snapshots"} {
		if left := dirNames(filepath.Join(d.dir, sub)); len(left) > 0 {
			t.Errorf("the failed snapshot left %s/%v", sub, left)
		}
	}
	wholeEventFiles(t, d, j.ID)
	n = d.waitCounting(t, j.ID, n)

	free()
	if err := waitFor(30*time.Second, func() error {
		d.api.want(t, http.StatusOK, "GET", "/jails/"+j.ID+"/report", nil, &rep)
		if !rep.Observation.OK || rep.Lost["disk"] == 0 {
			return fmt.Errorf("observation %+v, lost %v", rep.Observation, rep.Lost)
		}
		return nil
	}); err != nil {
		t.Fatalf("with room again: %v", err)
	}
	// The files report the lost events once the writer has written past
	// them (the count in the report only grows: compare with what the
	// files say once they say something).
	if err := waitFor(30*time.Second, func() error {
		if reported := wholeEventFiles(t, d, j.ID); reported == 0 {
			return fmt.Errorf("no lost event in the files yet (report: %d lost)", rep.Lost["disk"])
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	s := d.takeSnapshot(t, j.ID, "full")
	rj := d.restoreSnapshot(t, s.ID)
	d.waitCounting(t, rj.ID, d.waitCounting(t, rj.ID, 0))
	d.waitCounting(t, j.ID, n)
}
