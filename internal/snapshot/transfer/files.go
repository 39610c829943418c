package transfer

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/agentjail/agentjail/internal/errdefs"
)

// maxEntries bounds the entries of a snapshot's files archive.
const maxEntries = 100_000

// writeFiles writes the tree dir as a tar stream: its directories and
// regular files (modes and sizes; no owners, times or other types), in
// lexical order, leaving out the names skip lists at the top.
func writeFiles(w io.Writer, dir string, skip ...string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		for _, s := range skip {
			if rel == s {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: filepath.ToSlash(rel), Mode: int64(fi.Mode().Perm()), Format: tar.FormatPAX}
		switch {
		case d.IsDir():
			hdr.Typeflag = tar.TypeDir
			hdr.Name += "/"
		case d.Type().IsRegular():
			hdr.Typeflag = tar.TypeReg
			hdr.Size = fi.Size()
		default:
			return fmt.Errorf("%s is neither a file nor a directory (%s); a snapshot that holds one cannot be pushed", p, fi.Mode().Type())
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		if n, err := io.Copy(tw, f); err != nil {
			return err
		} else if n != hdr.Size {
			return fmt.Errorf("%s changed while it was read", p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// readFiles unpacks the tar stream r into dir (which exists and is
// empty): directories and regular files only, every name relative and
// inside dir, at most limit bytes of file content and maxEntries entries.
// Anything else is errdefs.ErrUnprocessable naming the entry. What was
// unpacked before an error stays for the caller to remove.
func readFiles(r io.Reader, dir string, limit int64) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	var total int64
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return errdefs.Wrap(errdefs.ErrUnprocessable, err, "the snapshot's files are not a tar archive")
		}
		if n >= maxEntries {
			return errdefs.Unprocessablef("the snapshot's files hold more than %d entries", maxEntries)
		}
		name, err := entryName(hdr.Name)
		if err != nil {
			return err
		}
		mode := os.FileMode(hdr.Mode).Perm()
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.Mkdir(name, mode|0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return entryErr(hdr.Name, err)
			}
		case tar.TypeReg:
			if hdr.Size < 0 || hdr.Size > limit-total {
				return errdefs.New(errdefs.ErrTooLarge, "the snapshot's files hold more than the limit of %d bytes (at %q)", limit, hdr.Name)
			}
			total += hdr.Size
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode|0o600)
			if err != nil {
				return entryErr(hdr.Name, err)
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				if errors.Is(err, io.ErrUnexpectedEOF) {
					return errdefs.Wrap(errdefs.ErrUnprocessable, err, "the snapshot's files end inside %q", hdr.Name)
				}
				return err
			}
		default:
			return errdefs.Unprocessablef("the snapshot's files hold %q of tar type %q; only files and directories may be in a snapshot", hdr.Name, hdr.Typeflag)
		}
	}
}

// entryName checks a tar entry's name: relative, clean, inside the tree.
func entryName(name string) (string, error) {
	clean := path.Clean(strings.TrimSuffix(name, "/"))
	if name == "" || path.IsAbs(name) || clean == "." || clean == ".." || strings.HasPrefix(clean, "../") || strings.Contains(name, "\x00") {
		return "", errdefs.Unprocessablef("the snapshot's files hold an entry named %q, outside the snapshot", name)
	}
	for _, part := range strings.Split(strings.TrimSuffix(name, "/"), "/") {
		if part == ".." {
			return "", errdefs.Unprocessablef("the snapshot's files hold an entry named %q, outside the snapshot", name)
		}
	}
	return filepath.FromSlash(clean), nil
}

// entryErr describes a failure to unpack entry: one os.Root refused
// (it would leave the tree) is the artifact's fault.
func entryErr(entry string, err error) error {
	if errors.Is(err, fs.ErrExist) || strings.Contains(err.Error(), "path escapes") {
		return errdefs.Wrap(errdefs.ErrUnprocessable, err, "the snapshot's files: entry %q", entry)
	}
	return fmt.Errorf("the snapshot's files: entry %q: %w", entry, err)
}
