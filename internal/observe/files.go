package observe

import "path"

// x86_64 syscall numbers the file tracker interprets.
const (
	sysRead           = 0
	sysWrite          = 1
	sysOpen           = 2
	sysClose          = 3
	sysPread64        = 17
	sysPwrite64       = 18
	sysReadv          = 19
	sysWritev         = 20
	sysPipe           = 22
	sysDup            = 32
	sysDup2           = 33
	sysSendfile       = 40
	sysSocket         = 41
	sysConnect        = 42
	sysAccept         = 43
	sysSendto         = 44
	sysRecvfrom       = 45
	sysSendmsg        = 46
	sysRecvmsg        = 47
	sysSocketpair     = 53
	sysFcntl          = 72
	sysTruncate       = 76
	sysFtruncate      = 77
	sysChdir          = 80
	sysFchdir         = 81
	sysRename         = 82
	sysMkdir          = 83
	sysRmdir          = 84
	sysCreat          = 85
	sysLink           = 86
	sysUnlink         = 87
	sysSymlink        = 88
	sysChmod          = 90
	sysFchmod         = 91
	sysChown          = 92
	sysFchown         = 93
	sysLchown         = 94
	sysMknod          = 133
	sysOpenat         = 257
	sysMkdirat        = 258
	sysMknodat        = 259
	sysFchownat       = 260
	sysUnlinkat       = 263
	sysRenameat       = 264
	sysLinkat         = 265
	sysSymlinkat      = 266
	sysFchmodat       = 268
	sysSplice         = 275
	sysAccept4        = 288
	sysDup3           = 292
	sysPipe2          = 293
	sysPreadv         = 295
	sysPwritev        = 296
	sysRenameat2      = 316
	sysMemfdCreate    = 319
	sysCopyFileRange  = 326
	sysPreadv2        = 327
	sysPwritev2       = 328
	sysCloseRange     = 436
	sysOpenat2        = 437
	sysFchmodat2      = 452
	sysEventfd2       = 290
	sysEpollCreate    = 213
	sysEpollCreate1   = 291
	sysInotifyInit    = 253
	sysInotifyInit1   = 294
	sysSignalfd4      = 289
	sysTimerfdCreate  = 283
	sysPidfdOpen      = 434
	sysOpenTree       = 428
	sysFsopen         = 430
	sysFsmount        = 432
	sysFspick         = 433
	sysOpenByHandleAt = 304
	sysPerfEventOpen  = 298
	sysUserfaultfd    = 323
	sysFanotifyInit   = 300
	sysIoUringSetup   = 425
	sysBpf            = 321
	sysPidfdGetfd     = 438
	sysEventfd        = 284
	sysSignalfd       = 282
)

const (
	atFDCWD           = -100
	atRemoveDir       = 0x200
	oCloexec          = 0o2000000
	oCreat            = 0o100
	oWronly           = 0o1
	oTrunc            = 0o1000
	sockCloexec       = 0o2000000
	fDupfd            = 0
	fSetfd            = 2
	fDupfdCloexec     = 1030
	fdCloexec         = 1
	closeRangeUnshare = 1 << 1
	closeRangeCloexec = 1 << 2
)

// newFDKinds lists the syscalls (other than opens, pipes and sockets) whose
// non-negative return value is a new descriptor, with the kind recorded.
var newFDKinds = map[int32]string{
	sysEpollCreate: "anon", sysEpollCreate1: "anon", sysEventfd: "anon", sysEventfd2: "anon",
	sysSignalfd: "anon", sysSignalfd4: "anon", sysTimerfdCreate: "anon", sysInotifyInit: "anon",
	sysInotifyInit1: "anon", sysPidfdOpen: "anon", sysOpenTree: "anon", sysFsopen: "anon",
	sysFsmount: "anon", sysFspick: "anon", sysPerfEventOpen: "anon", sysUserfaultfd: "anon",
	sysFanotifyInit: "anon", sysIoUringSetup: "anon", sysBpf: "anon", sysPidfdGetfd: "anon",
	sysOpenByHandleAt: "file",
}

// FileSyscalls returns the syscall numbers the FileTracker needs in order
// to derive file events; a tracer delivers them even when a jail's options
// exclude them from its syscall stream.
func FileSyscalls() []int {
	nrs := []int{
		sysRead, sysWrite, sysOpen, sysClose, sysPread64, sysPwrite64, sysReadv, sysWritev,
		sysPipe, sysDup, sysDup2, sysSendfile, sysSocket, sysAccept, sysSendto, sysRecvfrom,
		sysSendmsg, sysRecvmsg, sysSocketpair, sysFcntl, sysTruncate, sysFtruncate, sysChdir,
		sysFchdir, sysRename, sysMkdir, sysRmdir, sysCreat, sysLink, sysUnlink, sysSymlink,
		sysChmod, sysFchmod, sysChown, sysFchown, sysLchown, sysMknod, sysOpenat, sysMkdirat,
		sysMknodat, sysFchownat, sysUnlinkat, sysRenameat, sysLinkat, sysSymlinkat, sysFchmodat,
		sysSplice, sysAccept4, sysDup3, sysPipe2, sysPreadv, sysPwritev, sysRenameat2,
		sysMemfdCreate, sysCopyFileRange, sysPreadv2, sysPwritev2, sysCloseRange, sysOpenat2,
		sysFchmodat2, sysConnect,
	}
	for nr := range newFDKinds {
		nrs = append(nrs, int(nr))
	}
	return nrs
}

// openFile is one open file description, shared by dup'ed and inherited
// descriptors.
type openFile struct {
	refs   int
	path   string
	kind   string // file, pipe, socket, anon, unknown
	flags  int64
	rbytes int64
	rcalls int64
	wbytes int64
	wcalls int64
}

type fdEntry struct {
	of      *openFile
	cloexec bool
}

// fdTable is a descriptor table, shared by threads and CLONE_FILES children.
type fdTable struct {
	users int
	fds   map[int32]fdEntry
}

// task is one thread known to the tracker.
type task struct {
	files *fdTable
	cwd   string
	pid   int32 // in the jail's namespace
	hpid  int32
	comm  string
}

// FileTracker derives file events from a jail's syscall and process
// events: it keeps a descriptor table per process (following open, dup,
// fcntl, close, close_range, pipes, sockets, fork with or without
// CLONE_FILES, exec's close-on-exec, and exit) and the working directory, so
// paths are absolute as seen inside the jail. Reads and writes are
// aggregated per open file description and reported when its last
// descriptor closes, as one "read" and one "write" event (when non-zero)
// followed by "close". Only regular files (kind "file") produce events;
// pipes, sockets and anonymous descriptors are tracked but not reported.
//
// It is not safe for concurrent use; feed it from the event source's
// goroutine.
type FileTracker struct {
	emit  func(*Event)
	tasks map[int32]*task // by taskKey
	ev    Event
}

// NewFileTracker returns a tracker that passes every derived event to emit
// (the event is valid only during the call).
func NewFileTracker(emit func(*Event)) *FileTracker {
	return &FileTracker{emit: emit, tasks: make(map[int32]*task)}
}

// taskKey is the id the tracker keeps ev's thread under: its host tid, or
// for a source whose threads are not host threads (HostTID 0: a
// user-space kernel) its tid in the jail. Event.CallerTID is in the same
// space.
func taskKey(ev *Event) int32 {
	if ev.HostTID != 0 {
		return ev.HostTID
	}
	return ev.TID
}

// Tasks returns the number of threads the tracker holds state for.
func (ft *FileTracker) Tasks() int { return len(ft.tasks) }

func (ft *FileTracker) task(ev *Event) *task {
	t := ft.tasks[taskKey(ev)]
	if t == nil {
		t = &task{files: &fdTable{users: 1, fds: make(map[int32]fdEntry)}}
		ft.tasks[taskKey(ev)] = t
	}
	t.pid, t.hpid, t.comm = ev.PID, ev.HostPID, ev.Comm
	return t
}

// Handle updates the tracker with ev (syscall and proc events; others are
// ignored) and emits the file events it implies.
func (ft *FileTracker) Handle(ev *Event) {
	switch ev.Type {
	case TypeProc:
		ft.handleProc(ev)
	case TypeSyscall:
		ft.handleSyscall(ev)
	}
}

func (ft *FileTracker) handleProc(ev *Event) {
	switch ev.Op {
	case "fork":
		parent := ft.tasks[ev.CallerTID]
		child := &task{pid: ev.PID, hpid: ev.HostPID, comm: ev.Comm}
		switch {
		case parent == nil:
			child.files = &fdTable{users: 1, fds: make(map[int32]fdEntry)}
		case ev.SharedFiles:
			child.files = parent.files
			child.files.users++
			child.cwd = parent.cwd
		default:
			child.files = parent.files.clone()
			child.cwd = parent.cwd
		}
		if old := ft.tasks[taskKey(ev)]; old != nil {
			ft.release(old, ev)
		}
		ft.tasks[taskKey(ev)] = child
	case "exec":
		t := ft.tasks[ev.CallerTID]
		if t == nil {
			t = &task{files: &fdTable{users: 1, fds: make(map[int32]fdEntry)}}
		}
		delete(ft.tasks, ev.CallerTID)
		if old := ft.tasks[taskKey(ev)]; old != nil && old != t {
			ft.release(old, ev)
		}
		ft.tasks[taskKey(ev)] = t
		t.pid, t.hpid, t.comm = ev.PID, ev.HostPID, ev.Comm
		t.cwd = ev.Cwd
		if t.files.users > 1 { // exec unshares the table
			t.files.users--
			t.files = t.files.clone()
		}
		for fd, e := range t.files.fds {
			if e.cloexec {
				delete(t.files.fds, fd)
				ft.unref(e.of, fd, ev)
			}
		}
	case "exit":
		if t := ft.tasks[taskKey(ev)]; t != nil {
			delete(ft.tasks, taskKey(ev))
			ft.release(t, ev)
		}
	}
}

// release drops t's use of its table, closing everything when it was the
// last user.
func (ft *FileTracker) release(t *task, ev *Event) {
	t.files.users--
	if t.files.users > 0 {
		return
	}
	for fd, e := range t.files.fds {
		delete(t.files.fds, fd)
		ft.unref(e.of, fd, ev)
	}
}

func (tb *fdTable) clone() *fdTable {
	n := &fdTable{users: 1, fds: make(map[int32]fdEntry, len(tb.fds))}
	for fd, e := range tb.fds {
		e.of.refs++
		n.fds[fd] = e
	}
	return n
}

func (ft *FileTracker) handleSyscall(ev *Event) {
	nr, a, ret := ev.NR, &ev.Args, ev.Ret
	switch nr {
	case sysRead, sysReadv, sysPread64, sysPreadv, sysPreadv2, sysRecvfrom, sysRecvmsg:
		if ret > 0 {
			if of := ft.lookup(ev, int32(a[0])); of != nil {
				of.rbytes += ret * ev.Calls()
				of.rcalls += ev.Calls()
			}
		}
		return
	case sysWrite, sysWritev, sysPwrite64, sysPwritev, sysPwritev2, sysSendto, sysSendmsg:
		if ret > 0 {
			if of := ft.lookup(ev, int32(a[0])); of != nil {
				of.wbytes += ret * ev.Calls()
				of.wcalls += ev.Calls()
			}
		}
		return
	case sysSendfile: // out_fd, in_fd
		if ret > 0 {
			ft.moved(ev, int32(a[1]), int32(a[0]), ret)
		}
		return
	case sysSplice, sysCopyFileRange: // fd_in, off_in, fd_out
		if ret > 0 {
			ft.moved(ev, int32(a[0]), int32(a[2]), ret)
		}
		return
	}
	if ret < 0 {
		return
	}
	t := ft.task(ev)
	switch nr {
	case sysOpen, sysCreat, sysOpenat, sysOpenat2:
		var p string
		var flags int64
		switch nr {
		case sysOpen:
			p, flags = ft.resolve(t, atFDCWD, ev.Path), int64(a[1])
		case sysCreat:
			p, flags = ft.resolve(t, atFDCWD, ev.Path), oCreat|oWronly|oTrunc
		case sysOpenat:
			p, flags = ft.resolve(t, int32(a[0]), ev.Path), int64(a[2])
		default: // openat2: the flags are in struct open_how, not decoded
			p = ft.resolve(t, int32(a[0]), ev.Path)
		}
		of := &openFile{path: p, kind: "file", flags: flags}
		ft.install(t, ev, int32(ret), of, flags&oCloexec != 0)
		ft.fileEvent(ev, "open", p, "", 0, 0, int32(ret), flags)
	case sysOpenByHandleAt:
		ft.install(t, ev, int32(ret), &openFile{kind: "unknown"}, int64(a[2])&oCloexec != 0)
	case sysMemfdCreate:
		ft.install(t, ev, int32(ret), &openFile{path: "memfd:" + ev.Path, kind: "anon"}, a[1]&1 != 0)
	case sysClose:
		ft.closeFD(t, ev, int32(a[0]))
	case sysCloseRange:
		ft.closeRange(t, ev, uint32(a[0]), uint32(a[1]), a[2])
	case sysDup:
		ft.dup(t, ev, int32(a[0]), int32(ret), false)
	case sysDup2:
		ft.dup(t, ev, int32(a[0]), int32(a[1]), false)
	case sysDup3:
		ft.dup(t, ev, int32(a[0]), int32(a[1]), a[2]&oCloexec != 0)
	case sysFcntl:
		switch a[1] {
		case fDupfd:
			ft.dup(t, ev, int32(a[0]), int32(ret), false)
		case fDupfdCloexec:
			ft.dup(t, ev, int32(a[0]), int32(ret), true)
		case fSetfd:
			if e, ok := t.files.fds[int32(a[0])]; ok {
				e.cloexec = a[2]&fdCloexec != 0
				t.files.fds[int32(a[0])] = e
			}
		}
	case sysPipe, sysPipe2, sysSocketpair:
		kind, cloexec := "pipe", nr == sysPipe2 && a[1]&oCloexec != 0
		if nr == sysSocketpair {
			kind, cloexec = "socket", a[1]&sockCloexec != 0
		}
		fds := ev.FDs
		if fds[0] >= 0 && fds[1] >= 0 {
			ft.install(t, ev, fds[0], &openFile{path: kind, kind: kind}, cloexec)
			ft.install(t, ev, fds[1], &openFile{path: kind, kind: kind}, cloexec)
		}
	case sysSocket:
		ft.install(t, ev, int32(ret), &openFile{path: "socket", kind: "socket"}, a[1]&sockCloexec != 0)
	case sysAccept, sysAccept4:
		cloexec := nr == sysAccept4 && a[3]&sockCloexec != 0
		p := "socket"
		if ev.Addr != "" {
			p = "socket:" + ev.Addr
		}
		ft.install(t, ev, int32(ret), &openFile{path: p, kind: "socket"}, cloexec)
	case sysConnect:
		if e, ok := t.files.fds[int32(a[0])]; ok && ev.Addr != "" {
			e.of.path = "socket:" + ev.Addr
		}
	case sysChdir:
		t.cwd = ft.resolve(t, atFDCWD, ev.Path)
	case sysFchdir:
		if e, ok := t.files.fds[int32(a[0])]; ok && e.of.kind == "file" {
			t.cwd = e.of.path
		}
	case sysUnlink:
		ft.fileEvent(ev, "unlink", ft.resolve(t, atFDCWD, ev.Path), "", 0, 0, -1, 0)
	case sysRmdir:
		ft.fileEvent(ev, "rmdir", ft.resolve(t, atFDCWD, ev.Path), "", 0, 0, -1, 0)
	case sysUnlinkat:
		op := "unlink"
		if a[2]&atRemoveDir != 0 {
			op = "rmdir"
		}
		ft.fileEvent(ev, op, ft.resolve(t, int32(a[0]), ev.Path), "", 0, 0, -1, 0)
	case sysMkdir:
		ft.fileEvent(ev, "mkdir", ft.resolve(t, atFDCWD, ev.Path), "", 0, 0, -1, int64(a[1]))
	case sysMkdirat:
		ft.fileEvent(ev, "mkdir", ft.resolve(t, int32(a[0]), ev.Path), "", 0, 0, -1, int64(a[2]))
	case sysMknod:
		ft.fileEvent(ev, "mknod", ft.resolve(t, atFDCWD, ev.Path), "", 0, 0, -1, int64(a[1]))
	case sysMknodat:
		ft.fileEvent(ev, "mknod", ft.resolve(t, int32(a[0]), ev.Path), "", 0, 0, -1, int64(a[2]))
	case sysRename:
		ft.fileEvent(ev, "rename", ft.resolve(t, atFDCWD, ev.Path), ft.resolve(t, atFDCWD, ev.Path2), 0, 0, -1, 0)
	case sysRenameat, sysRenameat2:
		ft.fileEvent(ev, "rename", ft.resolve(t, int32(a[0]), ev.Path), ft.resolve(t, int32(a[2]), ev.Path2), 0, 0, -1, 0)
	case sysLink:
		ft.fileEvent(ev, "link", ft.resolve(t, atFDCWD, ev.Path), ft.resolve(t, atFDCWD, ev.Path2), 0, 0, -1, 0)
	case sysLinkat:
		ft.fileEvent(ev, "link", ft.resolve(t, int32(a[0]), ev.Path), ft.resolve(t, int32(a[2]), ev.Path2), 0, 0, -1, 0)
	case sysSymlink: // target, linkpath: the target is stored verbatim
		ft.fileEvent(ev, "symlink", ft.resolve(t, atFDCWD, ev.Path2), ev.Path, 0, 0, -1, 0)
	case sysSymlinkat: // target, newdirfd, linkpath
		ft.fileEvent(ev, "symlink", ft.resolve(t, int32(a[1]), ev.Path2), ev.Path, 0, 0, -1, 0)
	case sysChmod:
		ft.fileEvent(ev, "chmod", ft.resolve(t, atFDCWD, ev.Path), "", 0, 0, -1, int64(a[1]))
	case sysFchmodat, sysFchmodat2:
		ft.fileEvent(ev, "chmod", ft.resolve(t, int32(a[0]), ev.Path), "", 0, 0, -1, int64(a[2]))
	case sysFchmod:
		if of := ft.lookup(ev, int32(a[0])); of != nil {
			ft.fileEvent(ev, "chmod", of.path, "", 0, 0, int32(a[0]), int64(a[1]))
		}
	case sysChown, sysLchown:
		ft.fileEvent(ev, "chown", ft.resolve(t, atFDCWD, ev.Path), "", 0, 0, -1, 0)
	case sysFchownat:
		ft.fileEvent(ev, "chown", ft.resolve(t, int32(a[0]), ev.Path), "", 0, 0, -1, 0)
	case sysFchown:
		if of := ft.lookup(ev, int32(a[0])); of != nil {
			ft.fileEvent(ev, "chown", of.path, "", 0, 0, int32(a[0]), 0)
		}
	case sysTruncate:
		ft.fileEvent(ev, "truncate", ft.resolve(t, atFDCWD, ev.Path), "", int64(a[1]), 0, -1, 0)
	case sysFtruncate:
		if of := ft.lookup(ev, int32(a[0])); of != nil {
			ft.fileEvent(ev, "truncate", of.path, "", int64(a[1]), 0, int32(a[0]), 0)
		}
	default:
		if kind, ok := newFDKinds[nr]; ok {
			ft.install(t, ev, int32(ret), &openFile{kind: kind, path: kind}, false)
		}
	}
}

// lookup returns the description behind fd of ev's thread, creating an
// "unknown" one for descriptors inherited from before the jail was watched.
func (ft *FileTracker) lookup(ev *Event, fd int32) *openFile {
	if fd < 0 {
		return nil
	}
	t := ft.task(ev)
	e, ok := t.files.fds[fd]
	if !ok {
		e = fdEntry{of: &openFile{refs: 1, kind: "unknown"}}
		t.files.fds[fd] = e
	}
	return e.of
}

func (ft *FileTracker) moved(ev *Event, in, out int32, n int64) {
	if of := ft.lookup(ev, in); of != nil {
		of.rbytes += n
		of.rcalls++
	}
	if of := ft.lookup(ev, out); of != nil {
		of.wbytes += n
		of.wcalls++
	}
}

func (ft *FileTracker) install(t *task, ev *Event, fd int32, of *openFile, cloexec bool) {
	if fd < 0 {
		return
	}
	if old, ok := t.files.fds[fd]; ok { // a close we did not see (or dup2 onto it)
		delete(t.files.fds, fd)
		ft.unref(old.of, fd, ev)
	}
	of.refs++
	t.files.fds[fd] = fdEntry{of: of, cloexec: cloexec}
}

func (ft *FileTracker) dup(t *task, ev *Event, oldfd, newfd int32, cloexec bool) {
	e, ok := t.files.fds[oldfd]
	if !ok {
		e = fdEntry{of: &openFile{kind: "unknown"}}
	}
	if oldfd == newfd {
		return
	}
	ft.install(t, ev, newfd, e.of, cloexec)
}

func (ft *FileTracker) closeFD(t *task, ev *Event, fd int32) {
	e, ok := t.files.fds[fd]
	if !ok {
		return
	}
	delete(t.files.fds, fd)
	ft.unref(e.of, fd, ev)
}

func (ft *FileTracker) closeRange(t *task, ev *Event, first, last uint32, flags uint64) {
	if flags&closeRangeUnshare != 0 && t.files.users > 1 {
		t.files.users--
		t.files = t.files.clone()
	}
	for fd, e := range t.files.fds {
		if uint32(fd) < first || uint32(fd) > last {
			continue
		}
		if flags&closeRangeCloexec != 0 {
			e.cloexec = true
			t.files.fds[fd] = e
			continue
		}
		delete(t.files.fds, fd)
		ft.unref(e.of, fd, ev)
	}
}

// unref drops one descriptor's reference to of, reporting the description's
// totals when it was the last.
func (ft *FileTracker) unref(of *openFile, fd int32, ev *Event) {
	of.refs--
	if of.refs > 0 || of.kind != "file" {
		return
	}
	if of.rcalls > 0 {
		ft.fileEvent(ev, "read", of.path, "", of.rbytes, of.rcalls, fd, 0)
	}
	if of.wcalls > 0 {
		ft.fileEvent(ev, "write", of.path, "", of.wbytes, of.wcalls, fd, 0)
	}
	ft.fileEvent(ev, "close", of.path, "", 0, 0, fd, 0)
}

func (ft *FileTracker) fileEvent(src *Event, op, p, p2 string, bytes, count int64, fd int32, mode int64) {
	e := &ft.ev
	*e = Event{
		Type: TypeFile, TS: src.TS,
		PID: src.PID, TID: src.TID, HostPID: src.HostPID, HostTID: src.HostTID, Comm: src.Comm,
		Op: op, Path: p, Path2: p2, Bytes: bytes, Count: count, FD: fd, Mode: mode,
	}
	ft.emit(e)
}

// resolve returns p made absolute against dirfd (or the cwd for AT_FDCWD).
// When the base is unknown the path is returned as given.
func (ft *FileTracker) resolve(t *task, dirfd int32, p string) string {
	if p == "" || p[0] == '/' {
		if p == "" {
			return p
		}
		return path.Clean(p)
	}
	base := t.cwd
	if dirfd != atFDCWD {
		if e, ok := t.files.fds[dirfd]; ok && e.of.kind == "file" {
			base = e.of.path
		} else {
			base = ""
		}
	}
	if base == "" {
		return p
	}
	return capPath(path.Join(base, p))
}

// maxTrackedPath bounds the paths the tracker makes (twice the paths the
// kernel side reads). A process can go down directories by relative steps
// without end, and its working directory and every path made from it
// would grow with each one; the tracker holds one per open descriptor of
// every process of the jail.
const maxTrackedPath = 1024

// capPath returns p, or, when it is longer than maxTrackedPath, its start
// and end around "/…/".
func capPath(p string) string {
	if len(p) <= maxTrackedPath {
		return p
	}
	const mid = "/…/"
	keep := (maxTrackedPath - len(mid)) / 2
	return p[:keep] + mid + p[len(p)-keep:]
}
