package observe

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestWriterFilesPerType(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "events")
	w, err := OpenWriter(dir, WriterOptions{ChunkBytes: 512})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		w.Write(&Event{Type: TypeSyscall, NR: 0, PID: int32(i)})
	}
	w.Write(&Event{Type: TypeFile, Op: "open", Path: "/x", FD: 3})
	w.Write(&Event{Type: TypeProc, Op: "exec", Argv: []string{"a"}})
	w.Write(&Event{Type: TypeSyscall, Flags: FlagInternal})
	w.Write(&Event{Type: TypeNotice})
	w.Write(&Event{Type: TypeLost, Source: LostKernel, Lost: 3})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{SyscallsFile: 101, FilesystemFile: 2, NetworkFile: 1, ProcessesFile: 2}
	for name, n := range want {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		lines := 0
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if !json.Valid(sc.Bytes()) {
				t.Errorf("%s: invalid line %q", name, sc.Text())
			}
			lines++
		}
		f.Close()
		if lines != n {
			t.Errorf("%s: %d lines, want %d", name, lines, n)
		}
	}
}

// TestWriterDropsInsteadOfBlocking makes the disk stall: syscalls.jsonl is
// a FIFO nobody reads, so the disk goroutine blocks once the pipe is full.
// Write must keep returning, count the dropped lines, and report them in
// the file once the reader catches up.
func TestWriterDropsInsteadOfBlocking(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, SyscallsFile)
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	rd, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	w, err := OpenWriter(dir, WriterOptions{ChunkBytes: 4096, QueueChunks: 2})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20000; i++ { // ~4 MB: far more than pipe + queue
		w.Write(&Event{Type: TypeSyscall, NR: 1, PID: int32(i)})
	}
	dropped := w.Dropped()
	if dropped == 0 {
		t.Fatal("nothing dropped while the disk was stalled")
	}
	// Unblock: read everything until the writer closes its end.
	if err := syscall.SetNonblock(int(rd.Fd()), false); err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- w.Close() }()
	var lost, events uint64
	sc := bufio.NewScanner(rd)
	for sc.Scan() {
		if !strings.Contains(sc.Text(), `"type":"lost"`) {
			events++
			continue
		}
		var m struct {
			Count  uint64 `json:"count"`
			Source string `json:"source"`
		}
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil || m.Source != LostWriter {
			t.Fatalf("lost line %q: %v", sc.Text(), err)
		}
		lost += m.Count
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if lost != w.Dropped() {
		t.Errorf("lost lines report %d, Dropped %d", lost, w.Dropped())
	}
	if events+w.Dropped() != 20000 {
		t.Errorf("written %d + dropped %d != 20000", events, w.Dropped())
	}
}
