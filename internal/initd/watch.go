package initd

import (
	"encoding/binary"
	"errors"
	"os"
	"path"
	"strconv"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/initproto"
)

// watchMask are the inotify events a watch reports.
const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR | unix.IN_EXCL_UNLINK

// watcher is one MsgWatch: an inotify instance over a directory (and, when
// recursive, its subdirectories).
type watcher struct {
	srv       *Server
	f         *os.File // the inotify fd, non-blocking and pollable
	root      string   // the watched jail path
	recursive bool
	dirs      map[int32]string // watch descriptor → path relative to root ("" for root)
}

// watch serves MsgWatch until the client closes the connection or the
// watch fails.
func (s *Server) watch(c *conn, req initproto.WatchRequest) error {
	p, err := cleanPath("path", req.Path)
	if err != nil {
		return err
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return newError(initproto.KindInternal, p, "inotify: %v", err)
	}
	w := &watcher{srv: s, f: os.NewFile(uintptr(fd), "inotify"), root: p, recursive: req.Recursive, dirs: map[int32]string{}}
	var closeOnce sync.Once
	closeF := func() { closeOnce.Do(func() { w.f.Close() }) }
	defer closeF()
	if err := w.add(""); err != nil {
		return err
	}
	if err := c.sendJSON(initproto.MsgOK, nil); err != nil {
		return nil
	}
	// The client ends the watch by closing the connection.
	go func() {
		defer recoverPanic(s.log, "watch reader")
		for {
			if _, _, err := c.read(); err != nil {
				closeF()
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			return nil // closed: the client went away
		}
		if err := w.events(c, buf[:n]); err != nil {
			var pe *initproto.Error
			if errors.As(err, &pe) {
				_ = c.sendErr(pe)
			}
			return nil
		}
	}
}

// add watches the directory at rel (relative to the root), and its
// subdirectories when recursive.
func (w *watcher) add(rel string) error {
	p := path.Join(w.root, rel)
	fd, err := w.srv.root.openDir(p)
	if err != nil {
		if rel == "" {
			if errors.Is(err, unix.ENOTDIR) {
				return newError(initproto.KindUnprocessable, p, "watch %q: not a directory", p)
			}
			return pathError("watch", p, err)
		}
		return nil // gone meanwhile
	}
	defer unix.Close(fd)
	if _, err := w.srv.root.checkFd(fd, p); err != nil {
		return err
	}
	if len(w.dirs) >= initproto.MaxWatches {
		return newError(initproto.KindUnprocessable, p, "watch %q: more than %d directories", w.root, initproto.MaxWatches)
	}
	wd, err := unix.InotifyAddWatch(int(w.f.Fd()), "/proc/self/fd/"+strconv.Itoa(fd), watchMask)
	if err != nil {
		return pathError("watch", p, err)
	}
	w.dirs[int32(wd)] = rel
	if !w.recursive {
		return nil
	}
	list, err := w.srv.readDir(p)
	if err != nil {
		return nil
	}
	for _, e := range list {
		if e.Type == initproto.TypeDir {
			if err := w.add(path.Join(rel, e.Name)); err != nil {
				return err
			}
		}
	}
	return nil
}

// events decodes a buffer of inotify events and sends them.
func (w *watcher) events(c *conn, b []byte) error {
	const hdr = int(unsafe.Sizeof(unix.InotifyEvent{}))
	for len(b) >= hdr {
		wd := int32(binary.NativeEndian.Uint32(b[0:4]))
		mask := binary.NativeEndian.Uint32(b[4:8])
		nameLen := int(binary.NativeEndian.Uint32(b[12:16]))
		if hdr+nameLen > len(b) {
			break
		}
		name := string(b[hdr : hdr+nameLen])
		for i := 0; i < len(name); i++ {
			if name[i] == 0 {
				name = name[:i]
				break
			}
		}
		b = b[hdr+nameLen:]
		if mask&unix.IN_Q_OVERFLOW != 0 {
			return newError(initproto.KindUnprocessable, w.root, "watch %q: too many changes at once; events were lost", w.root)
		}
		dir, ok := w.dirs[wd]
		if !ok {
			continue
		}
		if mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0 && dir == "" {
			return newError(initproto.KindNotFound, w.root, "watch %q: the directory was removed or moved", w.root)
		}
		if mask&unix.IN_IGNORED != 0 {
			delete(w.dirs, wd)
			continue
		}
		if name == "" {
			continue
		}
		rel := path.Join(dir, name)
		var op string
		switch {
		case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
			op = initproto.WatchCreate
			if w.recursive && mask&unix.IN_ISDIR != 0 {
				if err := w.add(rel); err != nil {
					return err
				}
			}
		case mask&unix.IN_MODIFY != 0:
			op = initproto.WatchWrite
		case mask&unix.IN_DELETE != 0:
			op = initproto.WatchRemove
		case mask&unix.IN_MOVED_FROM != 0:
			op = initproto.WatchRename
		case mask&unix.IN_ATTRIB != 0:
			op = initproto.WatchChmod
		default:
			continue
		}
		if err := c.sendJSON(initproto.MsgOK, initproto.WatchEvent{Name: rel, Op: op}); err != nil {
			return err
		}
	}
	return nil
}
