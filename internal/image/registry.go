package image

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"strconv"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// CacheHeader carries the token a jail's requests to the registry cache
// need; the daemon's proxy adds it (it never enters the jail).
const CacheHeader = "X-Agentjail-Cache"

// RegistryHandler serves the store's pull-through cache as a read-only
// registry: GET and HEAD of /v2/<registry>/<repository>/manifests/<ref>
// and /v2/<registry>/<repository>/blobs/<digest> fetch from <registry>
// (with the daemon's credentials and insecure list) through the cache.
// Requests without token in CacheHeader are 401.
func (s *Store) RegistryHandler(token string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get(CacheHeader)), []byte(token)) != 1 {
			registryError(w, http.StatusUnauthorized, "UNAUTHORIZED", "the registry cache serves jails whose policy allows it")
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			registryError(w, http.StatusMethodNotAllowed, "UNSUPPORTED", "the registry cache is read-only")
			return
		}
		if r.URL.Path == "/v2/" || r.URL.Path == "/v2" {
			w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
			w.Write([]byte("{}"))
			return
		}
		parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/v2/"), "/")
		if len(parts) < 4 || (parts[len(parts)-2] != "manifests" && parts[len(parts)-2] != "blobs") {
			registryError(w, http.StatusNotFound, "NAME_UNKNOWN", "use /v2/<registry>/<repository>/(manifests|blobs)/<reference>")
			return
		}
		repo := strings.Join(parts[:len(parts)-2], "/")
		kind, ref := parts[len(parts)-2], parts[len(parts)-1]
		sep := ":"
		if strings.HasPrefix(ref, "sha256:") {
			sep = "@"
		}
		nr, err := s.parsePullRef(repo + sep + ref)
		if err != nil {
			registryError(w, http.StatusBadRequest, "NAME_INVALID", err.Error())
			return
		}
		opts := []remote.Option{remote.WithContext(r.Context()), remote.WithAuthFromKeychain(authn.DefaultKeychain), remote.WithTransport(s.transport())}
		if kind == "manifests" {
			desc, err := remote.Get(nr, opts...)
			if err != nil {
				registryError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", err.Error())
				return
			}
			w.Header().Set("Content-Type", string(desc.MediaType))
			w.Header().Set("Docker-Content-Digest", desc.Digest.String())
			w.Header().Set("Content-Length", strconv.Itoa(len(desc.Manifest)))
			if r.Method == http.MethodGet {
				w.Write(desc.Manifest)
			}
			return
		}
		d, ok := nr.(name.Digest)
		if !ok {
			registryError(w, http.StatusBadRequest, "DIGEST_INVALID", "blobs are fetched by digest")
			return
		}
		s.serveBlob(w, r, d, opts)
	})
}

// serveBlob answers a blob from the cache, or fetches it through the
// cache; a blob that does not match its digest is cut short (the client
// sees a truncated body) and not kept.
func (s *Store) serveBlob(w http.ResponseWriter, r *http.Request, d name.Digest, opts []remote.Option) {
	if s.cache != nil {
		f, _, err := s.cache.Open(d.DigestStr())
		if err == nil {
			defer f.Close()
			if fi, err := f.Stat(); err == nil {
				w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
			}
			w.Header().Set("Docker-Content-Digest", d.DigestStr())
			w.Header().Set("Content-Type", "application/octet-stream")
			if r.Method == http.MethodGet {
				io.Copy(w, f)
			}
			return
		}
		if !errors.Is(err, fs.ErrNotExist) {
			registryError(w, http.StatusInternalServerError, "UNKNOWN", err.Error())
			return
		}
	}
	l, err := remote.Layer(d, opts...)
	if err != nil {
		registryError(w, http.StatusNotFound, "BLOB_UNKNOWN", err.Error())
		return
	}
	size, err := l.Size()
	if err != nil {
		registryError(w, http.StatusNotFound, "BLOB_UNKNOWN", err.Error())
		return
	}
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	w.Header().Set("Docker-Content-Digest", d.DigestStr())
	w.Header().Set("Content-Type", "application/octet-stream")
	if r.Method == http.MethodHead {
		return
	}
	rc, err := l.Compressed()
	if err != nil {
		registryError(w, http.StatusBadGateway, "BLOB_UNKNOWN", err.Error())
		return
	}
	defer rc.Close()
	io.Copy(w, rc)
}

func registryError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	body, _ := json.Marshal(map[string]any{"errors": []map[string]string{{"code": code, "message": msg}}})
	w.Write(body)
}
