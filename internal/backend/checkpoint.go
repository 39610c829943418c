package backend

import (
	"context"
	"time"
)

// CheckpointOptions says what a checkpoint records and where.
type CheckpointOptions struct {
	// Dir is the snapshot's directory (exists, empty); the backend keeps
	// its process images and bookkeeping below it.
	Dir string
	// DiskImage is the path the jail's disk is copied to. It lies in the
	// storage pool, so the copy is a reflink.
	DiskImage string
	// Processes asks for the jail's processes too; without it only the
	// filesystem is recorded (and the jail's processes are never stopped).
	Processes bool
}

// CheckpointResult describes a checkpoint that was taken.
type CheckpointResult struct {
	// Frozen is how long the jail's processes (or, for a filesystem-only
	// checkpoint, its filesystem) were frozen.
	Frozen time.Duration
	// ProcessBytes is the size of the process images.
	ProcessBytes int64
}

// RestoreSource is a checkpoint to make a new jail from.
type RestoreSource struct {
	// Dir and DiskImage are the CheckpointOptions of the checkpoint.
	Dir, DiskImage string
	// Processes is true when the checkpoint holds the jail's processes;
	// otherwise the new jail boots its own init on the copied filesystem.
	Processes bool
}

// Checkpointer is implemented by backends that can record a running
// jail's state and make new jails from such records (snapshots, branches).
// Whether process checkpoints work on this host is in Capabilities
// (Checkpoint, CheckpointReason).
type Checkpointer interface {
	// Checkpoint records inst, which runs, into opts: the disk image always,
	// and with opts.Processes every process of the jail, consistently (the
	// filesystem copy and the process images are taken while the
	// processes are frozen). The jail keeps running unaffected, whether
	// the checkpoint succeeds or fails; on failure whatever was written
	// into opts.Dir and opts.DiskImage is the caller's to remove, and the
	// error names the process and resource that could not be recorded.
	// A process checkpoint where Capabilities().Checkpoint is false is
	// errdefs.ErrNotImplemented with the reason.
	Checkpoint(ctx context.Context, inst Instance, opts CheckpointOptions) (CheckpointResult, error)
	// Restore makes the new jail inst (its directory exists; nothing else
	// of it does) from src and returns once its init serves its control
	// socket, as Start does: its own disk (a copy of src's image), root,
	// network namespace and attachment, control dir, runtime bundle and
	// cgroup; inst.OnCreated runs before any of its processes resume. On
	// error every resource of inst is released (as Destroy does).
	Restore(ctx context.Context, inst Instance, src RestoreSource) (Status, error)
	// Recover undoes what an interrupted Checkpoint may have left on a
	// running jail (a frozen filesystem or cgroup), after a daemon crash.
	// A checkpoint still at work for the dead daemon is waited for first;
	// after Recover nothing writes into any checkpoint's Dir or DiskImage.
	Recover(ctx context.Context, inst Instance) error
}

// CheckpointMover is implemented by Checkpointers whose checkpoints can
// be restored by another daemon, on another host (snapshots moved
// through a registry), when that host matches what they need.
type CheckpointMover interface {
	// Requirements returns what a host restoring the checkpoint in dir
	// must match, as names and values of the backend's choosing (the
	// digest of the binary its processes ran...); nil when anything goes.
	// It changes nothing.
	Requirements(dir string) (map[string]string, error)
	// Adopt checks that this host meets req, errdefs.ErrConflict naming
	// what differs; then, when dir is not "", it rewrites the records of
	// the checkpoint in dir (made on another host) that name host paths,
	// for this host. With dir "" it only checks.
	Adopt(dir string, req map[string]string) error
}
