// Package regfile opens and reads files of a tree a jail can change while
// the daemon reads it (a jail's upper layer): only regular files, without
// following a link put in a file's place, without blocking on a FIFO, and
// with bare system calls (no poller registration, one buffer reused).
package regfile

import (
	"context"
	"errors"
	"fmt"
	"io"

	"golang.org/x/sys/unix"
)

// ErrNotRegular is returned by Open when the path names something other
// than a regular file (a directory, a FIFO, a link...).
var ErrNotRegular = errors.New("not a regular file")

// Open opens host path p for reading when it is a regular file, and
// returns its descriptor (close-on-exec; the caller closes it) and size.
// A link at p is not followed (ELOOP) and a FIFO neither blocks the open
// nor is read (ErrNotRegular).
func Open(p string) (fd int, size int64, err error) {
	fd, err = unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, 0, fmt.Errorf("open %s: %w", p, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, 0, fmt.Errorf("stat %s: %w", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return -1, 0, fmt.Errorf("%s: %w", p, ErrNotRegular)
	}
	return fd, st.Size, nil
}

// Read calls fn with what it reads from fd through buf (each call's bytes
// are valid until it returns), until the end of the file, limit bytes, or
// ctx ends (its error is returned). It returns how many bytes it read.
func Read(ctx context.Context, fd int, buf []byte, limit int64, fn func([]byte) error) (int64, error) {
	var n int64
	for n < limit {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		r, err := unix.Read(fd, buf[:min(int64(len(buf)), limit-n)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		if r == 0 {
			return n, nil
		}
		n += int64(r)
		if err := fn(buf[:r]); err != nil {
			return n, err
		}
	}
	return n, nil
}

// CopyN writes exactly size bytes of fd to w: the file's first size bytes,
// followed by zeros when the file has shrunk since its size was taken (as
// tar does), so that a record announced with that size stays whole.
func CopyN(ctx context.Context, w io.Writer, fd int, size int64, buf []byte) error {
	n, err := Read(ctx, fd, buf, size, func(b []byte) error {
		_, err := w.Write(b)
		return err
	})
	if err != nil {
		return err
	}
	clear(buf)
	for n < size {
		k := min(int64(len(buf)), size-n)
		if _, err := w.Write(buf[:k]); err != nil {
			return err
		}
		n += k
	}
	return nil
}
