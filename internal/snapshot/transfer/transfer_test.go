package transfer

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/image/imagetest"
	"github.com/agentjail/agentjail/internal/model"
)

func ref(t *testing.T, reg *imagetest.Registry, repo string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(reg.Host + "/" + repo)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// sampleSnapshot makes a snapshot directory and a sparse disk image.
func sampleSnapshot(t *testing.T) Source {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "snap")
	for p, data := range map[string]string{
		"metadata.json":         `{"left":"out"}`,
		"checkpoint.json":       `{"init_binary":"/x"}`,
		"criu/pages-1.img":      strings.Repeat("page", 50000),
		"criu/core-1.img":       "core",
		"control/init.log":      "log line\n",
		"criu-work/empty/.keep": "",
	} {
		p = filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	disk := filepath.Join(t.TempDir(), "disk.img")
	f, err := os.Create(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(256 << 20); err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, 100 << 20, 256<<20 - 4096} {
		if _, err := f.WriteAt(bytes.Repeat([]byte{byte(off>>20) + 1}, 4096), off); err != nil {
			t.Fatal(err)
		}
	}
	snap := &model.Snapshot{ID: "s0123456789ab", Name: "sample", Mode: model.SnapshotFull}
	snap.Config.Isolation.Level = "container"
	return Source{Snapshot: snap, Dir: dir, Skip: []string{"metadata.json"}, DiskImage: disk}
}

var testLimits = Limits{Files: 1 << 30, Disk: 1 << 30, Blob: 1 << 30}

func newDest(t *testing.T) Dest {
	dir := filepath.Join(t.TempDir(), "pulled")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return Dest{Dir: dir, DiskImage: filepath.Join(t.TempDir(), "pulled.img")}
}

func accept(*Config) error { return nil }

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(data)
}

func TestPushPull(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	src := sampleSnapshot(t)
	ctx := context.Background()
	pushed, err := Push(ctx, ref(t, reg, "snaps/sample:v1"), src, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A 256 MiB disk holding 12 KiB of data travels as its data.
	if pushed.Bytes > 1<<20 || pushed.Config.DiskBytes != 256<<20 {
		t.Fatalf("pushed %d bytes, disk %d", pushed.Bytes, pushed.Config.DiskBytes)
	}
	dest := newDest(t)
	var seen *Config
	pulled, err := Pull(ctx, ref(t, reg, "snaps/sample:v1"), dest, testLimits, func(c *Config) error { seen = c; return nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	if pulled.Digest != pushed.Digest || seen == nil || seen.Snapshot.Name != "sample" || pulled.Config.Snapshot.Config.Isolation.Level != "container" {
		t.Fatalf("pulled %+v, pushed %+v", pulled, pushed)
	}
	for _, p := range []string{"checkpoint.json", "criu/pages-1.img", "criu/core-1.img", "control/init.log", "criu-work/empty/.keep"} {
		if fileSum(t, filepath.Join(src.Dir, p)) != fileSum(t, filepath.Join(dest.Dir, p)) {
			t.Errorf("%s differs after the pull", p)
		}
	}
	if _, err := os.Stat(filepath.Join(dest.Dir, "metadata.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the store's record travelled: %v", err)
	}
	if fileSum(t, src.DiskImage) != fileSum(t, dest.DiskImage) {
		t.Fatal("the disk image differs after the pull")
	}
	var st syscall.Stat_t
	if err := syscall.Stat(dest.DiskImage, &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 > 16<<20 {
		t.Errorf("the pulled disk image is not sparse: %d bytes allocated", st.Blocks*512)
	}
	// By digest, too.
	byDigest, err := name.ParseReference(pushed.Ref)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Pull(ctx, byDigest, newDest(t), testLimits, accept, nil); err != nil {
		t.Fatalf("pull by digest: %v", err)
	}
}

func TestPullRefusedBeforeLayers(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	src := sampleSnapshot(t)
	ctx := context.Background()
	if _, err := Push(ctx, ref(t, reg, "snaps/sample:v1"), src, nil); err != nil {
		t.Fatal(err)
	}
	refused := errdefs.Unprocessablef("not here")
	dest := newDest(t)
	_, err := Pull(ctx, ref(t, reg, "snaps/sample:v1"), dest, testLimits, func(*Config) error { return refused }, nil)
	if !errors.Is(err, refused) {
		t.Fatalf("got %v", err)
	}
	for _, l := range imagetest.RemoteManifest(t, ref(t, reg, "snaps/sample:v1")).Layers {
		if n := reg.BlobGets(l.Digest.String()); n != 0 {
			t.Errorf("layer %s fetched %d times before the refusal", l.Digest, n)
		}
	}
	if _, err := os.Stat(dest.DiskImage); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a disk image was written: %v", err)
	}
	// Too small limits: 413 before the layers.
	_, err = Pull(ctx, ref(t, reg, "snaps/sample:v1"), newDest(t), Limits{Files: 1 << 30, Disk: 1 << 20, Blob: 1 << 30}, accept, nil)
	if !errors.Is(err, errdefs.ErrTooLarge) {
		t.Fatalf("a disk above the limit: %v", err)
	}
}

func TestPullTamperedBlob(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	src := sampleSnapshot(t)
	ctx := context.Background()
	r := ref(t, reg, "snaps/sample:v1")
	if _, err := Push(ctx, r, src, nil); err != nil {
		t.Fatal(err)
	}
	for i, l := range imagetest.RemoteManifest(t, r).Layers {
		body := imagetest.RemoteBlob(t, r.Context(), l.Digest)
		body[len(body)/2] ^= 0xff
		reg.SetHook(func(w http.ResponseWriter, req *http.Request) bool {
			if req.Method != http.MethodGet || !strings.HasSuffix(req.URL.Path, "/blobs/"+l.Digest.String()) {
				return false
			}
			w.Write(body)
			return true
		})
		_, err := Pull(ctx, r, newDest(t), testLimits, accept, nil)
		if !errors.Is(err, errdefs.ErrUnprocessable) || !strings.Contains(err.Error(), "does not match its digest") {
			t.Errorf("layer %d changed in the registry: %v", i, err)
		}
	}
}

// pushArtifact pushes a hand-made snapshot artifact: cfg and the layers
// as given (already compressed).
func pushArtifact(t *testing.T, ref name.Reference, cfg any, files, disk []byte) {
	t.Helper()
	raw, _ := json.Marshal(cfg)
	cl := static.NewLayer(raw, ConfigMediaType)
	fl := static.NewLayer(files, FilesMediaType)
	dl := static.NewLayer(disk, DiskMediaType)
	var descs []v1.Descriptor
	for _, l := range []v1.Layer{cl, fl, dl} {
		if err := remote.WriteLayer(ref.Context(), l); err != nil {
			t.Fatal(err)
		}
		d, err := partialDescriptor(l)
		if err != nil {
			t.Fatal(err)
		}
		descs = append(descs, *d)
	}
	m := v1.Manifest{SchemaVersion: 2, MediaType: types.OCIManifestSchema1, ArtifactType: ArtifactType, Config: descs[0], Layers: descs[1:]}
	mraw, _ := json.Marshal(m)
	if err := remote.Put(ref, rawManifest{mraw}); err != nil {
		t.Fatal(err)
	}
}

func gz(t *testing.T, write func(io.Writer)) []byte {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	write(zw)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestPullBadArtifacts(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	ctx := context.Background()
	good := sampleSnapshot(t)
	cfg := Config{Format: format, Snapshot: *good.Snapshot, FilesBytes: 10, DiskBytes: 256 << 20}
	var disk bytes.Buffer
	if err := writeDisk(&disk, good.DiskImage); err != nil {
		t.Fatal(err)
	}
	goodDisk := gz(t, func(w io.Writer) { w.Write(disk.Bytes()) })
	tarOf := func(name string, typ byte, body string) []byte {
		return gz(t, func(w io.Writer) {
			tw := tar.NewWriter(w)
			tw.WriteHeader(&tar.Header{Name: name, Typeflag: typ, Size: int64(len(body)), Mode: 0o600, Linkname: "/etc/passwd"})
			tw.Write([]byte(body))
			tw.Close()
		})
	}
	outside := filepath.Join(t.TempDir(), "escaped")
	cases := []struct {
		name  string
		cfg   any
		files []byte
		disk  []byte
		kind  error
		want  string
	}{
		{"traversal", cfg, tarOf("../../../../../../.."+outside, tar.TypeReg, "x"), goodDisk, errdefs.ErrUnprocessable, "outside the snapshot"},
		{"absolute", cfg, tarOf(outside, tar.TypeReg, "x"), goodDisk, errdefs.ErrUnprocessable, "outside the snapshot"},
		{"symlink", cfg, tarOf("criu/link", tar.TypeSymlink, ""), goodDisk, errdefs.ErrUnprocessable, "only files and directories"},
		{"files above their record", cfg, tarOf("big", tar.TypeReg, strings.Repeat("x", 11)), goodDisk, errdefs.ErrTooLarge, "limit"},
		{"not gzip", cfg, []byte("garbage garbage garbage"), goodDisk, errdefs.ErrUnprocessable, "gzip"},
		{"not a tar", cfg, gz(t, func(w io.Writer) { w.Write(bytes.Repeat([]byte("garbage!"), 200)) }), goodDisk, errdefs.ErrUnprocessable, "tar"},
		{"disk not a disk stream", cfg, tarOf("a", tar.TypeReg, "x"), gz(t, func(w io.Writer) { w.Write([]byte("garbage garbage garbage")) }), errdefs.ErrUnprocessable, "disk stream"},
		{"disk cut short", cfg, tarOf("a", tar.TypeReg, "x"), gz(t, func(w io.Writer) { w.Write(disk.Bytes()[:disk.Len()-100]) }), errdefs.ErrUnprocessable, "ends"},
		{"disk of another size", Config{Format: format, Snapshot: cfg.Snapshot, FilesBytes: 10, DiskBytes: 1 << 20}, tarOf("a", tar.TypeReg, "x"), goodDisk, errdefs.ErrTooLarge, "disks of 1 to"},
		{"unknown format", Config{Format: 9, Snapshot: cfg.Snapshot, DiskBytes: 1}, nil, nil, errdefs.ErrUnprocessable, "format 9"},
		{"config with unknown keys", map[string]any{"format": 1, "evil": true}, nil, nil, errdefs.ErrUnprocessable, "not a snapshot's record"},
		{"huge disk", Config{Format: format, Snapshot: cfg.Snapshot, DiskBytes: 1 << 40}, nil, nil, errdefs.ErrTooLarge, "disks of 1 to"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := ref(t, reg, "bad/artifact:"+string(rune('a'+i)))
			pushArtifact(t, r, c.cfg, c.files, c.disk)
			dest := newDest(t)
			_, err := Pull(ctx, r, dest, testLimits, accept, nil)
			if !errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v; want %v with %q", err, c.kind, c.want)
			}
		})
	}
	if _, err := os.Lstat(outside); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a tar entry was written outside the snapshot: %v", err)
	}
	// An ordinary image is not a snapshot.
	img, err := random.Image(100, 1)
	if err != nil {
		t.Fatal(err)
	}
	plain := ref(t, reg, "plain/image:v1")
	if err := remote.Write(plain, img); err != nil {
		t.Fatal(err)
	}
	if _, err := Pull(ctx, plain, newDest(t), testLimits, accept, nil); !errors.Is(err, errdefs.ErrUnprocessable) || !strings.Contains(err.Error(), "not a snapshot") {
		t.Fatalf("an image: %v", err)
	}
	if _, err := Pull(ctx, ref(t, reg, "no/such:v1"), newDest(t), testLimits, accept, nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("an unknown ref: %v", err)
	}
}
