// Package image is the daemon's OCI image store: images pulled from
// registries (go-containerregistry), loaded from docker-archive or OCI
// layout tars, committed from jails or built as profiles, recorded by id
// (the config digest) with their tags, over a content-addressed store of
// layers each unpacked once (keyed by diff id) in the overlay lower format.
// A jail's root is an overlay of those shared layers: many jails of one
// image share one copy on disk.
//
// Layout under the store's directory:
//
//	index.json              images (by id) and tags (normalised ref → id)
//	layers/<hex>/root/      an unpacked layer (its presence means complete)
//	layers/<hex>/meta.json  its diff id, size and unpack statistics
//	tmp/                    unpacks in progress (swept at Open)
package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/name"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/atomicfile"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/storage"
)

// DefaultMaxLayerBytes bounds a layer's declared (compressed) size and its
// unpacked size unless Options say otherwise.
const DefaultMaxLayerBytes = 16 << 30

// Options configure a Store.
type Options struct {
	// Dir is the store's directory (DATA_DIR/images).
	Dir string
	// MaxLayerBytes bounds each layer's declared blob size and unpacked
	// size (default DefaultMaxLayerBytes).
	MaxLayerBytes int64
	// Registries holds per-registry settings (insecure, credentials are
	// taken from the docker config).
	Registries Registries
	// CacheBytes bounds the pull-through registry cache under Dir/cache
	// (default DefaultCacheBytes; negative: no cache).
	CacheBytes int64
}

// Registries are the per-registry settings of pulls.
type Registries struct {
	// Insecure are registries (host[:port]) that may be reached over
	// plain HTTP; any other answers only over HTTPS.
	Insecure []string `json:"insecure,omitempty"`
}

// Store is the image store. Its methods are safe for concurrent use.
type Store struct {
	opts Options
	dir  string

	mu  sync.Mutex
	idx index
	// flights are layer unpacks in progress, by diff id hex.
	flights map[string]*flight
	// importing counts the imports in progress that need each layer (by
	// diff id hex): prune keeps them until the image is recorded.
	importing map[string]int
	// pins count images in use by operations in flight (jail creates),
	// which prune keeps.
	pins map[string]int
	// inUse reports images held by jails and snapshots.
	inUse func() map[string]bool
	// cache is the pull-through registry cache (nil: none).
	cache *BlobCache
}

type flight struct {
	done chan struct{}
	err  error
}

type index struct {
	Images map[string]*model.Image `json:"images"`
	// Tags maps normalised references (registry/repo:tag) to image ids.
	Tags map[string]string `json:"tags"`
}

// Open opens (creating) the store at opts.Dir and removes unpacks that an
// earlier daemon left unfinished.
func Open(opts Options) (*Store, error) {
	if !filepath.IsAbs(opts.Dir) {
		return nil, errdefs.Invalidf("image store: %q is not absolute", opts.Dir)
	}
	if opts.MaxLayerBytes <= 0 {
		opts.MaxLayerBytes = DefaultMaxLayerBytes
	}
	s := &Store{opts: opts, dir: opts.Dir, flights: map[string]*flight{}, pins: map[string]int{}, importing: map[string]int{}}
	for _, d := range []string{s.dir, s.layersDir(), s.tmpDir(), filepath.Join(s.dir, "configs")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("image store: %w", err)
		}
	}
	// layers/ is a lower of jail roots: the jails' processes traverse it.
	if err := os.Chmod(s.layersDir(), 0o711); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	if err := os.Chmod(s.dir, 0o711); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	if err := s.sweepTmp(); err != nil {
		return nil, err
	}
	if opts.CacheBytes >= 0 {
		c, err := OpenBlobCache(filepath.Join(s.dir, "cache"), opts.CacheBytes)
		if err != nil {
			return nil, err
		}
		s.cache = c
	}
	data, err := os.ReadFile(s.indexPath())
	switch {
	case errors.Is(err, fs.ErrNotExist):
		s.idx = index{Images: map[string]*model.Image{}, Tags: map[string]string{}}
	case err != nil:
		return nil, fmt.Errorf("image store: %w", err)
	default:
		if err := json.Unmarshal(data, &s.idx); err != nil {
			return nil, fmt.Errorf("image store: %s: %w", s.indexPath(), err)
		}
		if s.idx.Images == nil {
			s.idx.Images = map[string]*model.Image{}
		}
		if s.idx.Tags == nil {
			s.idx.Tags = map[string]string{}
		}
	}
	return s, nil
}

// SetInUse installs the function prune asks for the images that jails and
// snapshots hold (by id).
func (s *Store) SetInUse(f func() map[string]bool) {
	s.mu.Lock()
	s.inUse = f
	s.mu.Unlock()
}

// Cache returns the pull-through registry cache (nil when there is none).
func (s *Store) Cache() *BlobCache { return s.cache }

// Dir returns the store's directory.
func (s *Store) Dir() string { return s.dir }

func (s *Store) indexPath() string { return filepath.Join(s.dir, "index.json") }
func (s *Store) layersDir() string { return filepath.Join(s.dir, "layers") }
func (s *Store) tmpDir() string    { return filepath.Join(s.dir, "tmp") }

// TmpDir is the store's scratch directory (swept at Open): archives to
// load are best spooled there.
func (s *Store) TmpDir() string { return s.tmpDir() }

// configPath is where the raw config of image id is kept.
func (s *Store) configPath(id string) string {
	return filepath.Join(s.dir, "configs", hexOf(id)+".json")
}

// layerDir is the directory of the layer with diff id hex h.
func (s *Store) layerDir(h string) string { return filepath.Join(s.layersDir(), h) }

// LayerRoot returns the unpacked tree of the layer with diff id d.
func (s *Store) LayerRoot(d string) string {
	return filepath.Join(s.layerDir(hexOf(d)), "root")
}

func hexOf(d string) string { return strings.TrimPrefix(d, "sha256:") }

// sweepTmp removes unpacks left by an interrupted run.
func (s *Store) sweepTmp() error {
	ents, err := os.ReadDir(s.tmpDir())
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(s.tmpDir(), e.Name())); err != nil {
			return fmt.Errorf("image store: remove unfinished %s: %w", e.Name(), err)
		}
	}
	return nil
}

// saveLocked writes the index atomically; s.mu is held.
func (s *Store) saveLocked() error {
	data, err := json.MarshalIndent(s.idx, "", " ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(s.indexPath(), data, 0o600); err != nil {
		return fmt.Errorf("image store: save index: %w", err)
	}
	return nil
}

// ParseRef normalises an image reference ("python:3.12" →
// index.docker.io/library/python:3.12); a reference without tag or digest
// gets ":latest". errdefs.ErrInvalid for a malformed one.
func ParseRef(ref string) (name.Reference, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, errdefs.Wrap(errdefs.ErrInvalid, err, "image reference %q", ref)
	}
	return r, nil
}

// Familiar shortens a normalised reference the way docker prints it.
func Familiar(ref string) string {
	ref = strings.TrimPrefix(ref, name.DefaultRegistry+"/")
	ref = strings.TrimPrefix(ref, "index.docker.io/")
	return strings.TrimPrefix(ref, "library/")
}

// isID reports whether s names an image by id or id prefix (≥ 12 hex
// digits, optionally with "sha256:").
func isID(s string) bool {
	h := strings.TrimPrefix(s, "sha256:")
	if len(h) < 12 || len(h) > 64 {
		return false
	}
	for _, c := range h {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// Get returns the image that ref names: an id (or a prefix of at least 12
// hex digits), a reference with a digest (matching the id or the manifest
// digest), or a tag. errdefs.ErrNotFound when the store has none.
func (s *Store) Get(ref string) (*model.Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	img, err := s.getLocked(ref)
	if err != nil {
		return nil, err
	}
	return s.viewLocked(img), nil
}

func (s *Store) getLocked(ref string) (*model.Image, error) {
	if isID(ref) {
		h := strings.TrimPrefix(ref, "sha256:")
		var found *model.Image
		for id, img := range s.idx.Images {
			if strings.HasPrefix(hexOf(id), h) {
				if found != nil {
					return nil, errdefs.Unprocessablef("image id prefix %q is ambiguous", ref)
				}
				found = img
			}
		}
		if found != nil {
			return found, nil
		}
	}
	if i := strings.LastIndex(ref, "@"); i >= 0 {
		d := ref[i+1:]
		if img, ok := s.idx.Images[d]; ok {
			return img, nil
		}
		for _, img := range s.idx.Images {
			if img.Digest == d {
				return img, nil
			}
		}
		return nil, errdefs.NotFoundf("image %q: not in the store (agentjail pull it first)", ref)
	}
	r, err := ParseRef(ref)
	if err != nil {
		return nil, err
	}
	if id, ok := s.idx.Tags[r.Name()]; ok {
		if img, ok := s.idx.Images[id]; ok {
			return img, nil
		}
	}
	return nil, errdefs.NotFoundf("image %q: not in the store (agentjail pull it first)", ref)
}

// viewLocked returns a copy of img with its tags.
func (s *Store) viewLocked(img *model.Image) *model.Image {
	c := *img
	c.Tags = []string{}
	for t, id := range s.idx.Tags {
		if id == img.ID {
			c.Tags = append(c.Tags, Familiar(t))
		}
	}
	sort.Strings(c.Tags)
	c.Layers = slices.Clone(img.Layers)
	return &c
}

// List returns every image, newest first.
func (s *Store) List() []*model.Image {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*model.Image, 0, len(s.idx.Images))
	for _, img := range s.idx.Images {
		out = append(out, s.viewLocked(img))
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.After(out[j].Created)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// addLocked records img under tags (normalised references); s.mu is held.
func (s *Store) addLocked(img *model.Image, tags []string) error {
	if old, ok := s.idx.Images[img.ID]; ok {
		if img.Digest == "" {
			img.Digest = old.Digest
		}
		img.Created = old.Created
	}
	s.idx.Images[img.ID] = img
	for _, t := range tags {
		s.idx.Tags[t] = img.ID
	}
	return s.saveLocked()
}

// Tag names the image src with ref as well.
func (s *Store) Tag(src, ref string) (*model.Image, error) {
	r, err := ParseRef(ref)
	if err != nil {
		return nil, err
	}
	if _, ok := r.(name.Tag); !ok {
		return nil, errdefs.Invalidf("tag %q: a tag cannot hold a digest", ref)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	img, err := s.getLocked(src)
	if err != nil {
		return nil, err
	}
	s.idx.Tags[r.Name()] = img.ID
	if err := s.saveLocked(); err != nil {
		return nil, err
	}
	return s.viewLocked(img), nil
}

// Remove untags ref; when ref was the image's last tag (or names the
// image by id) and no jail or snapshot uses it, the image is removed
// too (its layers go at the next prune). Removing by id an image that is
// in use is errdefs.ErrConflict; force removes its tags anyway.
func (s *Store) Remove(ref string, force bool) (model.ImageRemoval, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	img, err := s.getLocked(ref)
	if err != nil {
		return model.ImageRemoval{}, err
	}
	var res model.ImageRemoval
	byTag := !isID(ref) && !strings.Contains(ref, "@")
	if byTag {
		r, _ := ParseRef(ref)
		delete(s.idx.Tags, r.Name())
		res.Untagged = append(res.Untagged, Familiar(r.Name()))
	}
	left := 0
	for _, id := range s.idx.Tags {
		if id == img.ID {
			left++
		}
	}
	used := s.usedLocked()
	switch {
	case byTag && left > 0:
	case used[img.ID]:
		if !byTag && !force {
			return model.ImageRemoval{}, errdefs.Conflictf("image %s is used by a jail or snapshot (remove them first, or --force to untag it)", short(img.ID))
		}
		if !byTag {
			for t, id := range s.idx.Tags {
				if id == img.ID {
					delete(s.idx.Tags, t)
					res.Untagged = append(res.Untagged, Familiar(t))
				}
			}
		}
	case left > 0 && !force:
		return model.ImageRemoval{}, errdefs.Conflictf("image %s has %d tags: remove them by name, or --force", short(img.ID), left)
	default:
		for t, id := range s.idx.Tags {
			if id == img.ID {
				delete(s.idx.Tags, t)
				res.Untagged = append(res.Untagged, Familiar(t))
			}
		}
		if err := s.unmountViewLocked(img.ID); err != nil {
			return model.ImageRemoval{}, err
		}
		delete(s.idx.Images, img.ID)
		os.Remove(s.configPath(img.ID))
		res.Deleted = img.ID
	}
	sort.Strings(res.Untagged)
	return res, s.saveLocked()
}

func short(id string) string {
	h := hexOf(id)
	if len(h) > 12 {
		h = h[:12]
	}
	return h
}

// usedLocked returns the images held by jails, snapshots and operations in
// flight; s.mu is held.
func (s *Store) usedLocked() map[string]bool {
	used := map[string]bool{}
	if s.inUse != nil {
		for id := range s.inUse() {
			used[id] = true
		}
	}
	for id := range s.pins {
		used[id] = true
	}
	return used
}

// Prune removes images that have no tag and that no jail, snapshot or
// operation in flight uses (all unused images with all), then every layer
// no remaining image references.
func (s *Store) Prune(all bool) (model.ImagePrune, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	used := s.usedLocked()
	tagged := map[string]bool{}
	for _, id := range s.idx.Tags {
		tagged[id] = true
	}
	res := model.ImagePrune{Images: []string{}, Layers: []string{}}
	for id := range s.idx.Images {
		if used[id] || (tagged[id] && !all) {
			continue
		}
		for t, tid := range s.idx.Tags {
			if tid == id {
				delete(s.idx.Tags, t)
			}
		}
		if err := s.unmountViewLocked(id); err != nil {
			return res, err
		}
		delete(s.idx.Images, id)
		os.Remove(s.configPath(id))
		res.Images = append(res.Images, id)
	}
	if err := s.saveLocked(); err != nil {
		return res, err
	}
	keep := map[string]bool{}
	for _, img := range s.idx.Images {
		for _, l := range img.Layers {
			keep[hexOf(l.DiffID)] = true
		}
	}
	ents, err := os.ReadDir(s.layersDir())
	if err != nil {
		return res, fmt.Errorf("image store: %w", err)
	}
	for _, e := range ents {
		h := e.Name()
		if keep[h] || s.flights[h] != nil || s.importing[h] > 0 {
			continue
		}
		size := s.layerSize(h)
		if err := os.RemoveAll(s.layerDir(h)); err != nil {
			return res, fmt.Errorf("image store: remove layer %s: %w", h, err)
		}
		res.Layers = append(res.Layers, "sha256:"+h)
		res.ReclaimedBytes += size
	}
	sort.Strings(res.Images)
	sort.Strings(res.Layers)
	return res, nil
}

// layerMeta is a layer's meta.json.
type layerMeta struct {
	DiffID string      `json:"diff_id"`
	Size   int64       `json:"size"`
	Stats  UnpackStats `json:"stats"`
}

func (s *Store) readMeta(h string) layerMeta {
	var m layerMeta
	if data, err := os.ReadFile(filepath.Join(s.layerDir(h), "meta.json")); err == nil {
		_ = json.Unmarshal(data, &m)
	}
	return m
}

func (s *Store) layerSize(h string) int64 { return s.readMeta(h).Size }

func (s *Store) layerStats(h string) UnpackStats { return s.readMeta(h).Stats }

// DiskUsage accounts the store.
func (s *Store) DiskUsage() (model.ImageUsage, error) {
	s.mu.Lock()
	keep := map[string]bool{}
	for _, img := range s.idx.Images {
		for _, l := range img.Layers {
			keep[hexOf(l.DiffID)] = true
		}
	}
	u := model.ImageUsage{Images: len(s.idx.Images)}
	s.mu.Unlock()
	ents, err := os.ReadDir(s.layersDir())
	if err != nil {
		return u, fmt.Errorf("image store: %w", err)
	}
	for _, e := range ents {
		size := s.layerSize(e.Name())
		u.Layers++
		u.LayerBytes += size
		if !keep[e.Name()] {
			u.UnusedLayers++
			u.UnusedBytes += size
		}
	}
	if s.cache != nil {
		u.CacheBytes, u.CacheMaxBytes = s.cache.Size()
	}
	u.DiskBytes, err = diskBytes(s.dir)
	return u, err
}

// diskBytes sums the allocated blocks of the tree at root (hard links
// counted once).
func diskBytes(root string) (int64, error) {
	var total int64
	seen := map[[2]uint64]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() && p != root {
			// Mounted views show the layers a second time.
			if m, _ := storage.IsMounted(p); m {
				return filepath.SkipDir
			}
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return nil
		}
		if st.Nlink > 1 && !d.IsDir() {
			k := [2]uint64{st.Dev, st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		total += st.Blocks * 512
		return nil
	})
	return total, err
}
