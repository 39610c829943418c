package jail

import (
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/asciicast"
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
