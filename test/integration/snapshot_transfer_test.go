package integration

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/agentjail/agentjail/internal/image/imagetest"
)

type snapshotPush struct {
	Ref        string       `json:"ref"`
	Digest     string       `json:"digest"`
	Bytes      int64        `json:"bytes"`
	FilesBytes int64        `json:"files_bytes"`
	DiskBytes  int64        `json:"disk_bytes"`
	DurationMs float64      `json:"duration_ms"`
	Snapshot   snapshotInfo `json:"snapshot"`
}

type pulledSnapshot struct {
	snapshotInfo
	Config struct {
		Isolation struct {
			Level string `json:"level"`
		} `json:"isolation"`
	} `json:"config"`
	Source *struct {
		Ref        string  `json:"ref"`
		Digest     string  `json:"digest"`
		ID         string  `json:"id"`
		Bytes      int64   `json:"bytes"`
		DurationMs float64 `json:"duration_ms"`
	} `json:"source"`
}

// ociManifest is a manifest remote.Put writes as it is.
type ociManifest []byte

func (m ociManifest) RawManifest() ([]byte, error)        { return m, nil }
func (m ociManifest) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

// pushEdited pushes a copy of the snapshot artifact at from as to, its
// config's JSON changed by edit (the layers are the same blobs).
func pushEdited(t *testing.T, from, to string, edit func(cfg map[string]any)) {
	t.Helper()
	src, err := name.ParseReference(from)
	if err != nil {
		t.Fatal(err)
	}
	m := imagetest.RemoteManifest(t, src)
	raw := imagetest.RemoteBlob(t, src.Context(), m.Config.Digest)
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	edit(cfg)
	raw, _ = json.Marshal(cfg)
	cl := static.NewLayer(raw, m.Config.MediaType)
	if err := remote.WriteLayer(src.Context(), cl); err != nil {
		t.Fatal(err)
	}
	if m.Config.Digest, err = cl.Digest(); err != nil {
		t.Fatal(err)
	}
	m.Config.Size = int64(len(raw))
	mraw, _ := json.Marshal(m)
	dst, err := name.ParseReference(to)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Put(dst, ociManifest(mraw)); err != nil {
		t.Fatal(err)
	}
}

// TestSnapshotPushPullAcrossDaemons moves a snapshot of a jail with a
// running process and files from one daemon to another (two data dirs)
// through an OCI registry: the second restores and branches it, the
// process counts on from where it was and the files are there. Bad
// requests and artifacts are refused with a precise 4xx, and a refused
// or failed pull leaves nothing in the second daemon.
func TestSnapshotPushPullAcrossDaemons(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	a := newDaemon(t, "--insecure-registry", reg.Host)
	b := newDaemon(t, "--insecure-registry", reg.Host)

	j := a.createJail(t, nil)
	if res := a.shAs(t, j.ID, "", counterScript); res.ExitCode != 0 {
		t.Fatalf("starting the counter: %s", &res)
	}
	sum := strings.Fields(a.mustSh(t, j.ID, "echo carried over > /workspace/note && mkdir -p /workspace/data && head -c 3000000 /dev/urandom > /workspace/data/blob && sha256sum /workspace/data/blob"))[0]
	before := a.waitCounting(t, j.ID, 3)
	snap := a.takeSnapshot(t, j.ID, "full")

	ref := reg.Host + "/agentjail/snapshots:counter"
	var pushed snapshotPush
	a.api.want(t, http.StatusOK, "POST", "/snapshots/"+snap.ID+"/push", map[string]any{"ref": ref}, &pushed)
	if !strings.HasPrefix(pushed.Digest, "sha256:") || pushed.Ref != reg.Host+"/agentjail/snapshots@"+pushed.Digest || pushed.Snapshot.ID != snap.ID || pushed.Bytes <= 3000000 {
		t.Fatalf("push: %+v", pushed)
	}
	t.Logf("snapshot %.0f ms (frozen %.0f ms); push %.0f ms: %d bytes (files %d, disk %d of which data travels)",
		snap.DurationMs, snap.FrozenMs, pushed.DurationMs, pushed.Bytes, pushed.FilesBytes, pushed.DiskBytes)

	var pulled pulledSnapshot
	b.api.want(t, http.StatusCreated, "POST", "/snapshots/pull", map[string]any{"ref": ref}, &pulled)
	if pulled.ID == snap.ID || pulled.Mode != "full" || pulled.Config.Isolation.Level != "container" || pulled.Source == nil ||
		pulled.Source.Digest != pushed.Digest || pulled.Source.ID != snap.ID || pulled.Name != snap.Name {
		t.Fatalf("pulled: %+v (source %+v)", pulled, pulled.Source)
	}
	t.Logf("pull %.0f ms: %d bytes", pulled.Source.DurationMs, pulled.Source.Bytes)
	t.Cleanup(func() { b.api.send("DELETE", "/snapshots/"+pulled.ID, nil) })
	// The first daemon may forget its jail and snapshot: the second has
	// its own copy.
	a.destroy(t, j.ID)
	a.api.want(t, http.StatusNoContent, "DELETE", "/snapshots/"+snap.ID, nil, nil)

	r := b.restoreSnapshot(t, pulled.ID)
	branches := append([]jailInfo{r}, b.branch(t, pulled.ID, 2)...)
	for _, x := range branches {
		first := b.waitCounting(t, x.ID, 0)
		if first < before {
			t.Fatalf("jail %s counts from %d, below the %d it had reached before the snapshot: the process did not carry on", x.ID, first, before)
		}
		b.waitCounting(t, x.ID, first)
		if got := b.mustSh(t, x.ID, "cat /workspace/note; sha256sum /workspace/data/blob"); !strings.Contains(got, "carried over") || !strings.Contains(got, sum) {
			t.Fatalf("jail %s's files after the move: %q (want the note and blob %s)", x.ID, got, sum)
		}
	}

	// Bad requests: a precise 4xx each.
	for _, c := range []struct {
		path string
		body any
		want int
	}{
		{"/snapshots/s0123456789ab/push", map[string]any{"ref": ref}, http.StatusNotFound},
		{"/snapshots/" + pulled.ID + "/push", map[string]any{}, http.StatusBadRequest},
		{"/snapshots/" + pulled.ID + "/push", map[string]any{"ref": "Not A Reference!"}, http.StatusBadRequest},
		{"/snapshots/" + pulled.ID + "/push", map[string]any{"ref": ref, "extra": 1}, http.StatusBadRequest},
		// A registry not named insecure is not reached over plain HTTP.
		{"/snapshots/" + pulled.ID + "/push", map[string]any{"ref": "127.0.0.1:9/x/y:z"}, http.StatusUnprocessableEntity},
		{"/snapshots/pull", map[string]any{}, http.StatusBadRequest},
		{"/snapshots/pull", map[string]any{"ref": ref, "name": "bad name!"}, http.StatusUnprocessableEntity},
		{"/snapshots/pull", map[string]any{"ref": reg.Host + "/agentjail/snapshots:missing"}, http.StatusNotFound},
	} {
		if res := b.api.do(t, "POST", c.path, c.body); res.status != c.want {
			t.Errorf("POST %s %v: %s; want %d", c.path, c.body, res, c.want)
		}
	}
	// Bad artifacts: refused, nothing left.
	pushEdited(t, ref, reg.Host+"/agentjail/snapshots:other-level", func(cfg map[string]any) {
		cfg["snapshot"].(map[string]any)["config"].(map[string]any)["isolation"].(map[string]any)["level"] = "no-such-level"
	})
	pushEdited(t, ref, reg.Host+"/agentjail/snapshots:missing-rootfs", func(cfg map[string]any) {
		cfg["snapshot"].(map[string]any)["config"].(map[string]any)["isolation"].(map[string]any)["filesystem"].(map[string]any)["rootfs"] = "image:example.com/gone:1@sha256:" + strings.Repeat("ab", 32)
	})
	pushEdited(t, ref, reg.Host+"/agentjail/snapshots:other-build", func(cfg map[string]any) {
		req := cfg["requires"].(map[string]any)
		if len(req) == 0 {
			t.Fatalf("the artifact requires nothing of the host: %v", cfg["requires"])
		}
		for k := range req {
			req[k] = strings.Repeat("0", 64)
		}
	})
	pushEdited(t, ref, reg.Host+"/agentjail/snapshots:huge", func(cfg map[string]any) {
		cfg["disk_bytes"] = int64(1) << 50
	})
	pushedRef, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	m := imagetest.RemoteManifest(t, pushedRef).Layers
	reg.SetHook(func(w http.ResponseWriter, req *http.Request) bool {
		if req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/blobs/"+m[1].Digest.String()) {
			w.Header().Set("Content-Length", strconv.FormatInt(m[1].Size, 10))
			w.Write(bytes.Repeat([]byte{0x1f}, int(m[1].Size)))
			return true
		}
		return false
	})
	for tag, want := range map[string]int{
		"other-level":    http.StatusUnprocessableEntity,
		"missing-rootfs": http.StatusConflict,
		"other-build":    http.StatusConflict,
		"huge":           http.StatusRequestEntityTooLarge,
		"counter":        http.StatusUnprocessableEntity, // its disk layer is now garbage
	} {
		if res := b.api.do(t, "POST", "/snapshots/pull", map[string]any{"ref": reg.Host + "/agentjail/snapshots:" + tag}); res.status != want {
			t.Errorf("pull of %s: %s; want %d", tag, res, want)
		} else {
			t.Logf("pull of %s: %d %s", tag, res.status, res.errorMessage())
		}
	}
	reg.SetHook(nil)
	for _, dir := range []string{filepath.Join(b.dir, "snapshots"), filepath.Join(b.dir, "pool", "snapshots")} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 {
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			t.Errorf("%s holds %v; want only the snapshot pulled first", dir, names)
		}
	}
}
