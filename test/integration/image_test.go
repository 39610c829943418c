package integration

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	ajclient "github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/internal/image/imagetest"
	"github.com/agentjail/agentjail/internal/testenv"
)

// imageEnv is a daemon that may pull from an in-process registry serving
// a busybox image of two layers with a config to apply.
type imageEnv struct {
	d   *daemon
	reg *imagetest.Registry
	c   *ajclient.Client
	// ref is the busybox image's reference in reg.
	ref string
	img v1.Image
}

func newImageEnv(t testing.TB) *imageEnv {
	t.Helper()
	bb := testenv.RequireTool(t, "busybox")
	reg := imagetest.NewRegistry(t)
	d := newDaemon(t, "--insecure-registry", reg.Host)
	base := imagetest.Layer(t, imagetest.Busybox(t, bb)...)
	app := imagetest.Layer(t,
		imagetest.Entry{Name: "srv/", Type: tar.TypeDir},
		imagetest.Entry{Name: "srv/app/", Type: tar.TypeDir, Uid: 1234, Gid: 1234},
		imagetest.Entry{Name: "srv/app/main.sh", Body: "echo from the image\n", Mode: 0o755},
		imagetest.Entry{Name: "etc/.wh.group"},
	)
	img := imagetest.Image(t, v1.Config{
		Env:        []string{"PATH=/bin", "GREETING=hello from the image"},
		WorkingDir: "/srv/app",
		User:       "app",
		Cmd:        []string{"sh", "/srv/app/main.sh"},
	}, base, app)
	return &imageEnv{d: d, reg: reg, c: ajclient.New(d.addr, d.token), ref: reg.Push(t, "test/busybox:1", img), img: img}
}

// TestImageJails pulls an image from a registry, runs jails of it with the
// image's Env, WorkingDir and User, refuses hostile images with nothing
// left behind, commits a jail and runs the result, loads archives, diffs
// against the image, snapshots and branches, and prunes.
func TestImageJails(t *testing.T) {
	e := newImageEnv(t)
	d, c := e.d, e.c
	ctx := context.Background()

	var statuses []string
	img, err := c.Pull(ctx, e.ref, func(p ajclient.PullProgress) { statuses = append(statuses, p.Status) })
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(statuses, " "), "done") || len(img.Layers) != 2 {
		t.Fatalf("pull: %+v, progress %v", img, statuses)
	}

	t.Run("config applied", func(t *testing.T) {
		j := d.createJail(t, map[string]any{"isolation": map[string]any{"filesystem": map[string]any{"rootfs": "image:" + e.ref}}})
		out := d.mustSh(t, j.ID, `id -u; pwd; echo "$GREETING"; cat /etc/group 2>&1; ls /srv/app`)
		want := "1234\n/srv/app\nhello from the image\ncat: can't open '/etc/group': No such file or directory\nmain.sh\n"
		if out != want {
			t.Fatalf("in the image jail:\n%q\nwant\n%q", out, want)
		}
		var cfg struct {
			Isolation struct {
				Filesystem struct {
					Rootfs string `json:"rootfs"`
				} `json:"filesystem"`
			} `json:"isolation"`
		}
		if err := json.Unmarshal(d.getJail(t, j.ID).Config, &cfg); err != nil {
			t.Fatal(err)
		}
		if cfg.Isolation.Filesystem.Rootfs != "image:"+e.ref+"@"+img.ID {
			t.Errorf("the jail's rootfs is %q, want the image pinned by id", cfg.Isolation.Filesystem.Rootfs)
		}
		// The diff is relative to the image: only what the jail did.
		d.mustSh(t, j.ID, "echo result > /srv/app/result.txt; rm /srv/app/main.sh")
		var diff struct {
			Changes []struct {
				Path string `json:"path"`
				Kind string `json:"kind"`
			} `json:"changes"`
		}
		d.api.want(t, http.StatusOK, "GET", "/jails/"+j.ID+"/fs/diff", nil, &diff)
		got := map[string]string{}
		for _, ch := range diff.Changes {
			// The daemon's resolver and CA files are the network's.
			if ch.Path != "/etc/resolv.conf" && !strings.HasPrefix(ch.Path, "/etc/ssl") {
				got[ch.Path] = ch.Kind
			}
		}
		if got["/srv/app/result.txt"] != "added" || got["/srv/app/main.sh"] != "deleted" || len(got) != 2 {
			t.Errorf("diff relative to the image: %v", got)
		}

		// Commit, and run the result in a new jail.
		committed, err := c.Commit(ctx, j.ID, ajclient.CommitRequest{Ref: "committed/app:1"})
		if err != nil {
			t.Fatal(err)
		}
		if committed.Parent != img.ID || len(committed.Layers) != 3 {
			t.Fatalf("commit: %+v", committed)
		}
		j2 := d.createJail(t, map[string]any{"isolation": map[string]any{"filesystem": map[string]any{"rootfs": "image:committed/app:1"}}})
		if out := d.mustSh(t, j2.ID, "cat /srv/app/result.txt; ls /srv/app; id -u"); out != "result\nresult.txt\n1234\n" {
			t.Errorf("jail of the committed image: %q", out)
		}

		// A snapshot of the image jail branches into jails that see its files.
		var snap struct {
			ID string `json:"id"`
		}
		d.api.want(t, http.StatusCreated, "POST", "/jails/"+j.ID+"/snapshot", map[string]any{"mode": "fs"}, &snap)
		var branches struct {
			Jails []jailInfo `json:"jails"`
		}
		d.api.want(t, http.StatusCreated, "POST", "/snapshots/"+snap.ID+"/branch", map[string]any{"count": 2}, &branches)
		for _, b := range branches.Jails {
			t.Cleanup(func() { d.destroy(t, b.ID) })
			if out := d.mustSh(t, b.ID, "cat /srv/app/result.txt; echo $GREETING"); out != "result\nhello from the image\n" {
				t.Errorf("branch %s: %q", b.Name, out)
			}
		}
		t.Cleanup(func() { d.api.do(t, "DELETE", "/snapshots/"+snap.ID, nil) })
	})

	t.Run("full snapshot and branch", func(t *testing.T) {
		j := d.createJail(t, map[string]any{"isolation": map[string]any{"filesystem": map[string]any{"rootfs": "image:" + e.ref}}})
		d.mustSh(t, j.ID, `setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /srv/app/count; sleep 0.1; done' >/dev/null 2>&1 </dev/null &`)
		count := func(id string, above int) int {
			t.Helper()
			var n int
			if err := waitFor(10*time.Second, func() error {
				out := d.shAs(t, id, "", "cat /srv/app/count")
				v, err := strconv.Atoi(strings.TrimSpace(out.Stdout))
				if err != nil || v <= above {
					return fmt.Errorf("jail %s: counter %q", id, out.Stdout)
				}
				n = v
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			return n
		}
		before := count(j.ID, 2)
		snap := d.takeSnapshot(t, j.ID, "full")
		bs := d.branch(t, snap.ID, 1)
		// The branch's counter goes on from the snapshot's value, in a jail
		// of the same image.
		if first := count(bs[0].ID, before-1); first < before {
			t.Errorf("branch counter %d below %d", first, before)
		}
		if out := d.mustSh(t, bs[0].ID, "echo $GREETING; id -u"); out != "hello from the image\n1234\n" {
			t.Errorf("branch of an image jail: %q", out)
		}
	})

	t.Run("cli run", func(t *testing.T) {
		out, errOut, code := d.cli(t, "", "run", "--rm", e.ref, "--", "sh", "-c", "echo $GREETING; pwd")
		if code != 0 || out != "hello from the image\n/srv/app\n" {
			t.Fatalf("agentjail run --rm IMAGE -- CMD: exit %d %q %q", code, out, errOut)
		}
		// Without a command: the image's Cmd.
		out, errOut, code = d.cli(t, "", "run", "--rm", e.ref)
		if code != 0 || out != "from the image\n" {
			t.Fatalf("agentjail run --rm IMAGE: exit %d %q %q", code, out, errOut)
		}
		if out := d.mustCLI(t, "images"); !strings.Contains(out, "test/busybox:1") || !strings.Contains(out, "committed/app:1") {
			t.Errorf("agentjail images:\n%s", out)
		}
	})

	t.Run("hostile images", func(t *testing.T) {
		before, _, err := c.Images(ctx)
		if err != nil {
			t.Fatal(err)
		}
		escape := imagetest.Image(t, v1.Config{}, imagetest.Layer(t,
			imagetest.Entry{Name: "evil", Type: tar.TypeSymlink, Linkname: "/etc"},
			imagetest.Entry{Name: "evil/agentjail-pwned", Body: "x"}))
		_, err = c.Pull(ctx, e.reg.Push(t, "test/escape:1", escape), nil)
		if !isAPIError(err, http.StatusUnprocessableEntity, "outside the layer") {
			t.Errorf("pull of a symlink escape: %v", err)
		}
		if _, err := os.Lstat("/etc/agentjail-pwned"); err == nil {
			os.Remove("/etc/agentjail-pwned")
			t.Error("the symlink escape wrote on the host")
		}
		layer := imagetest.Layer(t, imagetest.Entry{Name: "big", Body: "small"})
		manifest, config := imagetest.Manifest(t, imagetest.Image(t, v1.Config{}, layer), map[int]int64{0: 1 << 50})
		_, err = c.Pull(ctx, e.reg.PushRaw(t, "test/huge:1", manifest, config, imagetest.Blob(t, layer)), nil)
		if !isAPIError(err, http.StatusUnprocessableEntity, "declares 1125899906842624 bytes") {
			t.Errorf("pull of a huge declared size: %v", err)
		}
		if _, err := c.Pull(ctx, e.reg.Host+"/test/missing:1", nil); !isAPIError(err, http.StatusNotFound, "") {
			t.Errorf("pull of a missing image: %v", err)
		}
		after, usage, err := c.Images(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(after) != len(before) {
			t.Errorf("refused pulls changed the image list: %d → %d", len(before), len(after))
		}
		if _, err := c.PruneImages(ctx, false); err != nil {
			t.Fatal(err)
		}
		if _, u2, _ := c.Images(ctx); u2.Layers != usage.Layers-usage.UnusedLayers {
			t.Errorf("prune after refused pulls left %d layers, want %d", u2.Layers, usage.Layers-usage.UnusedLayers)
		}
		r := d.api.do(t, "POST", "/jails", map[string]any{"isolation": map[string]any{"filesystem": map[string]any{"rootfs": "image:nothere:1"}}})
		if r.status != http.StatusUnprocessableEntity || !strings.Contains(r.errorMessage(), "agentjail pull") {
			t.Errorf("create from an image not in the store: %s", r)
		}
	})

	t.Run("load", func(t *testing.T) {
		dir := t.TempDir()
		other := imagetest.Image(t, v1.Config{Env: []string{"PATH=/bin", "FROM=archive"}}, e.baseLayer(t), imagetest.Layer(t, imagetest.Entry{Name: "loaded", Body: "yes\n"}))
		for _, tc := range []struct{ name, path, ref string }{
			{"docker-archive", imagetest.DockerArchive(t, dir, "loaded/docker:1", other), "loaded/docker:1"},
			{"oci-layout", imagetest.OCIArchive(t, dir, "loaded/oci:1", other), "loaded/oci:1"},
		} {
			out, errOut, code := d.cli(t, "", "load", "-i", tc.path)
			if code != 0 || !strings.Contains(out, tc.ref) {
				t.Fatalf("load %s: exit %d %q %q", tc.name, code, out, errOut)
			}
			j := d.createJail(t, map[string]any{"isolation": map[string]any{"filesystem": map[string]any{"rootfs": "image:" + tc.ref}}})
			if out := d.mustSh(t, j.ID, "cat /loaded; echo $FROM"); out != "yes\narchive\n" {
				t.Errorf("jail of the %s image: %q", tc.name, out)
			}
		}
	})

	t.Run("registry cache for jails", func(t *testing.T) {
		path := "http://" + jailCacheHost + "/v2/" + e.reg.Host + "/test/busybox/manifests/1"
		j := d.createJail(t, map[string]any{
			"isolation": map[string]any{"filesystem": map[string]any{"rootfs": "image:" + e.ref}, "network": map[string]any{"registry_cache": true}},
		})
		out := d.mustSh(t, j.ID, "wget -q -O- "+path)
		if !strings.Contains(out, `"layers"`) {
			t.Fatalf("manifest through the cache from the jail: %q", out)
		}
		dg, _ := e.baseLayer(t).Digest()
		before := e.reg.BlobGets(dg.String())
		out = d.mustSh(t, j.ID, "wget -q -O- http://"+jailCacheHost+"/v2/"+e.reg.Host+"/test/busybox/blobs/"+dg.String()+" | wc -c")
		if strings.TrimSpace(out) == "0" || e.reg.BlobGets(dg.String()) != before {
			t.Errorf("blob through the cache: %q bytes, registry fetches %d → %d", out, before, e.reg.BlobGets(dg.String()))
		}
		if strings.Contains(string(d.getJail(t, j.ID).Config), d.regCacheToken(t)) {
			t.Error("the cache's token shows in the jail's config")
		}
		if r := d.exec(t, j.ID, execReq{Cmd: []string{"sh", "-c", "env; cat /proc/1/environ"}}); strings.Contains(r.Stdout, d.regCacheToken(t)) {
			t.Error("the cache's token entered the jail")
		}
		// A jail whose policy does not allow it cannot reach the cache.
		j2 := d.createJail(t, map[string]any{"isolation": map[string]any{"filesystem": map[string]any{"rootfs": "image:" + e.ref}}})
		if r := d.shAs(t, j2.ID, "", "wget -q -T 5 -O- "+path); r.ExitCode == 0 || strings.Contains(r.Stdout, "layers") {
			t.Errorf("a jail without registry_cache reached the cache: %s", &r)
		}
	})

	t.Run("rmi and prune", func(t *testing.T) {
		j := d.createJail(t, map[string]any{"isolation": map[string]any{"filesystem": map[string]any{"rootfs": "image:" + e.ref}}})
		if _, err := c.RemoveImage(ctx, img.ID, false); !isAPIError(err, http.StatusConflict, "used by") {
			t.Fatalf("rmi by id of an image in use: %v", err)
		}
		if _, err := c.RemoveImage(ctx, e.ref, false); err != nil {
			t.Fatal(err)
		}
		if _, err := c.PruneImages(ctx, false); err != nil {
			t.Fatal(err)
		}
		// The jail still runs on its layers, and a restart remounts them.
		d.api.want(t, http.StatusOK, "POST", "/jails/"+j.ID+"/stop", nil, nil)
		d.api.want(t, http.StatusOK, "POST", "/jails/"+j.ID+"/start", nil, nil)
		if out := d.mustSh(t, j.ID, "echo $GREETING"); out != "hello from the image\n" {
			t.Errorf("jail of an untagged image after prune: %q", out)
		}
	})
}

// baseLayer is the busybox layer of e's image.
func (e *imageEnv) baseLayer(t testing.TB) v1.Layer {
	ls, err := e.img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	return ls[0]
}

// isAPIError reports whether err is an API error of status whose message
// holds sub.
func isAPIError(err error, status int, sub string) bool {
	ae, ok := err.(*ajclient.APIError)
	return ok && ae.Status == status && strings.Contains(ae.Message, sub)
}

// TestProfileJail runs a jail of the python profile (built with
// mmdebstrap from the Debian archive on this machine's first run, cached
// afterwards) and shows that a second build is a cache hit.
func TestProfileJail(t *testing.T) {
	testenv.RequireTool(t, "mmdebstrap")
	d := shared(t)
	c := ajclient.New(d.addr, d.token)
	start := time.Now()
	j := d.createJail(t, map[string]any{"isolation": map[string]any{"filesystem": map[string]any{"rootfs": "profile:python"}}})
	t.Logf("create of the first python profile jail: %s", time.Since(start).Round(time.Millisecond))
	if out := d.mustSh(t, j.ID, `python3 -c 'import sqlite3, ssl; print(sqlite3.sqlite_version_info >= (3, 0))'; id -un`); out != "True\nagent\n" {
		t.Fatalf("python profile jail: %q", out)
	}
	res, err := c.BuildProfile(context.Background(), "python")
	if err != nil {
		t.Fatal(err)
	}
	if !res.Cached || res.Image == nil {
		t.Fatalf("second build of the python profile: %+v", res)
	}
	var cfg struct {
		Isolation struct {
			Filesystem struct {
				Rootfs string `json:"rootfs"`
			} `json:"filesystem"`
		} `json:"isolation"`
	}
	if err := json.Unmarshal(d.getJail(t, j.ID).Config, &cfg); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(cfg.Isolation.Filesystem.Rootfs, "@"+res.Image.ID) {
		t.Errorf("the jail's rootfs %q does not pin the profile's image %s", cfg.Isolation.Filesystem.Rootfs, res.Image.ID)
	}
	r := d.api.do(t, "POST", "/jails", map[string]any{"isolation": map[string]any{"filesystem": map[string]any{"rootfs": "nix:nixpkgs#hello"}}})
	if _, err := exec.LookPath("nix"); err != nil && (r.status != http.StatusUnprocessableEntity || !strings.Contains(r.errorMessage(), "nix is not installed")) {
		t.Errorf("nix: rootfs without nix: %s", r)
	}
}

// jailCacheHost is the registry cache's name for jails.
const jailCacheHost = "registry.agentjail"

// regCacheToken is the token of d's registry cache.
func (d *daemon) regCacheToken(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(d.dir, "registry-cache.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Token string `json:"token"`
	}
	if err := json.Unmarshal(data, &st); err != nil || st.Token == "" {
		t.Fatalf("registry-cache.json: %v", err)
	}
	return st.Token
}

// TestPullWithCredentials pulls a private image (a registry that answers
// 401 without its user and password): without credentials (the daemon's
// docker config has none) and with wrong ones the pull fails as forbidden,
// saying whose credentials the registry refused; half a credential is a
// 400; with the right ones the image is pulled, through the API and
// through the CLI (the password on standard input), and runs. What the
// credentialed pull fetched is not served from the registry cache to a
// pull of the same digest without credentials.
func TestPullWithCredentials(t *testing.T) {
	e := newImageEnv(t)
	d := e.d
	ref := e.reg.Push(t, "private/app:1", e.img)
	e.reg.RequireAuth("private/", "robot", "s3cret")
	auth := func(user, pw string) map[string]any { return map[string]any{"username": user, "password": pw} }
	// pull answers the HTTP status of a refused request, or the error code
	// the stream of an accepted one ended with ("" when it ended with the
	// image), and the answer.
	type image struct {
		ID     string `json:"id"`
		Digest string `json:"digest"`
	}
	pull := func(body map[string]any) (string, *image, *response) {
		t.Helper()
		r := d.api.do(t, "POST", "/images/pull", body)
		if strings.Contains(string(r.body), "s3cret") {
			t.Errorf("the answer shows the password: %s", r)
		}
		if r.status != http.StatusOK {
			return strconv.Itoa(r.status), nil, r
		}
		lines := strings.Split(strings.TrimSpace(string(r.body)), "\n")
		var last struct {
			Type  string `json:"type"`
			Image *image `json:"image"`
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil {
			t.Fatalf("pull %v: %s: %v", body, r, err)
		}
		return last.Error.Code, last.Image, r
	}
	for _, tc := range []struct {
		body map[string]any
		code string
		msg  string
	}{
		{map[string]any{"ref": ref}, "forbidden", "refused the credentials (docker config)"},
		{map[string]any{"ref": ref, "auth": auth("robot", "wrong")}, "forbidden", "refused the credentials (the credentials given)"},
		{map[string]any{"ref": ref, "auth": auth("robot", "")}, "400", "a username and a password are both required"},
		{map[string]any{"ref": ref, "auth": map[string]any{"username": "robot", "password": "s3cret", "email": "x"}}, "400", "email"},
	} {
		if code, _, r := pull(tc.body); code != tc.code || !strings.Contains(string(r.body), tc.msg) {
			t.Errorf("pull %v: %s; want %s %q", tc.body, r, tc.code, tc.msg)
		}
	}
	code, img, r := pull(map[string]any{"ref": ref, "auth": auth("robot", "s3cret")})
	if code != "" || img == nil || img.Digest == "" {
		t.Fatalf("pull with the credentials: %s", r)
	}
	j := d.createJail(t, map[string]any{"isolation": map[string]any{"filesystem": map[string]any{"rootfs": "image:" + ref}}})
	if out := d.mustSh(t, j.ID, "cat /srv/app/main.sh"); out != "echo from the image\n" {
		t.Errorf("in a jail of the private image: %q", out)
	}
	d.destroy(t, j.ID)
	if code, _, r := pull(map[string]any{"ref": e.reg.Host + "/private/app@" + img.Digest}); code != "forbidden" {
		t.Errorf("pull of the private digest without credentials: %s", r)
	}
	// The CLI: the password on standard input, never in argv.
	d.api.want(t, http.StatusOK, "DELETE", "/images/"+ref+"?force=true", nil, nil)
	if out, errOut, code := d.cli(t, "s3cret\n", "pull", "-q", "--username", "robot", "--password-stdin", ref); code != 0 || strings.TrimSpace(out) != img.ID {
		t.Errorf("agentjail pull --password-stdin: %d %q %s", code, out, errOut)
	}
	if _, errOut, code := d.cli(t, "", "pull", "--username", "robot", ref); code != 2 || !strings.Contains(errOut, "go together") {
		t.Errorf("agentjail pull --username alone: %d %s", code, errOut)
	}
}
