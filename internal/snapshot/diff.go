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
	"math"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/regfile"
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

// resolver finds paths in the merged view of a Tree, by overlayfs's rules:
// an upper entry hides the lower one, a whiteout (a 0/0 character device)
// deletes it, an opaque upper directory hides the whole lower directory,
// and a lower entry is only visible below directories. It keeps the
// directories of the last path it resolved: a diff resolves paths in
// sorted order, so a path's directories are mostly those of the one
// before, and each path costs a look at its own name rather than at every
// directory above it.
type resolver struct {
	t Tree
	// dirs are the visible directories above the last path resolved:
	// dirs[0] is the root, dirs[i] the one i levels down.
	dirs []layerDir
}

// layerDir is a directory of the merged view: its name, its host path in
// each layer, and whether each layer still shows what is below it.
type layerDir struct {
	name             string
	up, low          string
	upperOK, lowerOK bool
}

// resolve finds jail path p (absolute, clean) in the merged view.
func (r *resolver) resolve(p string) (*entry, bool) {
	if len(r.dirs) == 0 {
		r.dirs = []layerDir{{up: r.t.Upper, low: r.t.Lower, upperOK: true, lowerOK: r.t.Lower != ""}}
	}
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	keep := 1
	for keep < len(r.dirs) && keep < len(parts) && r.dirs[keep].name == parts[keep-1] {
		keep++
	}
	r.dirs = r.dirs[:keep]
	for _, part := range parts[keep-1 : len(parts)-1] {
		d, ok := r.dirs[len(r.dirs)-1].child(part)
		if !ok {
			return nil, false
		}
		r.dirs = append(r.dirs, d)
	}
	return r.dirs[len(r.dirs)-1].entry(parts[len(parts)-1])
}

// child is d's entry name when it is a visible directory.
func (d layerDir) child(name string) (layerDir, bool) {
	c := layerDir{name: name, up: filepath.Join(d.up, name), low: filepath.Join(d.low, name), upperOK: d.upperOK, lowerOK: d.lowerOK}
	var st unix.Stat_t
	if c.upperOK {
		if err := unix.Lstat(c.up, &st); err == nil {
			if isWhiteout(&st) || st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return c, false
			}
			if isOpaque(c.up) {
				c.lowerOK = false
			}
			if c.lowerOK && (unix.Lstat(c.low, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR) {
				c.lowerOK = false
			}
			return c, true
		}
		c.upperOK = false
	}
	if !c.lowerOK || unix.Lstat(c.low, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return c, false
	}
	return c, true
}

// entry is d's visible entry name.
func (d layerDir) entry(name string) (*entry, bool) {
	up, low := filepath.Join(d.up, name), filepath.Join(d.low, name)
	var st unix.Stat_t
	if d.upperOK {
		if err := unix.Lstat(up, &st); err == nil {
			if isWhiteout(&st) {
				return nil, false
			}
			return &entry{host: up, st: st}, true
		}
	}
	if !d.lowerOK || unix.Lstat(low, &st) != nil {
		return nil, false
	}
	return &entry{host: low, st: st}, true
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
// lower children of opaque upper directories. It reports true when into
// holds only some of them: it stopped at limit paths, or some directory
// lies too deep for its host path to be opened (a jail can nest
// directories past the kernel's path limit; such a directory is itself
// taken in, what is below it is not).
func candidates(ctx context.Context, trees []Tree, skip func(string) bool, into map[string]bool, limit int) (bool, error) {
	partial := false
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
			if errors.Is(err, unix.ENAMETOOLONG) {
				partial = true
				continue
			}
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
			if errors.Is(err, unix.ENAMETOOLONG) {
				partial = true
				continue
			}
			if err != nil {
				return false, fmt.Errorf("fs diff of %s: %w", t.Lower, err)
			}
			if !full {
				return true, nil
			}
		}
	}
	return partial, nil
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
	ra, rb := &resolver{t: a}, &resolver{t: b}
	buf := make([]byte, 64<<10) // for hashing
	for _, p := range paths {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ea, inA := ra.resolve(p)
		eb, inB := rb.resolve(p)
		var c model.Change
		switch {
		case !inA && !inB:
			continue
		case !inA:
			c = describe(ctx, p, eb, buf)
			c.Kind = Added
			d.Added++
			if text {
				c.Diff = textDiff(ctx, p, nil, eb, budget)
			}
		case !inB:
			if _, parentInB := rb.resolve(path.Dir(p)); path.Dir(p) != "/" && !parentInB {
				continue // the deleted parent directory says it
			}
			c = describe(ctx, p, ea, buf)
			c.Kind = Deleted
			d.Deleted++
			if text {
				c.Diff = textDiff(ctx, p, ea, nil, budget)
			}
		default:
			if ea.host == eb.host {
				continue
			}
			oldC, newC := describe(ctx, p, ea, buf), describe(ctx, p, eb, buf)
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
// regular file, the sha256 of its content (read through buf).
func describe(ctx context.Context, p string, e *entry, buf []byte) model.Change {
	c := model.Change{Path: p, Type: typeOf(&e.st), Mode: fmt.Sprintf("%04o", e.st.Mode&07777)}
	switch c.Type {
	case "file":
		c.Size = e.st.Size
		c.SHA256, _ = hashFile(ctx, e.host, buf)
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

func hashFile(ctx context.Context, p string, buf []byte) (string, error) {
	fd, _, err := regfile.Open(p)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	h := sha256.New()
	if _, err := regfile.Read(ctx, fd, buf, math.MaxInt64, func(b []byte) error { h.Write(b); return nil }); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// readText returns the content of a regular text file of at most
// maxTextDiff bytes (nil entry: empty), and false when it is binary or
// larger.
func readText(ctx context.Context, e *entry) ([]byte, bool) {
	if e == nil {
		return nil, true
	}
	if e.st.Size > maxTextDiff {
		return nil, false
	}
	fd, size, err := regfile.Open(e.host)
	if err != nil {
		return nil, false
	}
	defer unix.Close(fd)
	if size > maxTextDiff {
		return nil, false
	}
	data := make([]byte, 0, size+1)
	_, err = regfile.Read(ctx, fd, make([]byte, 32<<10), maxTextDiff+1, func(b []byte) error { data = append(data, b...); return nil })
	if err != nil || len(data) > maxTextDiff || bytes.IndexByte(data, 0) >= 0 || !utf8.Valid(data) {
		return nil, false
	}
	return data, true
}

// SkipInternal prunes the paths agentjail itself mounts into every jail.
func SkipInternal(jp string) bool {
	return jp == "/.agentjail" || strings.HasPrefix(jp, "/.agentjail/")
}
