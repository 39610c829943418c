package image

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"os"
	"runtime"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
)

// MaxArchiveEntries bounds the entries of an archive given to Load.
const MaxArchiveEntries = 100000

// Load imports every image of the tar archive at path: a docker-archive
// (docker save: manifest.json) or an OCI image layout (oci-layout,
// index.json), tagged as the archive names them. errdefs.ErrInvalid when
// the archive is neither.
func (s *Store) Load(ctx context.Context, path string, progress ProgressFunc) ([]*model.Image, error) {
	kind, err := archiveKind(path)
	if err != nil {
		return nil, err
	}
	var srcs []importSource
	switch kind {
	case "docker":
		srcs, err = dockerArchive(path)
	case "oci":
		var cleanup func()
		srcs, cleanup, err = s.ociArchive(path)
		if cleanup != nil {
			defer cleanup()
		}
	}
	if err != nil {
		return nil, err
	}
	if len(srcs) == 0 {
		return nil, errdefs.Unprocessablef("load: the archive holds no image for linux/%s", runtime.GOARCH)
	}
	var out []*model.Image
	for _, src := range srcs {
		img, err := s.importImage(ctx, src, progress)
		if err != nil {
			return out, err
		}
		out = append(out, img)
	}
	return out, nil
}

// archiveKind tells a docker-archive from an OCI layout by their index
// files; a docker save of Docker ≥ 25 holds both and reads as docker.
func archiveKind(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("load: %w", err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	var manifest, ociLayout, index bool
	for n := 0; ; n++ {
		if n > MaxArchiveEntries {
			return "", errdefs.Unprocessablef("load: the archive has more than %d entries", MaxArchiveEntries)
		}
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", errdefs.Wrap(errdefs.ErrInvalid, err, "load: not a tar archive")
		}
		switch clean, _ := cleanName(h.Name); clean {
		case "manifest.json":
			manifest = true
		case "oci-layout":
			ociLayout = true
		case "index.json":
			index = true
		}
	}
	switch {
	case manifest:
		return "docker", nil
	case ociLayout && index:
		return "oci", nil
	}
	return "", errdefs.Invalidf("load: the archive is neither a docker-archive (manifest.json) nor an OCI image layout (oci-layout, index.json)")
}

// dockerArchive reads the images of a docker-archive.
func dockerArchive(path string) ([]importSource, error) {
	opener := func() (io.ReadCloser, error) { return os.Open(path) }
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.ErrUnprocessable, err, "load: manifest.json")
	}
	if len(m) > 1 {
		for _, d := range m {
			if len(d.RepoTags) == 0 {
				return nil, errdefs.Unprocessablef("load: the archive holds %d images, one of them without a tag", len(m))
			}
		}
	}
	var out []importSource
	for _, d := range m {
		var tag *name.Tag
		var tags []string
		for _, rt := range d.RepoTags {
			t, err := name.NewTag(rt)
			if err != nil {
				return nil, errdefs.Wrap(errdefs.ErrUnprocessable, err, "load: tag %q", rt)
			}
			if tag == nil {
				tag = &t
			}
			tags = append(tags, t.Name())
		}
		img, err := tarball.Image(opener, tag)
		if err != nil {
			return nil, errdefs.Wrap(errdefs.ErrUnprocessable, err, "load")
		}
		src, err := sourceOf(img, "load", false)
		if err != nil {
			return nil, err
		}
		src.tags = tags
		out = append(out, src)
	}
	return out, nil
}

// ociArchive unpacks an OCI layout archive into a temporary directory
// (removed by cleanup) and reads its images.
func (s *Store) ociArchive(path string) ([]importSource, func(), error) {
	dir, err := os.MkdirTemp(s.tmpDir(), "layout-")
	if err != nil {
		return nil, nil, fmt.Errorf("load: %w", err)
	}
	cleanup := func() { os.RemoveAll(dir) }
	f, err := os.Open(path)
	if err != nil {
		return nil, cleanup, fmt.Errorf("load: %w", err)
	}
	_, err = unpack(f, dir, s.opts.MaxLayerBytes*64)
	f.Close()
	if err != nil {
		return nil, cleanup, fmt.Errorf("load: %w", err)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, cleanup, errdefs.Wrap(errdefs.ErrUnprocessable, err, "load: OCI layout")
	}
	var out []importSource
	if err := walkIndex(idx, nil, &out); err != nil {
		return nil, cleanup, err
	}
	return out, cleanup, nil
}

// The annotations that name an image of an OCI layout.
const (
	annotationRefName        = "org.opencontainers.image.ref.name"
	annotationContainerdName = "io.containerd.image.name"
)

// walkIndex collects the images of idx for this platform, nested indexes
// included.
func walkIndex(idx v1.ImageIndex, names []string, out *[]importSource) error {
	im, err := idx.IndexManifest()
	if err != nil {
		return errdefs.Wrap(errdefs.ErrUnprocessable, err, "load: index")
	}
	for _, d := range im.Manifests {
		if d.Platform != nil && (d.Platform.OS != "linux" || d.Platform.Architecture != runtime.GOARCH) {
			continue
		}
		tags := names
		for _, a := range []string{annotationContainerdName, annotationRefName} {
			if t, err := name.NewTag(d.Annotations[a]); err == nil && d.Annotations[a] != "" {
				tags = append(tags[:len(tags):len(tags)], t.Name())
				break
			}
		}
		switch {
		case d.MediaType.IsIndex():
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return errdefs.Wrap(errdefs.ErrUnprocessable, err, "load: index %s", d.Digest)
			}
			if err := walkIndex(child, tags, out); err != nil {
				return err
			}
		case d.MediaType.IsImage():
			img, err := idx.Image(d.Digest)
			if err != nil {
				return errdefs.Wrap(errdefs.ErrUnprocessable, err, "load: image %s", d.Digest)
			}
			src, err := sourceOf(img, "load", true)
			if err != nil {
				return err
			}
			src.digest = d.Digest.String()
			src.tags = tags
			*out = append(*out, src)
		}
	}
	return nil
}

// sourceOf describes img for importImage; with blobs, layers are read as
// their (verified) blobs, else as their uncompressed tars.
func sourceOf(img v1.Image, source string, blobs bool) (importSource, error) {
	id, err := img.ConfigName()
	if err != nil {
		return importSource{}, errdefs.Wrap(errdefs.ErrUnprocessable, err, "load: image config")
	}
	raw, err := img.RawConfigFile()
	if err != nil {
		return importSource{}, errdefs.Wrap(errdefs.ErrUnprocessable, err, "load: image config")
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return importSource{}, errdefs.Wrap(errdefs.ErrUnprocessable, err, "load: image config")
	}
	src := importSource{id: id, config: cf, rawConfig: raw, source: source}
	if blobs {
		m, err := img.Manifest()
		if err != nil {
			return importSource{}, errdefs.Wrap(errdefs.ErrUnprocessable, err, "load: manifest")
		}
		for _, d := range m.Layers {
			l, err := img.LayerByDigest(d.Digest)
			if err != nil {
				return importSource{}, errdefs.Wrap(errdefs.ErrUnprocessable, err, "load: layer %s", d.Digest)
			}
			src.layers = append(src.layers, layerSource{digest: d.Digest, mediaType: d.MediaType, size: d.Size, open: l.Compressed})
		}
		return src, nil
	}
	for _, diff := range cf.RootFS.DiffIDs {
		l, err := img.LayerByDiffID(diff)
		if err != nil {
			return importSource{}, errdefs.Wrap(errdefs.ErrUnprocessable, err, "load: layer %s", diff)
		}
		mt, err := l.MediaType()
		if err != nil {
			return importSource{}, errdefs.Wrap(errdefs.ErrUnprocessable, err, "load: layer %s", diff)
		}
		src.layers = append(src.layers, layerSource{mediaType: mt, size: -1, open: l.Uncompressed})
	}
	return src, nil
}
