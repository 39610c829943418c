package image

import (
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/agentjail/agentjail/internal/image/imagetest"
)

func TestRegistryCacheServesVerifiedBlobs(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	s := newStore(t, reg)
	layer := imagetest.Layer(t, imagetest.Entry{Name: "f", Body: strings.Repeat("cache me ", 1000)})
	ref := reg.Push(t, "test/cached:1", imagetest.Image(t, v1.Config{}, layer))
	d, _ := layer.Digest()

	// A corrupted answer never enters the cache.
	reg.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasSuffix(r.URL.Path, "/blobs/"+d.String()) || r.Method != http.MethodGet {
			return false
		}
		b := imagetest.Blob(t, layer)
		b[len(b)/2] ^= 1
		w.Write(b)
		return true
	})
	if _, err := s.Pull(context.Background(), ref, PullOptions{}); err == nil {
		t.Fatal("a corrupted blob was accepted")
	}
	if f, _, err := s.Cache().Open(d.String()); err == nil {
		f.Close()
		t.Fatal("the corrupted blob entered the cache")
	}
	reg.SetHook(nil)
	img, err := s.Pull(context.Background(), ref, PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gets := reg.BlobGets(d.String())
	// Gone from the store, the image comes back from the cache.
	if _, err := s.Remove(ref, false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prune(false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pull(context.Background(), ref, PullOptions{}); err != nil {
		t.Fatal(err)
	}
	if reg.BlobGets(d.String()) != gets {
		t.Errorf("the layer was fetched from the registry again (%d → %d)", gets, reg.BlobGets(d.String()))
	}

	// Jails get it as a registry, with the token only.
	srv := httptest.NewServer(s.RegistryHandler("sesame"))
	defer srv.Close()
	get := func(path, token string) (*http.Response, []byte) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		if token != "" {
			req.Header.Set(CacheHeader, token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	if resp, _ := get("/v2/", ""); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("without the token: %s", resp.Status)
	}
	resp, body := get("/v2/"+reg.Host+"/test/cached/manifests/1", "sesame")
	var m v1.Manifest
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &m) != nil || len(m.Layers) != 1 || resp.Header.Get("Docker-Content-Digest") != img.Digest {
		t.Fatalf("manifest through the cache: %s %s", resp.Status, body)
	}
	resp, body = get("/v2/"+reg.Host+"/test/cached/blobs/"+d.String(), "sesame")
	if resp.StatusCode != http.StatusOK || imagetest.Digest(body) != d {
		t.Fatalf("blob through the cache: %s (%d bytes)", resp.Status, len(body))
	}
	if reg.BlobGets(d.String()) != gets {
		t.Errorf("the cached blob was fetched from the registry for a jail")
	}
	if resp, _ := get("/v2/"+reg.Host+"/test/none/manifests/1", "sesame"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("missing manifest: %s", resp.Status)
	}
}

func TestRegistryCacheIsBounded(t *testing.T) {
	reg := imagetest.NewRegistry(t)
	testStore := newStore(t, reg)
	opts := testStore.opts
	opts.Dir = filepath.Join(t.TempDir(), "images")
	opts.CacheBytes = 64 << 10
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	var digests []string
	for i := range 4 {
		body := make([]byte, 30<<10)
		rand.NewChaCha8([32]byte{byte(i)}).Read(body)
		layer := imagetest.Layer(t, imagetest.Entry{Name: "f", Body: string(body)})
		d, _ := layer.Digest()
		digests = append(digests, d.String())
		ref := reg.Push(t, "test/bounded:"+string(rune('a'+i)), imagetest.Image(t, v1.Config{}, layer))
		if _, err := s.Pull(context.Background(), ref, PullOptions{}); err != nil {
			t.Fatal(err)
		}
		if u, err := s.DiskUsage(); err != nil || u.CacheBytes > u.CacheMaxBytes || u.CacheMaxBytes != 64<<10 || u.CacheBytes == 0 {
			t.Fatalf("the cache holds %d bytes of its bound of %d (%v)", u.CacheBytes, u.CacheMaxBytes, err)
		}
	}
	cached := func(d string) bool {
		f, _, err := s.Cache().Open(d)
		if err == nil {
			f.Close()
		}
		return err == nil
	}
	if cached(digests[0]) || !cached(digests[3]) {
		t.Errorf("eviction: the oldest layer cached %v, the newest %v", cached(digests[0]), cached(digests[3]))
	}
}
