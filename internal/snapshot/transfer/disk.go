package transfer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/errdefs"
)

// A disk image travels as its data only: a snapshot's disk is a sparse
// file of the jail's disk size (gigabytes) of which a small jail uses
// megabytes. The stream is diskMagic, the image's size, then extents,
// each its offset and length (big-endian uint64) and its bytes, in
// increasing order, ended by an extent of length 0.
var diskMagic = [8]byte{'A', 'J', 'D', 'I', 'S', 'K', '0', '1'}

// writeDisk writes the data extents of the image at path as a disk
// stream (holes are skipped: SEEK_DATA/SEEK_HOLE).
func writeDisk(w io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	var hdr [16]byte
	copy(hdr[:8], diskMagic[:])
	binary.BigEndian.PutUint64(hdr[8:], uint64(size))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	fd := int(f.Fd())
	for pos := int64(0); pos < size; {
		data, err := unix.Seek(fd, pos, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("%s: seek data: %w", path, err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("%s: seek hole: %w", path, err)
		}
		hole = min(hole, size)
		binary.BigEndian.PutUint64(hdr[:8], uint64(data))
		binary.BigEndian.PutUint64(hdr[8:], uint64(hole-data))
		if _, err := w.Write(hdr[:]); err != nil {
			return err
		}
		if n, err := io.Copy(w, io.NewSectionReader(f, data, hole-data)); err != nil {
			return err
		} else if n != hole-data {
			return fmt.Errorf("%s changed while it was read", path)
		}
		pos = hole
	}
	binary.BigEndian.PutUint64(hdr[:8], uint64(size))
	binary.BigEndian.PutUint64(hdr[8:], 0)
	_, err = w.Write(hdr[:])
	return err
}

// readDisk writes the disk stream r to a new sparse file at path, whose
// size must be at most limit. A malformed stream is
// errdefs.ErrUnprocessable; the file is left for the caller to remove.
func readDisk(r io.Reader, path string, limit int64) (int64, error) {
	var hdr [16]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, errdefs.Wrap(errdefs.ErrUnprocessable, err, "the snapshot's disk image is not a disk stream")
	}
	if [8]byte(hdr[:8]) != diskMagic {
		return 0, errdefs.Unprocessablef("the snapshot's disk image is not a disk stream (it begins %q)", hdr[:8])
	}
	size := int64(binary.BigEndian.Uint64(hdr[8:]))
	if size <= 0 || size > limit {
		return 0, errdefs.New(errdefs.ErrTooLarge, "the snapshot's disk image has %d bytes; this daemon takes disks of 1 to %d bytes", size, limit)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return 0, err
	}
	var end int64
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return 0, errdefs.Wrap(errdefs.ErrUnprocessable, err, "the snapshot's disk image ends without its last extent")
		}
		off, n := int64(binary.BigEndian.Uint64(hdr[:8])), int64(binary.BigEndian.Uint64(hdr[8:]))
		if n == 0 {
			break
		}
		if off < end || n < 0 || off > size || n > size-off {
			return 0, errdefs.Unprocessablef("the snapshot's disk image has an extent of %d bytes at %d, outside its %d bytes or out of order", n, off, size)
		}
		if m, err := io.Copy(io.NewOffsetWriter(f, off), io.LimitReader(r, n)); err != nil {
			return 0, err
		} else if m != n {
			return 0, errdefs.Unprocessablef("the snapshot's disk image ends inside an extent (%d of %d bytes at %d)", m, n, off)
		}
		end = off + n
	}
	if err := f.Sync(); err != nil {
		return 0, err
	}
	return size, f.Close()
}
