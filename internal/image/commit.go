package image

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/regfile"
)

// CommitRequest describes a commit: a jail's upper layer on top of the
// image its root is made of.
type CommitRequest struct {
	// Parent is the id of the jail's image.
	Parent string
	// Upper is the host path of the jail's upper layer.
	Upper string
	// Skip reports jail paths the daemon itself made (they are left out).
	Skip func(jailPath string) bool
	// Shift is subtracted from owners (a jail with a user namespace has
	// its ids shifted on disk).
	Shift int
	// Tag names the new image ("" for none).
	Tag string
	// Comment goes into the image's history.
	Comment string
	// Changes amend the parent's config (nil: none; see
	// model.CommitRequest).
	Changes *model.ImageConfig
}

// Commit makes a new image of the parent's layers and one more: the
// changes in req.Upper as an OCI layer (overlay whiteouts become .wh.
// entries, opaque directories .wh..wh..opq). The new image keeps the
// parent's config. A jail that is not made of an image cannot be
// committed (errdefs.ErrUnprocessable, raised by the caller).
func (s *Store) Commit(ctx context.Context, req CommitRequest) (*model.Image, error) {
	var tags []string
	if req.Tag != "" {
		r, err := ParseRef(req.Tag)
		if err != nil {
			return nil, err
		}
		if _, ok := r.(name.Tag); !ok {
			return nil, errdefs.Invalidf("commit: %q: name the new image with a tag, not a digest", req.Tag)
		}
		tags = []string{r.Name()}
	}
	if req.Changes != nil {
		for _, kv := range req.Changes.Env {
			if n, _, ok := strings.Cut(kv, "="); !ok || n == "" || strings.ContainsAny(n, " \t\n") {
				return nil, errdefs.Invalidf("commit: changes.env: %q is not NAME=VALUE", kv)
			}
		}
	}
	parent, release, err := s.Acquire(req.Parent)
	if err != nil {
		return nil, err
	}
	defer release()
	raw, err := os.ReadFile(s.configPath(parent.ID))
	if err != nil {
		return nil, fmt.Errorf("commit: the config of image %s: %w", short(parent.ID), err)
	}
	cf, err := v1.ParseConfigFile(strings.NewReader(string(raw)))
	if err != nil {
		return nil, fmt.Errorf("commit: the config of image %s: %w", short(parent.ID), err)
	}
	f, err := os.CreateTemp(s.tmpDir(), "commit-*.tar")
	if err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	h := sha256.New()
	if err := writeLayer(ctx, io.MultiWriter(f, h), req); err != nil {
		return nil, err
	}
	diffID := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}
	now := time.Now().UTC()
	cf = cf.DeepCopy()
	cf.RootFS.Type = "layers"
	cf.RootFS.DiffIDs = append(cf.RootFS.DiffIDs, diffID)
	cf.Created = v1.Time{Time: now}
	cf.History = append(cf.History, v1.History{Created: v1.Time{Time: now}, CreatedBy: "agentjail commit", Comment: req.Comment})
	if req.Changes != nil {
		amendConfig(&cf.Config, *req.Changes)
	}
	newRaw, err := json.Marshal(cf)
	if err != nil {
		return nil, err
	}
	src := importSource{
		id:        v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sha256Sum(newRaw))},
		config:    cf,
		rawConfig: newRaw,
		tags:      tags,
		source:    "commit",
		parent:    parent.ID,
		created:   now,
	}
	for _, l := range parent.Layers {
		d, _ := v1.NewHash(l.DiffID)
		src.layers = append(src.layers, layerSource{diffID: d, mediaType: types.MediaType(l.MediaType), size: -1, open: func() (io.ReadCloser, error) {
			return nil, fmt.Errorf("layer %s of image %s is no longer in the store", l.DiffID, short(parent.ID))
		}})
	}
	path := f.Name()
	src.layers = append(src.layers, layerSource{mediaType: types.OCIUncompressedLayer, size: -1, open: func() (io.ReadCloser, error) { return os.Open(path) }})
	return s.importImage(ctx, src, nil)
}

// amendConfig applies a commit's changes to an image config: each env
// entry replaces the one of its name or is added, the other fields
// replace the config's when given.
func amendConfig(c *v1.Config, ch model.ImageConfig) {
	for _, kv := range ch.Env {
		name, _, _ := strings.Cut(kv, "=")
		i := slices.IndexFunc(c.Env, func(e string) bool { n, _, _ := strings.Cut(e, "="); return n == name })
		if i >= 0 {
			c.Env[i] = kv
		} else {
			c.Env = append(c.Env, kv)
		}
	}
	if ch.WorkingDir != "" {
		c.WorkingDir = ch.WorkingDir
	}
	if ch.User != "" {
		c.User = ch.User
	}
	if ch.Entrypoint != nil {
		c.Entrypoint = ch.Entrypoint
	}
	if ch.Cmd != nil {
		c.Cmd = ch.Cmd
	}
}

func sha256Sum(b []byte) []byte {
	s := sha256.Sum256(b)
	return s[:]
}

// writeLayer writes the tar of req.Upper to w. The jail may still run: an
// entry gone since its directory was read is left out, a file that shrank
// while it was read is padded with zeros (as tar does), and a directory
// nested past the kernel's path limit fails the commit as unprocessable.
func writeLayer(ctx context.Context, w io.Writer, req CommitRequest) error {
	tw := tar.NewWriter(w)
	links := map[[2]uint64]string{}
	buf := make([]byte, 64<<10)
	err := filepath.WalkDir(req.Upper, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return tooDeep(err, p, req.Upper)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(req.Upper, p)
		if err != nil || rel == "." {
			return err
		}
		if req.Skip != nil && req.Skip("/"+rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); errors.Is(err, unix.ENOENT) {
			return nil
		} else if err != nil {
			return tooDeep(err, p, req.Upper)
		}
		hdr := &tar.Header{
			Name:    rel,
			Mode:    int64(st.Mode & 0o7777),
			Uid:     max(int(st.Uid)-req.Shift, 0),
			Gid:     max(int(st.Gid)-req.Shift, 0),
			ModTime: time.Unix(st.Mtim.Unix()),
			Format:  tar.FormatPAX,
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFCHR:
			if st.Rdev != 0 {
				return nil // a device node: never part of a layer
			}
			dir, base := filepath.Split(rel)
			return tw.WriteHeader(&tar.Header{Name: dir + whiteoutPrefix + base, Typeflag: tar.TypeReg, Mode: 0o600, ModTime: hdr.ModTime, Format: tar.FormatPAX})
		case unix.S_IFDIR:
			hdr.Typeflag, hdr.Name = tar.TypeDir, rel+"/"
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if isOpaqueDir(p) {
				return tw.WriteHeader(&tar.Header{Name: rel + "/" + whiteoutOpaque, Typeflag: tar.TypeReg, Mode: 0o600, ModTime: hdr.ModTime, Format: tar.FormatPAX})
			}
			return nil
		case unix.S_IFLNK:
			t, err := os.Readlink(p)
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.EINVAL) {
				return nil // gone, or no longer a link
			}
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, t
			return tw.WriteHeader(hdr)
		case unix.S_IFIFO:
			hdr.Typeflag = tar.TypeFifo
			return tw.WriteHeader(hdr)
		case unix.S_IFREG:
			k := [2]uint64{st.Dev, st.Ino}
			if st.Nlink > 1 {
				if first, ok := links[k]; ok {
					hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
					return tw.WriteHeader(hdr)
				}
			}
			fd, size, err := regfile.Open(p)
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, regfile.ErrNotRegular) || errors.Is(err, unix.ELOOP) {
				return nil // gone, or no longer a file
			}
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			hdr.Typeflag, hdr.Size = tar.TypeReg, size
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if st.Nlink > 1 {
				links[k] = rel
			}
			return regfile.CopyN(ctx, tw, fd, size, buf)
		}
		return nil // sockets
	})
	if err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		return fmt.Errorf("commit: %w", err)
	}
	return tw.Close()
}

// tooDeep turns err, met at path p of tree root, into an unprocessable
// error when p is longer than the kernel takes (a jail can nest
// directories past that limit); other errors are returned as they are.
func tooDeep(err error, p, root string) error {
	if !errors.Is(err, unix.ENAMETOOLONG) {
		return err
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(p, root), "/")
	if len(rel) > 200 {
		rel = rel[:100] + "..." + rel[len(rel)-100:]
	}
	return errdefs.Unprocessablef("commit: the jail's directories are nested past the kernel's path limit (4096 bytes) at /%s; a layer cannot hold them", rel)
}

func isOpaqueDir(dir string) bool {
	buf := make([]byte, 4)
	for _, attr := range []string{"trusted.overlay.opaque", "user.overlay.opaque"} {
		if n, err := unix.Lgetxattr(dir, attr, buf); err == nil && n > 0 && buf[0] == 'y' {
			return true
		}
	}
	return false
}

// ImportRootfs records the plain tar of a root filesystem at path as a
// one-layer image with config cfg, tagged tag (a normalisable reference;
// "" for none), from source (e.g. "profile").
func (s *Store) ImportRootfs(ctx context.Context, path string, cfg model.ImageConfig, tag, source string) (*model.Image, error) {
	var tags []string
	if tag != "" {
		r, err := ParseRef(tag)
		if err != nil {
			return nil, err
		}
		tags = []string{r.Name()}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	h := sha256.New()
	_, err = io.Copy(h, f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("import: %w", err)
	}
	diffID := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}
	now := time.Now().UTC()
	cf := &v1.ConfigFile{
		Architecture: runtime.GOARCH,
		OS:           "linux",
		Created:      v1.Time{Time: now},
		RootFS:       v1.RootFS{Type: "layers", DiffIDs: []v1.Hash{diffID}},
		Config:       v1.Config{Env: cfg.Env, WorkingDir: cfg.WorkingDir, User: cfg.User, Entrypoint: cfg.Entrypoint, Cmd: cfg.Cmd},
		History:      []v1.History{{Created: v1.Time{Time: now}, CreatedBy: "agentjail " + source}},
	}
	raw, err := json.Marshal(cf)
	if err != nil {
		return nil, err
	}
	return s.importImage(ctx, importSource{
		id:        v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sha256Sum(raw))},
		config:    cf,
		rawConfig: raw,
		tags:      tags,
		source:    source,
		created:   now,
		layers:    []layerSource{{mediaType: types.OCIUncompressedLayer, size: -1, open: func() (io.ReadCloser, error) { return os.Open(path) }}},
	}, nil)
}
