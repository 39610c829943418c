package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/agentjail/agentjail/internal/model"
)

// The snapshot types of the API.
type (
	// Snapshot is a recorded state of a jail.
	Snapshot = model.Snapshot
	// SnapshotRequest is the request of Snapshot.
	SnapshotRequest = model.SnapshotRequest
	// Lineage names the parent of a jail or snapshot.
	Lineage = model.Lineage
	// SnapshotPush is the answer of PushSnapshot.
	SnapshotPush = model.SnapshotPush
	// SnapshotSource names the artifact a pulled snapshot came from.
	SnapshotSource = model.SnapshotSource
)

func snapshotURL(sid string) string { return "/snapshots/" + url.PathEscape(sid) }

// Snapshot records the running jail ref; req.Mode is "full" (processes and
// filesystem, the default) or "fs" (filesystem only). The jail keeps
// running.
func (c *Client) Snapshot(ctx context.Context, ref string, req SnapshotRequest) (*Snapshot, error) {
	var s Snapshot
	if err := c.call(ctx, http.MethodPost, jailURL(ref)+"/snapshot", req, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// Snapshots lists the snapshots of jail ref (every snapshot when ref is
// ""), oldest first.
func (c *Client) Snapshots(ctx context.Context, ref string) ([]*Snapshot, error) {
	p := "/snapshots"
	if ref != "" {
		p = jailURL(ref) + "/snapshots"
	}
	var out struct {
		Snapshots []*Snapshot `json:"snapshots"`
	}
	if err := c.call(ctx, http.MethodGet, p, nil, &out); err != nil {
		return nil, err
	}
	return out.Snapshots, nil
}

// GetSnapshot returns one snapshot.
func (c *Client) GetSnapshot(ctx context.Context, sid string) (*Snapshot, error) {
	var s Snapshot
	if err := c.call(ctx, http.MethodGet, snapshotURL(sid), nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// DeleteSnapshot removes a snapshot and everything it holds.
func (c *Client) DeleteSnapshot(ctx context.Context, sid string) error {
	return c.call(ctx, http.MethodDelete, snapshotURL(sid), nil, nil)
}

// Restore makes a new running jail, named name ("": derived from the
// snapshot's name), in the snapshot's state.
func (c *Client) Restore(ctx context.Context, sid, name string) (*Jail, error) {
	var j Jail
	if err := c.call(ctx, http.MethodPost, snapshotURL(sid)+"/restore", model.RestoreRequest{Name: name}, &j); err != nil {
		return nil, err
	}
	return &j, nil
}

// Branch makes req.Count (0 means 1, or len(req.Names)) independent
// running jails from one snapshot, named by req.Names, else
// req.NamePrefix-1 ..., else each after the snapshot and its own id.
func (c *Client) Branch(ctx context.Context, sid string, req BranchRequest) ([]*Jail, error) {
	var out struct {
		Jails []*Jail `json:"jails"`
	}
	if err := c.call(ctx, http.MethodPost, snapshotURL(sid)+"/branch", req, &out); err != nil {
		return nil, err
	}
	return out.Jails, nil
}

// PushSnapshot writes snapshot sid to an OCI registry as the artifact ref
// (registry/repository:tag), with the daemon's registry credentials.
func (c *Client) PushSnapshot(ctx context.Context, sid, ref string) (*SnapshotPush, error) {
	var out SnapshotPush
	if err := c.call(ctx, http.MethodPost, snapshotURL(sid)+"/push", model.SnapshotPushRequest{Ref: ref}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// PullSnapshot fetches the snapshot artifact ref into a new snapshot of
// the daemon, named name ("": the pushed snapshot's name).
func (c *Client) PullSnapshot(ctx context.Context, ref, name string) (*Snapshot, error) {
	var s Snapshot
	if err := c.call(ctx, http.MethodPost, "/snapshots/pull", model.SnapshotPullRequest{Ref: ref, Name: name}, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// SnapshotDiff lists what the snapshot's jail changed since the snapshot;
// text adds unified diffs of text files.
func (c *Client) SnapshotDiff(ctx context.Context, sid string, text bool) (*FsDiff, error) {
	p := snapshotURL(sid) + "/diff"
	if text {
		p += "?text=true"
	}
	var d FsDiff
	if err := c.call(ctx, http.MethodGet, p, nil, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// Diff lists the filesystem changes from from to to, each a jail (id or
// name) or a snapshot id; text adds unified diffs of text files.
func (c *Client) Diff(ctx context.Context, from, to string, text bool) (*FsDiff, error) {
	q := url.Values{"from": {from}, "to": {to}}
	if text {
		q.Set("text", "true")
	}
	var d FsDiff
	if err := c.call(ctx, http.MethodGet, "/diff?"+q.Encode(), nil, &d); err != nil {
		return nil, err
	}
	return &d, nil
}
