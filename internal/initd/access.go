package initd

import (
	"fmt"
	"path"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/initproto"
)

// Permission bits asked of permits.
const (
	wantRead  = 4
	wantWrite = 2
	wantExec  = 1
)

// permits reports whether id gets the want bits on a file with stat st
// under classic Unix permission rules (owner, then group, then other; root
// bypasses everything but the execute bit of non-directories). ACLs and
// capabilities other than root's are not considered.
func permits(st *unix.Stat_t, id *identity, want uint32) bool {
	if id.UID == 0 {
		if want&wantExec != 0 && st.Mode&unix.S_IFMT != unix.S_IFDIR && st.Mode&0o111 == 0 {
			return false
		}
		return true
	}
	var bits uint32
	switch {
	case int(st.Uid) == id.UID:
		bits = (st.Mode >> 6) & 7
	case slices.Contains(id.Groups, int(st.Gid)):
		bits = (st.Mode >> 3) & 7
	default:
		bits = st.Mode & 7
	}
	return bits&want == want
}

// describe names a file's mode and owner for denial reasons.
func describe(st *unix.Stat_t) string {
	return fmt.Sprintf("mode %04o, owner %d:%d", st.Mode&0o7777, st.Uid, st.Gid)
}

// access decides whether id can read (write false) or write the jail path
// p, following symlinks inside the root. A missing path is writable when
// its parent directory is writable and searchable. It returns a reason
// when access is denied; err is set only when the question cannot be
// answered.
func (r *fsRoot) access(p string, id *identity, write bool) (ok bool, reason string, err error) {
	want := uint32(wantRead)
	if write {
		want = wantWrite
	}
	ok, reason, missing, err := r.checkPath(p, id, want)
	if err != nil || !missing {
		return ok, reason, err
	}
	if !write || p == "/" {
		return false, fmt.Sprintf("%s does not exist", p), nil
	}
	parent := path.Dir(p)
	ok, reason, missing, err = r.checkPath(parent, id, wantWrite|wantExec)
	if missing {
		return false, fmt.Sprintf("%s does not exist", parent), nil
	}
	return ok, reason, err
}

// checkPath resolves p (following symlinks inside the root) and checks
// that id can search every ancestor directory of the resolved path and
// has the want bits on it (plus search on a directory asked for write).
// missing is set when p does not exist.
func (r *fsRoot) checkPath(p string, id *identity, want uint32) (ok bool, reason string, missing bool, err error) {
	fd, err := r.open(p, unix.O_PATH, 0)
	switch {
	case isErrno(err, unix.ENOENT):
		return false, "", true, nil
	case isErrno(err, unix.ENOTDIR), isErrno(err, unix.ELOOP):
		return false, fmt.Sprintf("%s cannot be resolved: %v", p, err), false, nil
	case err != nil:
		return false, "", false, pathError("resolve", p, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, "", false, pathError("stat", p, err)
	}
	ok, reason, err = r.checkOpen(fd, &st, p, id, want)
	return ok, reason, false, err
}

// checkOpen is checkPath on p already resolved and open as fd (O_PATH),
// whose stat is st.
func (r *fsRoot) checkOpen(fd int, st *unix.Stat_t, p string, id *identity, want uint32) (ok bool, reason string, err error) {
	resolved, err := r.jailPath(fd)
	if err != nil {
		return false, "", pathError("resolve", p, err)
	}
	if r.isBlocked(resolved) {
		return false, fmt.Sprintf("path %q is blocked by the jail's policy", p), nil
	}
	if reason, err := r.searchable(resolved, id); err != nil || reason != "" {
		return false, reason, err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR && want&wantWrite != 0 {
		want |= wantExec
	}
	if !permits(st, id, want) {
		return false, fmt.Sprintf("user %s has no %s permission on %s (%s)", id.Name, permName(want), resolved, describe(st)), nil
	}
	if want&wantWrite != 0 {
		var fs unix.Statfs_t
		if err := unix.Fstatfs(fd, &fs); err == nil && fs.Flags&unix.ST_RDONLY != 0 {
			return false, fmt.Sprintf("%s is on a read-only filesystem", resolved), nil
		}
	}
	return true, "", nil
}

// searchable returns a reason when id cannot search one of the ancestor
// directories of the resolved jail path p.
func (r *fsRoot) searchable(p string, id *identity) (string, error) {
	var dirs []string
	for d := path.Dir(p); ; d = path.Dir(d) {
		dirs = append(dirs, d)
		if d == "/" {
			break
		}
	}
	if p == "/" {
		dirs = nil
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		fd, err := r.openDir(dirs[i])
		if err != nil {
			return "", pathError("open", dirs[i], err)
		}
		var st unix.Stat_t
		err = unix.Fstat(fd, &st)
		unix.Close(fd)
		if err != nil {
			return "", pathError("stat", dirs[i], err)
		}
		if !permits(&st, id, wantExec) {
			return fmt.Sprintf("user %s cannot search %s (%s)", id.Name, dirs[i], describe(&st)), nil
		}
	}
	return "", nil
}

// permName names permission bits for reasons.
func permName(want uint32) string {
	switch {
	case want&wantWrite != 0:
		return "write"
	case want&wantRead != 0:
		return "read"
	}
	return "execute"
}

// checkCwd verifies that id can use the jail path dir as its working
// directory: it exists, is a directory, and every component is searchable.
func (r *fsRoot) checkCwd(dir string, id *identity) error {
	fd, err := r.open(dir, unix.O_PATH, 0)
	if err != nil {
		e := pathError("cwd", dir, err)
		e.Kind = initproto.KindUnprocessable
		return e
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return pathError("stat cwd", dir, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return newError(initproto.KindUnprocessable, dir, "cwd %q is not a directory", dir)
	}
	ok, reason, err := r.checkOpen(fd, &st, dir, id, wantExec)
	if err != nil {
		return err
	}
	if !ok {
		return newError(initproto.KindUnprocessable, dir, "cwd %q is not usable by user %s: %s", dir, id.Name, reason)
	}
	return nil
}
