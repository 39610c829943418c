package initd

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/initproto"
)

// protoError converts err into the wire error; an err that already is a
// *initproto.Error is returned as is, a system call error gets its kind
// from its errno.
func protoError(err error) *initproto.Error {
	var pe *initproto.Error
	if errors.As(err, &pe) {
		return pe
	}
	e := &initproto.Error{Kind: initproto.KindInternal, Message: err.Error()}
	var errno unix.Errno
	if errors.As(err, &errno) {
		e.Errno = unix.ErrnoName(errno)
		e.Kind = errnoKind(errno)
	}
	return e
}

// errnoKind maps an errno to an error kind.
func errnoKind(errno unix.Errno) string {
	switch errno {
	case unix.ENOENT, unix.ESRCH:
		return initproto.KindNotFound
	case unix.EACCES, unix.EPERM, unix.EROFS:
		return initproto.KindForbidden
	case unix.EEXIST:
		return initproto.KindConflict
	case unix.EISDIR, unix.ENOTDIR, unix.ENOTEMPTY, unix.ELOOP, unix.EXDEV, unix.EBUSY, unix.EINVAL, unix.ENAMETOOLONG:
		return initproto.KindUnprocessable
	case unix.ENOSPC, unix.EDQUOT:
		return initproto.KindNoSpace
	}
	return initproto.KindInternal
}

// newError builds a wire error of the given kind about a jail path.
func newError(kind, path, format string, args ...any) *initproto.Error {
	return &initproto.Error{Kind: kind, Path: path, Message: fmt.Sprintf(format, args...)}
}

// pathError builds the wire error of a failed system call on a jail path:
// the message names the operation and the path.
func pathError(op, path string, err error) *initproto.Error {
	var pe *initproto.Error
	if errors.As(err, &pe) {
		return pe
	}
	e := protoError(err)
	e.Path = path
	e.Message = fmt.Sprintf("%s %q: %v", op, path, err)
	return e
}

// blockedError is the error of an operation on a blocked path.
func blockedError(path string) *initproto.Error {
	return newError(initproto.KindBlocked, path, "path %q is blocked by the jail's policy", path)
}
