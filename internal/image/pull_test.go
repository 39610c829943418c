package image

import (
	"archive/tar"
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/image/imagetest"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/testenv"
)

func newStore(t testing.TB, reg *imagetest.Registry) *Store {
	t.Helper()
	testenv.RequireRoot(t)
	opts := Options{Dir: filepath.Join(t.TempDir(), "images")}
	if reg != nil {
		opts.Registries.Insecure = []string{reg.Host}
	}
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// layered is an image of three layers: a base, a layer deleting a file
// and replacing a directory's contents (opaque), and one with odd
// entries (a setuid file, a device node, a hard link, a capability xattr).
func layered(t testing.TB) v1.Image {
	base := imagetest.Layer(t,
		imagetest.Entry{Name: "etc/", Type: tar.TypeDir},
		imagetest.Entry{Name: "etc/passwd", Body: "root:x:0:0:root:/root:/bin/sh\napp:x:1234:1234::/home/app:/bin/sh\n"},
		imagetest.Entry{Name: "etc/gone", Body: "deleted later"},
		imagetest.Entry{Name: "data/", Type: tar.TypeDir},
		imagetest.Entry{Name: "data/old1", Body: "old"},
		imagetest.Entry{Name: "data/old2", Body: "old"},
		imagetest.Entry{Name: "bin", Type: tar.TypeSymlink, Linkname: "usr/bin"},
		imagetest.Entry{Name: "usr/bin/tool", Body: "#!/bin/sh\n", Mode: 0o755},
	)
	mid := imagetest.Layer(t,
		imagetest.Entry{Name: "etc/.wh.gone"},
		imagetest.Entry{Name: "data/", Type: tar.TypeDir},
		imagetest.Entry{Name: "data/.wh..wh..opq"},
		imagetest.Entry{Name: "data/new", Body: "new"},
	)
	odd := imagetest.Layer(t,
		imagetest.Entry{Name: "usr/bin/su", Body: "x", Mode: 0o4755},
		imagetest.Entry{Name: "dev/sda", Type: tar.TypeBlock},
		imagetest.Entry{Name: "usr/bin/su2", Type: tar.TypeLink, Linkname: "usr/bin/su"},
		imagetest.Entry{Name: "usr/bin/ping", Body: "p", Xattrs: map[string]string{"security.capability": "\x01\x00\x00\x02", "user.note": "kept"}},
		imagetest.Entry{Name: "home/app/", Type: tar.TypeDir, Uid: 1234, Gid: 1234},
		imagetest.Entry{Name: "usr/lib/", Type: tar.TypeDir},
		imagetest.Entry{Name: "lib", Type: tar.TypeSymlink, Linkname: "usr/lib"},
		imagetest.Entry{Name: "lib/viasymlink", Body: "through a relative link inside the layer"},
	)
	return imagetest.Image(t, v1.Config{
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "GREETING=hello"},
		WorkingDir: "/home/app",
		User:       "app",
		Cmd:        []string{"/bin/sh"},
	}, base, mid, odd)
}

func TestPullLayersWhiteoutsAndConfig(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	s := newStore(t, reg)
	ref := reg.Push(t, "test/layered:1", layered(t))

	var mu sync.Mutex
	statuses := map[string]bool{}
	img, err := s.Pull(context.Background(), ref, PullOptions{Progress: func(p model.PullProgress) {
		mu.Lock()
		statuses[p.Status] = true
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range []string{"resolving", "waiting", "done", "complete"} {
		if !statuses[st] {
			t.Errorf("no %q progress", st)
		}
	}
	if len(img.Layers) != 3 || img.Config.User != "app" || img.Config.WorkingDir != "/home/app" || img.Config.Env[1] != "GREETING=hello" {
		t.Fatalf("image %+v", img)
	}
	if len(img.Tags) != 1 || img.Tags[0] != reg.Host+"/test/layered:1" {
		t.Fatalf("tags %v", img.Tags)
	}
	got, err := s.Get(ref)
	if err != nil || got.ID != img.ID {
		t.Fatalf("get by tag: %v %v", got, err)
	}
	if got, err := s.Get(img.ID[7:19]); err != nil || got.ID != img.ID {
		t.Fatalf("get by id prefix: %v %v", got, err)
	}
	if got, err := s.Get(reg.Host + "/test/layered@" + img.Digest); err != nil || got.ID != img.ID {
		t.Fatalf("get by digest: %v %v", got, err)
	}

	// The layers mounted as an overlay show the image as a container sees it.
	merged, err := s.View(img.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := os.Stat(filepath.Join(merged, "etc/gone")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("whiteout: etc/gone: %v", err)
	}
	ents, err := os.ReadDir(filepath.Join(merged, "data"))
	if err != nil || len(ents) != 1 || ents[0].Name() != "new" {
		t.Errorf("opaque dir data: %v %v", ents, err)
	}
	st, err := os.Stat(filepath.Join(merged, "usr/bin/su"))
	if err != nil || st.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 || st.Mode().Perm() != 0o755 {
		t.Errorf("setuid not cleared: %v %v", st, err)
	}
	if _, err := os.Lstat(filepath.Join(merged, "dev/sda")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("device node created: %v", err)
	}
	var a, b unix.Stat_t
	if unix.Stat(filepath.Join(merged, "usr/bin/su"), &a) != nil || unix.Stat(filepath.Join(merged, "usr/bin/su2"), &b) != nil || a.Ino != b.Ino {
		t.Errorf("hard link not kept")
	}
	if _, err := unix.Getxattr(filepath.Join(merged, "usr/bin/ping"), "security.capability", make([]byte, 64)); err == nil {
		t.Errorf("file capability applied")
	}
	if n, err := unix.Getxattr(filepath.Join(merged, "usr/bin/ping"), "user.note", make([]byte, 64)); err != nil || n != 4 {
		t.Errorf("user xattr: %d %v", n, err)
	}
	if err := unix.Stat(filepath.Join(merged, "home/app"), &a); err != nil || a.Uid != 1234 {
		t.Errorf("owner of home/app: %d %v", a.Uid, err)
	}
	if data, err := os.ReadFile(filepath.Join(merged, "usr/lib/viasymlink")); err != nil || !strings.HasPrefix(string(data), "through") {
		t.Errorf("entry through an in-layer symlink: %q %v", data, err)
	}

	// A second pull downloads nothing.
	before := reg.BlobGets(img.Layers[0].Digest)
	exists := 0
	if _, err := s.Pull(context.Background(), ref, PullOptions{Progress: func(p model.PullProgress) {
		if p.Status == "exists" {
			exists++
		}
	}}); err != nil {
		t.Fatal(err)
	}
	if exists != 3 || reg.BlobGets(img.Layers[0].Digest) != before {
		t.Errorf("re-pull: %d layers existed, blob fetched %d → %d times", exists, before, reg.BlobGets(img.Layers[0].Digest))
	}
}

// assertNothingLeft checks that a failed pull left no layer, no unpack in
// progress and no image.
func assertNothingLeft(t *testing.T, s *Store) {
	t.Helper()
	for _, d := range []string{s.layersDir(), s.tmpDir()} {
		ents, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) != 0 {
			t.Errorf("%s holds %d entries after a failed pull", d, len(ents))
		}
	}
	if imgs := s.List(); len(imgs) != 0 {
		t.Errorf("store lists %d images after a failed pull", len(imgs))
	}
}

func TestPullRefusesHostileLayers(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	cases := []struct {
		name    string
		entries []imagetest.Entry
		want    string
	}{
		{"symlink escape", []imagetest.Entry{
			{Name: "evil", Type: tar.TypeSymlink, Linkname: "/etc"},
			{Name: "evil/agentjail-pwned", Body: "x"},
		}, "resolves outside the layer"},
		{"relative symlink escape", []imagetest.Entry{
			{Name: "a/", Type: tar.TypeDir},
			{Name: "a/up", Type: tar.TypeSymlink, Linkname: "../../../../../../../../tmp"},
			{Name: "a/up/agentjail-pwned", Body: "x"},
		}, "resolves outside the layer"},
		{"dot-dot name", []imagetest.Entry{{Name: "../../agentjail-pwned", Body: "x"}}, "leaves the layer"},
		{"hard link outside", []imagetest.Entry{{Name: "shadow", Type: tar.TypeLink, Linkname: "../../../etc/shadow"}}, "leaves the layer"},
		{"hard link to a missing entry", []imagetest.Entry{{Name: "x", Type: tar.TypeLink, Linkname: "etc/shadow"}}, "no such entry"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newStore(t, reg)
			good := imagetest.Layer(t, imagetest.Entry{Name: "ok", Body: "fine"})
			bad := imagetest.Layer(t, c.entries...)
			ref := reg.Push(t, "test/hostile:"+strings.ReplaceAll(c.name, " ", "-"), imagetest.Image(t, v1.Config{}, good, bad))
			_, err := s.Pull(context.Background(), ref, PullOptions{})
			if !errors.Is(err, errdefs.ErrUnprocessable) || !errors.Is(err, ErrUnsafeLayer) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("pull: %v, want an unsafe-layer error with %q", err, c.want)
			}
			for _, p := range []string{"/etc/agentjail-pwned", "/tmp/agentjail-pwned"} {
				if _, err := os.Lstat(p); err == nil {
					os.Remove(p)
					t.Fatalf("%s was written on the host", p)
				}
			}
			// The good layer may have completed; prune leaves nothing.
			if _, err := s.Prune(false); err != nil {
				t.Fatal(err)
			}
			assertNothingLeft(t, s)
		})
	}
}

func TestPullRefusesWritesThroughALowerSymlink(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	s := newStore(t, reg)
	base := imagetest.Layer(t, imagetest.Entry{Name: "usr/bin/", Type: tar.TypeDir}, imagetest.Entry{Name: "bin", Type: tar.TypeSymlink, Linkname: "usr/bin"})
	top := imagetest.Layer(t, imagetest.Entry{Name: "bin/tool", Body: "x"})
	ref := reg.Push(t, "test/through:1", imagetest.Image(t, v1.Config{}, base, top))
	_, err := s.Pull(context.Background(), ref, PullOptions{})
	if !errors.Is(err, errdefs.ErrUnprocessable) || !strings.Contains(err.Error(), "writes below /bin") {
		t.Fatalf("pull: %v", err)
	}
	if len(s.List()) != 0 {
		t.Fatal("the refused image was recorded")
	}
	// An explicit directory entry replaces the symlink, as docker does.
	top2 := imagetest.Layer(t, imagetest.Entry{Name: "bin/", Type: tar.TypeDir}, imagetest.Entry{Name: "bin/tool", Body: "x"})
	ref = reg.Push(t, "test/through:2", imagetest.Image(t, v1.Config{}, base, top2))
	if _, err := s.Pull(context.Background(), ref, PullOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestPullCorruptedBlob(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	s := newStore(t, reg)
	layer := imagetest.Layer(t, imagetest.Entry{Name: "f", Body: strings.Repeat("data", 1000)})
	ref := reg.Push(t, "test/corrupt:1", imagetest.Image(t, v1.Config{}, layer))
	d, _ := layer.Digest()
	reg.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/blobs/"+d.String()) {
			return false
		}
		// Same length, other content: a tar of other bytes.
		blob := imagetest.Blob(t, layer)
		bad := append([]byte{}, blob...)
		bad[len(bad)/2] ^= 0xff
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(bad)
		return true
	})
	_, err := s.Pull(context.Background(), ref, PullOptions{})
	if !errors.Is(err, errdefs.ErrUnprocessable) || !strings.Contains(err.Error(), d.String()) {
		t.Fatalf("pull of a corrupted blob: %v", err)
	}
	assertNothingLeft(t, s)
}

func TestPullHugeDeclaredSize(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	s := newStore(t, reg)
	layer := imagetest.Layer(t, imagetest.Entry{Name: "f", Body: "small"})
	img := imagetest.Image(t, v1.Config{}, layer)
	manifest, config := imagetest.Manifest(t, img, map[int]int64{0: 1 << 50})
	ref := reg.PushRaw(t, "test/huge:1", manifest, config, imagetest.Blob(t, layer))
	d, _ := layer.Digest()
	_, err := s.Pull(context.Background(), ref, PullOptions{})
	if !errors.Is(err, errdefs.ErrUnprocessable) || !strings.Contains(err.Error(), "declares 1125899906842624 bytes") {
		t.Fatalf("pull of a layer declaring 1 PiB: %v", err)
	}
	if n := reg.BlobGets(d.String()); n != 0 {
		t.Errorf("the blob was fetched %d times before the refusal", n)
	}
	assertNothingLeft(t, s)
}

func TestPullInterruptedCleansUpAndResumes(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	s := newStore(t, reg)
	first := imagetest.Layer(t, imagetest.Entry{Name: "first", Body: "one"})
	big := imagetest.Layer(t, imagetest.Entry{Name: "big", Body: strings.Repeat("0123456789abcdef", 1<<16)})
	ref := reg.Push(t, "test/interrupted:1", imagetest.Image(t, v1.Config{}, first, big))
	// A layer completed earlier (by another image) survives the interruption.
	if _, err := s.Pull(context.Background(), reg.Push(t, "test/first:1", imagetest.Image(t, v1.Config{}, first)), PullOptions{}); err != nil {
		t.Fatal(err)
	}
	d, _ := big.Digest()
	ctx, cancel := context.WithCancel(context.Background())
	reg.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/blobs/"+d.String()) {
			return false
		}
		blob := imagetest.Blob(t, big)
		w.Header().Set("Content-Length", strconv.Itoa(len(blob)))
		w.Write(blob[:len(blob)/2])
		w.(http.Flusher).Flush()
		cancel() // the client goes away half-way
		<-r.Context().Done()
		return true
	})
	_, err := s.Pull(ctx, ref, PullOptions{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted pull: %v", err)
	}
	if ents, _ := os.ReadDir(s.tmpDir()); len(ents) != 0 {
		t.Fatalf("tmp holds %d entries after an interrupted pull", len(ents))
	}
	fd, _ := first.DiffID()
	if _, err := os.Stat(s.layerDir(fd.Hex)); err != nil {
		t.Fatalf("the completed layer is gone: %v", err)
	}
	bd, _ := big.DiffID()
	if _, err := os.Stat(s.layerDir(bd.Hex)); err == nil {
		t.Fatal("the interrupted layer looks complete")
	}
	if len(s.List()) != 1 {
		t.Fatal("an interrupted pull recorded its image")
	}
	// An unpack a crash left behind is swept when the store opens.
	if err := os.MkdirAll(filepath.Join(s.tmpDir(), bd.Hex+"-crashed", "root", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(s.opts); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(s.tmpDir()); len(ents) != 0 {
		t.Fatalf("Open left %d unfinished unpacks", len(ents))
	}
	// The next pull fetches only the missing layer.
	reg.SetHook(nil)
	fdg, _ := first.Digest()
	before := reg.BlobGets(fdg.String())
	if _, err := s.Pull(context.Background(), ref, PullOptions{}); err != nil {
		t.Fatal(err)
	}
	if reg.BlobGets(fdg.String()) != before {
		t.Error("the resumed pull fetched the completed layer again")
	}
}

func TestPullPlainHTTPNeedsInsecure(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	ref := reg.Push(t, "test/plain:1", imagetest.Image(t, v1.Config{}, imagetest.Layer(t, imagetest.Entry{Name: "f"})))
	s := newStore(t, nil)
	_, err := s.Pull(context.Background(), ref, PullOptions{})
	if err == nil || !strings.Contains(err.Error(), "insecure") {
		t.Fatalf("pull over plain HTTP without naming the registry insecure: %v", err)
	}
}

func TestPullNotFound(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	s := newStore(t, reg)
	_, err := s.Pull(context.Background(), reg.Host+"/test/none:1", PullOptions{})
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("pull of a missing image: %v", err)
	}
	if _, err := s.Pull(context.Background(), "Not A Ref!", PullOptions{}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("pull of a malformed reference: %v", err)
	}
}

func TestConcurrentPullsUnpackOnce(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	s := newStore(t, reg)
	layer := imagetest.Layer(t, imagetest.Entry{Name: "f", Body: strings.Repeat("x", 1<<20)})
	ref := reg.Push(t, "test/concurrent:1", imagetest.Image(t, v1.Config{}, layer))
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = s.Pull(context.Background(), ref, PullOptions{})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	d, _ := layer.Digest()
	if n := reg.BlobGets(d.String()); n != 1 {
		t.Errorf("four concurrent pulls fetched the layer %d times", n)
	}
}

func TestRemoveAndPrune(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	s := newStore(t, reg)
	shared := imagetest.Layer(t, imagetest.Entry{Name: "shared", Body: strings.Repeat("s", 4096)})
	a := imagetest.Layer(t, imagetest.Entry{Name: "a", Body: "a"})
	b := imagetest.Layer(t, imagetest.Entry{Name: "b", Body: "b"})
	refA := reg.Push(t, "test/a:1", imagetest.Image(t, v1.Config{}, shared, a))
	refB := reg.Push(t, "test/b:1", imagetest.Image(t, v1.Config{}, shared, b))
	imgA, err := s.Pull(context.Background(), refA, PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	imgB, err := s.Pull(context.Background(), refB, PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u, err := s.DiskUsage()
	if err != nil || u.Images != 2 || u.Layers != 3 || u.UnusedLayers != 0 || u.LayerBytes != 4096+2 {
		t.Fatalf("usage %+v %v", u, err)
	}
	// A jail holds B.
	s.SetInUse(func() map[string]bool { return map[string]bool{imgB.ID: true} })
	if _, err := s.Remove(imgB.ID, false); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("rmi of an image in use: %v", err)
	}
	res, err := s.Remove(refA, false)
	if err != nil || res.Deleted != imgA.ID {
		t.Fatalf("rmi %s: %+v %v", refA, res, err)
	}
	res, err = s.Remove(refB, false)
	if err != nil || res.Deleted != "" || len(res.Untagged) != 1 {
		t.Fatalf("rmi of the last tag of an image in use: %+v %v", res, err)
	}
	pr, err := s.Prune(false)
	if err != nil {
		t.Fatal(err)
	}
	if len(pr.Images) != 0 || len(pr.Layers) != 1 || pr.ReclaimedBytes != 1 {
		t.Fatalf("prune while B is in use: %+v", pr)
	}
	if _, err := s.Get(imgB.ID); err != nil {
		t.Fatalf("image in use pruned: %v", err)
	}
	// A pin (a jail being created) holds it too.
	_, release, err := s.Acquire(imgB.ID)
	if err != nil {
		t.Fatal(err)
	}
	s.SetInUse(nil)
	if pr, _ := s.Prune(false); len(pr.Images) != 0 {
		t.Fatalf("prune removed a pinned image: %+v", pr)
	}
	release()
	pr, err = s.Prune(false)
	if err != nil || len(pr.Images) != 1 || len(pr.Layers) != 2 {
		t.Fatalf("prune: %+v %v", pr, err)
	}
	u, _ = s.DiskUsage()
	if u.Images != 0 || u.Layers != 0 {
		t.Fatalf("usage after prune %+v", u)
	}
}

// TestPruneDuringPullKeepsItsLayers prunes while a pull has one layer
// unpacked and waits for the other: the pull's layer stays.
func TestPruneDuringPullKeepsItsLayers(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	s := newStore(t, reg)
	first := imagetest.Layer(t, imagetest.Entry{Name: "first", Body: "1"})
	second := imagetest.Layer(t, imagetest.Entry{Name: "second", Body: "2"})
	ref := reg.Push(t, "test/pruned:1", imagetest.Image(t, v1.Config{}, first, second))
	fd, _ := first.Digest()
	sd, _ := second.Digest()
	release := make(chan struct{})
	reg.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+sd.String()) {
			<-release
		}
		return false
	})
	firstDone := make(chan struct{})
	var once sync.Once
	errc := make(chan error, 1)
	go func() {
		_, err := s.Pull(context.Background(), ref, PullOptions{Progress: func(p model.PullProgress) {
			if p.Layer == fd.String() && p.Status == "done" {
				once.Do(func() { close(firstDone) })
			}
		}})
		errc <- err
	}()
	<-firstDone
	res, err := s.Prune(true)
	close(release)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Layers) != 0 {
		t.Errorf("prune removed the layers of a pull in progress: %v", res.Layers)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	img, err := s.Get(ref)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range img.Layers {
		if _, err := os.Stat(s.LayerRoot(l.DiffID)); err != nil {
			t.Errorf("layer %s of the pulled image: %v", l.DiffID, err)
		}
	}
}
