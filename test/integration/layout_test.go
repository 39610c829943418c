package integration

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// mountFSType returns the filesystem type mounted at path ("" when path is
// not a mount point).
func mountFSType(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fstype := ""
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source super
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields := strings.Fields(pre)
		if !ok || len(fields) < 5 || unescapeOctal(fields[4]) != path {
			continue
		}
		if f := strings.Fields(post); len(f) > 0 {
			fstype = f[0] // the last mount at path is the one seen
		}
	}
	return fstype
}

// mustDir fails the test unless path is a directory.
func mustDir(t *testing.T, path string) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Errorf("%v", err)
		return
	}
	if !st.IsDir() {
		t.Errorf("%s is not a directory (%v)", path, st.Mode())
	}
}

// jailRecord is the part of jail.json the layout test reads.
type jailRecord struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	Status string `json:"status"`
	Config struct {
		Env       map[string]string `json:"env"`
		Isolation struct {
			Resources struct {
				MemoryBytes int64 `json:"memory_bytes"`
			} `json:"resources"`
		} `json:"isolation"`
	} `json:"config"`
}

// readRecord reads DATA_DIR/jails/{id}/jail.json.
func readRecord(t *testing.T, d *daemon, id string) jailRecord {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(d.dir, "jails", id, "jail.json"))
	if err != nil {
		t.Fatalf("the jail's record: %v", err)
	}
	var rec jailRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatalf("jail.json is not JSON: %v\n%s", err, data)
	}
	return rec
}

// TestLayoutJailDir checks the documented storage layout of a jail:
// DATA_DIR/jails/{id}/jail.json holds its id, name, status and config;
// rootfs/upper, work and merged exist, merged being the jail's overlay
// root while it runs and upper holding what the jail wrote; events/ holds
// the observation streams once it ran; a snapshot lands in
// DATA_DIR/snapshots/{sid} (snapshots outlive their jail, so they are not
// under the jail's directory); DELETE removes the jail's directory.
func TestLayoutJailDir(t *testing.T) {
	d := shared(t)
	const mem = 256 << 20
	spec := map[string]any{
		"env":       map[string]string{"LAYOUT_MARK": "layout-value"},
		"isolation": map[string]any{"resources": map[string]any{"memory_bytes": mem}},
	}

	t.Run("created", func(t *testing.T) {
		s := map[string]any{"start": false}
		for k, v := range spec {
			s[k] = v
		}
		j := d.createJail(t, s)
		dir := filepath.Join(d.dir, "jails", j.ID)
		rec := readRecord(t, d, j.ID)
		if rec.ID != j.ID || rec.Name != j.Name || rec.Status != "created" {
			t.Errorf("jail.json of a created jail: %+v, want id %s name %s status created", rec, j.ID, j.Name)
		}
		if rec.Config.Env["LAYOUT_MARK"] != "layout-value" || rec.Config.Isolation.Resources.MemoryBytes != mem {
			t.Errorf("jail.json does not hold the config asked for: %+v", rec.Config)
		}
		for _, sub := range []string{"rootfs/upper", "rootfs/work", "rootfs/merged"} {
			mustDir(t, filepath.Join(dir, sub))
		}
		d.api.want(t, http.StatusNoContent, "DELETE", "/jails/"+j.ID, nil, nil)
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("after DELETE the jail's directory is still there: %v", err)
		}
	})

	t.Run("running", func(t *testing.T) {
		j := d.createJail(t, spec)
		dir := filepath.Join(d.dir, "jails", j.ID)
		rec := readRecord(t, d, j.ID)
		if rec.ID != j.ID || rec.Name != j.Name || rec.Status != "running" {
			t.Errorf("jail.json of a running jail: %+v", rec)
		}
		if rec.Config.Env["LAYOUT_MARK"] != "layout-value" || rec.Config.Isolation.Resources.MemoryBytes != mem {
			t.Errorf("jail.json does not hold the config asked for: %+v", rec.Config)
		}
		for _, sub := range []string{"rootfs/upper", "rootfs/work", "rootfs/merged", "events"} {
			mustDir(t, filepath.Join(dir, sub))
		}
		merged := filepath.Join(dir, "rootfs", "merged")
		if fs := mountFSType(t, merged); fs != "overlay" {
			t.Errorf("rootfs/merged of a running jail is mounted as %q, want overlay", fs)
		}
		if out := d.mustSh(t, j.ID, "echo $LAYOUT_MARK; echo written > /workspace/layout.txt"); !strings.HasPrefix(out, "layout-value\n") {
			t.Errorf("the jail's env: %q", out)
		}
		if b, err := os.ReadFile(filepath.Join(dir, "rootfs", "upper", "workspace", "layout.txt")); err != nil || string(b) != "written\n" {
			t.Errorf("a file the jail wrote is not in rootfs/upper: %q %v", b, err)
		}
		if b, err := os.ReadFile(filepath.Join(merged, "workspace", "layout.txt")); err != nil || string(b) != "written\n" {
			t.Errorf("a file the jail wrote is not in rootfs/merged: %q %v", b, err)
		}
		if ents, err := os.ReadDir(filepath.Join(dir, "events")); err != nil || len(ents) == 0 {
			t.Errorf("events/ of a jail that ran a command is empty: %v", err)
		}

		snap := d.takeSnapshot(t, j.ID, "fs")
		sdir := filepath.Join(d.dir, "snapshots", snap.ID)
		var meta struct {
			ID     string `json:"id"`
			JailID string `json:"jail_id"`
		}
		data, err := os.ReadFile(filepath.Join(sdir, "metadata.json"))
		if err != nil {
			t.Fatalf("the snapshot's record: %v", err)
		}
		if err := json.Unmarshal(data, &meta); err != nil || meta.ID != snap.ID || meta.JailID != j.ID {
			t.Errorf("snapshots/%s/metadata.json: %s (%v)", snap.ID, data, err)
		}
		if _, err := os.Stat(filepath.Join(d.dir, "pool", "snapshots", snap.ID+".img")); err != nil {
			t.Errorf("the snapshot's disk: %v", err)
		}

		d.api.want(t, http.StatusNoContent, "DELETE", "/jails/"+j.ID, nil, nil)
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("after DELETE the jail's directory is still there: %v", err)
		}
		if _, err := os.Stat(filepath.Join(sdir, "metadata.json")); err != nil {
			t.Errorf("the snapshot did not outlive its jail: %v", err)
		}
		d.api.want(t, http.StatusNoContent, "DELETE", "/snapshots/"+snap.ID, nil, nil)
		if _, err := os.Stat(sdir); !os.IsNotExist(err) {
			t.Errorf("after DELETE /snapshots/%s its directory is still there: %v", snap.ID, err)
		}
	})
}

// dirTree writes a small root tree for the `dir` provider: the host's /usr
// is bound over its empty usr/ (read-only mount), bin, sbin and lib link
// into it, and etc/ holds the tree's own users. It returns the tree and a
// marker only the tree has.
func dirTree(t *testing.T) (string, string) {
	t.Helper()
	root, err := os.MkdirTemp("", "agentjail-it-tree-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"usr", "etc", "tmp", "root", "home/agent", "var/tmp"} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, dir := range []string{"tmp", "var/tmp"} {
		if err := os.Chmod(filepath.Join(root, dir), 0o1777); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(filepath.Join(root, "home/agent"), 1000, 1000); err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"} {
		// Only the links the host has (a merged-/usr host).
		if target, err := os.Readlink("/" + l); err == nil {
			if err := os.Symlink(target, filepath.Join(root, l)); err != nil {
				t.Fatal(err)
			}
		}
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	marker := "tree-" + hex.EncodeToString(b[:])
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\n" +
			"agent:x:1000:1000:agent:/home/agent:/bin/sh\n" +
			"treeuser:x:4321:4321:only in the tree:/nonexistent:/bin/sh\n",
		"etc/group":     "root:x:0:\nagent:x:1000:\ntreeuser:x:4321:\n",
		"etc/hosts":     "127.0.0.1\tlocalhost\n",
		"tree-marker":   marker + "\n",
		"to-delete":     "delete me\n",
		"etc/tree-only": "yes\n",
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(root, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root, marker
}

// TestRootfsDir starts a jail on a `dir:` root tree: the jail sees that
// tree (its marker file and its own users, nothing of the host provider's
// /etc), runs commands, and its writes, changes and deletions land in the
// jail's upper layer while the source tree stays as it was.
func TestRootfsDir(t *testing.T) {
	d := shared(t)
	root, marker := dirTree(t)
	j := d.createJail(t, map[string]any{"isolation": map[string]any{"filesystem": map[string]any{
		"rootfs":           "dir:" + root,
		"read_only_mounts": []map[string]any{{"source": "/usr", "target": "/usr"}},
	}}})
	if j.Status != "running" {
		t.Fatalf("a jail on a dir tree: %+v", j)
	}
	out := d.mustSh(t, j.ID, "cat /tree-marker; id -un; id -u; grep -c treeuser /etc/passwd; cat /etc/tree-only; test -e /etc/os-release && echo host-etc || echo own-etc")
	if want := marker + "\nagent\n1000\n1\nyes\nown-etc\n"; out != want {
		t.Fatalf("the jail does not see its dir tree:\n got %q\nwant %q", out, want)
	}

	res := d.shAs(t, j.ID, "root", "echo changed > /tree-marker && echo new > /created-in-jail && rm /to-delete && echo done")
	if res.ExitCode != 0 || res.Stdout != "done\n" {
		t.Fatalf("writing to the jail's root: %s", &res)
	}
	if out := d.mustSh(t, j.ID, "cat /tree-marker /created-in-jail; test -e /to-delete && echo still-there || echo gone"); out != "changed\nnew\ngone\n" {
		t.Errorf("the jail does not see its own writes: %q", out)
	}
	// The source tree is untouched.
	if b, err := os.ReadFile(filepath.Join(root, "tree-marker")); err != nil || string(b) != marker+"\n" {
		t.Errorf("the jail's write reached the source tree: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(root, "created-in-jail")); !os.IsNotExist(err) {
		t.Errorf("a file the jail created appeared in the source tree: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "to-delete")); err != nil {
		t.Errorf("a file the jail deleted is gone from the source tree: %v", err)
	}
	// The writes went to the upper layer: the new contents, and a
	// whiteout (a 0/0 character device) for the deletion.
	upper := filepath.Join(d.dir, "jails", j.ID, "rootfs", "upper")
	if b, err := os.ReadFile(filepath.Join(upper, "tree-marker")); err != nil || string(b) != "changed\n" {
		t.Errorf("upper/tree-marker: %q %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(upper, "created-in-jail")); err != nil || string(b) != "new\n" {
		t.Errorf("upper/created-in-jail: %q %v", b, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(upper, "to-delete"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("upper/to-delete is not a whiteout: mode %o rdev %d %v", st.Mode, st.Rdev, err)
	}
	// The tree's /usr is the read-only host /usr.
	if res := d.shAs(t, j.ID, "root", "touch /usr/agentjail-it-x"); res.ExitCode == 0 {
		t.Errorf("the jail wrote to its read-only /usr")
	}
}
