package image

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/storage"
)

// Pin returns the rootfs value (config.RootfsImagePrefix) that names img
// by ref and pins its id.
func Pin(ref string, img *model.Image) string {
	if i := strings.LastIndex(ref, "@"); i >= 0 {
		ref = ref[:i]
	}
	return config.RootfsImagePrefix + ref + "@" + img.ID
}

// PinnedID returns the image id a pinned rootfs value names ("" when
// rootfs is not a pinned image).
func PinnedID(rootfs string) string {
	ref, ok := strings.CutPrefix(rootfs, config.RootfsImagePrefix)
	if !ok {
		return ""
	}
	i := strings.LastIndex(ref, "@")
	if i < 0 || !strings.HasPrefix(ref[i+1:], "sha256:") {
		return ""
	}
	return ref[i+1:]
}

// Acquire resolves ref (as Get does) and pins the image against prune
// until release is called: a jail being created holds it so until its
// record names the image.
func (s *Store) Acquire(ref string) (*model.Image, func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	img, err := s.getLocked(ref)
	if err != nil {
		return nil, nil, err
	}
	return s.viewLocked(img), s.pinLocked(img.ID), nil
}

// pinLocked pins image id and returns its release; s.mu is held.
func (s *Store) pinLocked(id string) func() {
	s.pins[id]++
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			if s.pins[id]--; s.pins[id] <= 0 {
				delete(s.pins, id)
			}
			s.mu.Unlock()
		})
	}
}

// skeleton is the store's top lower of every image jail: the mount points
// the jail's init and runtime need, so that they never land in the
// jail's own layer (nor in its diff).
var skeleton = []struct {
	path string
	mode fs.FileMode
	file bool
}{
	{".agentjail", 0o755, false},
	{".agentjail/run", 0o700, false},
	{".agentjail/agentjail", 0o755, true},
	{"proc", 0o555, false},
	{"sys", 0o555, false},
	{"dev", 0o755, false},
}

// skelVersion changes with skeleton.
const skelVersion = "1"

// Skeleton returns the skeleton layer's directory, made once.
func (s *Store) Skeleton() (string, error) {
	dir := filepath.Join(s.dir, "skel-"+skelVersion)
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	tmp, err := os.MkdirTemp(s.tmpDir(), "skel-")
	if err != nil {
		return "", fmt.Errorf("image store: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", fmt.Errorf("image store: %w", err)
	}
	for _, e := range skeleton {
		p := filepath.Join(tmp, e.path)
		if e.file {
			err = os.WriteFile(p, nil, e.mode)
		} else {
			err = os.Mkdir(p, e.mode)
		}
		if err == nil {
			err = os.Chmod(p, e.mode)
		}
		if err != nil {
			return "", fmt.Errorf("image store: skeleton: %w", err)
		}
	}
	if err := os.Rename(tmp, dir); err != nil && !errors.Is(err, fs.ErrExist) {
		if _, serr := os.Stat(dir); serr != nil {
			return "", fmt.Errorf("image store: skeleton: %w", err)
		}
	}
	return dir, nil
}

// RootLayers returns the overlay lowers of a jail root on image id, top
// first: the skeleton, then the image's layers.
func (s *Store) RootLayers(id string) ([]string, error) {
	skel, err := s.Skeleton()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	img, ok := s.idx.Images[id]
	if !ok {
		return nil, errdefs.NotFoundf("image %s: not in the store", id)
	}
	out := []string{skel}
	for i := len(img.Layers) - 1; i >= 0; i-- {
		out = append(out, s.LayerRoot(img.Layers[i].DiffID))
	}
	return out, nil
}

// View returns a read-only tree of image id as a jail sees it (its layers
// merged), mounted once under the store and kept until the image is
// pruned: the tree lookups (users, workspace) and diffs read.
func (s *Store) View(id string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	img, ok := s.idx.Images[id]
	if !ok {
		return "", errdefs.NotFoundf("image %s: not in the store", id)
	}
	if len(img.Layers) == 1 {
		return s.LayerRoot(img.Layers[0].DiffID), nil
	}
	dir := s.viewDir(id)
	mounted, err := storage.IsMounted(dir)
	if err != nil {
		return "", err
	}
	if mounted {
		return dir, nil
	}
	var lowers []string
	for i := len(img.Layers) - 1; i >= 0; i-- {
		lowers = append(lowers, s.LayerRoot(img.Layers[i].DiffID))
	}
	if err := storage.MountOverlay(lowers, "", "", dir); err != nil {
		return "", fmt.Errorf("image view: %w", err)
	}
	return dir, nil
}

func (s *Store) viewDir(id string) string { return filepath.Join(s.dir, "view", hexOf(id)) }

// unmountViewLocked removes the view of image id; s.mu is held.
func (s *Store) unmountViewLocked(id string) error {
	dir := s.viewDir(id)
	if err := storage.Unmount(dir); err != nil {
		return err
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("image view: %w", err)
	}
	return nil
}

// Close unmounts every view.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ents, err := os.ReadDir(filepath.Join(s.dir, "view"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	var errs []error
	for _, e := range ents {
		errs = append(errs, s.unmountViewLocked("sha256:"+e.Name()))
	}
	return errors.Join(errs...)
}
