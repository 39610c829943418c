// Package imagetest builds OCI images for tests and serves them from an
// in-process registry (go-containerregistry's pkg/registry) on loopback:
// layers from tar entries, images with a config, hostile variants (a
// corrupted blob, a layer declaring a huge size) and archives for load.
package imagetest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Entry is one tar entry of a test layer.
type Entry struct {
	Name     string
	Type     byte // tar.TypeReg when zero
	Body     string
	Mode     int64 // 0644 (0755 for directories) when zero
	Linkname string
	Uid, Gid int
	Xattrs   map[string]string
	Size     int64 // declared size for TypeReg when Body is empty and Size > 0 (a lie)
}

// Tar returns the plain tar of entries.
func Tar(t testing.TB, entries ...Entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.Name, Typeflag: e.Type, Mode: e.Mode, Linkname: e.Linkname,
			Uid: e.Uid, Gid: e.Gid, ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.Body))
		}
		if len(e.Xattrs) > 0 {
			h.PAXRecords = map[string]string{}
			for k, v := range e.Xattrs {
				h.PAXRecords["SCHILY.xattr."+k] = v
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.WriteString(tw, e.Body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Gzip compresses b.
func Gzip(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Layer is a gzip layer holding entries.
func Layer(t testing.TB, entries ...Entry) v1.Layer {
	t.Helper()
	b := Tar(t, entries...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Digest is the sha256 digest of b.
func Digest(b []byte) v1.Hash {
	sum := sha256.Sum256(b)
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
}

// Image is an image of layers (base first) with cfg as its config.
func Image(t testing.TB, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img := empty.Image
	var err error
	for _, l := range layers {
		diff, err := diffID(l)
		if err != nil {
			t.Fatal(err)
		}
		img, err = mutate.Append(img, mutate.Addendum{Layer: l, History: v1.History{CreatedBy: "test " + diff.Hex[:8]}})
		if err != nil {
			t.Fatal(err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.Config = cfg
	cf.OS, cf.Architecture = "linux", "amd64"
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// diffID is the diff id of a static layer (its gzip body uncompressed).
func diffID(l v1.Layer) (v1.Hash, error) {
	rc, err := l.Uncompressed()
	if err != nil {
		return v1.Hash{}, err
	}
	defer rc.Close()
	h := sha256.New()
	if _, err := io.Copy(h, rc); err != nil {
		return v1.Hash{}, err
	}
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}, nil
}

// Registry is an in-process registry on loopback. Its Hook, when set,
// may answer a request instead of the registry (to corrupt a blob, stall
// a download...).
type Registry struct {
	// Host is host:port of the registry.
	Host string
	srv  *httptest.Server

	mu   sync.Mutex
	hook func(w http.ResponseWriter, r *http.Request) bool
	// Gets counts blob GETs by digest.
	gets map[string]int
}

// NewRegistry starts a registry, stopped when the test ends.
func NewRegistry(t testing.TB) *Registry {
	t.Helper()
	r := &Registry{gets: map[string]int{}}
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method == http.MethodGet {
			if i := strings.Index(req.URL.Path, "/blobs/"); i >= 0 {
				r.mu.Lock()
				r.gets[req.URL.Path[i+len("/blobs/"):]]++
				r.mu.Unlock()
			}
		}
		r.mu.Lock()
		hook := r.hook
		r.mu.Unlock()
		if hook != nil && hook(w, req) {
			return
		}
		reg.ServeHTTP(w, req)
	}))
	t.Cleanup(r.srv.Close)
	r.Host = strings.TrimPrefix(r.srv.URL, "http://")
	return r
}

// SetHook installs (or with nil removes) the request hook.
func (r *Registry) SetHook(h func(w http.ResponseWriter, r *http.Request) bool) {
	r.mu.Lock()
	r.hook = h
	r.mu.Unlock()
}

// BlobGets returns how many times the blob d was fetched.
func (r *Registry) BlobGets(d string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gets[d]
}

// RequireAuth makes the registry a private one for the repositories under
// prefix (e.g. "private/"): their requests, and the version check every
// client makes first (GET /v2/), are answered 401 with a basic challenge
// unless they carry user and password. Other repositories stay open to
// anyone (a client without credentials answers the challenge with none).
// It takes the hook's place.
func (r *Registry) RequireAuth(prefix, user, password string) {
	r.SetHook(func(w http.ResponseWriter, req *http.Request) bool {
		if req.URL.Path != "/v2/" && !strings.HasPrefix(req.URL.Path, "/v2/"+prefix) {
			return false
		}
		if u, p, ok := req.BasicAuth(); ok && u == user && p == password {
			return false
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="agentjail-test"`)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
		return true
	})
}

// Push writes img as repo:tag and returns the reference to pull it by.
func (r *Registry) Push(t testing.TB, repoTag string, img v1.Image) string {
	t.Helper()
	ref := r.Host + "/" + repoTag
	tag, err := name.NewTag(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img); err != nil {
		t.Fatal(err)
	}
	return ref
}

// PushRaw uploads blobs and a hand-written manifest (for manifests that
// lie) as repo:tag and returns the reference.
func (r *Registry) PushRaw(t testing.TB, repoTag string, manifest []byte, blobs ...[]byte) string {
	t.Helper()
	repo, tag, _ := strings.Cut(repoTag, ":")
	for _, b := range blobs {
		d := Digest(b)
		u := fmt.Sprintf("%s/v2/%s/blobs/uploads/?digest=%s", r.srv.URL, repo, d)
		resp, err := http.Post(u, "application/octet-stream", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("blob upload: %s", resp.Status)
		}
	}
	req, err := http.NewRequest(http.MethodPut, fmt.Sprintf("%s/v2/%s/manifests/%s", r.srv.URL, repo, tag), bytes.NewReader(manifest))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", string(types.DockerManifestSchema2))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("manifest upload: %s", resp.Status)
	}
	return r.Host + "/" + repoTag
}

// Manifest is the manifest of img with layer sizes replaced by sizes
// (when non-nil), as JSON, and img's raw config.
func Manifest(t testing.TB, img v1.Image, sizes map[int]int64) (manifest, config []byte) {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	m = m.DeepCopy()
	for i, s := range sizes {
		m.Layers[i].Size = s
	}
	manifest, err = json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	config, err = img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	return manifest, config
}

// Blob returns the compressed bytes of layer l.
func Blob(t testing.TB, l v1.Layer) []byte {
	t.Helper()
	rc, err := l.Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// RemoteManifest returns the manifest at ref (an OCI or docker image
// manifest) as the registry serves it.
func RemoteManifest(t testing.TB, ref name.Reference) *v1.Manifest {
	t.Helper()
	desc, err := remote.Get(ref)
	if err != nil {
		t.Fatal(err)
	}
	m, err := v1.ParseManifest(bytes.NewReader(desc.Manifest))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// RemoteBlob returns the bytes of blob d of repo as the registry serves
// them.
func RemoteBlob(t testing.TB, repo name.Repository, d v1.Hash) []byte {
	t.Helper()
	l, err := remote.Layer(repo.Digest(d.String()))
	if err != nil {
		t.Fatal(err)
	}
	return Blob(t, l)
}

// DockerArchive writes img as a docker-archive (docker save) tagged tag
// to a file in dir and returns its path.
func DockerArchive(t testing.TB, dir, tag string, img v1.Image) string {
	t.Helper()
	tg, err := name.NewTag(tag)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "docker-archive.tar")
	if err := tarball.WriteToFile(p, tg, img); err != nil {
		t.Fatal(err)
	}
	return p
}

// OCIArchive writes img as an OCI image layout named ref, packed in a tar
// in dir, and returns the tar's path.
func OCIArchive(t testing.TB, dir, ref string, img v1.Image) string {
	t.Helper()
	ld := filepath.Join(dir, "layout")
	lp, err := layout.Write(ld, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref})); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "oci-layout.tar")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(ld, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(ld, path)
		if rel == "." {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			_, err = tw.Write(b)
			return err
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// busyboxApplets are the commands Busybox links into /bin.
var busyboxApplets = []string{"sh", "cat", "id", "pwd", "env", "ls", "echo", "touch", "rm", "mkdir", "stat", "true", "false", "sleep", "wc", "head", "dd", "sync", "setsid"}

// Busybox returns the entries of a small root filesystem: the host's
// static busybox (path) as /bin/busybox with its applets, /etc/passwd
// and /etc/group with root and app (uid 1234), /tmp and /home/app.
func Busybox(t testing.TB, path string) []Entry {
	t.Helper()
	bin, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	entries := []Entry{
		{Name: "bin/", Type: tar.TypeDir},
		{Name: "bin/busybox", Body: string(bin), Mode: 0o755},
		{Name: "etc/", Type: tar.TypeDir},
		{Name: "etc/passwd", Body: "root:x:0:0:root:/root:/bin/sh\napp:x:1234:1234:app:/home/app:/bin/sh\n"},
		{Name: "etc/group", Body: "root:x:0:\napp:x:1234:\n"},
		{Name: "tmp/", Type: tar.TypeDir, Mode: 0o1777},
		{Name: "root/", Type: tar.TypeDir, Mode: 0o700},
		{Name: "home/", Type: tar.TypeDir},
		{Name: "home/app/", Type: tar.TypeDir, Uid: 1234, Gid: 1234},
	}
	for _, a := range busyboxApplets {
		entries = append(entries, Entry{Name: "bin/" + a, Type: tar.TypeSymlink, Linkname: "busybox"})
	}
	return entries
}
