// Package transfer moves snapshots between daemons through OCI registries.
// A snapshot travels as an OCI artifact (an image manifest of artifact
// type ArtifactType): its config blob is the snapshot's record, one layer
// the files of its directory (process images and the backend's records)
// as a gzipped tar, one its disk image as a gzipped stream of the
// image's data extents (the holes of the sparse file are not sent).
//
// Both directions stream: nothing is held in memory beyond a buffer, and
// a pull reads the record first, so that what the daemon cannot restore
// is refused before any layer is fetched. Every blob a pull reads is
// checked against its digest and its declared size.
package transfer

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/stream"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/image"
	"github.com/agentjail/agentjail/internal/model"
)

// Media types of a snapshot artifact.
const (
	// ArtifactType is the manifest's artifactType.
	ArtifactType = "application/vnd.agentjail.snapshot.v1"
	// ConfigMediaType is the config blob's: a Config as JSON.
	ConfigMediaType types.MediaType = "application/vnd.agentjail.snapshot.config.v1+json"
	// FilesMediaType is the layer of the snapshot directory's files.
	FilesMediaType types.MediaType = "application/vnd.agentjail.snapshot.files.v1.tar+gzip"
	// DiskMediaType is the layer of the disk image's data extents.
	DiskMediaType types.MediaType = "application/vnd.agentjail.snapshot.disk.v1+gzip"
)

// format is the version of Config this package writes and reads.
const format = 1

// maxConfig bounds the config blob and the manifest.
const maxConfig = 1 << 20

// Config is the config blob of a snapshot artifact.
type Config struct {
	// Format is the artifact's version (1).
	Format int `json:"format"`
	// Snapshot is the record of the snapshot as its daemon kept it.
	Snapshot model.Snapshot `json:"snapshot"`
	// FilesBytes is the sum of the sizes of the snapshot's files,
	// DiskBytes the size of its disk image (holes included).
	FilesBytes int64 `json:"files_bytes"`
	DiskBytes  int64 `json:"disk_bytes"`
	// Requires is what a host restoring the snapshot must match, as its
	// backend says (backend.CheckpointMover).
	Requires map[string]string `json:"requires,omitempty"`
}

// Source is a snapshot to push.
type Source struct {
	// Snapshot is its record.
	Snapshot *model.Snapshot
	// Dir is its directory; Skip names entries of Dir left out (the
	// store's own record, which the config carries).
	Dir  string
	Skip []string
	// DiskImage is its disk image.
	DiskImage string
	// Requires is what a host restoring it must match.
	Requires map[string]string
}

// Result is what a push wrote or a pull read.
type Result struct {
	// Ref is the artifact's reference with its digest.
	Ref string
	// Digest is the manifest's digest.
	Digest string
	// Bytes is the size of the artifact's blobs (compressed).
	Bytes int64
	// Config is the artifact's config.
	Config *Config
	// Duration is how long the transfer took.
	Duration time.Duration
}

// Push writes src to ref as a snapshot artifact, its layers streamed.
// opts reach the registry (image.Store.Remote); their context bounds the
// push. Registry answers are mapped by image.RegistryError.
func Push(ctx context.Context, ref name.Reference, src Source, opts []remote.Option) (*Result, error) {
	start := time.Now()
	doing := "push " + ref.String()
	cfg := &Config{Format: format, Snapshot: *src.Snapshot, Requires: src.Requires}
	opts = append(opts[:len(opts):len(opts)], remote.WithContext(ctx))
	files, err := pushLayer(ctx, ref.Context(), FilesMediaType, opts, func(w io.Writer) error {
		cw := &countWriter{w: w}
		err := writeFiles(cw, src.Dir, src.Skip...)
		cfg.FilesBytes = cw.n
		return err
	})
	if err != nil {
		return nil, wrapPush(doing, "its files", err)
	}
	disk, err := pushLayer(ctx, ref.Context(), DiskMediaType, opts, func(w io.Writer) error {
		return writeDisk(w, src.DiskImage)
	})
	if err != nil {
		return nil, wrapPush(doing, "its disk image", err)
	}
	if cfg.DiskBytes, err = fileSize(src.DiskImage); err != nil {
		return nil, err
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	cl := static.NewLayer(raw, ConfigMediaType)
	if err := remote.WriteLayer(ref.Context(), cl, opts...); err != nil {
		return nil, image.RegistryError(doing, err)
	}
	cdesc, err := partialDescriptor(cl)
	if err != nil {
		return nil, err
	}
	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		ArtifactType:  ArtifactType,
		Config:        *cdesc,
		Layers:        []v1.Descriptor{*files, *disk},
		Annotations: map[string]string{
			"org.opencontainers.image.created": src.Snapshot.CreatedAt.UTC().Format(time.RFC3339),
			"org.opencontainers.image.title":   src.Snapshot.Name,
			"dev.agentjail.snapshot.level":     src.Snapshot.Config.Isolation.Level,
			"dev.agentjail.snapshot.mode":      src.Snapshot.Mode,
		},
	}
	mraw, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if err := remote.Put(ref, rawManifest{mraw}, opts...); err != nil {
		return nil, image.RegistryError(doing, err)
	}
	dg, _, err := v1.SHA256(bytes.NewReader(mraw))
	if err != nil {
		return nil, err
	}
	return &Result{
		Ref: ref.Context().Digest(dg.String()).String(), Digest: dg.String(),
		Bytes:  cdesc.Size + files.Size + disk.Size,
		Config: cfg, Duration: time.Since(start),
	}, nil
}

// pushLayer streams what write writes, gzipped, as a blob of mt to repo.
func pushLayer(ctx context.Context, repo name.Repository, mt types.MediaType, opts []remote.Option, write func(io.Writer) error) (*v1.Descriptor, error) {
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := write(pw)
		pw.CloseWithError(err)
		done <- err
	}()
	l := stream.NewLayer(pr, stream.WithCompressionLevel(gzip.BestSpeed), stream.WithMediaType(mt))
	err := remote.WriteLayer(repo, l, opts...)
	// The writer stops at its next write once the reader is gone.
	pr.CloseWithError(errUploadEnded)
	if werr := <-done; werr != nil && !errors.Is(werr, errUploadEnded) {
		return nil, localErr{werr}
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, errdefs.Wrap(errdefs.ErrTimeout, ctx.Err(), "the push did not finish in time")
		}
		return nil, err
	}
	return partialDescriptor(l)
}

// errUploadEnded stops a layer's writer when its upload has ended.
var errUploadEnded = errors.New("the upload ended")

// localErr marks an error reading the snapshot (not the registry's).
type localErr struct{ error }

func (e localErr) Unwrap() error { return e.error }

func wrapPush(doing, what string, err error) error {
	var le localErr
	if errors.As(err, &le) {
		return fmt.Errorf("%s: reading %s: %w", doing, what, le.error)
	}
	if errors.Is(err, errdefs.ErrTimeout) {
		return fmt.Errorf("%s: %w", doing, err)
	}
	return image.RegistryError(doing+": "+what, err)
}

func partialDescriptor(l v1.Layer) (*v1.Descriptor, error) {
	dg, err := l.Digest()
	if err != nil {
		return nil, err
	}
	size, err := l.Size()
	if err != nil {
		return nil, err
	}
	mt, err := l.MediaType()
	if err != nil {
		return nil, err
	}
	return &v1.Descriptor{MediaType: mt, Digest: dg, Size: size}, nil
}

// rawManifest is a manifest remote.Put writes as it is.
type rawManifest struct{ raw []byte }

func (m rawManifest) RawManifest() ([]byte, error) { return m.raw, nil }

func (m rawManifest) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// Limits bound what a pull accepts.
type Limits struct {
	// Files bounds the sum of the sizes of the snapshot's files, Disk the
	// size of its disk image (holes included), Blob each compressed blob.
	Files, Disk, Blob int64
}

// Dest is where a pull puts a snapshot.
type Dest struct {
	// Dir is the new snapshot's directory (exists, empty).
	Dir string
	// DiskImage is the path of its disk image (does not exist).
	DiskImage string
}

// Pull reads the snapshot artifact at ref into dest. check sees the
// artifact's config before any layer is fetched and refuses (with its
// error) what cannot be restored here. An artifact that is not a
// snapshot, is larger than lim, does not match its digests, or holds
// anything but files and directories inside the snapshot is
// errdefs.ErrUnprocessable or errdefs.ErrTooLarge. What was written into
// dest before an error is the caller's to remove.
func Pull(ctx context.Context, ref name.Reference, dest Dest, lim Limits, check func(*Config) error, opts []remote.Option) (*Result, error) {
	start := time.Now()
	doing := "pull " + ref.String()
	opts = append(opts[:len(opts):len(opts)], remote.WithContext(ctx))
	desc, err := remote.Get(ref, opts...)
	if err != nil {
		return nil, image.RegistryError(doing, err)
	}
	m, err := readManifest(desc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", doing, err)
	}
	repo := ref.Context()
	var cfg Config
	if err := readBlob(ctx, repo, m.Config, maxConfig, opts, func(r io.Reader) error {
		dec := json.NewDecoder(r)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg); err != nil {
			return errdefs.Wrap(errdefs.ErrUnprocessable, err, "its config is not a snapshot's record")
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("%s: %w", doing, err)
	}
	switch {
	case cfg.Format != format:
		return nil, errdefs.Unprocessablef("%s: the artifact is of format %d; this daemon reads format %d", doing, cfg.Format, format)
	case cfg.FilesBytes < 0 || cfg.FilesBytes > lim.Files:
		return nil, errdefs.New(errdefs.ErrTooLarge, "%s: the snapshot's files have %d bytes, above this daemon's limit of %d", doing, cfg.FilesBytes, lim.Files)
	case cfg.DiskBytes <= 0 || cfg.DiskBytes > lim.Disk:
		return nil, errdefs.New(errdefs.ErrTooLarge, "%s: the snapshot's disk has %d bytes; this daemon takes disks of 1 to %d bytes", doing, cfg.DiskBytes, lim.Disk)
	}
	for _, l := range m.Layers {
		if l.Size < 0 || l.Size > lim.Blob {
			return nil, errdefs.New(errdefs.ErrTooLarge, "%s: a layer of %d bytes is above this daemon's limit of %d", doing, l.Size, lim.Blob)
		}
	}
	if err := check(&cfg); err != nil {
		return nil, err
	}
	if err := readBlob(ctx, repo, m.Layers[0], m.Layers[0].Size, opts, gunzip(func(r io.Reader) error {
		return readFiles(r, dest.Dir, cfg.FilesBytes)
	})); err != nil {
		return nil, fmt.Errorf("%s: the snapshot's files: %w", doing, err)
	}
	if err := readBlob(ctx, repo, m.Layers[1], m.Layers[1].Size, opts, gunzip(func(r io.Reader) error {
		size, err := readDisk(r, dest.DiskImage, cfg.DiskBytes)
		if err == nil && size != cfg.DiskBytes {
			err = errdefs.Unprocessablef("the disk image has %d bytes; its record says %d", size, cfg.DiskBytes)
		}
		return err
	})); err != nil {
		return nil, fmt.Errorf("%s: the snapshot's disk image: %w", doing, err)
	}
	return &Result{
		Ref: repo.Digest(desc.Digest.String()).String(), Digest: desc.Digest.String(),
		Bytes:  m.Config.Size + m.Layers[0].Size + m.Layers[1].Size,
		Config: &cfg, Duration: time.Since(start),
	}, nil
}

// readManifest checks that desc is a snapshot artifact's manifest.
func readManifest(desc *remote.Descriptor) (*v1.Manifest, error) {
	if len(desc.Manifest) > maxConfig {
		return nil, errdefs.New(errdefs.ErrTooLarge, "its manifest has %d bytes", len(desc.Manifest))
	}
	if desc.MediaType != types.OCIManifestSchema1 {
		return nil, errdefs.Unprocessablef("it is a %s, not a snapshot (an OCI manifest of artifact type %s)", desc.MediaType, ArtifactType)
	}
	m, err := v1.ParseManifest(bytes.NewReader(desc.Manifest))
	if err != nil {
		return nil, errdefs.Wrap(errdefs.ErrUnprocessable, err, "its manifest")
	}
	if m.ArtifactType != ArtifactType || m.Config.MediaType != ConfigMediaType {
		return nil, errdefs.Unprocessablef("it is not a snapshot: artifact type %q, config %q (a snapshot has artifact type %s)", m.ArtifactType, m.Config.MediaType, ArtifactType)
	}
	if len(m.Layers) != 2 || m.Layers[0].MediaType != FilesMediaType || m.Layers[1].MediaType != DiskMediaType {
		var mts []string
		for _, l := range m.Layers {
			mts = append(mts, string(l.MediaType))
		}
		return nil, errdefs.Unprocessablef("its layers are [%s]; a snapshot has [%s %s]", strings.Join(mts, " "), FilesMediaType, DiskMediaType)
	}
	if m.Config.Size < 0 || m.Config.Size > maxConfig {
		return nil, errdefs.New(errdefs.ErrTooLarge, "its config has %d bytes", m.Config.Size)
	}
	return m, nil
}

// readBlob streams the blob d of repo (at most limit bytes, checked
// against its declared size and digest) to read. A blob that does not
// match its digest is reported as such, whatever read made of it.
func readBlob(ctx context.Context, repo name.Repository, d v1.Descriptor, limit int64, opts []remote.Option, read func(io.Reader) error) error {
	l, err := remote.Layer(repo.Digest(d.Digest.String()), opts...)
	if err != nil {
		return image.RegistryError("fetch "+d.Digest.String(), err)
	}
	rc, err := l.Compressed()
	if err != nil {
		return image.RegistryError("fetch "+d.Digest.String(), err)
	}
	defer rc.Close()
	br := &boundedReader{r: rc, left: min(d.Size, limit)}
	rerr := read(br)
	// Read to the end: the digest is checked there.
	_, derr := io.Copy(io.Discard, br)
	switch {
	case br.over:
		return errdefs.Unprocessablef("blob %s has more than its declared %d bytes", d.Digest, d.Size)
	case derr != nil && strings.Contains(derr.Error(), "checksum"):
		return errdefs.Wrap(errdefs.ErrUnprocessable, derr, "blob %s does not match its digest", d.Digest)
	case rerr != nil && strings.Contains(rerr.Error(), "verifying sha256 checksum"):
		return errdefs.Wrap(errdefs.ErrUnprocessable, rerr, "blob %s does not match its digest", d.Digest)
	case br.n < d.Size && rerr == nil && derr == nil:
		return errdefs.Unprocessablef("blob %s has %d bytes; its manifest says %d", d.Digest, br.n, d.Size)
	case rerr != nil:
		if ctx.Err() != nil {
			return errdefs.Wrap(errdefs.ErrTimeout, ctx.Err(), "the pull did not finish in time")
		}
		return rerr
	case derr != nil:
		if ctx.Err() != nil {
			return errdefs.Wrap(errdefs.ErrTimeout, ctx.Err(), "the pull did not finish in time")
		}
		return image.RegistryError("fetch "+d.Digest.String(), derr)
	}
	return nil
}

// gunzip wraps read to see the gunzipped stream; whatever follows the
// gzip stream is an error.
func gunzip(read func(io.Reader) error) func(io.Reader) error {
	return func(r io.Reader) error {
		zr, err := gzip.NewReader(r)
		if err != nil {
			return errdefs.Wrap(errdefs.ErrUnprocessable, err, "not gzip")
		}
		if err := read(zr); err != nil {
			return corrupt(err)
		}
		if n, err := io.Copy(io.Discard, zr); err != nil {
			return corrupt(err)
		} else if n > 0 {
			return errdefs.Unprocessablef("%d bytes follow the end of its content", n)
		}
		return zr.Close()
	}
}

// corrupt marks decompression errors as the artifact's fault.
func corrupt(err error) error {
	var ce flate.CorruptInputError
	if errors.Is(err, gzip.ErrChecksum) || errors.Is(err, gzip.ErrHeader) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ce) {
		return errdefs.Wrap(errdefs.ErrUnprocessable, err, "corrupt gzip stream")
	}
	return err
}

// fileSize is the size of the file at path.
func fileSize(path string) (int64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// boundedReader reads at most left bytes and notes whether r had more.
type boundedReader struct {
	r    io.Reader
	left int64
	n    int64
	over bool
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		var one [1]byte
		n, err := b.r.Read(one[:])
		if n > 0 {
			b.over = true
			return 0, errdefs.Unprocessablef("the blob is longer than declared")
		}
		return 0, err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	b.n += int64(n)
	return n, err
}
