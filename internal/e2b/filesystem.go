package e2b

import (
	"context"
	"errors"
	"io/fs"
	"net/http"
	"path"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/agentjail/agentjail/internal/e2b/envd/filesystem"
	"github.com/agentjail/agentjail/internal/e2b/envd/filesystem/filesystemconnect"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/model"
)

// Bounds of the filesystem service.
const (
	// maxListEntries bounds a ListDir answer.
	maxListEntries = 100000
	// maxWatcherEvents bounds the events a polled watcher keeps.
	maxWatcherEvents = 10000
	// maxWatchers bounds the polled watchers of one sandbox.
	maxWatchers = 64
)

// filesystemService serves filesystem.Filesystem on the sandbox's jail.
type filesystemService struct {
	s *Service
}

var _ filesystemconnect.FilesystemHandler = (*filesystemService)(nil)

// entry converts a file description.
func entry(fi *model.FileInfo) *filesystem.EntryInfo {
	mode64, _ := strconv.ParseUint(fi.Mode, 8, 32)
	perm := fs.FileMode(mode64) & fs.ModePerm
	e := &filesystem.EntryInfo{
		Name: fi.Name, Path: fi.Path, Size: fi.Size, Mode: uint32(perm),
		Owner: strconv.Itoa(fi.UID), Group: strconv.Itoa(fi.GID), ModifiedTime: timestamppb.New(fi.ModTime),
	}
	if fi.UID == 0 {
		e.Owner = "root"
	}
	if fi.GID == 0 {
		e.Group = "root"
	}
	switch fi.Type {
	case initproto.TypeFile:
		e.Type = filesystem.FileType_FILE_TYPE_FILE
	case initproto.TypeDir:
		e.Type = filesystem.FileType_FILE_TYPE_DIRECTORY
		perm |= fs.ModeDir
	case initproto.TypeSymlink:
		e.Type = filesystem.FileType_FILE_TYPE_SYMLINK
		perm |= fs.ModeSymlink
		t := fi.LinkTarget
		e.SymlinkTarget = &t
	}
	e.Permissions = perm.String()
	return e
}

// pathArg resolves a request path for the RPC's user (Basic auth).
func (f *filesystemService) pathArg(ctx context.Context, sb *sandbox, h http.Header, p string) (string, error) {
	return f.s.resolvePath(ctx, sb, p, basicUser(h))
}

func (f *filesystemService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	s, sb := f.s, sandboxFrom(ctx)
	p, err := f.pathArg(ctx, sb, req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, s.rpcError(err)
	}
	fi, err := s.jails.Stat(ctx, sb.snapshot().JailID, p)
	if err != nil {
		return nil, s.rpcError(err)
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: entry(fi)}), nil
}

func (f *filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	s, sb := f.s, sandboxFrom(ctx)
	p, err := f.pathArg(ctx, sb, req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, s.rpcError(err)
	}
	jail := sb.snapshot().JailID
	fi, err := s.jails.Stat(ctx, jail, p)
	if err != nil {
		return nil, s.rpcError(err)
	}
	if fi.Type != initproto.TypeDir {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("path "+strconv.Quote(p)+" is not a directory"))
	}
	depth := max(int(req.Msg.GetDepth()), 1)
	out := &filesystem.ListDirResponse{}
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		l, err := s.jails.ReadDir(ctx, jail, dir)
		if err != nil {
			return err
		}
		if l.Truncated {
			return errdefs.New(errdefs.ErrTooLarge, "listing %s: %s has more than %d entries", p, dir, len(l.Entries))
		}
		list := l.Entries
		for i := range list {
			if len(out.Entries) >= maxListEntries {
				return errdefs.New(errdefs.ErrTooLarge, "listing %s: more than %d entries", p, maxListEntries)
			}
			out.Entries = append(out.Entries, entry(&list[i]))
			if list[i].Type == initproto.TypeDir && level < depth {
				if err := walk(list[i].Path, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(p, 1); err != nil {
		return nil, s.rpcError(err)
	}
	return connect.NewResponse(out), nil
}

func (f *filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	s, sb := f.s, sandboxFrom(ctx)
	user := basicUser(req.Header())
	p, err := f.pathArg(ctx, sb, req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, s.rpcError(err)
	}
	jail := sb.snapshot().JailID
	if fi, err := s.jails.Stat(ctx, jail, p); err == nil {
		if fi.Type == initproto.TypeDir {
			return nil, connect.NewError(connect.CodeAlreadyExists, errors.New("directory "+strconv.Quote(p)+" already exists"))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("path "+strconv.Quote(p)+" exists and is not a directory"))
	}
	fi, err := s.jails.Mkdir(ctx, jail, p, model.WriteOptions{User: user})
	if err != nil {
		return nil, s.rpcError(err)
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: entry(fi)}), nil
}

func (f *filesystemService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	s, sb := f.s, sandboxFrom(ctx)
	from, err := f.pathArg(ctx, sb, req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, s.rpcError(err)
	}
	to, err := f.pathArg(ctx, sb, req.Header(), req.Msg.GetDestination())
	if err != nil {
		return nil, s.rpcError(err)
	}
	jail := sb.snapshot().JailID
	if _, err := s.jails.Stat(ctx, jail, from); err != nil {
		return nil, s.rpcError(err)
	}
	if dir := path.Dir(to); dir != "/" {
		if _, err := s.jails.Stat(ctx, jail, dir); errors.Is(err, errdefs.ErrNotFound) {
			if _, err := s.jails.Mkdir(ctx, jail, dir, model.WriteOptions{User: basicUser(req.Header())}); err != nil {
				return nil, s.rpcError(err)
			}
		}
	}
	fi, err := s.jails.Rename(ctx, jail, from, to)
	if err != nil {
		return nil, s.rpcError(err)
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: entry(fi)}), nil
}

func (f *filesystemService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	s, sb := f.s, sandboxFrom(ctx)
	p, err := f.pathArg(ctx, sb, req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, s.rpcError(err)
	}
	// Like os.RemoveAll: recursive, and a missing path is no error.
	if err := s.jails.Remove(ctx, sb.snapshot().JailID, p, true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return nil, s.rpcError(err)
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

// watchEvent converts a watch event.
func watchEvent(ev initproto.WatchEvent) *filesystem.FilesystemEvent {
	t := filesystem.EventType_EVENT_TYPE_UNSPECIFIED
	switch ev.Op {
	case initproto.WatchCreate:
		t = filesystem.EventType_EVENT_TYPE_CREATE
	case initproto.WatchWrite:
		t = filesystem.EventType_EVENT_TYPE_WRITE
	case initproto.WatchRemove:
		t = filesystem.EventType_EVENT_TYPE_REMOVE
	case initproto.WatchRename:
		t = filesystem.EventType_EVENT_TYPE_RENAME
	case initproto.WatchChmod:
		t = filesystem.EventType_EVENT_TYPE_CHMOD
	}
	return &filesystem.FilesystemEvent{Name: ev.Name, Type: t}
}

// openWatch starts a watch of a directory of the sandbox.
func (f *filesystemService) openWatch(ctx context.Context, sb *sandbox, h http.Header, p string, recursive bool) (*initclient.Watch, error) {
	p, err := f.pathArg(ctx, sb, h, p)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), startTimeout)
	defer cancel()
	return f.s.jails.WatchDir(sctx, sb.snapshot().JailID, p, recursive)
}

func (f *filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], st *connect.ServerStream[filesystem.WatchDirResponse]) error {
	s, sb := f.s, sandboxFrom(ctx)
	ctx, done, err := sb.openStream(ctx)
	if err != nil {
		return s.rpcError(err)
	}
	defer done()
	w, err := f.openWatch(ctx, sb, req.Header(), req.Msg.GetPath(), req.Msg.GetRecursive())
	if err != nil {
		return s.rpcError(err)
	}
	defer w.Close()
	stop := context.AfterFunc(ctx, func() { w.Close() })
	defer stop()
	if err := st.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	interval := defaultKeepalive
	if v, err := strconv.Atoi(req.Header().Get("Keepalive-Ping-Interval")); err == nil && v > 0 {
		interval = time.Duration(v) * time.Second
	}
	type item struct {
		ev  initproto.WatchEvent
		err error
	}
	ch := make(chan item, 64)
	quit := make(chan struct{})
	defer close(quit)
	go func() {
		for {
			ev, err := w.Next()
			select {
			case ch <- item{ev, err}:
			case <-quit:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	keep := time.NewTicker(interval)
	defer keep.Stop()
	for {
		select {
		case <-ctx.Done():
			if errors.Is(context.Cause(ctx), errSandboxGone) {
				return s.rpcError(errSandboxGone)
			}
			return s.rpcError(ctx.Err())
		case <-keep.C:
			if err := st.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case it := <-ch:
			if it.err != nil {
				if ctx.Err() != nil {
					continue
				}
				return s.rpcError(it.err)
			}
			if err := st.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: watchEvent(it.ev)}}); err != nil {
				return err
			}
		}
	}
}

// pollWatcher is a watch kept by the daemon for a client that polls it
// (CreateWatcher, GetWatcherEvents, RemoveWatcher).
type pollWatcher struct {
	sandbox string
	w       *initclient.Watch
	mu      sync.Mutex
	events  []*filesystem.FilesystemEvent
	err     error
}

func (pw *pollWatcher) run() {
	for {
		ev, err := pw.w.Next()
		pw.mu.Lock()
		if err != nil {
			if pw.err == nil {
				pw.err = err
			}
			pw.mu.Unlock()
			return
		}
		if len(pw.events) >= maxWatcherEvents {
			pw.err = errdefs.New(errdefs.ErrTooLarge, "watcher: more than %d events were not fetched; it stopped", maxWatcherEvents)
			pw.mu.Unlock()
			pw.w.Close()
			return
		}
		pw.events = append(pw.events, watchEvent(ev))
		pw.mu.Unlock()
	}
}

func (pw *pollWatcher) close() { pw.w.Close() }

// closeWatchers ends the polled watchers of a sandbox.
func (s *Service) closeWatchers(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for wid, w := range s.watchers {
		if w.sandbox == id {
			w.close()
			delete(s.watchers, wid)
		}
	}
}

func (f *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	s, sb := f.s, sandboxFrom(ctx)
	id := sb.snapshot().ID
	s.mu.Lock()
	n := 0
	for _, w := range s.watchers {
		if w.sandbox == id {
			n++
		}
	}
	s.mu.Unlock()
	if n >= maxWatchers {
		return nil, connect.NewError(connect.CodeResourceExhausted, errors.New("the sandbox has "+strconv.Itoa(maxWatchers)+" watchers; remove one first"))
	}
	w, err := f.openWatch(ctx, sb, req.Header(), req.Msg.GetPath(), req.Msg.GetRecursive())
	if err != nil {
		return nil, s.rpcError(err)
	}
	pw := &pollWatcher{sandbox: id, w: w}
	wid := newToken()[:16]
	s.mu.Lock()
	s.watchers[wid] = pw
	s.mu.Unlock()
	go pw.run()
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: wid}), nil
}

// watcher returns a polled watcher of the request's sandbox.
func (f *filesystemService) watcher(ctx context.Context, wid string) (*pollWatcher, error) {
	sb := sandboxFrom(ctx)
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	w := f.s.watchers[wid]
	if w == nil || w.sandbox != sb.snapshot().ID {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("no watcher "+strconv.Quote(wid)))
	}
	return w, nil
}

func (f *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	w, err := f.watcher(ctx, req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	evs, werr := w.events, w.err
	w.events = nil
	w.mu.Unlock()
	if len(evs) == 0 && werr != nil {
		return nil, f.s.rpcError(werr)
	}
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: evs}), nil
}

func (f *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	w, err := f.watcher(ctx, req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	f.s.mu.Lock()
	delete(f.s.watchers, req.Msg.GetWatcherId())
	f.s.mu.Unlock()
	w.close()
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}
