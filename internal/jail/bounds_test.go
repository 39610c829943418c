package jail

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/asciicast"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/recording"
)

// TestStoredRecordingsBounded: recordings in a jail's control dir (which
// the jail's root can write, fabricated ones included) are moved to the
// data dir only while the jail's stored recordings are under their bound;
// the rest stay where they are.
func TestStoredRecordingsBounded(t *testing.T) {
	defer func(n int64) { maxStoredRecordings = n }(maxStoredRecordings)
	maxStoredRecordings = 1 // reached by the first one stored
	e := &entry{dir: t.TempDir(), rec: model.Jail{ID: "0123456789ab"}}
	raw := rawRecordings(e)
	if err := os.MkdirAll(raw, 0o700); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		f, err := os.Create(filepath.Join(raw, fmt.Sprintf("s%d.cast", i)))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		w, err := asciicast.NewWriter(f, asciicast.Header{Width: 80, Height: 24}, start)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]byte, 64<<10)
		if _, err := io.ReadFull(rand.Reader, out); err != nil {
			t.Fatal(err)
		}
		if err := w.Event(start.Add(time.Second), asciicast.Output, out); err != nil {
			t.Fatal(err)
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	m := &Manager{log: slog.New(slog.DiscardHandler)}
	m.finalizeRecordings(e, false)
	stored, err := recording.List(storedRecordings(e))
	if err != nil {
		t.Fatal(err)
	}
	left, _ := os.ReadDir(raw)
	if len(stored) != 1 || len(left) != 2 {
		t.Fatalf("%d recordings stored and %d left in the control dir; want 1 and 2 (the bound reached)", len(stored), len(left))
	}
}

// TestProjectCache: a project's package caches are a disk of their own in
// the storage pool: a write past its size fails there, not on the data
// dir's disk; a later jail of the project (and a manager started again)
// finds the same disk with its content; a bad key is refused; the data
// dir's teardown releases it.
func TestProjectCache(t *testing.T) {
	fake := newFake(config.LevelVM)
	td := newTestData(t, fake.factory())
	m := td.open(t)
	if _, err := m.ProjectCache("../x"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("a key that is not a digest: %v", err)
	}
	dir, err := m.ProjectCache("0123456789abcdef")
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if size := int64(st.Blocks) * st.Bsize; size > ProjectCacheBytes || size < ProjectCacheBytes*9/10 {
		t.Fatalf("the cache's filesystem holds %d bytes, want about %d", size, ProjectCacheBytes)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("a new cache disk holds %v", ents)
	}
	if err := os.WriteFile(filepath.Join(dir, "kept"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	m.Close()
	m = td.open(t)
	again, err := m.ProjectCache("0123456789abcdef")
	if err != nil || again != dir {
		t.Fatalf("the project's cache again: %q %v", again, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "kept")); err != nil {
		t.Errorf("the cache's content after a restart: %v", err)
	}
	// A filler past the disk's size is refused by the disk.
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, ProjectCacheBytes+1<<30)
	f.Close()
	if !errors.Is(err, unix.ENOSPC) {
		t.Errorf("allocating more than the cache disk holds: %v", err)
	}
}
