package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/errdefs"
)

// OCI whiteout markers (image-spec, layer.md).
const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// ErrUnsafeLayer is the kind of error for a layer the store refuses: an
// entry outside the layer, a write through a symlink that leaves it, a
// hard link to something it lacks. It is wrapped in errdefs.ErrUnprocessable.
var ErrUnsafeLayer = errors.New("unsafe layer")

// UnpackStats counts what an unpack did besides writing entries.
type UnpackStats struct {
	// Entries is the number of tar entries applied.
	Entries int `json:"entries"`
	// Bytes is the total size of the regular files written.
	Bytes int64 `json:"bytes"`
	// DevicesSkipped counts character and block devices not created.
	DevicesSkipped int `json:"devices_skipped,omitempty"`
	// SetidCleared counts files whose setuid/setgid bits were removed.
	SetidCleared int `json:"setid_cleared,omitempty"`
	// XattrsDropped counts extended attributes not applied (file
	// capabilities, trusted.* and security.* attributes).
	XattrsDropped int `json:"xattrs_dropped,omitempty"`
	// Implicit are the topmost directories the layer holds only as
	// parents of its entries (no entry of their own): in a lower layer
	// they may be symlinks, which checkChain refuses to shadow.
	Implicit []string `json:"implicit,omitempty"`
}

// unpacker applies one layer tar onto an empty directory in the overlay
// lower format: whiteouts become 0/0 character devices and opaque markers
// the trusted.overlay.opaque xattr. Every path is resolved beneath the
// layer's root (openat2 RESOLVE_BENEATH): names with "..", symlinks
// leaving the layer and hard links to entries it lacks are refused;
// device nodes are skipped, setuid/setgid bits cleared and privileged
// xattrs dropped.
type unpacker struct {
	root     int   // O_PATH fd of the layer root
	maxBytes int64 // bound on the regular files' total size
	stats    UnpackStats
	buf      []byte
	dirs     []dirTimes
	// parent caches the last parent directory opened.
	parentName string
	parentFd   int
	implicit   map[string]bool
}

type dirTimes struct {
	name string
	ts   [2]unix.Timespec
}

// unpack applies the tar stream r to the empty directory dir, writing at
// most maxBytes of file contents (errdefs.ErrTooLarge beyond).
func unpack(r io.Reader, dir string, maxBytes int64) (UnpackStats, error) {
	root, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return UnpackStats{}, fmt.Errorf("open layer dir: %w", err)
	}
	u := &unpacker{root: root, maxBytes: maxBytes, buf: make([]byte, 256<<10), parentFd: -1, implicit: map[string]bool{}}
	defer u.close()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return u.stats, errdefs.Wrap(errdefs.ErrUnprocessable, err, "layer tar")
		}
		if err := u.apply(h, tr); err != nil {
			return u.stats, err
		}
		u.stats.Entries++
	}
	for d := range u.implicit {
		if !u.implicit[path.Dir(d)] {
			u.stats.Implicit = append(u.stats.Implicit, d)
		}
	}
	sort.Strings(u.stats.Implicit)
	// Directory times last: creating entries changes them.
	for i := len(u.dirs) - 1; i >= 0; i-- {
		d := u.dirs[i]
		_ = unix.UtimesNanoAt(u.root, dotted(d.name), d.ts[:], unix.AT_SYMLINK_NOFOLLOW)
	}
	return u.stats, nil
}

func (u *unpacker) close() {
	if u.parentFd >= 0 {
		unix.Close(u.parentFd)
	}
	unix.Close(u.root)
}

// maxImplicit bounds the implicit directories a layer records.
const maxImplicit = 10000

// dotted turns a cleaned relative name into a path usable with *at calls
// ("" is the root itself).
func dotted(name string) string {
	if name == "" || name == "." {
		return "."
	}
	return name
}

// cleanName returns the layer-relative form of a tar entry name ("" for
// the root), or an unsafe-layer error when it leaves the layer.
func cleanName(name string) (string, error) {
	if strings.IndexByte(name, 0) >= 0 {
		return "", unsafef("entry name %q has a NUL byte", name)
	}
	n := strings.TrimLeft(name, "/")
	for _, part := range strings.Split(n, "/") {
		if part == ".." {
			return "", unsafef("entry %q leaves the layer (..)", name)
		}
	}
	n = path.Clean("/" + n)[1:]
	return n, nil
}

func unsafef(format string, args ...any) error {
	return errdefs.Wrap(errdefs.ErrUnprocessable, ErrUnsafeLayer, format, args...)
}

// apply writes one entry.
func (u *unpacker) apply(h *tar.Header, r io.Reader) error {
	name, err := cleanName(h.Name)
	if err != nil {
		return err
	}
	if name == "" {
		if h.Typeflag == tar.TypeDir {
			fd, err := unix.Openat(u.root, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("layer root: %w", err)
			}
			defer unix.Close(fd)
			return u.setMeta(fd, h)
		}
		return unsafef("entry %q replaces the layer root", h.Name)
	}
	dir, base := path.Split(name)
	dir = strings.TrimSuffix(dir, "/")
	if base == whiteoutOpaque {
		pfd, err := u.parent(dir, h.Name)
		if err != nil {
			return err
		}
		return setOpaque(pfd, h.Name)
	}
	if strings.HasPrefix(base, whiteoutPrefix) {
		target := strings.TrimPrefix(base, whiteoutPrefix)
		if target == "" || target == "." || target == ".." {
			return unsafef("entry %q: a whiteout without a name", h.Name)
		}
		pfd, err := u.parent(dir, h.Name)
		if err != nil {
			return err
		}
		if err := removeEntry(pfd, target); err != nil {
			return fmt.Errorf("whiteout %s: %w", h.Name, err)
		}
		if err := unix.Mknodat(pfd, target, unix.S_IFCHR, 0); err != nil {
			return fmt.Errorf("whiteout %s: %w", h.Name, err)
		}
		return nil
	}
	pfd, err := u.parent(dir, h.Name)
	if err != nil {
		return err
	}
	switch h.Typeflag {
	case tar.TypeDir:
		var st unix.Stat_t
		err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
		if err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if err := removeEntry(pfd, base); err != nil {
				return fmt.Errorf("entry %s: %w", h.Name, err)
			}
			err = unix.ENOENT
		}
		if err != nil {
			if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
				return fmt.Errorf("entry %s: %w", h.Name, err)
			}
		}
		fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("entry %s: %w", h.Name, err)
		}
		defer unix.Close(fd)
		if err := u.setMeta(fd, h); err != nil {
			return err
		}
		u.dirs = append(u.dirs, dirTimes{name, times(h)})
		delete(u.implicit, name)
		return nil
	case tar.TypeReg: // archive/tar reads the legacy TypeRegA as TypeReg
		const flags = unix.O_WRONLY | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW | unix.O_CLOEXEC
		fd, err := unix.Openat(pfd, base, flags, 0o600)
		if errors.Is(err, unix.EEXIST) {
			// A later entry replaces an earlier one of the layer.
			if err := removeEntry(pfd, base); err != nil {
				return fmt.Errorf("entry %s: %w", h.Name, err)
			}
			fd, err = unix.Openat(pfd, base, flags, 0o600)
		}
		if err != nil {
			return fmt.Errorf("entry %s: %w", h.Name, err)
		}
		werr := u.copy(fd, r, h)
		if werr == nil {
			werr = u.setMeta(fd, h)
		}
		if werr == nil {
			ts := times(h)
			werr = unix.UtimesNanoAt(fd, "", ts[:], unix.AT_EMPTY_PATH)
		}
		cerr := unix.Close(fd)
		if werr != nil {
			return werr
		}
		if cerr != nil {
			return fmt.Errorf("entry %s: %w", h.Name, cerr)
		}
		return nil
	case tar.TypeSymlink:
		err := unix.Symlinkat(h.Linkname, pfd, base)
		if errors.Is(err, unix.EEXIST) {
			if err := removeEntry(pfd, base); err != nil {
				return fmt.Errorf("entry %s: %w", h.Name, err)
			}
			err = unix.Symlinkat(h.Linkname, pfd, base)
		}
		if err != nil {
			return fmt.Errorf("entry %s: %w", h.Name, err)
		}
		if err := unix.Fchownat(pfd, base, h.Uid, h.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("entry %s: %w", h.Name, err)
		}
		ts := times(h)
		_ = unix.UtimesNanoAt(pfd, base, ts[:], unix.AT_SYMLINK_NOFOLLOW)
		return nil
	case tar.TypeLink:
		target, err := cleanName(h.Linkname)
		if err != nil || target == "" {
			return unsafef("hard link %q → %q leaves the layer", h.Name, h.Linkname)
		}
		tdir, tbase := path.Split(target)
		tfd, err := u.open(strings.TrimSuffix(tdir, "/"), h.Name, false)
		if errors.Is(err, unix.ENOENT) {
			return unsafef("hard link %q → %q: the layer has no such entry", h.Name, h.Linkname)
		}
		if err != nil {
			return err
		}
		defer unix.Close(tfd)
		var st unix.Stat_t
		if err := unix.Fstatat(tfd, tbase, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return unsafef("hard link %q → %q: the layer has no such entry", h.Name, h.Linkname)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			return unsafef("hard link %q → %q: a directory", h.Name, h.Linkname)
		}
		if target == name {
			return nil
		}
		if err := removeEntry(pfd, base); err != nil {
			return fmt.Errorf("entry %s: %w", h.Name, err)
		}
		if err := unix.Linkat(tfd, tbase, pfd, base, 0); err != nil {
			return fmt.Errorf("hard link %s: %w", h.Name, err)
		}
		return nil
	case tar.TypeChar, tar.TypeBlock:
		u.stats.DevicesSkipped++
		return nil
	case tar.TypeFifo:
		if err := removeEntry(pfd, base); err != nil {
			return fmt.Errorf("entry %s: %w", h.Name, err)
		}
		if err := unix.Mkfifoat(pfd, base, 0o600); err != nil {
			return fmt.Errorf("entry %s: %w", h.Name, err)
		}
		fd, err := unix.Openat(pfd, base, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("entry %s: %w", h.Name, err)
		}
		defer unix.Close(fd)
		if err := unix.Fchownat(fd, "", h.Uid, h.Gid, unix.AT_EMPTY_PATH); err != nil {
			return fmt.Errorf("entry %s: %w", h.Name, err)
		}
		return unix.Fchmodat(pfd, base, uint32(h.Mode)&0o777, 0)
	case tar.TypeXGlobalHeader:
		return nil
	default:
		return errdefs.Unprocessablef("layer entry %q: unsupported tar type %q", h.Name, h.Typeflag)
	}
}

// copy writes the file's contents, bounded by maxBytes overall.
func (u *unpacker) copy(fd int, r io.Reader, h *tar.Header) error {
	if h.Size < 0 || u.stats.Bytes+h.Size > u.maxBytes {
		return errdefs.New(errdefs.ErrTooLarge, "layer unpacks to more than %d bytes (entry %q is %d bytes)", u.maxBytes, h.Name, h.Size)
	}
	for {
		n, rerr := r.Read(u.buf)
		if n > 0 {
			if _, err := writeAll(fd, u.buf[:n]); err != nil {
				return fmt.Errorf("entry %s: %w", h.Name, err)
			}
			u.stats.Bytes += int64(n)
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return errdefs.Wrap(errdefs.ErrUnprocessable, rerr, "layer entry %q", h.Name)
		}
	}
}

func writeAll(fd int, b []byte) (int, error) {
	total := 0
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err != nil {
			if err == unix.EINTR {
				continue
			}
			return total, err
		}
		total += n
		b = b[n:]
	}
	return total, nil
}

// setMeta applies owner, mode (setuid/setgid of non-directories cleared)
// and user.* xattrs to the open entry fd.
func (u *unpacker) setMeta(fd int, h *tar.Header) error {
	if err := unix.Fchown(fd, h.Uid, h.Gid); err != nil {
		return fmt.Errorf("entry %s: chown: %w", h.Name, err)
	}
	mode := uint32(h.Mode) & 0o7777
	if mode&(unix.S_ISUID|unix.S_ISGID) != 0 && h.Typeflag != tar.TypeDir {
		mode &^= unix.S_ISUID | unix.S_ISGID
		u.stats.SetidCleared++
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return fmt.Errorf("entry %s: chmod: %w", h.Name, err)
	}
	for k, v := range h.PAXRecords {
		attr, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok {
			continue
		}
		if !strings.HasPrefix(attr, "user.") {
			u.stats.XattrsDropped++
			continue
		}
		if err := unix.Fsetxattr(fd, attr, []byte(v), 0); err != nil && !errors.Is(err, unix.ENOTSUP) {
			return fmt.Errorf("entry %s: xattr %s: %w", h.Name, attr, err)
		}
	}
	return nil
}

func times(h *tar.Header) [2]unix.Timespec {
	at := h.AccessTime
	if at.IsZero() {
		at = h.ModTime
	}
	return [2]unix.Timespec{unix.NsecToTimespec(at.UnixNano()), unix.NsecToTimespec(h.ModTime.UnixNano())}
}

// removeEntry removes name from the directory pfd if it exists (a
// directory with everything below it).
func removeEntry(pfd int, name string) error {
	err := unix.Unlinkat(pfd, name, 0)
	switch {
	case err == nil, errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.EISDIR), errors.Is(err, unix.EPERM):
		return removeAllAt(pfd, name)
	}
	return err
}

// removeAllAt removes the directory name below pfd and its contents,
// never following symlinks.
func removeAllAt(pfd int, name string) error {
	fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	buf := make([]byte, 8192)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			unix.Close(fd)
			return err
		}
		if n == 0 {
			break
		}
		var names []string
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
		for _, child := range names {
			if err := unix.Unlinkat(fd, child, 0); err != nil {
				if errors.Is(err, unix.EISDIR) {
					err = removeAllAt(fd, child)
				}
				if err != nil && !errors.Is(err, unix.ENOENT) {
					unix.Close(fd)
					return err
				}
			}
		}
		// Removing entries while reading: start over from the top.
		if _, err := unix.Seek(fd, 0, 0); err != nil {
			unix.Close(fd)
			return err
		}
	}
	unix.Close(fd)
	return unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR)
}

// setOpaque marks the directory pfd opaque for overlayfs.
func setOpaque(pfd int, entry string) error {
	p := fmt.Sprintf("/proc/self/fd/%d", pfd)
	if err := unix.Setxattr(p, "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		return fmt.Errorf("opaque marker %s: %w", entry, err)
	}
	return nil
}

// parent returns an fd of the layer directory dir (created as needed),
// cached until the next call with another dir; the caller must not close it.
func (u *unpacker) parent(dir, entry string) (int, error) {
	if u.parentFd >= 0 && u.parentName == dir {
		return u.parentFd, nil
	}
	fd, err := u.open(dir, entry, true)
	if err != nil {
		return -1, err
	}
	if u.parentFd >= 0 {
		unix.Close(u.parentFd)
	}
	u.parentFd, u.parentName = fd, dir
	return fd, nil
}

// open resolves the layer directory dir beneath the root (symlinks that
// stay inside the layer are followed; one that leaves it is refused) and
// returns an fd the caller closes. With create, missing directories are
// made (mode 0755, owned by root).
func (u *unpacker) open(dir, entry string, create bool) (int, error) {
	how := unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	}
	fd, err := unix.Openat2(u.root, dotted(dir), &how)
	if err == nil {
		return fd, nil
	}
	if !errors.Is(err, unix.ENOENT) || !create {
		return -1, resolveErr(err, dir, entry)
	}
	// Make the missing directories one by one.
	cur := ""
	for _, part := range strings.Split(dir, "/") {
		next := path.Join(cur, part)
		fd, err := unix.Openat2(u.root, next, &how)
		if errors.Is(err, unix.ENOENT) {
			pfd, perr := unix.Openat2(u.root, dotted(cur), &how)
			if perr != nil {
				return -1, resolveErr(perr, cur, entry)
			}
			merr := unix.Mkdirat(pfd, part, 0o755)
			unix.Close(pfd)
			if merr != nil && !errors.Is(merr, unix.EEXIST) {
				return -1, fmt.Errorf("entry %s: mkdir %s: %w", entry, next, merr)
			}
			if merr == nil {
				if len(u.implicit) >= maxImplicit {
					return -1, errdefs.Unprocessablef("layer entry %q: more than %d directories without entries of their own", entry, maxImplicit)
				}
				u.implicit[next] = true
			}
			fd, err = unix.Openat2(u.root, next, &how)
		}
		if err != nil {
			return -1, resolveErr(err, next, entry)
		}
		unix.Close(fd)
		cur = next
	}
	fd, err = unix.Openat2(u.root, dotted(dir), &how)
	if err != nil {
		return -1, resolveErr(err, dir, entry)
	}
	return fd, nil
}

func resolveErr(err error, dir, entry string) error {
	switch {
	case errors.Is(err, unix.EXDEV):
		return unsafef("entry %q: %s resolves outside the layer (through a symlink)", entry, dir)
	case errors.Is(err, unix.ELOOP):
		return unsafef("entry %q: too many symlinks resolving %s", entry, dir)
	case errors.Is(err, unix.ENOTDIR):
		return unsafef("entry %q: %s is not a directory", entry, dir)
	}
	return fmt.Errorf("entry %s: open %s: %w", entry, dir, err)
}

// lstatBeneath stats rel below the directory root without following any
// symlink (ok false when it does not exist there or a parent is not a
// plain directory).
func lstatBeneath(root, rel string) (st unix.Stat_t, ok bool) {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return st, false
	}
	defer unix.Close(rfd)
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS}
	pfd, err := unix.Openat2(rfd, dotted(path.Dir(rel)), &how)
	if err != nil {
		return st, false
	}
	defer unix.Close(pfd)
	if unix.Fstatat(pfd, path.Base(rel), &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
		return st, false
	}
	return st, true
}
