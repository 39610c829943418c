package image

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
)

// ProgressFunc receives progress; it is called from several goroutines
// (one at a time per layer) and must not block for long.
type ProgressFunc func(model.PullProgress)

// layerSource is a layer to import.
type layerSource struct {
	diffID    v1.Hash
	digest    v1.Hash // the blob's digest; zero when the blob is the plain tar
	mediaType types.MediaType
	size      int64 // declared blob size (-1 unknown)
	open      func() (io.ReadCloser, error)
}

func (l layerSource) label() string {
	if l.digest.Hex != "" {
		return l.digest.String()
	}
	return l.diffID.String()
}

// importSource is an image to import.
type importSource struct {
	id     v1.Hash
	digest string // manifest digest ("" unknown)
	config *v1.ConfigFile
	// rawConfig is the config as the image holds it (its digest is id).
	rawConfig []byte
	layers    []layerSource
	tags      []string // normalised references
	source    string
	parent    string
	created   time.Time
}

// layerMediaTypes are the layer blob types the store unpacks.
var layerMediaTypes = map[types.MediaType]bool{
	types.DockerLayer:             true,
	types.DockerUncompressedLayer: true,
	types.OCILayer:                true,
	types.OCILayerZStd:            true,
	types.OCIUncompressedLayer:    true,
	"":                            true,
}

// importImage unpacks every layer of src the store lacks, then records the
// image under its tags. On error nothing of src is recorded and no
// partial layer remains.
func (s *Store) importImage(ctx context.Context, src importSource, progress ProgressFunc) (*model.Image, error) {
	if progress == nil {
		progress = func(model.PullProgress) {}
	}
	cfg := src.config
	if cfg.OS != "" && cfg.OS != "linux" {
		return nil, errdefs.Unprocessablef("image %s is for %s, not linux", short(src.id.String()), cfg.OS)
	}
	if len(cfg.RootFS.DiffIDs) != len(src.layers) {
		return nil, errdefs.Unprocessablef("image %s: its config lists %d layers, its manifest %d", short(src.id.String()), len(cfg.RootFS.DiffIDs), len(src.layers))
	}
	for i, l := range src.layers {
		if !layerMediaTypes[l.mediaType] {
			return nil, errdefs.Unprocessablef("image %s: layer %s has media type %s, which the store cannot unpack", short(src.id.String()), l.label(), l.mediaType)
		}
		if l.size > s.opts.MaxLayerBytes {
			return nil, errdefs.Unprocessablef("image %s: layer %s declares %d bytes, more than the limit of %d", short(src.id.String()), l.label(), l.size, s.opts.MaxLayerBytes)
		}
		src.layers[i].diffID = cfg.RootFS.DiffIDs[i]
	}
	s.holdLayers(src.layers, 1)
	defer s.holdLayers(src.layers, -1)
	sizes := make([]int64, len(src.layers))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(3)
	for i, l := range src.layers {
		progress(model.PullProgress{Layer: l.label(), Status: "waiting", Total: max(l.size, 0)})
		g.Go(func() error {
			n, err := s.ensureLayer(gctx, l, progress)
			if err != nil {
				progress(model.PullProgress{Layer: l.label(), Status: "failed", Error: err.Error()})
				return err
			}
			sizes[i] = n
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if err := s.checkChain(src.layers); err != nil {
		return nil, err
	}
	if err := os.WriteFile(s.configPath(src.id.String()), src.rawConfig, 0o600); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	img := &model.Image{
		ID:      src.id.String(),
		Digest:  src.digest,
		Config:  configOf(cfg),
		Created: src.created,
		Source:  src.source,
		Parent:  src.parent,
	}
	if img.Created.IsZero() {
		img.Created = time.Now().UTC()
	}
	for i, l := range src.layers {
		img.Layers = append(img.Layers, model.ImageLayer{DiffID: l.diffID.String(), Digest: digestString(l.digest), MediaType: string(l.mediaType), Size: sizes[i]})
		img.Size += sizes[i]
	}
	s.mu.Lock()
	err := s.addLocked(img, src.tags)
	view := s.viewLocked(img)
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	progress(model.PullProgress{Status: "complete"})
	return view, nil
}

// holdLayers counts (delta 1) or uncounts (-1) an import's need of its
// layers.
func (s *Store) holdLayers(layers []layerSource, delta int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range layers {
		h := l.diffID.Hex
		if s.importing[h] += delta; s.importing[h] <= 0 {
			delete(s.importing, h)
		}
	}
}

// checkChain refuses an image one of whose layers would shadow a lower
// layer's symlink (or file) with a directory it holds only as the parent of
// its entries: the image's tool wrote through that symlink, which a layer
// unpacked on its own cannot do.
func (s *Store) checkChain(layers []layerSource) error {
	for i := 1; i < len(layers); i++ {
		for _, p := range s.layerStats(layers[i].diffID.Hex).Implicit {
			for j := i - 1; j >= 0; j-- {
				st, ok := lstatBeneath(s.LayerRoot(layers[j].diffID.String()), p)
				if !ok {
					continue
				}
				typ := st.Mode & unix.S_IFMT
				if typ == unix.S_IFDIR || (typ == unix.S_IFCHR && st.Rdev == 0) {
					break
				}
				return errdefs.Unprocessablef("layer %s writes below /%s, which layer %s has as a symlink or file: layers that write through a lower layer's symlink are not supported", layers[i].label(), p, layers[j].label())
			}
		}
	}
	return nil
}

func digestString(h v1.Hash) string {
	if h.Hex == "" {
		return ""
	}
	return h.String()
}

func configOf(cf *v1.ConfigFile) model.ImageConfig {
	c := cf.Config
	return model.ImageConfig{
		Env:        slices.Clone(c.Env),
		WorkingDir: c.WorkingDir,
		User:       c.User,
		Entrypoint: slices.Clone(c.Entrypoint),
		Cmd:        slices.Clone(c.Cmd),
	}
}

// ensureLayer makes sure the layer l is unpacked in the store and returns
// its unpacked size. Concurrent imports of one layer unpack it once.
func (s *Store) ensureLayer(ctx context.Context, l layerSource, progress ProgressFunc) (int64, error) {
	h := l.diffID.Hex
	if l.diffID.Algorithm != "sha256" || len(h) != 64 {
		return 0, errdefs.Unprocessablef("layer %s: diff id %q is not a sha256 digest", l.label(), l.diffID)
	}
	for {
		s.mu.Lock()
		if _, err := os.Stat(s.layerDir(h)); err == nil {
			s.mu.Unlock()
			progress(model.PullProgress{Layer: l.label(), Status: "exists"})
			return s.layerSize(h), nil
		}
		f := s.flights[h]
		if f == nil {
			f = &flight{done: make(chan struct{})}
			s.flights[h] = f
			s.mu.Unlock()
			n, err := s.unpackLayer(ctx, l, progress)
			s.mu.Lock()
			f.err = err
			delete(s.flights, h)
			close(f.done)
			s.mu.Unlock()
			return n, err
		}
		s.mu.Unlock()
		select {
		case <-f.done:
			if f.err != nil {
				return 0, f.err
			}
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// unpackLayer reads, verifies and unpacks l into tmp/, then renames it
// into layers/ once both its blob digest and diff id are verified.
func (s *Store) unpackLayer(ctx context.Context, l layerSource, progress ProgressFunc) (int64, error) {
	tmp := filepath.Join(s.tmpDir(), l.diffID.Hex+"-"+randHex())
	root := filepath.Join(tmp, "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return 0, fmt.Errorf("image store: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	rc, err := l.open()
	if err != nil {
		return 0, blobErr(l, err)
	}
	defer rc.Close()
	counter := &progressReader{r: rc, ctx: ctx, report: func(n int64) {
		progress(model.PullProgress{Layer: l.label(), Status: "downloading", Current: n, Total: max(l.size, 0)})
	}}
	var blob io.Reader = counter
	var blobHash hash.Hash
	if l.digest.Hex != "" {
		blobHash = sha256.New()
		blob = io.TeeReader(counter, blobHash)
	}
	plain, closeDec, err := decompress(bufio.NewReaderSize(blob, 1<<20))
	if err != nil {
		return 0, blobErr(l, err)
	}
	defer closeDec()
	diffHash := sha256.New()
	stats, err := unpack(io.TeeReader(plain, diffHash), root, s.opts.MaxLayerBytes)
	if err != nil {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if counter.err != nil {
			return 0, blobErr(l, counter.err)
		}
		return 0, fmt.Errorf("layer %s: %w", l.label(), err)
	}
	// The tar's end-of-archive padding and anything after count too.
	if _, err := io.Copy(diffHash, plain); err != nil {
		return 0, blobErr(l, err)
	}
	if _, err := io.Copy(io.Discard, blob); err != nil {
		return 0, blobErr(l, err)
	}
	if l.size >= 0 && l.digest.Hex != "" && counter.n != l.size {
		return 0, errdefs.Unprocessablef("layer %s: the blob has %d bytes, its descriptor declares %d", l.label(), counter.n, l.size)
	}
	if blobHash != nil {
		if got := "sha256:" + hex.EncodeToString(blobHash.Sum(nil)); got != l.digest.String() {
			return 0, errdefs.Unprocessablef("layer %s: the blob does not match its digest (got %s)", l.label(), got)
		}
	}
	if got := "sha256:" + hex.EncodeToString(diffHash.Sum(nil)); got != l.diffID.String() {
		return 0, errdefs.Unprocessablef("layer %s: the unpacked tar does not match the diff id %s of the image config (got %s)", l.label(), l.diffID, got)
	}
	progress(model.PullProgress{Layer: l.label(), Status: "unpacking", Current: counter.n, Total: max(l.size, 0)})
	meta, _ := json.Marshal(layerMeta{DiffID: l.diffID.String(), Size: stats.Bytes, Stats: stats})
	if err := os.WriteFile(filepath.Join(tmp, "meta.json"), meta, 0o600); err != nil {
		return 0, fmt.Errorf("image store: %w", err)
	}
	if err := os.Chmod(tmp, 0o711); err != nil {
		return 0, fmt.Errorf("image store: %w", err)
	}
	if err := os.Rename(tmp, s.layerDir(l.diffID.Hex)); err != nil {
		return 0, fmt.Errorf("image store: %w", err)
	}
	ok = true
	progress(model.PullProgress{Layer: l.label(), Status: "done", Current: counter.n, Total: max(l.size, 0)})
	return stats.Bytes, nil
}

func blobErr(l layerSource, err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		return errdefs.Wrap(errdefs.ErrUnavailable, err, "layer %s", l.label())
	}
	if errors.Is(err, errdefs.ErrUnprocessable) || errors.Is(err, errdefs.ErrUnavailable) {
		return fmt.Errorf("layer %s: %w", l.label(), err)
	}
	return errdefs.Wrap(errdefs.ErrUnprocessable, err, "layer %s: reading the blob", l.label())
}

// progressReader counts bytes and reports about every 1 MiB; it fails
// once ctx is done.
type progressReader struct {
	r      io.Reader
	ctx    context.Context
	n      int64
	last   int64
	report func(int64)
	// err is the last read error other than io.EOF.
	err error
}

func (p *progressReader) Read(b []byte) (int, error) {
	if err := p.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := p.r.Read(b)
	p.n += int64(n)
	if p.n-p.last >= 1<<20 {
		p.last = p.n
		p.report(p.n)
	}
	if err != nil && err != io.EOF {
		p.err = err
	}
	return n, err
}

// decompress detects gzip and zstd by their magic numbers; anything else
// is read as a plain tar.
func decompress(r *bufio.Reader) (io.Reader, func(), error) {
	magic, err := r.Peek(4)
	if err != nil && err != io.EOF {
		return nil, nil, err
	}
	switch {
	case len(magic) >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
		zr, err := gzip.NewReader(r)
		if err != nil {
			return nil, nil, err
		}
		return zr, func() { zr.Close() }, nil
	case len(magic) == 4 && magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd:
		zr, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(1<<30))
		if err != nil {
			return nil, nil, err
		}
		return zr, zr.Close, nil
	}
	return r, func() {}, nil
}

func randHex() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// PullOptions tune one pull.
type PullOptions struct {
	// Progress receives per-layer progress (may be nil).
	Progress ProgressFunc
	// Auth, when set, is presented to the registry instead of the docker
	// config's credentials. Such a pull bypasses the registry cache, so
	// that nothing fetched with one caller's credentials is served to
	// another from it.
	Auth *model.RegistryAuth
}

// Pull fetches ref from its registry (the image for this host's platform
// from an index), unpacks the layers the store lacks and tags the image
// with ref. Credentials are opts.Auth or else come from the docker config
// (~/.docker/config.json or $DOCKER_CONFIG); a registry is reached over
// plain HTTP only when it is named insecure.
func (s *Store) Pull(ctx context.Context, ref string, opts PullOptions) (*model.Image, error) {
	progress := opts.Progress
	if progress == nil {
		progress = func(model.PullProgress) {}
	}
	r, err := s.parsePullRef(ref)
	if err != nil {
		return nil, err
	}
	auth := remote.WithAuthFromKeychain(authn.DefaultKeychain)
	rt := s.transport()
	if opts.Auth != nil {
		auth = remote.WithAuth(authn.FromConfig(authn.AuthConfig{Username: opts.Auth.Username, Password: opts.Auth.Password}))
		rt = s.guard()
	}
	progress(model.PullProgress{Status: "resolving"})
	img, err := remote.Image(r,
		remote.WithContext(ctx),
		auth,
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}),
		remote.WithTransport(rt),
		remote.WithUserAgent("agentjail"),
	)
	if err != nil {
		if opts.Auth != nil {
			return nil, refusedError("pull "+ref, "the credentials given", err)
		}
		return nil, registryErr(ref, err)
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, registryErr(ref, err)
	}
	id, err := img.ConfigName()
	if err != nil {
		return nil, registryErr(ref, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, registryErr(ref, err)
	}
	dg, err := img.Digest()
	if err != nil {
		return nil, registryErr(ref, err)
	}
	raw, err := img.RawConfigFile()
	if err != nil {
		return nil, registryErr(ref, err)
	}
	src := importSource{id: id, digest: dg.String(), config: cf, rawConfig: raw, source: "pull"}
	if _, ok := r.(name.Tag); ok {
		src.tags = []string{r.Name()}
	}
	progress(model.PullProgress{Status: "resolved"})
	for _, d := range m.Layers {
		l, err := img.LayerByDigest(d.Digest)
		if err != nil {
			return nil, registryErr(ref, err)
		}
		src.layers = append(src.layers, layerSource{digest: d.Digest, mediaType: d.MediaType, size: d.Size, open: l.Compressed})
	}
	return s.importImage(ctx, src, progress)
}

func (s *Store) parsePullRef(ref string) (name.Reference, error) {
	r, err := ParseRef(ref)
	if err != nil {
		return nil, err
	}
	if slices.Contains(s.opts.Registries.Insecure, r.Context().RegistryStr()) {
		return name.ParseReference(ref, name.Insecure)
	}
	return r, nil
}

// transport refuses plain HTTP to registries not named insecure.
// Blobs and manifests by digest go through the registry cache.
func (s *Store) transport() http.RoundTripper {
	t := s.guard()
	if s.cache != nil {
		t = s.cache.Transport(t)
	}
	return t
}

// guard reaches registries directly, refusing plain HTTP to those not
// named insecure.
func (s *Store) guard() http.RoundTripper {
	return &guardTransport{insecure: s.opts.Registries.Insecure, next: registryTransport}
}

// registryTransport reaches registries: a registry that does not begin
// to answer within a minute fails the request (the pull's context bounds
// the rest).
var registryTransport = func() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.ResponseHeaderTimeout = time.Minute
	return t
}()

type guardTransport struct {
	insecure []string
	next     http.RoundTripper
}

func (g *guardTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "http" && !slices.Contains(g.insecure, req.URL.Host) {
		return nil, errdefs.Unprocessablef("registry %s answers only over plain HTTP; name it insecure (agentjail serve --insecure-registry %s) to allow that", req.URL.Host, req.URL.Host)
	}
	return g.next.RoundTrip(req)
}

// registryErr maps a registry answer to a pull of ref to an error kind.
func registryErr(ref string, err error) error { return RegistryError("pull "+ref, err) }

// RegistryError maps what a registry answered to doing (e.g. "push REF")
// to an error kind: unknown names and manifests are errdefs.ErrNotFound,
// refused credentials errdefs.ErrForbidden, anything else the registry or
// the network did errdefs.ErrUnavailable.
func RegistryError(doing string, err error) error {
	return refusedError(doing, "docker config", err)
}

// refusedError is RegistryError naming where the credentials came from (creds).
func refusedError(doing, creds string, err error) error {
	if errors.Is(err, errdefs.ErrUnprocessable) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", doing, err)
	}
	var te *transport.Error
	if errors.As(err, &te) {
		switch te.StatusCode {
		case http.StatusNotFound:
			return errdefs.Wrap(errdefs.ErrNotFound, err, "%s", doing)
		case http.StatusUnauthorized, http.StatusForbidden:
			return errdefs.Wrap(errdefs.ErrForbidden, err, "%s: the registry refused the credentials (%s)", doing, creds)
		}
		for _, d := range te.Errors {
			if d.Code == transport.ManifestUnknownErrorCode || d.Code == transport.NameUnknownErrorCode || d.Code == transport.BlobUnknownErrorCode {
				return errdefs.Wrap(errdefs.ErrNotFound, err, "%s", doing)
			}
		}
		return errdefs.Wrap(errdefs.ErrUnavailable, err, "%s", doing)
	}
	if strings.Contains(err.Error(), "no child with platform") {
		return errdefs.Wrap(errdefs.ErrUnprocessable, err, "%s", doing)
	}
	return errdefs.Wrap(errdefs.ErrUnavailable, err, "%s", doing)
}

// Remote parses ref as this store's pulls do (a registry named insecure is
// reached over plain HTTP) and returns the options that reach its
// registry as pulls do: credentials from the docker config, plain HTTP
// only to registries named insecure. The registry cache is not used:
// these options serve pushes and artifacts other than images. ctx bounds
// every request made with them.
func (s *Store) Remote(ctx context.Context, ref string) (name.Reference, []remote.Option, error) {
	r, err := s.parsePullRef(ref)
	if err != nil {
		return nil, nil, err
	}
	return r, []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(authn.DefaultKeychain),
		remote.WithTransport(s.guard()),
		remote.WithUserAgent("agentjail"),
	}, nil
}
