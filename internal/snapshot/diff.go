package snapshot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
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

// maxDiffPaths bounds the paths one Diff examines (a variable for the
// tests). A jail can make millions of files, and a diff holds every path it
// examines (and each change it lists) until it answers; past this many the
// diff is Truncated: it lists the changes among the paths read so far.
var maxDiffPaths = 100_000

// dirBatch is how many entries of a directory are read at a time, so that
// a directory of millions of entries is never held whole.
const dirBatch = 512

// candidates collects the jail paths that may differ between trees whose
// lower trees are the same: every path of either upper layer, and the
// lower children of opaque upper directories. It stops at limit paths and
// then reports true: into holds some of them.
func candidates(ctx context.Context, trees []Tree, skip func(string) bool, into map[string]bool, limit int) (bool, error) {
	// add takes path p in, unless the bound is reached.
	add := func(p string) bool {
		if !into[p] {
			if len(into) >= limit {
				return false
			}
			into[p] = true
		}
		return true
	}
	for _, t := range trees {
		// The directories still to read, by jail path.
		stack := []string{"/"}
		for len(stack) > 0 {
			jp := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			host := filepath.Join(t.Upper, filepath.FromSlash(jp))
			full, err := readDir(ctx, host, func(name string, dir bool) bool {
				cp := path.Join(jp, name)
				if skip != nil && skip(cp) {
					return true
				}
				if !add(cp) {
					return false
				}
				if dir {
					stack = append(stack, cp)
				}
				return true
			})
			if err != nil {
				return false, fmt.Errorf("fs diff of %s: %w", t.Upper, err)
			}
			if !full {
				return true, nil
			}
			if jp == "/" || t.Lower == "" || !isOpaque(host) {
				continue
			}
			full, err = readDir(ctx, filepath.Join(t.Lower, filepath.FromSlash(jp)), func(name string, _ bool) bool {
				return add(path.Join(jp, name))
			})
			if err != nil {
				return false, fmt.Errorf("fs diff of %s: %w", t.Lower, err)
			}
			if !full {
				return true, nil
			}
		}
	}
	return false, nil
}

// readDir calls fn for each entry of directory dir (with whether it is a
// directory, not following links), a batch at a time, until fn returns
// false; it reports whether it read them all. A directory that is gone,
// or is not one (a jail may have put a file or a link in its place since
// it was seen; a link is not followed), has no entries.
func readDir(ctx context.Context, dir string, fn func(name string, dir bool) bool) (bool, error) {
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	for {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		ents, err := f.ReadDir(dirBatch)
		for _, e := range ents {
			if !fn(e.Name(), e.IsDir()) {
				return false, nil
			}
		}
		if err == io.EOF {
			return true, nil
		}
		if err != nil {
			return false, err
		}
	}
}

// Diff lists what changed from tree a to tree b, sorted by path: entries
// added (every one, down to files in added directories), modified (type,
// content, mode or link target) and deleted (the topmost deleted entry
// only). Both trees must share their lower tree's content; paths skip
// prunes (with what is below them). With text, modified, added and
// deleted text files up to 1 MiB carry a unified diff, other regular files
// a line saying they are binary or too large (see textDiff for the bounds).
// At most maxDiffPaths paths are examined (see FsDiff.Truncated); ctx ends
// the work early.
func Diff(ctx context.Context, a, b Tree, skip func(string) bool, text bool) (*model.FsDiff, error) {
	budget := &textBudget{left: maxTextOutput}
	set := map[string]bool{}
	truncated, err := candidates(ctx, []Tree{a, b}, skip, set, maxDiffPaths)
	if err != nil {
		return nil, err
	}
	paths := make([]string, 0, len(set))
	for p := range set {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	d := &model.FsDiff{Changes: []model.Change{}, Truncated: truncated}
	for _, p := range paths {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ea, inA := a.resolve(p)
		eb, inB := b.resolve(p)
		var c model.Change
		switch {
		case !inA && !inB:
			continue
		case !inA:
			c = describe(ctx, p, eb)
			c.Kind = Added
			d.Added++
			if text {
				c.Diff = textDiff(ctx, p, nil, eb, budget)
			}
		case !inB:
			if _, parentInB := b.resolve(path.Dir(p)); path.Dir(p) != "/" && !parentInB {
				continue // the deleted parent directory says it
			}
			c = describe(ctx, p, ea)
			c.Kind = Deleted
			d.Deleted++
			if text {
				c.Diff = textDiff(ctx, p, ea, nil, budget)
			}
		default:
			if ea.host == eb.host {
				continue
			}
			oldC, newC := describe(ctx, p, ea), describe(ctx, p, eb)
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
	if err := ctx.Err(); err != nil {
		return nil, err
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
func describe(ctx context.Context, p string, e *entry) model.Change {
	c := model.Change{Path: p, Type: typeOf(&e.st), Mode: fmt.Sprintf("%04o", e.st.Mode&07777)}
	switch c.Type {
	case "file":
		c.Size = e.st.Size
		c.SHA256, _ = hashFile(ctx, e.host)
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

func hashFile(ctx context.Context, p string) (string, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, ctxReader{ctx, f}); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ctxReader reads r until ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
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
