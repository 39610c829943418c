package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/internal/config"
)

func newCpCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files and directories between a jail and this host",
		Long: `Copy a file or a directory tree (recursively) between this host and a
jail; one side is JAIL:/absolute/path. Permission bits are kept; files in the
jail belong to the jail's user. When DST is an existing directory, SRC is
copied into it. Symbolic links are copied as links, their targets as they are
(a link in the jail replaces what was at its path).`,
		Args: usageArgs(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			sref, spath, sjail := splitJailPath(args[0])
			dref, dpath, djail := splitJailPath(args[1])
			if sjail == djail {
				return usageError{errors.New("cp: exactly one of SRC and DST must be JAIL:/path")}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			g, gctx := errgroup.WithContext(cmd.Context())
			g.SetLimit(copyWorkers)
			cp := &copier{ctx: gctx, c: c, warn: cmd.ErrOrStderr(), g: g}
			if sjail {
				err = cp.fromJail(sref, spath, args[1])
			} else {
				err = cp.toJail(args[0], dref, dpath)
			}
			// A failed transfer cancels the walk: its error is the cause.
			if werr := g.Wait(); werr != nil {
				err = werr
			}
			if err != nil {
				return err
			}
			// Directory modes last (deepest first): a read-only directory
			// would refuse the files copied into it.
			for i := len(cp.dirModes) - 1; i >= 0; i-- {
				if err := cp.dirModes[i](); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

// splitJailPath splits "JAIL:/path" into the jail and the path. A local
// path never qualifies: what precedes its first colon is not a jail name
// or the rest is not absolute.
func splitJailPath(s string) (ref, p string, ok bool) {
	ref, p, found := strings.Cut(s, ":")
	if !found || !strings.HasPrefix(p, "/") || config.ValidName(ref) != nil {
		return "", "", false
	}
	return ref, p, true
}

// copyWorkers is how many files cp moves at once: each file is a request
// of its own, so a tree of many small files is bound by round trips.
const copyWorkers = 8

// copier copies trees between the host and one jail. The walk (making
// directories, reading them) runs on the caller's goroutine; files go to
// g's workers.
type copier struct {
	ctx  context.Context
	c    *client.Client
	warn io.Writer
	g    *errgroup.Group
	// dirModes set the modes of the local directories a copy out of a jail
	// made, once their contents are in.
	dirModes []func() error
}

// parseMode converts the API's octal mode string to an os.FileMode.
func parseMode(s string) (os.FileMode, error) {
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil {
		return 0, fmt.Errorf("mode %q: not octal", s)
	}
	m := os.FileMode(v & 0o777)
	if v&0o4000 != 0 {
		m |= os.ModeSetuid
	}
	if v&0o2000 != 0 {
		m |= os.ModeSetgid
	}
	if v&0o1000 != 0 {
		m |= os.ModeSticky
	}
	return m, nil
}

// apiMode converts an os.FileMode's permission and special bits to the
// number WriteOptions takes.
func apiMode(m os.FileMode) uint32 {
	v := uint32(m.Perm())
	if m&os.ModeSetuid != 0 {
		v |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		v |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		v |= 0o1000
	}
	return v
}

// fromJail copies the jail's src to the local dst.
func (cp *copier) fromJail(ref, src, dst string) error {
	fi, err := cp.c.Stat(cp.ctx, ref, src)
	if err != nil {
		return err
	}
	if st, err := os.Stat(dst); err == nil && st.IsDir() {
		dst = filepath.Join(dst, path.Base(fi.Path))
	}
	return cp.pull(ref, fi, dst)
}

func (cp *copier) pull(ref string, fi *client.FileInfo, dst string) error {
	switch fi.Type {
	case "dir":
		if err := os.Mkdir(dst, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		entries, err := cp.c.ReadDir(cp.ctx, ref, fi.Path)
		if err != nil {
			return err
		}
		for i := range entries {
			if err := cp.pull(ref, &entries[i], filepath.Join(dst, entries[i].Name)); err != nil {
				return err
			}
		}
		mode := fi.Mode
		cp.dirModes = append(cp.dirModes, func() error { return cp.chmod(dst, mode) })
		return nil
	case "file":
		p, mode := fi.Path, fi.Mode
		cp.g.Go(func() error { return cp.pullFile(ref, p, mode, dst) })
		return nil
	case "symlink":
		if err := os.Remove(dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return os.Symlink(fi.LinkTarget, dst)
	default:
		fmt.Fprintf(cp.warn, "agentjail: cp: skipping %s:%s (a %s)\n", ref, fi.Path, fi.Type)
		return nil
	}
}

// pullFile copies the jail's regular file p to dst, with mode.
func (cp *copier) pullFile(ref, p, mode, dst string) error {
	_, rc, err := cp.c.ReadFile(cp.ctx, ref, p)
	if err != nil {
		return err
	}
	defer rc.Close()
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, rc); err != nil {
		f.Close()
		return fmt.Errorf("copying %s:%s to %s: %w", ref, p, dst, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	return cp.chmod(dst, mode)
}

func (cp *copier) chmod(dst, mode string) error {
	m, err := parseMode(mode)
	if err != nil {
		return fmt.Errorf("%s: %w", dst, err)
	}
	return os.Chmod(dst, m)
}

// toJail copies the local src to the jail's dst.
func (cp *copier) toJail(src, ref, dst string) error {
	st, err := os.Lstat(src)
	if err != nil {
		return err
	}
	fi, err := cp.c.Stat(cp.ctx, ref, dst)
	switch {
	case err == nil && fi.Type == "dir":
		dst = path.Join(dst, filepath.Base(filepath.Clean(src)))
	case err != nil && !client.IsNotFound(err):
		return err
	}
	return cp.push(src, st, ref, dst)
}

func (cp *copier) push(src string, st os.FileInfo, ref, dst string) error {
	switch {
	case st.IsDir():
		if _, err := cp.c.Mkdir(cp.ctx, ref, dst, client.WriteOptions{Mode: apiMode(st.Mode())}); err != nil {
			return err
		}
		entries, err := os.ReadDir(src)
		if err != nil {
			return err
		}
		for _, e := range entries {
			child := filepath.Join(src, e.Name())
			cst, err := os.Lstat(child)
			if err != nil {
				return err
			}
			if err := cp.push(child, cst, ref, path.Join(dst, e.Name())); err != nil {
				return err
			}
		}
		return nil
	case st.Mode().IsRegular():
		mode := apiMode(st.Mode())
		cp.g.Go(func() error {
			f, err := os.Open(src)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = cp.c.WriteFile(cp.ctx, ref, dst, f, client.WriteOptions{Mode: mode})
			return err
		})
		return nil
	case st.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		cp.g.Go(func() error {
			_, err := cp.c.Symlink(cp.ctx, ref, dst, target, client.WriteOptions{})
			if client.IsConflict(err) {
				if err := cp.c.Remove(cp.ctx, ref, dst, false); err != nil {
					return err
				}
				_, err = cp.c.Symlink(cp.ctx, ref, dst, target, client.WriteOptions{})
			}
			return err
		})
		return nil
	default:
		fmt.Fprintf(cp.warn, "agentjail: cp: skipping %s (%s; only files, directories and symbolic links can be copied into a jail)\n", src, st.Mode().Type())
		return nil
	}
}
