package cgroups

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/errdefs"
)

// oomFiles keeps open, per cgroup path, the file OOMKills reads. It is
// read before every exec, and a read of an open file is one pread where
// reading it anew is a path walk, an open, two reads and a close.
var oomFiles = struct {
	sync.Mutex
	m map[string]*os.File // cgroup path → memory.oom_control or memory.events
}{m: map[string]*os.File{}}

// OOMKills reads only the memory controller's count of OOM kills of path
// (cheaper than Read on the exec path), from a file it keeps open until
// CloseFiles or Remove; errdefs.ErrNotFound when the cgroup has no memory
// directory.
func OOMKills(path string) (uint64, error) {
	if err := checkPath(path); err != nil {
		return 0, err
	}
	dir, v2 := dirOf("memory", path)
	if dir == "" {
		return 0, errdefs.NotFoundf("cgroup %s has no memory controller directory", path)
	}
	name := filepath.Join(dir, "memory.oom_control")
	if v2 {
		name = filepath.Join(dir, "memory.events")
	}
	var buf [4096]byte
	b, err := readKept(path, name, buf[:])
	if errors.Is(err, fs.ErrNotExist) {
		return 0, errdefs.NotFoundf("cgroup %s has no memory controller directory", path)
	}
	if err != nil {
		return 0, err
	}
	var n uint64
	return n, parseKey(b, name, "oom_kill", &n)
}

// readKept reads name, the OOM file of the cgroup path, through the file
// kept open for it. A kept file that fails to read belongs to a cgroup
// removed since (perhaps made again, by the runtime): it is dropped and
// name opened anew.
func readKept(path, name string, buf []byte) ([]byte, error) {
	for {
		f, kept, err := keptFile(path, name)
		if err != nil {
			return nil, err
		}
		n, err := pread(f, buf)
		if err == nil {
			return buf[:n], nil
		}
		dropKept(path, f)
		if !kept {
			return nil, &fs.PathError{Op: "read", Path: name, Err: err}
		}
	}
}

// keptFile returns the file kept open for the cgroup path, opening name
// when there is none; kept says whether it was open before.
func keptFile(path, name string) (f *os.File, kept bool, err error) {
	oomFiles.Lock()
	defer oomFiles.Unlock()
	if f, ok := oomFiles.m[path]; ok {
		return f, true, nil
	}
	if f, err = os.Open(name); err != nil {
		return nil, false, err
	}
	oomFiles.m[path] = f
	return f, false, nil
}

// pread reads f from its start in one system call (a cgroup file's whole
// content fits one read of a page); the kept file's descriptor cannot be
// closed and reused meanwhile.
func pread(f *os.File, buf []byte) (n int, err error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	if cerr := rc.Read(func(fd uintptr) bool {
		for {
			n, err = unix.Pread(int(fd), buf, 0)
			if err != unix.EINTR {
				return true
			}
		}
	}); cerr != nil {
		return 0, cerr
	}
	return n, err
}

// dropKept closes f and forgets it as path's kept file (unless another
// is kept by now).
func dropKept(path string, f *os.File) {
	oomFiles.Lock()
	if oomFiles.m[path] == f {
		delete(oomFiles.m, path)
	}
	oomFiles.Unlock()
	f.Close()
}

// CloseFiles closes the files kept open for the cgroup path (see
// OOMKills), so that they hold nothing of a cgroup about to be removed
// or whose processes all ended. Remove calls it.
func CloseFiles(path string) {
	oomFiles.Lock()
	f, ok := oomFiles.m[path]
	delete(oomFiles.m, path)
	oomFiles.Unlock()
	if ok {
		f.Close()
	}
}
