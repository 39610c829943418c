// Package fsdiff tells what an overlay's upper layer changes in its lower
// tree: added, modified and deleted entries with their types, sizes, modes
// and sha256 hashes, following overlayfs's own rules (a 0/0 character
// device is a whiteout, a directory marked opaque hides the lower one).
package fsdiff

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/model"
)

// Change kinds.
const (
	Added    = "added"
	Modified = "modified"
	Deleted  = "deleted"
)

// Upper lists the changes the overlay upper dir makes to lower, sorted by
// path. Paths are jail paths ("/etc/hosts"). skip, when set, prunes jail
// paths (and what is below them) from the walk.
func Upper(lower, upper string, skip func(jailPath string) bool) ([]model.Change, error) {
	var out []model.Change
	err := filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(upper, p)
		if rel == "." {
			return nil
		}
		jp := "/" + filepath.ToSlash(rel)
		if skip != nil && skip(jp) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		lowerPath := filepath.Join(lower, rel)
		lst, lerr := lstat(lowerPath)
		inLower := lerr == nil
		switch {
		case isWhiteout(&st):
			if inLower {
				c := describe(jp, lowerPath, lst)
				c.Kind = Deleted
				out = append(out, c)
			}
			return nil
		case st.Mode&unix.S_IFMT == unix.S_IFDIR:
			if !inLower || lst.Mode&unix.S_IFMT != unix.S_IFDIR {
				if inLower {
					c := describe(jp, lowerPath, lst)
					c.Kind = Deleted
					out = append(out, c)
				}
				c := describe(jp, p, &st)
				c.Kind = Added
				out = append(out, c)
				return nil
			}
			if opaque(p) {
				gone, err := hiddenChildren(jp, lowerPath, p)
				if err != nil {
					return err
				}
				out = append(out, gone...)
			}
			if st.Mode&07777 != lst.Mode&07777 {
				c := describe(jp, p, &st)
				c.Kind = Modified
				c.OldMode = mode(lst)
				out = append(out, c)
			}
			return nil
		}
		c := describe(jp, p, &st)
		if !inLower {
			c.Kind = Added
			out = append(out, c)
			return nil
		}
		old := describe(jp, lowerPath, lst)
		if old.Type == c.Type && old.Size == c.Size && old.Mode == c.Mode && old.SHA256 == c.SHA256 && linkTarget(p) == linkTarget(lowerPath) {
			return nil // copied up without a change (e.g. touched)
		}
		c.Kind = Modified
		c.OldSize, c.OldMode, c.OldSHA256 = old.Size, old.Mode, old.SHA256
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("fs diff of %s: %w", upper, err)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Path == out[j].Path {
			return out[i].Kind == Deleted
		}
		return out[i].Path < out[j].Path
	})
	return out, nil
}

// Summary counts changes by kind.
func Summary(changes []model.Change) model.FsDiff {
	d := model.FsDiff{Changes: changes}
	if d.Changes == nil {
		d.Changes = []model.Change{}
	}
	for _, c := range changes {
		switch c.Kind {
		case Added:
			d.Added++
		case Modified:
			d.Changed++
		case Deleted:
			d.Deleted++
		}
	}
	return d
}

// hiddenChildren lists the lower children of an opaque directory that the
// upper does not have: they are deleted in the merged view.
func hiddenChildren(jp, lowerDir, upperDir string) ([]model.Change, error) {
	entries, err := os.ReadDir(lowerDir)
	if err != nil {
		return nil, err
	}
	var out []model.Change
	for _, e := range entries {
		if _, err := os.Lstat(filepath.Join(upperDir, e.Name())); err == nil {
			continue
		}
		lp := filepath.Join(lowerDir, e.Name())
		st, err := lstat(lp)
		if err != nil {
			continue
		}
		c := describe(path.Join(jp, e.Name()), lp, st)
		c.Kind = Deleted
		out = append(out, c)
	}
	return out, nil
}

func lstat(p string) (*unix.Stat_t, error) {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

func isWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

func opaque(dir string) bool {
	buf := make([]byte, 8)
	for _, attr := range []string{"trusted.overlay.opaque", "user.overlay.opaque"} {
		n, err := unix.Lgetxattr(dir, attr, buf)
		if err == nil && n > 0 && buf[0] == 'y' {
			return true
		}
	}
	return false
}

func mode(st *unix.Stat_t) string { return fmt.Sprintf("%04o", st.Mode&07777) }

func typeOf(st *unix.Stat_t) string {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFLNK:
		return "symlink"
	}
	return "other"
}

// describe fills a Change for the entry at host path p.
func describe(jp, p string, st *unix.Stat_t) model.Change {
	c := model.Change{Path: jp, Type: typeOf(st), Mode: mode(st)}
	if c.Type == "file" || c.Type == "symlink" {
		c.Size = st.Size
	}
	if c.Type == "file" {
		c.SHA256, _ = hashFile(p)
	}
	return c
}

func linkTarget(p string) string {
	t, _ := os.Readlink(p)
	return t
}

// hashFile returns the hex sha256 of a regular file's content.
func hashFile(p string) (string, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// SkipInternal prunes the paths agentjail itself mounts into every jail.
func SkipInternal(jp string) bool {
	return jp == "/.agentjail" || strings.HasPrefix(jp, "/.agentjail/")
}
