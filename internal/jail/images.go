package jail

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/image"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/netpolicy"
	"github.com/agentjail/agentjail/internal/snapshot"
	"github.com/agentjail/agentjail/internal/tenant"
)

// Images returns the manager's image store.
func (m *Manager) Images() *image.Store { return m.images }

// imagesInUse lists the images that jails and snapshots are made of, by
// id: prune keeps them.
func (m *Manager) imagesInUse() map[string]bool {
	used := map[string]bool{}
	m.mu.Lock()
	for _, e := range m.jails {
		if id := image.PinnedID(e.snapshot().Config.Isolation.Filesystem.Rootfs); id != "" {
			used[id] = true
		}
	}
	m.mu.Unlock()
	if m.snaps != nil {
		snaps, err := m.snaps.store.List()
		if err != nil {
			m.log.Error("listing snapshots for the image store", "err", err)
		}
		for _, s := range snaps {
			if id := image.PinnedID(s.Config.Isolation.Filesystem.Rootfs); id != "" {
				used[id] = true
			}
		}
	}
	return used
}

// resolveImage pins the image an `image:` rootfs names (by appending its
// id) and applies the image's config where cfg leaves a value unset: Env
// entries, the user (the image's, else root), the workspace (its working
// directory). It runs before defaults are applied. The image stays pinned
// against prune until release is called (once the jail's record names it).
func (m *Manager) resolveImage(ctx context.Context, cfg *config.Config) (release func(), err error) {
	fs := &cfg.Isolation.Filesystem
	if name, ok := strings.CutPrefix(fs.Rootfs, config.RootfsProfilePrefix); ok {
		res, err := m.profiles.Build(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("isolation.filesystem.rootfs: %w", err)
		}
		fs.Rootfs = config.RootfsImagePrefix + res.Profile.Tag
	}
	if flake, ok := strings.CutPrefix(fs.Rootfs, config.RootfsNixPrefix); ok {
		img, err := m.profiles.Nix(ctx, flake)
		if err != nil {
			return nil, err
		}
		fs.Rootfs = config.RootfsImagePrefix + img.ID
	}
	ref, ok := strings.CutPrefix(fs.Rootfs, config.RootfsImagePrefix)
	if !ok {
		return func() {}, nil
	}
	img, release, err := m.images.Acquire(ref)
	if err == nil && !m.imageOwners.visible(ctx, img) {
		release()
		err = errdefs.NotFoundf("no image %q", ref)
	}
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, errdefs.Unprocessablef("isolation.filesystem.rootfs: image %q is not in the store (agentjail pull %s)", ref, ref)
	}
	if err != nil {
		return nil, errdefs.Wrap(errdefs.ErrUnprocessable, err, "isolation.filesystem.rootfs")
	}
	fs.Rootfs = image.Pin(ref, img)
	applyImageConfig(cfg, img.Config)
	return release, nil
}

// applyImageConfig fills what cfg leaves unset from the image's config.
func applyImageConfig(cfg *config.Config, ic model.ImageConfig) {
	for _, kv := range ic.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			continue
		}
		if _, set := cfg.Env[k]; set {
			continue
		}
		if cfg.Env == nil {
			cfg.Env = map[string]string{}
		}
		cfg.Env[k] = v
	}
	p := &cfg.Isolation.Process
	if p.User == "" {
		user, group, _ := strings.Cut(ic.User, ":")
		if user == "" {
			user = "0"
		}
		p.User = user
		if p.Group == "" {
			p.Group = group
		}
	}
	fs := &cfg.Isolation.Filesystem
	if fs.WorkspaceRoot == "" && ic.WorkingDir != "" && ic.WorkingDir != "/" {
		fs.WorkspaceRoot = ic.WorkingDir
	}
}

// ListImages returns every image of the store the caller of ctx may
// see, newest first.
func (m *Manager) ListImages(ctx context.Context) ([]*model.Image, error) {
	all := m.images.List()
	out := all[:0:0]
	for _, img := range all {
		if m.imageOwners.visible(ctx, img) {
			out = append(out, img)
		}
	}
	return out, nil
}

// GetImage returns the image ref names.
func (m *Manager) GetImage(ctx context.Context, ref string) (*model.Image, error) {
	return m.visibleImage(ctx, ref)
}

// PullImage pulls ref into the store with auth (nil: the daemon's docker
// config), reporting per-layer progress; the image then belongs to the
// caller's tenant too.
func (m *Manager) PullImage(ctx context.Context, ref string, auth *model.RegistryAuth, progress func(model.PullProgress)) (*model.Image, error) {
	img, err := m.images.Pull(ctx, ref, image.PullOptions{Progress: progress, Auth: auth})
	if err != nil {
		return nil, err
	}
	return img, m.imageOwners.add(img.ID, tenant.Owner(ctx), false)
}

// RemoveImage untags (and when unused, removes) the image ref names. An
// image other tenants own too stays: only the caller's claim on it goes.
func (m *Manager) RemoveImage(ctx context.Context, ref string, force bool) (model.ImageRemoval, error) {
	img, err := m.visibleImage(ctx, ref)
	if err != nil {
		return model.ImageRemoval{}, err
	}
	if p, ok := tenant.FromContext(ctx); ok && !p.Admin() && !sharedImage(img) {
		others, err := m.imageOwners.drop(img.ID, p.Tenant)
		if err != nil || others {
			return model.ImageRemoval{Untagged: []string{}}, err
		}
	} else if ok && !p.Admin() {
		return model.ImageRemoval{}, errdefs.Forbiddenf("image %s is built from a profile the daemon shares; only an admin may remove it", ref)
	}
	rm, err := m.images.Remove(ref, force)
	if err == nil && rm.Deleted != "" {
		m.imageOwners.forget(rm.Deleted)
	}
	return rm, err
}

// PruneImages removes unused images and unreferenced layers, whichever
// tenant they belong to: an admin's operation.
func (m *Manager) PruneImages(ctx context.Context, all bool) (model.ImagePrune, error) {
	if p, ok := tenant.FromContext(ctx); ok && !p.Admin() {
		return model.ImagePrune{}, errdefs.Forbiddenf("pruning the image store touches every tenant's images: only an admin key or the token may")
	}
	pr, err := m.images.Prune(all)
	if err == nil {
		m.imageOwners.forget(pr.Images...)
	}
	return pr, err
}

// ImageUsage accounts the image store's disk use.
func (m *Manager) ImageUsage(ctx context.Context) (model.ImageUsage, error) {
	return m.images.DiskUsage()
}

// LoadImages imports the images of the archive at path.
func (m *Manager) LoadImages(ctx context.Context, path string, progress func(model.PullProgress)) ([]*model.Image, error) {
	imgs, err := m.images.Load(ctx, path, progress)
	for _, img := range imgs {
		err = errors.Join(err, m.imageOwners.add(img.ID, tenant.Owner(ctx), false))
	}
	return imgs, err
}

// LoadDir is where the API spools uploaded archives (on the store's
// filesystem).
func (m *Manager) LoadDir() string { return m.images.TmpDir() }

// Commit writes the jail's changes (its upper layer, without the files
// the daemon itself puts there) as a layer on top of the jail's image.
func (m *Manager) Commit(ctx context.Context, ref string, req model.CommitRequest) (*model.Image, error) {
	e, err := m.lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	j := e.snapshot()
	parent := image.PinnedID(j.Config.Isolation.Filesystem.Rootfs)
	if parent == "" {
		return nil, errdefs.Unprocessablef("jail %s: commit needs a jail made of an image (its rootfs is %q)", j.Name, j.Config.Isolation.Filesystem.Rootfs)
	}
	if j.Status == model.StateCreated {
		return nil, errdefs.Conflictf("jail %s was never started; it has no changes to commit", j.Name)
	}
	lb, err := m.layered(e)
	if err != nil {
		return nil, err
	}
	_, upper, err := lb.Layers(m.instance(e))
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(upper); err != nil {
		return nil, errdefs.Conflictf("jail %s: its disk is not mounted (%v)", j.Name, err)
	}
	shift := lb.IDShift(m.instance(e))
	img, err := m.images.Commit(ctx, image.CommitRequest{
		Parent: parent, Upper: upper, Shift: shift, Tag: req.Ref, Comment: req.Comment, Changes: req.Changes,
		Skip: daemonWritten,
	})
	if err != nil {
		return nil, err
	}
	return img, m.imageOwners.add(img.ID, tenant.Of(j.Tenant), true)
}

// daemonWritten reports the jail paths the daemon itself writes into a
// jail's root (its mount points, the network's resolver and CA files):
// a commit leaves them out.
func daemonWritten(p string) bool {
	switch p {
	case "/etc/resolv.conf", netpolicy.JailCAPath, netpolicy.JailTrustStore:
		return true
	}
	return snapshot.SkipInternal(p)
}

// ListProfiles returns the built-in and user profiles.
func (m *Manager) ListProfiles(ctx context.Context) ([]model.Profile, error) {
	return m.profiles.List()
}

// PutProfile saves a user profile.
func (m *Manager) PutProfile(ctx context.Context, p model.Profile) (model.Profile, error) {
	return m.profiles.Put(p)
}

// DeleteProfile removes a user profile.
func (m *Manager) DeleteProfile(ctx context.Context, name string) error {
	return m.profiles.Delete(name)
}

// BuildProfile builds (or finds cached) the image of a profile.
func (m *Manager) BuildProfile(ctx context.Context, name string) (model.ProfileBuild, error) {
	return m.profiles.Build(ctx, name)
}
