package snapshot

import (
	"bytes"
	"context"
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
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/model"
)

// Change kinds.
const (
	Added    = "added"
	Modified = "modified"
	Deleted  = "deleted"
)

// Tree is an overlay root seen from the host: a read-only lower tree and
// the upper layer holding the changes (with overlayfs's whiteouts and
// opaque directories). Lower may be empty (no lower tree).
type Tree struct {
	Lower, Upper string
}

// entry is one path of a tree as the merged view shows it.
type entry struct {
	host string // host path of the visible file
	st   unix.Stat_t
}

// resolve finds jail path p (absolute, clean) in the merged view of t, by
// overlayfs's rules: an upper entry hides the lower one, a whiteout (a 0/0
// character device) deletes it, an opaque upper directory hides the whole
// lower directory, and a lower entry is only visible below directories.
func (t Tree) resolve(p string) (*entry, bool) {
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	up, low := t.Upper, t.Lower
	upperOK, lowerOK := true, t.Lower != ""
	for i, part := range parts {
		last := i == len(parts)-1
		up, low = filepath.Join(up, part), filepath.Join(low, part)
		if upperOK {
			var st unix.Stat_t
			if err := unix.Lstat(up, &st); err == nil {
				if isWhiteout(&st) {
					return nil, false
				}
				if last {
					return &entry{host: up, st: st}, true
				}
				if st.Mode&unix.S_IFMT != unix.S_IFDIR {
					return nil, false
				}
				if isOpaque(up) {
					lowerOK = false
				}
				if lowerOK {
					var lst unix.Stat_t
					if unix.Lstat(low, &lst) != nil || lst.Mode&unix.S_IFMT != unix.S_IFDIR {
						lowerOK = false
					}
				}
				continue
			}
			upperOK = false
		}
		if !lowerOK {
			return nil, false
		}
		var st unix.Stat_t
		if err := unix.Lstat(low, &st); err != nil {
			return nil, false
		}
		if last {
			return &entry{host: low, st: st}, true
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return nil, false
		}
	}
	return nil, false
}

func isWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

func isOpaque(dir string) bool {
	buf := make([]byte, 4)
	for _, attr := range []string{"trusted.overlay.opaque", "user.overlay.opaque"} {
		if n, err := unix.Lgetxattr(dir, attr, buf); err == nil && n > 0 && buf[0] == 'y' {
			return true
		}
	}
	return false
}

// candidates collects the jail paths that may differ between trees whose
// lower trees are the same: every path of either upper layer, and the
// lower children of opaque upper directories.
func candidates(trees []Tree, skip func(string) bool, into map[string]bool) error {
	for _, t := range trees {
		err := filepath.WalkDir(t.Upper, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(t.Upper, p)
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
			into[jp] = true
			if d.IsDir() && t.Lower != "" && isOpaque(p) {
				if kids, err := os.ReadDir(filepath.Join(t.Lower, rel)); err == nil {
					for _, k := range kids {
						into[path.Join(jp, k.Name())] = true
					}
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("fs diff of %s: %w", t.Upper, err)
		}
	}
	return nil
}

// Diff lists what changed from tree a to tree b, sorted by path: entries
// added (every one, down to files in added directories), modified (type,
// content, mode or link target) and deleted (the topmost deleted entry
// only). Both trees must share their lower tree's content; paths skip
// prunes (with what is below them). With text, modified, added and
// deleted text files up to 1 MiB carry a unified diff, other regular files
// a line saying they are binary or too large (see textDiff for the bounds).
func Diff(ctx context.Context, a, b Tree, skip func(string) bool, text bool) (*model.FsDiff, error) {
	budget := &textBudget{left: maxTextOutput}
	set := map[string]bool{}
	if err := candidates([]Tree{a, b}, skip, set); err != nil {
		return nil, err
	}
	paths := make([]string, 0, len(set))
	for p := range set {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	d := &model.FsDiff{Changes: []model.Change{}}
	for _, p := range paths {
		ea, inA := a.resolve(p)
		eb, inB := b.resolve(p)
		var c model.Change
		switch {
		case !inA && !inB:
			continue
		case !inA:
			c = describe(p, eb)
			c.Kind = Added
			d.Added++
			if text {
				c.Diff = textDiff(ctx, p, nil, eb, budget)
			}
		case !inB:
			if _, parentInB := b.resolve(path.Dir(p)); path.Dir(p) != "/" && !parentInB {
				continue // the deleted parent directory says it
			}
			c = describe(p, ea)
			c.Kind = Deleted
			d.Deleted++
			if text {
				c.Diff = textDiff(ctx, p, ea, nil, budget)
			}
		default:
			if ea.host == eb.host {
				continue
			}
			oldC, newC := describe(p, ea), describe(p, eb)
			if oldC.Type == newC.Type && oldC.Mode == newC.Mode && oldC.Size == newC.Size &&
				oldC.SHA256 == newC.SHA256 && linkTarget(ea) == linkTarget(eb) {
				continue
			}
			c = newC
			c.Kind = Modified
			c.OldSize, c.OldMode, c.OldSHA256 = oldC.Size, oldC.Mode, oldC.SHA256
			d.Changed++
			if text {
				c.Diff = textDiff(ctx, p, ea, eb, budget)
			}
		}
		d.Changes = append(d.Changes, c)
	}
	return d, nil
}

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

// describe fills a Change with the entry's type, size, mode and, for a
// regular file, the sha256 of its content.
func describe(p string, e *entry) model.Change {
	c := model.Change{Path: p, Type: typeOf(&e.st), Mode: fmt.Sprintf("%04o", e.st.Mode&07777)}
	switch c.Type {
	case "file":
		c.Size = e.st.Size
		c.SHA256, _ = hashFile(e.host)
	case "symlink":
		c.Size = e.st.Size
	}
	return c
}

func linkTarget(e *entry) string {
	if e.st.Mode&unix.S_IFMT != unix.S_IFLNK {
		return ""
	}
	t, _ := os.Readlink(e.host)
	return t
}

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

// readText returns the content of a regular text file of at most
// maxTextDiff bytes (nil entry: empty), and false when it is binary or
// larger.
func readText(e *entry) ([]byte, bool) {
	if e == nil {
		return nil, true
	}
	if e.st.Size > maxTextDiff {
		return nil, false
	}
	f, err := os.OpenFile(e.host, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxTextDiff+1))
	if err != nil || len(data) > maxTextDiff || bytes.IndexByte(data, 0) >= 0 || !utf8.Valid(data) {
		return nil, false
	}
	return data, true
}

// SkipInternal prunes the paths agentjail itself mounts into every jail.
func SkipInternal(jp string) bool {
	return jp == "/.agentjail" || strings.HasPrefix(jp, "/.agentjail/")
}
