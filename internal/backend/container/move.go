package container

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/agentjail/agentjail/internal/atomicfile"
	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/errdefs"
)

var _ backend.CheckpointMover = (*Backend)(nil)

// reqInit is the requirement of a process checkpoint moved to another
// host: the sha256 of the init binary its processes ran (CRIU restores
// only onto the same executable, and a restore binds this daemon's).
const reqInit = "container.init-sha256"

// Requirements implements backend.CheckpointMover.
func (b *Backend) Requirements(dir string) (map[string]string, error) {
	info, err := readCheckpointInfo(dir)
	if errors.Is(err, fs.ErrNotExist) || err == nil && info.InitBinary == "" {
		return nil, nil // a filesystem checkpoint: a restore boots init
	}
	if err != nil {
		return nil, err
	}
	sum, err := fileSHA256(info.InitBinary)
	if err != nil {
		return nil, fmt.Errorf("the checkpoint's init binary: %w", err)
	}
	return map[string]string{reqInit: sum}, nil
}

// Adopt implements backend.CheckpointMover.
func (b *Backend) Adopt(dir string, req map[string]string) error {
	want := req[reqInit]
	if want == "" {
		return nil
	}
	have, err := fileSHA256(b.opts.InitBinary)
	if err != nil {
		return fmt.Errorf("this daemon's init binary: %w", err)
	}
	if have != want {
		return errdefs.Conflictf("the snapshot's processes run another agentjail build (init binary sha256 %.12s; this daemon's %s is %.12s): restore it on a daemon of that build", want, b.opts.InitBinary, have)
	}
	if dir == "" {
		return nil
	}
	info, err := readCheckpointInfo(dir)
	if err != nil {
		return err
	}
	info.InitBinary = b.opts.InitBinary
	data, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(dir, checkpointRec), data, 0o600)
}

func readCheckpointInfo(dir string) (*checkpointInfo, error) {
	data, err := os.ReadFile(filepath.Join(dir, checkpointRec))
	if err != nil {
		return nil, err
	}
	var info checkpointInfo
	if err := json.Unmarshal(data, &info); err != nil {
		return nil, errdefs.Wrap(errdefs.ErrUnprocessable, err, "the checkpoint's record")
	}
	return &info, nil
}

// digests caches fileSHA256 by path, size and modification time: the
// binaries hashed are tens of megabytes and rarely change.
var digests sync.Map // digestKey → string

type digestKey struct {
	path  string
	size  int64
	mtime time.Time
}

// fileSHA256 is the hex sha256 of the file at path.
func fileSHA256(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	key := digestKey{path, fi.Size(), fi.ModTime()}
	if sum, ok := digests.Load(key); ok {
		return sum.(string), nil
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	digests.Store(key, sum)
	return sum, nil
}
