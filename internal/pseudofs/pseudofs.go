// Package pseudofs reads the small files the kernel generates on demand
// (/proc, cgroupfs) with bare system calls: open, read until EOF, close.
// os.ReadFile costs twice as many calls on them (fstat, and the poller
// registration that such files refuse, with the fcntl calls around it),
// which shows on paths run for every exec.
package pseudofs

import (
	"errors"
	"io/fs"

	"golang.org/x/sys/unix"
)

// ErrTooLarge reports a file that does not fit in the buffer given.
var ErrTooLarge = errors.New("pseudofs: file larger than the buffer")

// Read reads the whole file at path into buf and returns the part read.
// A file larger than buf is ErrTooLarge. Errors are *fs.PathError, so
// errors.Is(err, fs.ErrNotExist) holds for a missing file.
func Read(path string, buf []byte) ([]byte, error) {
	fd, err := open(path)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	n := 0
	for {
		if n == len(buf) {
			return nil, &fs.PathError{Op: "read", Path: path, Err: ErrTooLarge}
		}
		m, err := unix.Read(fd, buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &fs.PathError{Op: "read", Path: path, Err: err}
		}
		if m == 0 {
			return buf[:n], nil
		}
		n += m
	}
}

func open(path string) (int, error) {
	for {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}
