package api

import (
	"context"
	"net/http"
	"net/url"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
)

// SnapshotList is the body of GET /jails/{id}/snapshots and GET /snapshots.
type SnapshotList struct {
	Snapshots []*model.Snapshot `json:"snapshots"`
}

// BranchList is the body of POST /snapshots/{sid}/branch.
type BranchList struct {
	Jails []*model.Jail `json:"jails"`
}

// textParam reads the optional boolean query parameter "text".
func textParam(r *http.Request) (bool, error) { return boolParam(r.URL.Query(), "text") }

// followParam reads the optional boolean query parameter "follow"
// (default true).
func followParam(q url.Values) (bool, error) {
	if q.Get("follow") == "" {
		return true, nil
	}
	return boolParam(q, "follow")
}

func (s *server) createSnapshot(w http.ResponseWriter, r *http.Request) error {
	var req model.SnapshotRequest
	if err := decodeBody(w, r, &req, false, true); err != nil {
		return err
	}
	snap, err := s.svc.Snapshot(r.Context(), r.PathValue("id"), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, snap)
	return nil
}

func (s *server) writeSnapshots(w http.ResponseWriter, r *http.Request, ref string) error {
	list, err := s.svc.ListSnapshots(r.Context(), ref)
	if err != nil {
		return err
	}
	if list == nil {
		list = []*model.Snapshot{}
	}
	writeJSON(w, http.StatusOK, SnapshotList{Snapshots: list})
	return nil
}

func (s *server) jailSnapshots(w http.ResponseWriter, r *http.Request) error {
	return s.writeSnapshots(w, r, r.PathValue("id"))
}

func (s *server) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	return s.writeSnapshots(w, r, "")
}

func (s *server) getSnapshot(w http.ResponseWriter, r *http.Request) error {
	snap, err := s.svc.GetSnapshot(r.Context(), r.PathValue("sid"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, snap)
	return nil
}

func (s *server) deleteSnapshot(w http.ResponseWriter, r *http.Request) error {
	if err := s.svc.DeleteSnapshot(r.Context(), r.PathValue("sid")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *server) restoreSnapshot(w http.ResponseWriter, r *http.Request) error {
	var req model.RestoreRequest
	if err := decodeBody(w, r, &req, false, true); err != nil {
		return err
	}
	j, err := s.svc.Restore(r.Context(), r.PathValue("sid"), req.Name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, j)
	return nil
}

func (s *server) branchSnapshot(w http.ResponseWriter, r *http.Request) error {
	var req model.BranchRequest
	if err := decodeBody(w, r, &req, false, true); err != nil {
		return err
	}
	js, err := s.svc.Branch(r.Context(), r.PathValue("sid"), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, BranchList{Jails: js})
	return nil
}

func (s *server) pushSnapshot(w http.ResponseWriter, r *http.Request) error {
	var req model.SnapshotPushRequest
	if err := decodeBody(w, r, &req, false, false); err != nil {
		return err
	}
	res, err := s.svc.PushSnapshot(r.Context(), r.PathValue("sid"), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

func (s *server) pullSnapshot(w http.ResponseWriter, r *http.Request) error {
	var req model.SnapshotPullRequest
	if err := decodeBody(w, r, &req, false, false); err != nil {
		return err
	}
	snap, err := s.svc.PullSnapshot(r.Context(), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, snap)
	return nil
}

func (s *server) snapshotDiff(w http.ResponseWriter, r *http.Request) error {
	text, err := textParam(r)
	if err != nil {
		return err
	}
	d, err := s.svc.SnapshotDiff(r.Context(), r.PathValue("sid"), text)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, d)
	return nil
}

func (s *server) diff(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	text, err := textParam(r)
	if err != nil {
		return err
	}
	from, to := q.Get("from"), q.Get("to")
	if from == "" || to == "" {
		return errdefs.Invalidf("from and to: both query parameters are required (a jail id or name, or a snapshot id)")
	}
	d, err := s.svc.Diff(r.Context(), from, to, text)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, d)
	return nil
}

// SnapshotService is the snapshot part of Service: snapshots of jails,
// restores and branches from them, and diffs between jails and snapshots.
// A sid is a snapshot id; a ref a jail's id or name.
type SnapshotService interface {
	// Snapshot records the running jail ref (mode "full", the default:
	// processes and filesystem; "fs": filesystem only). The jail keeps
	// running. ErrNotImplemented with the reason when process checkpoints
	// are unavailable; ErrUnprocessable naming the process and resource
	// when the jail's processes cannot be recorded.
	Snapshot(ctx context.Context, ref string, req model.SnapshotRequest) (*model.Snapshot, error)
	// ListSnapshots returns the snapshots of jail ref (of a destroyed jail
	// too, by its id), or every snapshot when ref is "", oldest first.
	ListSnapshots(ctx context.Context, ref string) ([]*model.Snapshot, error)
	// GetSnapshot returns one snapshot (ErrNotFound if sid names none).
	GetSnapshot(ctx context.Context, sid string) (*model.Snapshot, error)
	// DeleteSnapshot removes a snapshot and all it holds (ErrConflict
	// while a restore from it runs).
	DeleteSnapshot(ctx context.Context, sid string) error
	// Restore makes a new running jail in the snapshot's state.
	Restore(ctx context.Context, sid, name string) (*model.Jail, error)
	// Branch makes req.Count (1..model.MaxBranches) independent running
	// jails from one snapshot, named as req says; all or none.
	Branch(ctx context.Context, sid string, req model.BranchRequest) ([]*model.Jail, error)
	// PushSnapshot writes a snapshot to an OCI registry as the artifact
	// req.Ref (its record, process images and disk image).
	PushSnapshot(ctx context.Context, sid string, req model.SnapshotPushRequest) (*model.SnapshotPush, error)
	// PullSnapshot fetches the snapshot artifact req.Ref into a new
	// snapshot; what this daemon could not restore is refused (4xx)
	// before its layers are fetched, and a failed pull leaves nothing.
	PullSnapshot(ctx context.Context, req model.SnapshotPullRequest) (*model.Snapshot, error)
	// SnapshotDiff compares a snapshot with its jail as it is now.
	SnapshotDiff(ctx context.Context, sid string, text bool) (*model.FsDiff, error)
	// Diff compares the filesystems of from and to, each a jail ref or a
	// snapshot id; text adds unified diffs of text files.
	Diff(ctx context.Context, from, to string, text bool) (*model.FsDiff, error)
}
