package snapshot

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentjail/agentjail/internal/storage"
)

// MountImage mounts the XFS disk image img read-only at a new directory
// below parent and returns that directory and the function that unmounts
// and removes it (which the caller must call). The image may be a copy of
// a mounted disk: norecovery skips its log, nouuid lets it sit beside the
// disk it was copied from. The loop device goes with the mount.
func MountImage(img, parent string) (string, func() error, error) {
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return "", nil, fmt.Errorf("mount %s: %w", img, err)
	}
	dir, err := os.MkdirTemp(parent, filepath.Base(strings.TrimSuffix(img, ".img"))+"-")
	if err != nil {
		return "", nil, fmt.Errorf("mount %s: %w", img, err)
	}
	if err := storage.MountReadOnly(img, dir, "xfs", "norecovery,nouuid"); err != nil {
		os.Remove(dir)
		return "", nil, err
	}
	release := func() error {
		if err := storage.Unmount(dir); err != nil {
			return err
		}
		return os.Remove(dir)
	}
	return dir, release, nil
}
