// Package atomicfile replaces files so that a reader, and the machine after
// a crash or a power loss, sees either the old content or the new one, never
// a part of it or an empty file. The new content goes to a temporary file
// in the target's directory, which is synced, renamed over the target, and
// the directory is synced so that the rename itself is durable.
//
// Refresh keeps the first promise without the second, for files that are
// derived from durable state and written again before every use.
package atomicfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// tmpPattern names the temporary files: hidden, and never ending like the
// target, so that listings of a directory by suffix pass them over.
func tmpPattern(path string) string { return "." + filepath.Base(path) + ".tmp-*" }

// WriteFile replaces path with data, with permissions perm (not altered
// by the umask). On error path is unchanged and no temporary file is left.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	f, err := Create(path, perm)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Abort()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Commit()
}

// Refresh replaces path with data, with permissions perm, so that a
// reader sees either the old content or the new one, like WriteFile, but
// without waiting for the disk: after a crash or a power loss path may
// hold either, or be empty. When path already holds data with perm it is
// left alone. Refresh is for files derived from durable state and written
// again before each use (a container's runtime spec, the configuration a
// process reads when it starts), which no one reads after a crash before
// they are written again. On error path is unchanged and no temporary file
// is left.
func Refresh(path string, data []byte, perm os.FileMode) error {
	if holds(path, data, perm) {
		return nil
	}
	f, err := Create(path, perm)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Abort()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.commit(false)
}

// holds reports whether path is a regular file (not a link to one) with
// permissions perm whose content is data.
func holds(path string, data []byte, perm os.FileMode) bool {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != perm || st.Size() != int64(len(data)) {
		return false
	}
	old := make([]byte, len(data)+1)
	n, _ := io.ReadFull(f, old)
	return n == len(data) && bytes.Equal(old[:n], data)
}

// File is the new content of a file being written; Commit puts it in place
// of its target, Abort throws it away. Exactly one of them must be called.
type File struct {
	*os.File
	path string
	done bool
}

// Create starts replacing path: it returns a temporary file, with
// permissions perm, in path's directory.
func Create(path string, perm os.FileMode) (*File, error) {
	f, err := os.CreateTemp(filepath.Dir(path), tmpPattern(path))
	if err != nil {
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	return &File{File: f, path: path}, nil
}

// Commit syncs and closes the file, renames it over its target and syncs
// the directory. On error the target is unchanged (or, if only the final
// directory sync failed, replaced but perhaps not durably) and the
// temporary file is removed.
func (f *File) Commit() error { return f.commit(true) }

// commit closes the file and renames it over its target; durable syncs
// the file before and the directory after.
func (f *File) commit(durable bool) error {
	if f.done {
		return fmt.Errorf("write %s: already committed or aborted", f.path)
	}
	f.done = true
	var serr error
	if durable {
		serr = f.Sync()
	}
	cerr := f.Close()
	if err := errors.Join(serr, cerr); err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("write %s: %w", f.path, err)
	}
	if err := os.Rename(f.Name(), f.path); err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("write %s: %w", f.path, err)
	}
	if !durable {
		return nil
	}
	if err := SyncDir(filepath.Dir(f.path)); err != nil {
		return fmt.Errorf("write %s: %w", f.path, err)
	}
	return nil
}

// Abort closes and removes the temporary file, leaving the target as it
// was. It is a no-op after Commit or another Abort, so it may be deferred.
func (f *File) Abort() {
	if f.done {
		return
	}
	f.done = true
	f.Close()
	os.Remove(f.Name())
}

// Rename moves oldpath, a complete file written by other means (another
// program, a stream closed by its writer), to newpath durably: the file's
// data is synced before the rename and newpath's directory after it.
func Rename(oldpath, newpath string) error {
	if err := syncData(oldpath); err != nil {
		return fmt.Errorf("rename %s: %w", oldpath, err)
	}
	if err := os.Rename(oldpath, newpath); err != nil {
		return err
	}
	if err := SyncDir(filepath.Dir(newpath)); err != nil {
		return fmt.Errorf("rename %s: %w", oldpath, err)
	}
	return nil
}

// Sync makes the file at path, written by other means (Refresh, another
// program), durable where it is: its data, then its name in its
// directory.
func Sync(path string) error {
	if err := syncData(path); err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// syncData syncs the data of the file at path.
func syncData(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(serr, cerr); err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return nil
}

// SyncDir syncs the directory dir, making the creation, removal and
// renaming of its entries durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}
