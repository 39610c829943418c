package jail

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"

	"github.com/agentjail/agentjail/internal/atomicfile"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/tenant"
)

// imageTenants records which tenants own which images of the shared,
// content-addressed store: a pull or a load adds the caller's tenant to
// the image's owners, a commit makes an image of its tenant alone, and a
// tenant's removal drops only its own claim while others hold one.
// Images built from the daemon's profiles belong to every tenant; images
// without a record (from before tenants) belong to the default tenant.
type imageTenants struct {
	path string
	mu   sync.Mutex
	m    map[string][]string // image id → tenants, sorted
}

// imageTenantsFile is the record's file in the data directory.
const imageTenantsFile = "image-tenants.json"

func openImageTenants(dataDir string) (*imageTenants, error) {
	it := &imageTenants{path: filepath.Join(dataDir, imageTenantsFile), m: map[string][]string{}}
	if err := atomicfile.ReadJSON(it.path, &it.m); err != nil {
		return nil, fmt.Errorf("image tenants: %w", err)
	}
	return it, nil
}

// shared reports whether img belongs to every tenant.
func sharedImage(img *model.Image) bool {
	return img.Source != "pull" && img.Source != "load" && img.Source != "commit"
}

// visible reports whether the caller of ctx may see img.
func (it *imageTenants) visible(ctx context.Context, img *model.Image) bool {
	if sharedImage(img) {
		return true
	}
	p, ok := tenant.FromContext(ctx)
	if !ok || p.Admin() {
		return true
	}
	it.mu.Lock()
	owners, known := it.m[img.ID]
	it.mu.Unlock()
	if !known {
		return tenant.Of("") == p.Tenant
	}
	return slices.Contains(owners, p.Tenant)
}

// add records t as an owner of image id (only t when alone).
func (it *imageTenants) add(id, t string, alone bool) error {
	t = tenant.Of(t)
	it.mu.Lock()
	defer it.mu.Unlock()
	old, had := it.m[id]
	owners := []string{t}
	if !alone {
		if !had {
			// An image from before tenants is the default tenant's too.
			old = []string{tenant.Of("")}
		}
		if slices.Contains(old, t) {
			return nil
		}
		owners = append(slices.Clone(old), t)
		slices.Sort(owners)
	}
	it.m[id] = owners
	if err := it.saveLocked(); err != nil {
		if had {
			it.m[id] = old
		} else {
			delete(it.m, id)
		}
		return err
	}
	return nil
}

// drop removes t's claim on image id and reports whether other tenants
// still own it.
func (it *imageTenants) drop(id, t string) (others bool, err error) {
	t = tenant.Of(t)
	it.mu.Lock()
	defer it.mu.Unlock()
	old, had := it.m[id]
	if !had {
		old = []string{tenant.Of("")}
	}
	rest := slices.DeleteFunc(slices.Clone(old), func(o string) bool { return o == t })
	if len(rest) == 0 {
		return false, nil
	}
	if len(rest) == len(old) {
		return true, nil
	}
	it.m[id] = rest
	if err := it.saveLocked(); err != nil {
		it.m[id] = old
		return true, err
	}
	return true, nil
}

// forget drops the record of a removed image.
func (it *imageTenants) forget(ids ...string) {
	it.mu.Lock()
	defer it.mu.Unlock()
	for _, id := range ids {
		delete(it.m, id)
	}
	_ = it.saveLocked()
}

func (it *imageTenants) saveLocked() error {
	if err := atomicfile.WriteJSON(it.path, it.m, 0o600); err != nil {
		return fmt.Errorf("image tenants: %w", err)
	}
	return nil
}

// visibleImage returns the image ref names as the caller of ctx may see
// it (errdefs.ErrNotFound otherwise).
func (m *Manager) visibleImage(ctx context.Context, ref string) (*model.Image, error) {
	img, err := m.images.Get(ref)
	if err != nil {
		return nil, err
	}
	if !m.imageOwners.visible(ctx, img) {
		return nil, errdefs.NotFoundf("no image %q in the store", ref)
	}
	return img, nil
}
