package jail

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/image"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/snapshot"
	"github.com/agentjail/agentjail/internal/snapshot/transfer"
	"github.com/agentjail/agentjail/internal/tenant"
)

// transferTimeout bounds one push or pull of a snapshot.
const transferTimeout = 30 * time.Minute

// pullLimits bound what a pull accepts: process images of at most twice
// the largest memory a jail may have, a disk of at most the largest disk,
// no compressed blob larger than what it holds (gzip of incompressible
// data adds little).
var pullLimits = transfer.Limits{
	Files: 2 * config.MaxMemory,
	Disk:  config.MaxDisk,
	Blob:  2*config.MaxMemory + config.MaxDisk,
}

// PushSnapshot writes snapshot sid to the registry as the OCI artifact
// req.Ref (see internal/snapshot/transfer), with the credentials and
// insecure registries of image pulls. The snapshot cannot be deleted
// meanwhile.
func (m *Manager) PushSnapshot(ctx context.Context, sid string, req model.SnapshotPushRequest) (*model.SnapshotPush, error) {
	if req.Ref == "" {
		return nil, errdefs.Invalidf("ref: required (registry/repository:tag)")
	}
	snap, done, err := m.use(ctx, sid)
	if err != nil {
		return nil, err
	}
	defer done()
	ctx, cancel := context.WithTimeout(ctx, transferTimeout)
	defer cancel()
	ref, opts, err := m.images.Remote(ctx, req.Ref)
	if err != nil {
		return nil, fmt.Errorf("ref: %w", err)
	}
	store := m.snaps.store
	src := transfer.Source{Snapshot: snap, Dir: store.Dir(sid), Skip: []string{snapshot.RecordFile}, DiskImage: store.Image(sid)}
	if mv, err := m.mover(snap.Config.Isolation.Level); err != nil {
		return nil, err
	} else if mv != nil {
		if src.Requires, err = mv.Requirements(src.Dir); err != nil {
			return nil, fmt.Errorf("snapshot %s: %w", sid, err)
		}
	}
	res, err := transfer.Push(ctx, ref, src, opts)
	if err != nil {
		return nil, err
	}
	return &model.SnapshotPush{
		Ref: res.Ref, Digest: res.Digest, Bytes: res.Bytes,
		FilesBytes: res.Config.FilesBytes, DiskBytes: res.Config.DiskBytes,
		DurationMs: ms(res.Duration), Snapshot: snap,
	}, nil
}

// PullSnapshot fetches the snapshot artifact req.Ref into a new snapshot
// of the caller's tenant: a new id, the pushed snapshot's config, mode
// and name (or req.Name), Source naming the artifact. What this daemon
// could not restore (another level, process restores unavailable, a
// rootfs it lacks, a config it refuses) is refused before the layers are
// fetched. A failed pull leaves nothing.
func (m *Manager) PullSnapshot(ctx context.Context, req model.SnapshotPullRequest) (*model.Snapshot, error) {
	if req.Ref == "" {
		return nil, errdefs.Invalidf("ref: required (registry/repository:tag or @digest)")
	}
	if req.Name != "" {
		if err := config.ValidName(req.Name); err != nil {
			return nil, fmt.Errorf("name: %w", err)
		}
	}
	owner := tenant.Owner(ctx)
	unreserve, err := m.reserveSnapshot(owner)
	if err != nil {
		return nil, err
	}
	defer unreserve()
	ctx, cancel := context.WithTimeout(ctx, transferTimeout)
	defer cancel()
	ref, opts, err := m.images.Remote(ctx, req.Ref)
	if err != nil {
		return nil, fmt.Errorf("ref: %w", err)
	}
	store := m.snaps.store
	sid := snapshot.NewID()
	if err := store.Create(sid); err != nil {
		return nil, err
	}
	ok := false
	defer m.removeUnless(&ok, sid, "a failed pull")
	res, err := transfer.Pull(ctx, ref, transfer.Dest{Dir: store.Dir(sid), DiskImage: store.Image(sid)}, pullLimits,
		func(c *transfer.Config) error { return m.restorable(&c.Snapshot, c.Requires, "") }, opts)
	if err != nil {
		return nil, err
	}
	// The snapshot's records, made on another host, for this one.
	if err := m.restorable(&res.Config.Snapshot, res.Config.Requires, store.Dir(sid)); err != nil {
		return nil, err
	}
	snap := res.Config.Snapshot
	snap.Source = &model.SnapshotSource{
		Ref: res.Ref, Digest: res.Digest, ID: snap.ID, Bytes: res.Bytes,
		DurationMs: ms(res.Duration), PulledAt: time.Now().UTC(),
	}
	snap.ID, snap.Tenant = sid, owner
	if req.Name != "" {
		snap.Name = req.Name
	}
	// The pushing daemon's snapshot ids mean nothing here.
	snap.PreviousSnapshot = ""
	snap.DiskBytes = store.ImageBytes(sid)
	if err := store.Save(&snap); err != nil {
		return nil, err
	}
	ok = true
	return &snap, nil
}

// mover returns the backend of level as a backend.CheckpointMover (nil
// when its checkpoints need nothing of the host restoring them).
func (m *Manager) mover(level string) (backend.CheckpointMover, error) {
	b, err := m.levels.Get(level)
	if err != nil {
		return nil, err
	}
	mv, _ := b.(backend.CheckpointMover)
	return mv, nil
}

// restorable refuses, with errdefs.ErrUnprocessable or ErrConflict
// naming the reason, a snapshot made elsewhere that this daemon could not
// restore: its config, and what its backend requires of the host (req).
// With dir, the pulled snapshot's directory, the backend adopts its
// records for this host.
func (m *Manager) restorable(snap *model.Snapshot, req map[string]string, dir string) error {
	cfg := snap.Config
	if snap.Mode != model.SnapshotFull && snap.Mode != model.SnapshotFS {
		return errdefs.Unprocessablef("the snapshot has mode %q; this daemon knows %q and %q", snap.Mode, model.SnapshotFull, model.SnapshotFS)
	}
	b, err := m.checkConfig(&cfg)
	if err != nil {
		return errdefs.Wrap(errdefs.ErrUnprocessable, err, "the snapshot's jail cannot run on this daemon")
	}
	if _, _, err := m.checkpointer(cfg.Isolation.Level, "restore snapshots"); err != nil {
		return errdefs.Wrap(errdefs.ErrUnprocessable, err, "this daemon cannot restore snapshots of the %s level", cfg.Isolation.Level)
	}
	if caps := b.Capabilities(); snap.Mode == model.SnapshotFull && !caps.Checkpoint {
		return errdefs.Unprocessablef("the snapshot holds processes, and process restores are unavailable at the %s level here: %s", caps.Level, caps.CheckpointReason)
	}
	rootfs := cfg.Isolation.Filesystem.Rootfs
	switch {
	case strings.HasPrefix(rootfs, config.RootfsImagePrefix):
		id := image.PinnedID(rootfs)
		if id == "" {
			return errdefs.Unprocessablef("the snapshot's rootfs %q does not pin its image by id", rootfs)
		}
		if _, err := m.images.Get(id); err != nil {
			ref, _, _ := strings.Cut(strings.TrimPrefix(rootfs, config.RootfsImagePrefix), "@")
			return errdefs.Conflictf("the snapshot's jail runs on image %s (id %s), which this daemon does not have: pull it first (agentjail pull %s)", ref, id, ref)
		}
	case strings.HasPrefix(rootfs, config.RootfsDirPrefix):
		root := strings.TrimPrefix(rootfs, config.RootfsDirPrefix)
		if _, err := os.Stat(root); err != nil {
			return errdefs.Conflictf("the snapshot's jail runs on the directory %s, which this host lacks", root)
		}
	}
	if mv, _ := b.(backend.CheckpointMover); mv != nil {
		return mv.Adopt(dir, req)
	}
	return nil
}
