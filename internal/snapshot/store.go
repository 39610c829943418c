// Package snapshot keeps the records of jail snapshots and compares file
// trees. A snapshot lives in two places: DATA_DIR/snapshots/{sid}/ holds
// metadata.json and whatever the backend recorded (process images), and
// DATA_DIR/pool/snapshots/{sid}.img is the copy of the jail's disk, in the
// storage pool so that it is a reflink of the jail's image (O(1) to make,
// sharing every unchanged block). Snapshots do not live under their jail's
// directory: they outlive the jail, as the branch points of its family.
//
// Diff compares any two overlay trees (a jail's live upper layer or a
// snapshot's, each over its lower tree) without mounting them: only the
// paths either upper layer holds can differ.
package snapshot

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/agentjail/agentjail/internal/atomicfile"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
)

// RecordFile is the record of a snapshot in its directory; a directory
// without one is a snapshot that was never completed (or, for a snapshot
// being pulled, not yet complete).
const RecordFile = "metadata.json"

// Store is the snapshots of one data dir. Its methods are safe for
// concurrent use on different ids; the caller serialises use of one id.
type Store struct {
	dir    string // DATA_DIR/snapshots
	images string // DATA_DIR/pool/snapshots
}

// Open returns the store of dataDir, creating its directories. The
// storage pool must be mounted at dataDir/pool. What incomplete snapshots
// (a crash while one was taken) left stays until Sweep.
func Open(dataDir string) (*Store, error) {
	s := &Store{dir: filepath.Join(dataDir, "snapshots"), images: filepath.Join(dataDir, "pool", "snapshots")}
	for _, d := range []string{s.dir, s.images} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("snapshot store: %w", err)
		}
	}
	return s, nil
}

// Sweep removes incomplete snapshot dirs and images without a record. Call
// it when no snapshot is being taken: once the checkpoints a crashed
// daemon left running have ended.
func (s *Store) Sweep() error {
	dirs, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("snapshot store: %w", err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(s.dir, d.Name(), RecordFile)); errors.Is(err, fs.ErrNotExist) {
			if err := s.Remove(d.Name()); err != nil {
				return err
			}
		}
	}
	imgs, err := os.ReadDir(s.images)
	if err != nil {
		return fmt.Errorf("snapshot store: %w", err)
	}
	for _, f := range imgs {
		sid := strings.TrimSuffix(f.Name(), ".img")
		if _, err := os.Stat(filepath.Join(s.dir, sid, RecordFile)); errors.Is(err, fs.ErrNotExist) {
			if err := os.Remove(filepath.Join(s.images, f.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("snapshot store: %w", err)
			}
		}
	}
	return nil
}

// NewID returns a fresh snapshot id.
func NewID() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return "s" + hex.EncodeToString(b[:])
}

// ValidID reports whether sid can name a snapshot (and so a file).
func ValidID(sid string) bool {
	if len(sid) < 2 || len(sid) > 64 || sid[0] != 's' {
		return false
	}
	for _, c := range sid[1:] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func checkID(sid string) error {
	if !ValidID(sid) {
		return errdefs.NotFoundf("no snapshot with id %q", sid)
	}
	return nil
}

// Dir returns the directory of snapshot sid.
func (s *Store) Dir(sid string) string { return filepath.Join(s.dir, sid) }

// Image returns the path of snapshot sid's disk image.
func (s *Store) Image(sid string) string { return filepath.Join(s.images, sid+".img") }

// Create makes the (empty) directory of a new snapshot sid.
func (s *Store) Create(sid string) error {
	if err := checkID(sid); err != nil {
		return err
	}
	if err := os.Mkdir(s.Dir(sid), 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return errdefs.Conflictf("snapshot %s already exists", sid)
		}
		return fmt.Errorf("snapshot %s: %w", sid, err)
	}
	return nil
}

// Save writes snap's record atomically; from then on the snapshot exists.
func (s *Store) Save(snap *model.Snapshot) error {
	if err := checkID(snap.ID); err != nil {
		return err
	}
	data, err := json.MarshalIndent(snap, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(s.Dir(snap.ID), RecordFile), data, 0o600); err != nil {
		return fmt.Errorf("snapshot %s: %w", snap.ID, err)
	}
	return nil
}

// Get reads the record of snapshot sid (errdefs.ErrNotFound if there is
// no such complete snapshot).
func (s *Store) Get(sid string) (*model.Snapshot, error) {
	if err := checkID(sid); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(s.Dir(sid), RecordFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errdefs.NotFoundf("no snapshot with id %q", sid)
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", sid, err)
	}
	var snap model.Snapshot
	if err := json.Unmarshal(data, &snap); err != nil {
		return nil, fmt.Errorf("snapshot %s: unreadable record: %w", sid, err)
	}
	return &snap, nil
}

// List returns every complete snapshot, oldest first.
func (s *Store) List() ([]*model.Snapshot, error) {
	dirs, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("snapshot store: %w", err)
	}
	out := []*model.Snapshot{}
	for _, d := range dirs {
		if !d.IsDir() || !ValidID(d.Name()) {
			continue
		}
		snap, err := s.Get(d.Name())
		if errors.Is(err, errdefs.ErrNotFound) {
			continue // being taken, or being removed
		}
		if err != nil {
			return nil, err
		}
		out = append(out, snap)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].ID < out[j].ID
		}
		return out[i].CreatedAt.Before(out[j].CreatedAt)
	})
	return out, nil
}

// Remove deletes snapshot sid: its record first (so it stops existing at
// once), then its image and directory. Idempotent.
func (s *Store) Remove(sid string) error {
	if err := checkID(sid); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(s.Dir(sid), RecordFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove snapshot %s: %w", sid, err)
	}
	if err := os.Remove(s.Image(sid)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove snapshot %s: %w", sid, err)
	}
	if err := os.RemoveAll(s.Dir(sid)); err != nil {
		return fmt.Errorf("remove snapshot %s: %w", sid, err)
	}
	return nil
}

// RemoveAll deletes every snapshot (teardown).
func (s *Store) RemoveAll() error {
	dirs, err := os.ReadDir(s.dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("snapshot store: %w", err)
	}
	var errs []error
	for _, d := range dirs {
		if ValidID(d.Name()) {
			errs = append(errs, s.Remove(d.Name()))
		}
	}
	if err := os.RemoveAll(s.images); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ImageBytes returns the apparent size of snapshot sid's disk image (0 if
// it has none).
func (s *Store) ImageBytes(sid string) int64 {
	fi, err := os.Stat(s.Image(sid))
	if err != nil {
		return 0
	}
	return fi.Size()
}
