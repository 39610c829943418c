package fanwatch

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/testenv"
)

// tmpfs mounts a small tmpfs for the test.
func tmpfs(t *testing.T) string {
	t.Helper()
	testenv.RequireRoot(t)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=8m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

func threads(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestWatchersHoldNoThreads: fifty watchers on one filesystem each report
// a file written there, with its jail path and writer, and while they
// wait they hold no thread of the process (a daemon watches every jail
// this way); after Close a watcher reports nothing more.
func TestWatchersHoldNoThreads(t *testing.T) {
	root := tmpfs(t)
	before := threads(t)
	const n = 50
	got := make(chan Event, 4*n)
	var ws []*Watcher
	for range n {
		w, err := Watch(root, func(ev Event) { got <- ev })
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	if err := os.WriteFile(filepath.Join(root, "notes.txt"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(30 * time.Second)
	for i := range n {
		select {
		case ev := <-got:
			if ev.Path != "/notes.txt" || ev.HostPid != int32(os.Getpid()) {
				t.Fatalf("event %+v, want /notes.txt written by pid %d", ev, os.Getpid())
			}
		case <-timeout:
			t.Fatalf("%d of %d watchers reported the write", i, n)
		}
	}
	// Every watcher has read its event and waits again.
	if grown := threads(t) - before; grown >= 10 {
		t.Errorf("%d watchers waiting hold %d more threads", n, grown)
	}
	for _, w := range ws {
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "later.txt"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-got:
		t.Fatalf("a closed watcher reported %+v", ev)
	default:
	}
}
