package regfile

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestOpenOnlyRegular: what a jail may have put in a file's place is not
// opened for reading: a FIFO (whose open would wait for a writer), a link
// (which could lead to a host file), a directory.
func TestOpenOnlyRegular(t *testing.T) {
	dir := t.TempDir()
	file, fifo, link := filepath.Join(dir, "file"), filepath.Join(dir, "fifo"), filepath.Join(dir, "link")
	if err := os.WriteFile(file, []byte("12345"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	fd, size, err := Open(file)
	if err != nil || size != 5 {
		t.Fatalf("open of a regular file: %d %v", size, err)
	}
	unix.Close(fd)
	for p, want := range map[string]error{fifo: ErrNotRegular, dir: ErrNotRegular, link: unix.ELOOP, filepath.Join(dir, "none"): os.ErrNotExist} {
		if fd, _, err := Open(p); !errors.Is(err, want) {
			if err == nil {
				unix.Close(fd)
			}
			t.Errorf("open of %s: %v, want %v", filepath.Base(p), err, want)
		}
	}
}

// TestCopyNPadsAShrunkFile: a file cut short after its size was taken is
// copied to that size, its missing end as zeros; a longer one is cut at
// it; reads stop at the limit and when the context ends.
func TestCopyNPadsAShrunkFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	data := bytes.Repeat([]byte("abcdefgh"), 10_000) // 80 000 bytes
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	fd, size, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := os.Truncate(p, 1000); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := CopyN(context.Background(), &out, fd, size, make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	want := append(bytes.Clone(data[:1000]), make([]byte, len(data)-1000)...)
	if !bytes.Equal(out.Bytes(), want) {
		t.Fatalf("copied %d bytes, want the first 1000 then zeros to %d", out.Len(), len(want))
	}

	if _, err := unix.Seek(fd, 0, 0); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := CopyN(context.Background(), &out, fd, 10, make([]byte, 4)); err != nil || out.String() != "abcdefghab" {
		t.Fatalf("copy of a longer file cut at 10 bytes: %q %v", out.String(), err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if n, err := Read(ctx, fd, make([]byte, 4), 100, func([]byte) error { return nil }); !errors.Is(err, context.Canceled) || n != 0 {
		t.Fatalf("read after the context ended: %d %v", n, err)
	}
}
