package model

import (
	"time"

	"github.com/agentjail/agentjail/internal/config"
)

// Snapshot modes.
const (
	// SnapshotFull checkpoints the jail's processes and its filesystem.
	SnapshotFull = "full"
	// SnapshotFS copies the jail's filesystem only; a restore boots it.
	SnapshotFS = "fs"
)

// Lineage kinds.
const (
	LineageJail     = "jail"
	LineageSnapshot = "snapshot"
)

// Lineage names the parent of a jail or snapshot in the family tree.
type Lineage struct {
	// Kind is "jail" or "snapshot".
	Kind string `json:"kind"`
	ID   string `json:"id"`
	// Name is the parent's name when it was recorded.
	Name string `json:"name,omitempty"`
}

// Snapshot is a recorded state of a jail: its filesystem and, in mode
// full, its processes. Snapshots outlive their jail: they are the branch
// points of the family tree.
type Snapshot struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Tenant is the tenant of the jail the snapshot was taken of.
	Tenant string `json:"tenant,omitempty"`
	// JailID and JailName name the jail the snapshot was taken of.
	JailID   string `json:"jail_id"`
	JailName string `json:"jail_name"`
	// Parent is the jail the snapshot was taken of.
	Parent Lineage `json:"parent"`
	// PreviousSnapshot is the jail's snapshot before this one, or the
	// snapshot the jail was restored from (empty for the first of a tree).
	PreviousSnapshot string `json:"previous_snapshot,omitempty"`
	// Mode is "full" or "fs".
	Mode      string    `json:"mode"`
	CreatedAt time.Time `json:"created_at"`
	// Config is the jail's config at snapshot time (restores use it).
	Config config.Config `json:"config"`
	// Usage is the jail's resource usage at snapshot time.
	Usage *Stats `json:"usage,omitempty"`
	// EventPositions are the byte sizes of the jail's JSONL event files
	// (by stream name) at snapshot time: where the jail's record stood.
	EventPositions map[string]int64 `json:"event_positions,omitempty"`
	// DiskBytes is the size of the disk image copy (a reflink: it shares
	// unchanged blocks with the jail), DiskUsedBytes the bytes in use on
	// the jail's disk, ProcessBytes the size of the process images.
	DiskBytes     int64  `json:"disk_bytes"`
	DiskUsedBytes uint64 `json:"disk_used_bytes"`
	ProcessBytes  int64  `json:"process_bytes"`
	// DurationMs is how long taking the snapshot took; FrozenMs how long
	// the jail's processes (full) or filesystem (fs) were frozen.
	DurationMs float64 `json:"duration_ms"`
	FrozenMs   float64 `json:"frozen_ms"`
	// Source says where a pulled snapshot came from (absent for a
	// snapshot taken here).
	Source *SnapshotSource `json:"source,omitempty"`
}

// SnapshotSource is the registry artifact a snapshot was pulled from.
type SnapshotSource struct {
	// Ref is the artifact's reference, with its digest.
	Ref string `json:"ref"`
	// Digest is the artifact's manifest digest.
	Digest string `json:"digest"`
	// ID is the snapshot's id on the daemon that pushed it.
	ID string `json:"id"`
	// Bytes is the size of the artifact's blobs; DurationMs how long the
	// pull took.
	Bytes      int64     `json:"bytes"`
	DurationMs float64   `json:"duration_ms"`
	PulledAt   time.Time `json:"pulled_at"`
}

// SnapshotPushRequest is the body of POST /snapshots/{sid}/push.
type SnapshotPushRequest struct {
	// Ref is the artifact's reference: registry/repository:tag.
	Ref string `json:"ref"`
}

// SnapshotPullRequest is the body of POST /snapshots/pull.
type SnapshotPullRequest struct {
	// Ref is the artifact's reference (a tag or a digest).
	Ref string `json:"ref"`
	// Name of the new snapshot (default: the pushed snapshot's name).
	Name string `json:"name,omitempty"`
}

// SnapshotPush is the answer to POST /snapshots/{sid}/push.
type SnapshotPush struct {
	// Ref is the artifact's reference with its digest
	// (registry/repository@sha256:...): a pull of it gets exactly this.
	Ref string `json:"ref"`
	// Digest is the artifact's manifest digest.
	Digest string `json:"digest"`
	// Bytes is the size of the artifact's blobs (compressed); FilesBytes
	// and DiskBytes the sizes of the snapshot's files and disk image
	// (holes included) before compression.
	Bytes      int64 `json:"bytes"`
	FilesBytes int64 `json:"files_bytes"`
	DiskBytes  int64 `json:"disk_bytes"`
	// DurationMs is how long the push took.
	DurationMs float64 `json:"duration_ms"`
	// Snapshot is the snapshot pushed.
	Snapshot *Snapshot `json:"snapshot"`
}

// SnapshotRequest is the body of POST /jails/{id}/snapshot.
type SnapshotRequest struct {
	// Name of the snapshot (default: derived from its id).
	Name string `json:"name,omitempty"`
	// Mode is "full" (default) or "fs".
	Mode string `json:"mode,omitempty"`
}

// RestoreRequest is the body of POST /snapshots/{sid}/restore.
type RestoreRequest struct {
	// Name of the new jail (default: derived from its id).
	Name string `json:"name,omitempty"`
}

// BranchRequest is the body of POST /snapshots/{sid}/branch. The jails
// are named by Names, else PREFIX-1 ... PREFIX-N with NamePrefix, else
// each SNAPSHOT-XXXXXX (the snapshot's name and six hex digits of the
// jail's id), which no other jail holds.
type BranchRequest struct {
	// Count is how many jails to make (default 1, or len(Names); at most
	// MaxBranches).
	Count int `json:"count,omitempty"`
	// NamePrefix names the jails PREFIX-1 ... PREFIX-N.
	NamePrefix string `json:"name_prefix,omitempty"`
	// Names names each jail (distinct; Count, when given, must be their
	// number). Not with NamePrefix.
	Names []string `json:"names,omitempty"`
}

// MaxBranches bounds BranchRequest.Count.
const MaxBranches = 32
