package pseudofs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestReadProcStat(t *testing.T) {
	b, err := Read("/proc/self/stat", make([]byte, 2048))
	if err != nil {
		t.Fatal(err)
	}
	if want := strconv.Itoa(os.Getpid()) + " ("; !strings.HasPrefix(string(b), want) {
		t.Fatalf("/proc/self/stat reads %q, want it to begin with %q", b, want)
	}
}

func TestReadWholeFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	data := strings.Repeat("0123456789", 100)
	if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := Read(p, make([]byte, len(data)+1))
	if err != nil || string(b) != data {
		t.Fatalf("Read = %d bytes, %v; want the %d bytes written", len(b), err, len(data))
	}
	if _, err := Read(p, make([]byte, len(data))); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a buffer of exactly the file's size: %v, want ErrTooLarge (EOF is not seen)", err)
	}
	if _, err := Read(p, make([]byte, 10)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a small buffer: %v, want ErrTooLarge", err)
	}
}

func TestReadMissing(t *testing.T) {
	_, err := Read(filepath.Join(t.TempDir(), "nope"), make([]byte, 64))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a missing file: %v, want fs.ErrNotExist", err)
	}
}
