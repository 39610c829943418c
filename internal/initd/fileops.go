package initd

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path"
	"sort"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/initproto"
)

// fileOp runs one file operation. Every path is resolved inside the
// server's root (see fsRoot); paths whose resolved form is blocked are
// refused.
func (s *Server) fileOp(c *conn, th *opThread, t initproto.MsgType, payload []byte) error {
	switch t {
	case initproto.MsgStat:
		var req initproto.PathRequest
		if err := decodeReq(t, payload, &req); err != nil {
			return err
		}
		info, err := s.stat(req.Path)
		if err != nil {
			return err
		}
		return c.sendJSON(initproto.MsgOK, info)
	case initproto.MsgReadDir:
		var req initproto.PathRequest
		if err := decodeReq(t, payload, &req); err != nil {
			return err
		}
		infos, err := s.readDir(req.Path)
		if err != nil {
			return err
		}
		return c.sendJSON(initproto.MsgOK, infos)
	case initproto.MsgListDir:
		var req initproto.ListDirRequest
		if err := decodeReq(t, payload, &req); err != nil {
			return err
		}
		return s.listDir(c, th, req)
	case initproto.MsgReadFile:
		var req initproto.PathRequest
		if err := decodeReq(t, payload, &req); err != nil {
			return err
		}
		return s.readFile(c, th, req.Path)
	case initproto.MsgWriteFile:
		var req initproto.WriteRequest
		if err := decodeReq(t, payload, &req); err != nil {
			return err
		}
		return s.writeFile(c, th, &req)
	case initproto.MsgMkdir:
		var req initproto.MkdirRequest
		if err := decodeReq(t, payload, &req); err != nil {
			return err
		}
		info, err := s.mkdir(&req)
		if err != nil {
			return err
		}
		return c.sendJSON(initproto.MsgOK, info)
	case initproto.MsgSymlink:
		var req initproto.SymlinkRequest
		if err := decodeReq(t, payload, &req); err != nil {
			return err
		}
		info, err := s.symlink(&req)
		if err != nil {
			return err
		}
		return c.sendJSON(initproto.MsgOK, info)
	case initproto.MsgRemove:
		var req initproto.RemoveRequest
		if err := decodeReq(t, payload, &req); err != nil {
			return err
		}
		if err := s.remove(req.Path, req.Recursive); err != nil {
			return err
		}
		return c.sendJSON(initproto.MsgOK, nil)
	case initproto.MsgRename:
		var req initproto.RenameRequest
		if err := decodeReq(t, payload, &req); err != nil {
			return err
		}
		if err := s.rename(req.From, req.To); err != nil {
			return err
		}
		return c.sendJSON(initproto.MsgOK, nil)
	case initproto.MsgAccess:
		var req initproto.AccessRequest
		if err := decodeReq(t, payload, &req); err != nil {
			return err
		}
		res, err := s.accessCheck(&req)
		if err != nil {
			return err
		}
		return c.sendJSON(initproto.MsgOK, res)
	}
	return newError(initproto.KindInvalid, "", "unknown file operation %s", t)
}

// decodeReq decodes a request payload into v as a KindInvalid error.
func decodeReq(t initproto.MsgType, payload []byte, v any) error {
	if err := initproto.Decode(t, payload, v); err != nil {
		return newError(initproto.KindInvalid, "", "%v", err)
	}
	return nil
}

// fileInfo converts a stat result.
func fileInfo(p string, st *unix.Stat_t) initproto.FileInfo {
	info := initproto.FileInfo{
		Name:    path.Base(p),
		Path:    p,
		Size:    st.Size,
		Mode:    st.Mode & 0o7777,
		ModTime: time.Unix(st.Mtim.Unix()).UTC(),
		UID:     int(st.Uid),
		GID:     int(st.Gid),
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		info.Type = initproto.TypeFile
	case unix.S_IFDIR:
		info.Type = initproto.TypeDir
	case unix.S_IFLNK:
		info.Type = initproto.TypeSymlink
	default:
		info.Type = initproto.TypeOther
	}
	return info
}

// statAt describes name in dirfd without following a final symlink.
func statAt(dirfd int, name, p string) (initproto.FileInfo, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return initproto.FileInfo{}, pathError("stat", p, err)
	}
	info := fileInfo(p, &st)
	if info.Type == initproto.TypeSymlink {
		info.LinkTarget = readlinkAt(dirfd, name)
	}
	return info, nil
}

// readlinkAt reads a symlink's target ("" when it cannot be read).
func readlinkAt(dirfd int, name string) string {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}

// stat describes a jail path with lstat semantics.
func (s *Server) stat(p string) (initproto.FileInfo, error) {
	p, err := cleanPath("path", p)
	if err != nil {
		return initproto.FileInfo{}, err
	}
	if p == "/" {
		if s.root.isBlocked("/") {
			return initproto.FileInfo{}, blockedError(p)
		}
		var st unix.Stat_t
		if err := unix.Fstat(s.root.fd, &st); err != nil {
			return initproto.FileInfo{}, pathError("stat", p, err)
		}
		return fileInfo(p, &st), nil
	}
	dirfd, base, _, err := s.root.openParent(p)
	if err != nil {
		return initproto.FileInfo{}, err
	}
	defer unix.Close(dirfd)
	return statAt(dirfd, base, p)
}

// readDir lists a directory (following symlinks to it inside the root),
// entries sorted by name, each with lstat semantics (MsgReadDir: the
// answer is one frame, so a directory of tens of thousands of entries
// does not fit; see listDir).
func (s *Server) readDir(p string) ([]initproto.FileInfo, error) {
	p, f, err := s.openDir(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, pathError("list", p, err)
	}
	return describeNames(int(f.Fd()), p, names), nil
}

// openDir opens directory p of the root (following symlinks inside it)
// and returns its clean path.
func (s *Server) openDir(p string) (string, *os.File, error) {
	p, err := cleanPath("path", p)
	if err != nil {
		return "", nil, err
	}
	fd, err := s.root.open(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return "", nil, pathError("list", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	if _, err := s.root.checkFd(fd, p); err != nil {
		f.Close()
		return "", nil, err
	}
	return p, f, nil
}

// describeNames sorts the names of entries of directory fd (path p) and
// describes each, leaving out those removed meanwhile.
func describeNames(fd int, p string, names []string) []initproto.FileInfo {
	sort.Strings(names)
	out := make([]initproto.FileInfo, 0, len(names))
	for _, n := range names {
		info, err := statAt(fd, n, path.Join(p, n))
		if err != nil {
			continue // removed while listing
		}
		out = append(out, info)
	}
	return out
}

// listChunk is how many entries one Data frame of a listing carries: a
// FileInfo is at most about 8.5 KiB of JSON (a path and a link target of
// 4 KiB each), so a frame stays under MaxPayload.
const listChunk = 256

// listDir answers MsgListDir: it reads at most req.Limit names (one more
// tells it that there are more), then sends OK with whether the listing is
// truncated, the entries sorted by name in Data frames, and EOF. Init
// holds the names it read and no more.
func (s *Server) listDir(c *conn, th *opThread, req initproto.ListDirRequest) error {
	if req.Limit < 1 || req.Limit > initproto.MaxListDir {
		return newError(initproto.KindInvalid, "", "limit %d: must be 1..%d", req.Limit, initproto.MaxListDir)
	}
	p, f, err := s.openDir(req.Path)
	if err != nil {
		return err
	}
	defer f.Close()
	var names []string
	for len(names) <= req.Limit {
		batch, err := f.Readdirnames(min(req.Limit+1-len(names), 4096))
		names = append(names, batch...)
		if err == io.EOF {
			break
		}
		if err != nil {
			return pathError("list", p, err)
		}
	}
	truncated := len(names) > req.Limit
	if truncated {
		names = names[:req.Limit]
	}
	infos := describeNames(int(f.Fd()), p, names)
	return th.off(func() error {
		if err := c.sendJSON(initproto.MsgOK, initproto.ListDirAnswer{Truncated: truncated}); err != nil {
			return err
		}
		for len(infos) > 0 {
			n := min(len(infos), listChunk)
			b, err := json.Marshal(infos[:n])
			if err != nil {
				return err
			}
			if err := c.send(initproto.MsgData, b); err != nil {
				return err
			}
			infos = infos[n:]
		}
		return c.send(initproto.MsgEOF, nil)
	})
}

// readFile streams a regular file (following symlinks inside the root):
// OK with its FileInfo, then Data frames and EOF.
func (s *Server) readFile(c *conn, th *opThread, p string) error {
	p, err := cleanPath("path", p)
	if err != nil {
		return err
	}
	pathFd, err := s.root.open(p, unix.O_PATH, 0)
	if err != nil {
		return pathError("read", p, err)
	}
	defer unix.Close(pathFd)
	if _, err := s.root.checkFd(pathFd, p); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(pathFd, &st); err != nil {
		return pathError("read", p, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		return pathError("read", p, unix.EISDIR)
	default:
		return newError(initproto.KindUnprocessable, p, "read %q: not a regular file", p)
	}
	// Reopen the pinned inode for reading: the path is not resolved again.
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pathFd), unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return pathError("read", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	if err := th.off(func() error { return c.sendJSON(initproto.MsgOK, fileInfo(p, &st)) }); err != nil {
		return nil
	}
	buf := make([]byte, initproto.ChunkSize)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if err := th.off(func() error { return c.send(initproto.MsgData, buf[:n]) }); err != nil {
				return nil
			}
		}
		if err == io.EOF {
			_ = th.off(func() error { return c.send(initproto.MsgEOF, nil) })
			return nil
		}
		if err != nil {
			return pathError("read", p, err)
		}
	}
}

// writeIdentity resolves the owner of created files.
func (s *Server) writeIdentity(user string) (*identity, error) {
	if user == "" {
		return s.lookupUser(s.cfg.DefaultUser, s.cfg.DefaultGroup)
	}
	return s.lookupUser(user, "")
}

// writeFile receives a file: OK (ready), the client's Data frames and
// EOF, then OK with the written file's FileInfo.
//
// The data goes to a new temporary file in the target's directory, which
// is renamed over the target when complete: readers never see a partial
// file, a final symlink is never followed (writing to a symlink fails),
// and a file with several hard links is replaced, never written through,
// so a link pointing elsewhere is not modified. A replaced file's mode and
// owner are kept unless the request sets them.
func (s *Server) writeFile(c *conn, th *opThread, req *initproto.WriteRequest) error {
	p, err := cleanPath("path", req.Path)
	if err != nil {
		return err
	}
	if p == "/" {
		return newError(initproto.KindUnprocessable, p, "write %q: is a directory", p)
	}
	id, err := s.writeIdentity(req.User)
	if err != nil {
		return err
	}
	if req.MkdirParents {
		if err := s.mkdirAll(path.Dir(p), id, 0o755); err != nil {
			return reportAs(err, p)
		}
	}
	dirfd, base, _, err := s.root.openParent(p)
	if err != nil {
		return err
	}
	defer unix.Close(dirfd)
	mode, uid, gid := uint32(0o644), id.UID, id.GID
	var old unix.Stat_t
	switch err := unix.Fstatat(dirfd, base, &old, unix.AT_SYMLINK_NOFOLLOW); {
	case err == nil:
		switch old.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			mode = old.Mode & 0o7777
			if req.User == "" {
				uid, gid = int(old.Uid), int(old.Gid)
			}
		case unix.S_IFDIR:
			return pathError("write", p, unix.EISDIR)
		case unix.S_IFLNK:
			return newError(initproto.KindUnprocessable, p, "write %q: is a symlink (writes do not follow symlinks)", p)
		default:
			return newError(initproto.KindUnprocessable, p, "write %q: not a regular file", p)
		}
	case !isErrno(err, unix.ENOENT):
		return pathError("write", p, err)
	}
	if req.Mode != 0 {
		mode = req.Mode & 0o7777
	}
	tmp, fd, err := createTemp(dirfd)
	if err != nil {
		return pathError("write", p, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	committed := false
	defer func() {
		f.Close()
		if !committed {
			unix.Unlinkat(dirfd, tmp, 0)
		}
	}()
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return pathError("write", p, err)
	}
	if err := th.off(func() error { return c.sendJSON(initproto.MsgOK, nil) }); err != nil {
		return nil
	}
	for {
		var t initproto.MsgType
		var data []byte
		err := th.off(func() (err error) {
			t, data, err = c.read()
			return err
		})
		if err != nil {
			return nil // the client went away; nothing is committed
		}
		if t == initproto.MsgEOF {
			break
		}
		if t != initproto.MsgData {
			return newError(initproto.KindInvalid, p, "write %q: unexpected %s frame in file data", p, t)
		}
		if _, err := f.Write(data); err != nil {
			return pathError("write", p, err)
		}
	}
	// After chown, which clears set-id bits.
	if err := unix.Fchmod(fd, mode); err != nil {
		return pathError("write", p, err)
	}
	if err := unix.Renameat(dirfd, tmp, dirfd, base); err != nil {
		return pathError("write", p, err)
	}
	committed = true
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return pathError("write", p, err)
	}
	return c.sendJSON(initproto.MsgOK, fileInfo(p, &st))
}

// createTemp creates a new private temporary file in dirfd.
func createTemp(dirfd int) (string, int, error) {
	for range 10 {
		var b [8]byte
		rand.Read(b[:])
		name := ".agentjail-write-" + hex.EncodeToString(b[:])
		fd, err := unix.Openat(dirfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if isErrno(err, unix.EEXIST) {
			continue
		}
		return name, fd, err
	}
	return "", -1, unix.EEXIST
}

// mkdir creates a directory (with MkdirParents, its missing parents too,
// and an existing directory is not an error).
func (s *Server) mkdir(req *initproto.MkdirRequest) (initproto.FileInfo, error) {
	p, err := cleanPath("path", req.Path)
	if err != nil {
		return initproto.FileInfo{}, err
	}
	id, err := s.writeIdentity(req.User)
	if err != nil {
		return initproto.FileInfo{}, err
	}
	mode := uint32(0o755)
	if req.Mode != 0 {
		mode = req.Mode & 0o7777
	}
	if req.MkdirParents {
		if err := s.mkdirAll(p, id, mode); err != nil {
			return initproto.FileInfo{}, reportAs(err, p)
		}
	} else if err := s.mkdirOne(p, id, mode); err != nil {
		return initproto.FileInfo{}, err
	}
	return s.stat(p)
}

// mkdirOne creates the directory p owned by id with mode.
func (s *Server) mkdirOne(p string, id *identity, mode uint32) error {
	dirfd, base, _, err := s.root.openParent(p)
	if err != nil {
		return err
	}
	defer unix.Close(dirfd)
	if err := unix.Mkdirat(dirfd, base, 0o700); err != nil {
		return pathError("mkdir", p, err)
	}
	fd, err := unix.Openat(dirfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return pathError("mkdir", p, err)
	}
	defer unix.Close(fd)
	if err := unix.Fchown(fd, id.UID, id.GID); err != nil {
		return pathError("mkdir", p, err)
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return pathError("mkdir", p, err)
	}
	return nil
}

// symlink creates the symbolic link req.Path → req.Target, owned by the
// request's user, and describes it.
func (s *Server) symlink(req *initproto.SymlinkRequest) (initproto.FileInfo, error) {
	p, err := cleanPath("path", req.Path)
	if err != nil {
		return initproto.FileInfo{}, err
	}
	if !initproto.ValidLinkTarget(req.Target) {
		return initproto.FileInfo{}, newError(initproto.KindInvalid, p, "target: a symbolic link's target is 1 to %d bytes without NUL", initproto.MaxLinkTarget)
	}
	id, err := s.writeIdentity(req.User)
	if err != nil {
		return initproto.FileInfo{}, err
	}
	dirfd, base, resolved, err := s.root.openParent(p)
	if err != nil {
		return initproto.FileInfo{}, err
	}
	defer unix.Close(dirfd)
	if s.root.containsBlocked(resolved) {
		return initproto.FileInfo{}, blockedError(p)
	}
	if err := unix.Symlinkat(req.Target, dirfd, base); err != nil {
		return initproto.FileInfo{}, pathError("symlink", p, err)
	}
	if err := unix.Fchownat(dirfd, base, id.UID, id.GID, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		unix.Unlinkat(dirfd, base, 0)
		return initproto.FileInfo{}, pathError("symlink", p, err)
	}
	return statAt(dirfd, base, p)
}

// reportAs names the requested path p in a blocked error found on one of
// its parents.
func reportAs(err error, p string) error {
	var pe *initproto.Error
	if errors.As(err, &pe) && pe.Kind == initproto.KindBlocked {
		return blockedError(p)
	}
	return err
}

// mkdirAll makes p and its missing parents; existing directories are kept.
func (s *Server) mkdirAll(p string, id *identity, mode uint32) error {
	fd, err := s.root.openDir(p)
	if err == nil {
		defer unix.Close(fd)
		_, err := s.root.checkFd(fd, p)
		return err
	}
	if !isErrno(err, unix.ENOENT) || p == "/" {
		return pathError("mkdir", p, err)
	}
	if err := s.mkdirAll(path.Dir(p), id, 0o755); err != nil {
		return err
	}
	err = s.mkdirOne(p, id, mode)
	var pe *initproto.Error
	if errors.As(err, &pe) && pe.Errno == "EEXIST" {
		// Created concurrently; accept it if it is a directory.
		fd, derr := s.root.openDir(p)
		if derr != nil {
			return err
		}
		unix.Close(fd)
		return nil
	}
	return err
}

// remove deletes a path (not following a final symlink); a non-empty
// directory needs recursive. Removing "/" or a path containing a blocked
// path is refused.
func (s *Server) remove(p string, recursive bool) error {
	p, err := cleanPath("path", p)
	if err != nil {
		return err
	}
	dirfd, base, resolved, err := s.root.openParent(p)
	if err != nil {
		return err
	}
	defer unix.Close(dirfd)
	if s.root.containsBlocked(resolved) {
		return blockedError(p)
	}
	err = unix.Unlinkat(dirfd, base, 0)
	if !isErrno(err, unix.EISDIR) {
		if err != nil {
			return pathError("remove", p, err)
		}
		return nil
	}
	err = unix.Unlinkat(dirfd, base, unix.AT_REMOVEDIR)
	if (isErrno(err, unix.ENOTEMPTY) || isErrno(err, unix.EEXIST)) && recursive {
		if err := removeTree(dirfd, base); err != nil {
			return pathError("remove", p, err)
		}
		err = unix.Unlinkat(dirfd, base, unix.AT_REMOVEDIR)
	}
	if err != nil {
		return pathError("remove", p, err)
	}
	return nil
}

// removeTree empties the directory name in dirfd without following
// symlinks.
func removeTree(dirfd int, name string) error {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	for {
		names, err := f.Readdirnames(1024)
		for _, n := range names {
			uerr := unix.Unlinkat(fd, n, 0)
			if isErrno(uerr, unix.EISDIR) {
				if uerr = removeTree(fd, n); uerr == nil {
					uerr = unix.Unlinkat(fd, n, unix.AT_REMOVEDIR)
				}
			}
			if uerr != nil && !isErrno(uerr, unix.ENOENT) {
				return uerr
			}
		}
		if err == io.EOF || len(names) == 0 {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// rename moves from to to (neither final component is followed); an
// existing file at to is replaced.
func (s *Server) rename(from, to string) error {
	from, err := cleanPath("from", from)
	if err != nil {
		return err
	}
	to, err = cleanPath("to", to)
	if err != nil {
		return err
	}
	fdir, fbase, fres, err := s.root.openParent(from)
	if err != nil {
		return err
	}
	defer unix.Close(fdir)
	tdir, tbase, tres, err := s.root.openParent(to)
	if err != nil {
		return err
	}
	defer unix.Close(tdir)
	if s.root.containsBlocked(fres) {
		return blockedError(from)
	}
	if s.root.containsBlocked(tres) {
		return blockedError(to)
	}
	if err := unix.Renameat(fdir, fbase, tdir, tbase); err != nil {
		e := pathError("rename", from, err)
		e.Message = "rename " + strconv.Quote(from) + " to " + strconv.Quote(to) + ": " + err.Error()
		return e
	}
	return nil
}

// accessCheck answers whether a user can read or write a path.
func (s *Server) accessCheck(req *initproto.AccessRequest) (initproto.AccessResult, error) {
	p, err := cleanPath("path", req.Path)
	if err != nil {
		return initproto.AccessResult{}, err
	}
	user, group := req.User, ""
	if user == "" {
		user, group = s.cfg.DefaultUser, s.cfg.DefaultGroup
	}
	id, err := s.lookupUser(user, group)
	if err != nil {
		return initproto.AccessResult{}, err
	}
	ok, reason, err := s.root.access(p, id, req.Write)
	if err != nil {
		return initproto.AccessResult{}, err
	}
	return initproto.AccessResult{OK: ok, Reason: reason}, nil
}
