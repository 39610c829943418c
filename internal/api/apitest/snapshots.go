package apitest

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
)

// fakeSnapshot is a snapshot: the record and a copy of the jail's files.
type fakeSnapshot struct {
	s     model.Snapshot
	files map[string]*node
}

func copyFiles(in map[string]*node) map[string]*node {
	out := make(map[string]*node, len(in))
	for p, n := range in {
		c := *n
		c.data = bytes.Clone(n.data)
		out[p] = &c
	}
	return out
}

// Snapshot copies the jail's files (mode full or fs alike).
func (s *Service) Snapshot(_ context.Context, ref string, req model.SnapshotRequest) (*model.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fj, err := s.running(ref)
	if err != nil {
		return nil, err
	}
	mode := req.Mode
	if mode == "" {
		mode = model.SnapshotFull
	}
	if mode != model.SnapshotFull && mode != model.SnapshotFS {
		return nil, errdefs.Invalidf("mode: %q must be full or fs", mode)
	}
	if s.snaps == nil {
		s.snaps = map[string]*fakeSnapshot{}
	}
	s.next++
	sid := fmt.Sprintf("s%011x", s.next)
	name := req.Name
	if name == "" {
		name = fj.j.Name + "-" + sid[1:7]
	}
	snap := &fakeSnapshot{files: copyFiles(fj.files), s: model.Snapshot{
		ID: sid, Name: name, JailID: fj.j.ID, JailName: fj.j.Name, Mode: mode, CreatedAt: time.Now().UTC(),
		Parent: model.Lineage{Kind: model.LineageJail, ID: fj.j.ID, Name: fj.j.Name}, Config: fj.j.Config,
	}}
	s.snaps[sid] = snap
	out := snap.s
	return &out, nil
}

// ListSnapshots lists the snapshots of a jail (all when ref is "").
func (s *Service) ListSnapshots(_ context.Context, ref string) ([]*model.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := ""
	if ref != "" {
		fj, err := s.lookup(ref)
		if err != nil {
			return nil, err
		}
		id = fj.j.ID
	}
	out := []*model.Snapshot{}
	for _, sn := range s.snaps {
		if id == "" || sn.s.JailID == id {
			c := sn.s
			out = append(out, &c)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].ID < out[b].ID })
	return out, nil
}

func (s *Service) snapshot(sid string) (*fakeSnapshot, error) {
	sn, ok := s.snaps[sid]
	if !ok {
		return nil, errdefs.NotFoundf("no snapshot with id %q", sid)
	}
	return sn, nil
}

// GetSnapshot returns one snapshot.
func (s *Service) GetSnapshot(_ context.Context, sid string) (*model.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sn, err := s.snapshot(sid)
	if err != nil {
		return nil, err
	}
	out := sn.s
	return &out, nil
}

// DeleteSnapshot forgets a snapshot.
func (s *Service) DeleteSnapshot(_ context.Context, sid string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.snapshot(sid); err != nil {
		return err
	}
	delete(s.snaps, sid)
	return nil
}

// restoreLocked makes a running jail holding the snapshot's files.
func (s *Service) restoreLocked(sn *fakeSnapshot, name string) (*model.Jail, error) {
	s.next++
	id := fmt.Sprintf("%012x", s.next)
	if name == "" {
		name = sn.s.Name + "-" + id[:6]
	}
	if _, err := s.lookup(name); err == nil {
		return nil, errdefs.Conflictf("a jail named %q already exists", name)
	}
	now := time.Now().UTC()
	fj := &fakeJail{files: copyFiles(sn.files), j: model.Jail{
		ID: id, Name: name, Status: model.StateRunning, CreatedAt: now, StartedAt: &now, Pid: 4242,
		Config: sn.s.Config, Parent: &model.Lineage{Kind: model.LineageSnapshot, ID: sn.s.ID, Name: sn.s.Name},
	}}
	s.jails[id] = fj
	out := fj.j
	return &out, nil
}

// Restore makes a running jail from a snapshot.
func (s *Service) Restore(_ context.Context, sid, name string) (*model.Jail, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sn, err := s.snapshot(sid)
	if err != nil {
		return nil, err
	}
	return s.restoreLocked(sn, name)
}

// Branch makes count jails from a snapshot.
func (s *Service) Branch(_ context.Context, sid string, req model.BranchRequest) ([]*model.Jail, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sn, err := s.snapshot(sid)
	if err != nil {
		return nil, err
	}
	count := req.Count
	if count == 0 {
		count = max(len(req.Names), 1)
	}
	if count < 1 || count > model.MaxBranches {
		return nil, errdefs.Invalidf("count: %d must be between 1 and %d", count, model.MaxBranches)
	}
	prefix := req.NamePrefix
	if prefix == "" {
		prefix = sn.s.Name
	}
	var out []*model.Jail
	for i := 1; i <= count; i++ {
		name := fmt.Sprintf("%s-%d", prefix, i)
		if i <= len(req.Names) {
			name = req.Names[i-1]
		}
		j, err := s.restoreLocked(sn, name)
		if err != nil {
			return nil, err
		}
		out = append(out, j)
	}
	return out, nil
}

// treeFiles returns the files of a jail ref or snapshot id.
func (s *Service) treeFiles(ref string) (map[string]*node, error) {
	if sn, ok := s.snaps[ref]; ok {
		return sn.files, nil
	}
	fj, err := s.lookup(ref)
	if err != nil {
		return nil, errdefs.NotFoundf("no jail or snapshot %q", ref)
	}
	return fj.files, nil
}

// Diff compares the file maps of two jails or snapshots.
func (s *Service) Diff(_ context.Context, from, to string, text bool) (*model.FsDiff, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, err := s.treeFiles(from)
	if err != nil {
		return nil, err
	}
	b, err := s.treeFiles(to)
	if err != nil {
		return nil, err
	}
	set := map[string]bool{}
	for p := range a {
		set[p] = true
	}
	for p := range b {
		set[p] = true
	}
	paths := make([]string, 0, len(set))
	for p := range set {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	d := &model.FsDiff{Changes: []model.Change{}}
	for _, p := range paths {
		na, nb := a[p], b[p]
		switch {
		case na == nil:
			d.Changes = append(d.Changes, model.Change{Path: p, Kind: "added", Type: "file", Size: int64(len(nb.data))})
			d.Added++
		case nb == nil:
			d.Changes = append(d.Changes, model.Change{Path: p, Kind: "deleted", Type: "file", Size: int64(len(na.data))})
			d.Deleted++
		case !bytes.Equal(na.data, nb.data):
			c := model.Change{Path: p, Kind: "modified", Type: "file", Size: int64(len(nb.data)), OldSize: int64(len(na.data))}
			if text {
				c.Diff = fmt.Sprintf("--- a%s\n+++ b%s\n", p, p)
			}
			d.Changes = append(d.Changes, c)
			d.Changed++
		}
	}
	return d, nil
}

// SnapshotDiff compares a snapshot with its jail.
func (s *Service) SnapshotDiff(ctx context.Context, sid string, text bool) (*model.FsDiff, error) {
	s.mu.Lock()
	sn, err := s.snapshot(sid)
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return s.Diff(ctx, sid, sn.s.JailID, text)
}

// PushSnapshot keeps a copy of the snapshot under req.Ref (the fake's
// registry is in memory).
func (s *Service) PushSnapshot(_ context.Context, sid string, req model.SnapshotPushRequest) (*model.SnapshotPush, error) {
	if req.Ref == "" {
		return nil, errdefs.Invalidf("ref: required")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sn, err := s.snapshot(sid)
	if err != nil {
		return nil, err
	}
	if s.pushed == nil {
		s.pushed = map[string]*fakeSnapshot{}
	}
	s.pushed[req.Ref] = &fakeSnapshot{s: sn.s, files: copyFiles(sn.files)}
	out := sn.s
	return &model.SnapshotPush{Ref: req.Ref, Digest: "sha256:" + fmt.Sprintf("%064x", len(s.pushed)), Snapshot: &out}, nil
}

// PullSnapshot makes a new snapshot of what was pushed to req.Ref.
func (s *Service) PullSnapshot(_ context.Context, req model.SnapshotPullRequest) (*model.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.pushed[req.Ref]
	if !ok {
		return nil, errdefs.NotFoundf("pull %s: no such artifact", req.Ref)
	}
	s.next++
	sid := fmt.Sprintf("s%011x", s.next)
	sn := &fakeSnapshot{s: p.s, files: copyFiles(p.files)}
	sn.s.Source = &model.SnapshotSource{Ref: req.Ref, ID: p.s.ID, PulledAt: time.Now().UTC()}
	sn.s.ID = sid
	if req.Name != "" {
		sn.s.Name = req.Name
	}
	s.snaps[sid] = sn
	out := sn.s
	return &out, nil
}
