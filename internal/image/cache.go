package image

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentjail/agentjail/internal/lazyre"
)

// DefaultCacheBytes bounds the registry cache unless Options say otherwise.
const DefaultCacheBytes = 10 << 30

// BlobCache is the pull-through registry cache: blobs and manifests by
// digest (DIR/sha256/<hex>, the media type beside it), each verified
// against its digest before it enters, the least recently used evicted
// past the size bound. Safe for concurrent use.
type BlobCache struct {
	dir string
	max int64

	mu    sync.Mutex
	total int64
}

// OpenBlobCache opens (creating) the cache at dir, bounded to max bytes.
func OpenBlobCache(dir string, max int64) (*BlobCache, error) {
	if max <= 0 {
		max = DefaultCacheBytes
	}
	c := &BlobCache{dir: dir, max: max}
	// Entries whose copy a crash interrupted never entered: drop them.
	if err := os.RemoveAll(filepath.Join(dir, "tmp")); err != nil {
		return nil, fmt.Errorf("registry cache: %w", err)
	}
	for _, d := range []string{c.blobDir(), filepath.Join(dir, "tmp")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("registry cache: %w", err)
		}
	}
	ents, err := os.ReadDir(c.blobDir())
	if err != nil {
		return nil, fmt.Errorf("registry cache: %w", err)
	}
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && !strings.Contains(e.Name(), ".") {
			c.total += fi.Size()
		}
	}
	return c, nil
}

func (c *BlobCache) blobDir() string { return filepath.Join(c.dir, "sha256") }

func (c *BlobCache) path(hexDigest string) string { return filepath.Join(c.blobDir(), hexDigest) }

// Size returns the bytes the cache holds and its bound.
func (c *BlobCache) Size() (used, max int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total, c.max
}

var digestRE = lazyre.New(`^sha256:([0-9a-f]{64})$`)

// Open returns the cached content of digest and its media type, marking
// it used; fs.ErrNotExist when it is not cached.
func (c *BlobCache) Open(digest string) (*os.File, string, error) {
	m := digestRE().FindStringSubmatch(digest)
	if m == nil {
		return nil, "", fs.ErrNotExist
	}
	f, err := os.Open(c.path(m[1]))
	if err != nil {
		return nil, "", err
	}
	now := time.Now()
	_ = os.Chtimes(c.path(m[1]), now, now)
	mt, _ := os.ReadFile(c.path(m[1]) + ".type")
	return f, string(mt), nil
}

// writer streams content into the cache; Commit enters it when its
// digest matches.
type cacheWriter struct {
	c      *BlobCache
	f      *os.File
	h      hash.Hash
	n      int64
	digest string
	mt     string
	err    error
}

// newWriter starts caching digest (nil when the digest is malformed or
// size, when known, is over the bound).
func (c *BlobCache) newWriter(digest, mediaType string, size int64) *cacheWriter {
	if !digestRE().MatchString(digest) || size > c.max {
		return nil
	}
	f, err := os.CreateTemp(filepath.Join(c.dir, "tmp"), "blob-")
	if err != nil {
		return nil
	}
	return &cacheWriter{c: c, f: f, h: sha256.New(), digest: digest, mt: mediaType}
}

func (w *cacheWriter) Write(b []byte) (int, error) {
	if w.err == nil {
		if w.n+int64(len(b)) > w.c.max {
			w.err = errors.New("over the cache bound")
		} else if _, err := w.f.Write(b); err != nil {
			w.err = err
		}
		w.h.Write(b)
		w.n += int64(len(b))
	}
	return len(b), nil
}

// abort drops what was written.
func (w *cacheWriter) abort() {
	w.f.Close()
	os.Remove(w.f.Name())
}

// commit enters the content when it is whole and matches its digest.
func (w *cacheWriter) commit() bool {
	defer os.Remove(w.f.Name())
	if err := w.f.Close(); err != nil || w.err != nil {
		return false
	}
	if "sha256:"+hex.EncodeToString(w.h.Sum(nil)) != w.digest {
		return false
	}
	hexDigest := strings.TrimPrefix(w.digest, "sha256:")
	if w.mt != "" {
		if err := os.WriteFile(w.c.path(hexDigest)+".type", []byte(w.mt), 0o600); err != nil {
			return false
		}
	}
	if err := os.Rename(w.f.Name(), w.c.path(hexDigest)); err != nil {
		return false
	}
	w.c.mu.Lock()
	w.c.total += w.n
	w.c.mu.Unlock()
	w.c.evict()
	return true
}

// evict removes the least recently used entries past the bound.
func (c *BlobCache) evict() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.total <= c.max {
		return
	}
	ents, err := os.ReadDir(c.blobDir())
	if err != nil {
		return
	}
	type entry struct {
		name string
		size int64
		used time.Time
	}
	var all []entry
	for _, e := range ents {
		if strings.Contains(e.Name(), ".") {
			continue
		}
		if fi, err := e.Info(); err == nil {
			all = append(all, entry{e.Name(), fi.Size(), fi.ModTime()})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].used.Before(all[j].used) })
	for _, e := range all {
		if c.total <= c.max {
			break
		}
		if os.Remove(c.path(e.name)) == nil {
			os.Remove(c.path(e.name) + ".type")
			c.total -= e.size
		}
	}
}

// Transport returns a RoundTripper that answers GETs of blobs and
// manifests by digest from the cache and enters what next fetches for
// them, once verified (following a registry's redirect to its storage).
func (c *BlobCache) Transport(next http.RoundTripper) http.RoundTripper {
	return &cacheTransport{c: c, next: next}
}

type cacheTransport struct {
	c    *BlobCache
	next http.RoundTripper
}

var byDigestRE = lazyre.New(`^/v2/.+/(blobs|manifests)/(sha256:[0-9a-f]{64})$`)

// requestDigest returns the digest a GET asks for ("" for other
// requests), looking through the redirects that led to it.
func requestDigest(req *http.Request) string {
	for r := req; r != nil; {
		if m := byDigestRE().FindStringSubmatch(r.URL.Path); m != nil {
			return m[2]
		}
		if r.Response == nil {
			break
		}
		r = r.Response.Request
	}
	return ""
}

func (t *cacheTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	digest := ""
	if req.Method == http.MethodGet && req.Header.Get("Range") == "" {
		digest = requestDigest(req)
	}
	if digest == "" {
		return t.next.RoundTrip(req)
	}
	if f, mt, err := t.c.Open(digest); err == nil {
		fi, err := f.Stat()
		if err == nil {
			h := http.Header{"Docker-Content-Digest": {digest}, "Content-Length": {strconv.FormatInt(fi.Size(), 10)}}
			if mt != "" {
				h.Set("Content-Type", mt)
			}
			return &http.Response{Status: "200 OK", StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
				Header: h, Body: f, ContentLength: fi.Size(), Request: req}, nil
		}
		f.Close()
	}
	resp, err := t.next.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		return resp, err
	}
	if w := t.c.newWriter(digest, resp.Header.Get("Content-Type"), resp.ContentLength); w != nil {
		resp.Body = &teeBody{rc: resp.Body, w: w}
	}
	return resp, nil
}

// teeBody copies a response into the cache as it is read; the copy
// enters the cache only when the body was read to its end.
type teeBody struct {
	rc   io.ReadCloser
	w    *cacheWriter
	done bool
}

func (b *teeBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 && !b.done {
		b.w.Write(p[:n])
	}
	if err == io.EOF && !b.done {
		b.done = true
		b.w.commit()
	}
	return n, err
}

func (b *teeBody) Close() error {
	if !b.done {
		b.done = true
		b.w.abort()
	}
	return b.rc.Close()
}
