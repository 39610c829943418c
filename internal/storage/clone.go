package storage

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/errdefs"
)

// CloneFile makes dst (which must not exist) a reflink copy of src. On
// error dst does not exist.
func CloneFile(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("clone %s: %w", src, err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return errdefs.Conflictf("clone %s: %s already exists", src, dst)
	}
	if err != nil {
		return fmt.Errorf("clone %s: %w", src, err)
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("clone %s to %s: %w", src, dst, cerr)
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	if err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd())); err != nil {
		return fmt.Errorf("clone %s to %s: %w", src, dst, err)
	}
	return nil
}
