package observe

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/agentjail/agentjail/internal/testenv"
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
	before := StreamTotals()[0]
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
	// The process-wide totals (the metrics') saw the same.
	after := StreamTotals()[0]
	if after.Stream != "syscalls" || after.Written-before.Written != events || after.Dropped-before.Dropped != w.Dropped() {
		t.Errorf("stream totals moved from %+v to %+v; the writer wrote %d and dropped %d", before, after, events, w.Dropped())
	}
}

// TestWriterCutsPartLineAtOpen: a file that ends in part of a line (the
// daemon died while writing it) is cut back to its last whole line when
// the writer opens it, and the next events follow whole.
func TestWriterCutsPartLineAtOpen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, ProcessesFile)
	if err := os.WriteFile(path, []byte(`{"type":"proc","pid":1}`+"\n"+`{"type":"proc","pi`), 0o640); err != nil {
		t.Fatal(err)
	}
	w, err := OpenWriter(dir, WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w.Write(&Event{Type: TypeProc, Op: "exec", PID: 2})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	lines := readLines(t, path)
	if len(lines) != 2 || !strings.Contains(lines[0], `"pid":1`) || !strings.Contains(lines[1], `"pid":2`) {
		t.Fatalf("after reopening: %q", lines)
	}
}

// readLines returns the lines of a JSONL file, failing on any that is not
// a whole JSON object.
func readLines(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		t.Fatalf("%s ends in part of a line: %q", path, data[max(0, len(data)-80):])
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		if l == "" {
			continue
		}
		if !json.Valid([]byte(l)) {
			t.Fatalf("%s: not a whole line: %q", path, l)
		}
		out = append(out, l)
	}
	return out
}

// TestWriterDiskFull writes events to a small tmpfs that fills up: the
// writes the disk refuses leave whole lines only, Health names the error
// and counts the lost lines, and once there is room again the next write
// succeeds, reports the loss in a lost line and Health clears.
func TestWriterDiskFull(t *testing.T) {
	testenv.RequireRoot(t)
	mnt := t.TempDir()
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=256k"); err != nil {
		t.Fatalf("tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	filler := filepath.Join(mnt, "filler")
	if err := os.WriteFile(filler, make([]byte, 200<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := OpenWriter(filepath.Join(mnt, "events"), WriterOptions{ChunkBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	// Far more than the room left, one flush at a time so that every
	// chunk reaches the disk (none is dropped for a full queue).
	for i := range 4000 {
		w.Write(&Event{Type: TypeSyscall, NR: 1, PID: int32(i), Comm: "filler-of-disks"})
		if i%10 == 9 {
			w.Flush()
			w.waitWritten()
		}
	}
	lost, err := w.Health()
	if lost == 0 || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("after filling the disk: %d lost, %v; want lines lost and ENOSPC", lost, err)
	}
	readLines(t, filepath.Join(mnt, "events", SyscallsFile))

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	w.Write(&Event{Type: TypeSyscall, NR: 2, PID: 99999})
	if err := w.Close(); err == nil {
		t.Error("Close does not report that writes failed")
	}
	lost, err = w.Health()
	if err != nil {
		t.Fatalf("with room again: %v", err)
	}
	// Every lost line is accounted for in the file, and the last event
	// made it.
	lines := readLines(t, filepath.Join(mnt, "events", SyscallsFile))
	reported, _ := countLost(t, lines)
	if reported != lost || !slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, `"pid":99999`) }) {
		t.Fatalf("the file reports %d lost lines, the writer lost %d; the last event is there: %v", reported, lost, slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, `"pid":99999`) }))
	}
}

// TestWriterReserve: a Writer keeping a reserve stops writing while the
// filesystem has less free space than the reserve (the lines counted lost,
// Health saying why), leaves that space free, and writes again, reporting
// what it lost, once there is room.
func TestWriterReserve(t *testing.T) {
	testenv.RequireRoot(t)
	mnt := t.TempDir()
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	filler := filepath.Join(mnt, "filler")
	if err := os.WriteFile(filler, make([]byte, 256<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	const reserve = 512 << 10
	w, err := OpenWriter(filepath.Join(mnt, "events"), WriterOptions{ChunkBytes: 4096, ReserveBytes: reserve})
	if err != nil {
		t.Fatal(err)
	}
	free := func() int64 {
		var st syscall.Statfs_t
		if err := syscall.Statfs(mnt, &st); err != nil {
			t.Fatal(err)
		}
		return int64(st.Bavail) * st.Bsize
	}
	// Far more than the room above the reserve.
	for i := range 8000 {
		w.Write(&Event{Type: TypeSyscall, NR: 1, PID: int32(i), Comm: "filler-of-disks"})
		if i%10 == 9 {
			w.Flush()
			w.waitWritten()
		}
	}
	lost, err := w.Health()
	if lost == 0 || !errors.Is(err, ErrReserve) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("after writing past the reserve: %d lost, %v; want lines lost and the reserve's error", lost, err)
	}
	if f := free(); f < reserve {
		t.Fatalf("%d bytes free, under the %d kept", f, reserve)
	}
	readLines(t, filepath.Join(mnt, "events", SyscallsFile))

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	w.Write(&Event{Type: TypeSyscall, NR: 2, PID: 99999})
	w.Flush()
	w.waitWritten()
	if err := w.Close(); err == nil {
		t.Error("Close does not report that writes were refused")
	}
	if lost, err = w.Health(); err != nil {
		t.Fatalf("with room again: %v", err)
	}
	lines := readLines(t, filepath.Join(mnt, "events", SyscallsFile))
	reported, _ := countLost(t, lines)
	if reported != lost || !slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, `"pid":99999`) }) {
		t.Fatalf("the file reports %d lost lines, the writer lost %d; the last event is there: %v", reported, lost, slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, `"pid":99999`) }))
	}
}

// TestWriterFileBound: a file at the Writer's bound takes no more lines
// (they are counted lost and over the bound, Health saying why) while the
// other files are still written; on close the file ends with a lost line
// counting every line it refused, just past the bound.
func TestWriterFileBound(t *testing.T) {
	dir := t.TempDir()
	const bound = 64 << 10
	w, err := OpenWriter(dir, WriterOptions{ChunkBytes: 4096, MaxFileBytes: bound})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5000 { // about 500 KiB of syscall lines
		w.Write(&Event{Type: TypeSyscall, NR: 1, PID: int32(i), Comm: "flood"})
		if i%10 == 9 {
			w.Flush()
			w.waitWritten()
		}
	}
	w.Write(&Event{Type: TypeProc, PID: 4242, Comm: "after-the-flood"})
	w.Flush()
	w.waitWritten()
	lost, err := w.Health()
	over, overErr := w.OverBound()
	if lost == 0 || over != lost || !errors.Is(err, ErrBound) || !errors.Is(overErr, ErrBound) || !strings.Contains(overErr.Error(), SyscallsFile) {
		t.Fatalf("after a flood past the bound: %d lost, %d over the bound (%v), %v", lost, over, overErr, err)
	}
	// A line that still fits takes the file out of failing; the bound it
	// reached stays said.
	w.Write(&Event{Type: TypeSyscall, NR: 1, PID: 1, Comm: "x"})
	w.Flush()
	w.waitWritten()
	if _, overErr := w.OverBound(); !errors.Is(overErr, ErrBound) {
		t.Errorf("after a line that fits, OverBound says %v", overErr)
	}
	if err := w.Close(); !errors.Is(err, ErrBound) {
		t.Errorf("Close: %v, want the bound's error", err)
	}
	st, err := os.Stat(filepath.Join(dir, SyscallsFile))
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() > bound+200 {
		t.Errorf("%s holds %d bytes, its bound is %d", SyscallsFile, st.Size(), bound)
	}
	reported, written := countLost(t, readLines(t, filepath.Join(dir, SyscallsFile)))
	lost, _ = w.Health()
	if reported != lost || written+lost != 5001 {
		t.Errorf("the file holds %d lines and reports %d lost; the writer lost %d of 5001", written, reported, lost)
	}
	if lines := readLines(t, filepath.Join(dir, ProcessesFile)); len(lines) != 1 || !strings.Contains(lines[0], "after-the-flood") {
		t.Errorf("the other files are not written: %q", lines)
	}
}

// countLost returns the total of the lost lines among JSONL lines, and the
// number of other lines.
func countLost(t *testing.T, lines []string) (lost, other uint64) {
	t.Helper()
	for _, l := range lines {
		var ev struct {
			Type string `json:"type"`
			Lost uint64 `json:"count"`
		}
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Type == "lost" {
			lost += ev.Lost
		} else {
			other++
		}
	}
	return lost, other
}
