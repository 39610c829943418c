package model

import "time"

// Image is one image of the daemon's image store.
type Image struct {
	// ID is the digest of the image's config ("sha256:…").
	ID string `json:"id"`
	// Digest is the manifest digest it was pulled by or loaded with
	// ("" when none is known, e.g. a docker-archive or a commit).
	Digest string `json:"digest,omitempty"`
	// Tags are its names, in familiar form ("python:3.12-slim").
	Tags []string `json:"tags"`
	// Layers are its filesystem layers, base first.
	Layers []ImageLayer `json:"layers"`
	// Config is the part of the image config a jail applies.
	Config ImageConfig `json:"config"`
	// Size is the unpacked size of its layers in bytes.
	Size int64 `json:"size"`
	// Created is when the image entered the store.
	Created time.Time `json:"created"`
	// Source says how: pull, load, commit or profile.
	Source string `json:"source"`
	// Parent is the image a commit was made on top of.
	Parent string `json:"parent,omitempty"`
}

// ImageLayer is one filesystem layer of an image.
type ImageLayer struct {
	// DiffID is the digest of the uncompressed tar (the store's key).
	DiffID string `json:"diff_id"`
	// Digest and MediaType describe the blob it came from ("" when none).
	Digest    string `json:"digest,omitempty"`
	MediaType string `json:"media_type,omitempty"`
	// Size is the unpacked size in bytes.
	Size int64 `json:"size"`
}

// ImageConfig is what a jail takes from an image's config: Env is added
// to the jail's environment, WorkingDir becomes its workspace, User its
// default user; Entrypoint and Cmd make the command of `agentjail run
// IMAGE`.
type ImageConfig struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
}

// RegistryAuth is a user name and password (or token) a pull presents to
// the image's registry instead of the daemon's docker config.
type RegistryAuth struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

// PullProgress reports one step of a pull or load, per layer.
type PullProgress struct {
	// Layer is the layer's blob digest (its diff id when the blob is not
	// known); empty for whole-image steps.
	Layer string `json:"layer,omitempty"`
	// Status of a layer: waiting, exists, downloading, unpacking, done,
	// failed; of the image: resolving, resolved, complete.
	Status string `json:"status"`
	// Current and Total are bytes of the blob read so far and declared
	// (Total 0 when unknown).
	Current int64 `json:"current,omitempty"`
	Total   int64 `json:"total,omitempty"`
	// Error says why a layer failed.
	Error string `json:"error,omitempty"`
}

// ImageRemoval says what removing an image did.
type ImageRemoval struct {
	// Untagged are the tags removed.
	Untagged []string `json:"untagged"`
	// Deleted is the image id removed ("" when the image stays because
	// other tags, jails or snapshots still use it).
	Deleted string `json:"deleted,omitempty"`
}

// ImagePrune says what a prune removed.
type ImagePrune struct {
	// Images are the ids of the untagged, unused images removed.
	Images []string `json:"images"`
	// Layers are the diff ids of the layers removed.
	Layers []string `json:"layers"`
	// ReclaimedBytes is the unpacked size of the removed layers.
	ReclaimedBytes int64 `json:"reclaimed_bytes"`
}

// ImageUsage is the image store's disk accounting.
type ImageUsage struct {
	// Images is the number of images; Layers the number of unpacked layers.
	Images int `json:"images"`
	Layers int `json:"layers"`
	// LayerBytes is the unpacked size of all layers (each counted once,
	// however many images and jails share it).
	LayerBytes int64 `json:"layer_bytes"`
	// DiskBytes is the disk space the store's directory takes.
	DiskBytes int64 `json:"disk_bytes"`
	// UnusedLayers are the layers no image references (prune removes
	// them); UnusedBytes their size.
	UnusedLayers int   `json:"unused_layers"`
	UnusedBytes  int64 `json:"unused_bytes"`
	// CacheBytes is what the pull-through registry cache holds, of at
	// most CacheMaxBytes.
	CacheBytes    int64 `json:"cache_bytes"`
	CacheMaxBytes int64 `json:"cache_max_bytes"`
}

// CommitRequest is the body of POST /jails/{id}/commit.
type CommitRequest struct {
	// Ref tags the new image ("" for none).
	Ref string `json:"ref,omitempty"`
	// Comment goes into the image's history.
	Comment string `json:"comment,omitempty"`
	// Changes amend the parent's config (nil: kept as it is): each env
	// entry replaces the parent's of its name or is added; working_dir,
	// user, entrypoint and cmd replace the parent's when given.
	Changes *ImageConfig `json:"changes,omitempty"`
}

// Profile is a named package list the daemon builds into an image with
// mmdebstrap (the built-in minimal, python, node, build; or a user
// profile adding packages to one of them).
type Profile struct {
	// Name is the profile's name ([a-z0-9][a-z0-9_.-]*).
	Name string `json:"name"`
	// Base is the built-in profile a user profile adds packages to.
	Base string `json:"base,omitempty"`
	// Suite is the Debian suite (default: the host's, else bookworm).
	Suite string `json:"suite,omitempty"`
	// Packages are the packages installed on top of minbase.
	Packages []string `json:"packages"`
	// BuiltIn is true for minimal, python, node and build.
	BuiltIn bool `json:"built_in,omitempty"`
	// Key digests what the build depends on; Tag is the image it makes.
	Key string `json:"key,omitempty"`
	Tag string `json:"tag,omitempty"`
	// Image is the id of the built image ("" until built).
	Image string `json:"image,omitempty"`
}

// ProfileBuild is the answer to a profile build.
type ProfileBuild struct {
	Profile Profile `json:"profile"`
	Image   *Image  `json:"image"`
	// Cached is true when no mmdebstrap run was needed: the image was in
	// the store, or its tarball in the daemon's cache.
	Cached bool `json:"cached"`
	// Seconds the build took.
	Seconds float64 `json:"seconds"`
}
