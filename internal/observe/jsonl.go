package observe

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
)

// The JSONL files of a jail's events/ directory, one per stored type.
const (
	SyscallsFile   = "syscalls.jsonl"
	FilesystemFile = "filesystem.jsonl"
	NetworkFile    = "network.jsonl"
	ProcessesFile  = "processes.jsonl"
	JailFile       = "jail.jsonl"
)

var streamFiles = [...]string{SyscallsFile, FilesystemFile, NetworkFile, ProcessesFile, JailFile}

// streamOf returns the index in streamFiles of the file that stores t, or
// -1 (lost events go to every file, notices to none).
func streamOf(t Type) int {
	switch t {
	case TypeSyscall:
		return 0
	case TypeFile:
		return 1
	case TypeNet:
		return 2
	case TypeProc:
		return 3
	case TypeJail:
		return 4
	}
	return -1
}

// WriterOptions tunes a Writer; zero fields take the defaults.
type WriterOptions struct {
	// ChunkBytes is the size of one buffer handed to the disk goroutine
	// (default 256 KiB).
	ChunkBytes int
	// QueueChunks is how many full buffers may wait for the disk before
	// further ones are dropped (default 64, i.e. 16 MiB with the default
	// chunk size).
	QueueChunks int
}

type chunk struct {
	stream int
	buf    []byte
}

// Writer appends a jail's events to its JSONL files (events/syscalls.jsonl,
// filesystem.jsonl, network.jsonl, processes.jsonl, jail.jsonl), one JSON object per
// line. Formatting happens in the caller; the disk is written by a goroutine
// of the Writer's own, fed through a bounded queue. When the queue is full the
// Writer drops the buffer instead of waiting, counts its lines, and writes a
// "lost" line (source "writer") at the head of the stream's next buffer.
//
// Write, Flush and Close must be called from one goroutine at a time (the
// event source's); Dropped may be called from any.
type Writer struct {
	dir      string
	files    [len(streamFiles)]*os.File
	cur      [len(streamFiles)][]byte
	lines    [len(streamFiles)]uint64 // lines in cur
	pending  [len(streamFiles)]uint64 // lines dropped, not yet reported in the file
	carried  [len(streamFiles)]uint64 // drops reported by the lost line at the head of cur
	chunkCap int

	queue chan chunk
	free  sync.Pool
	done  chan struct{}

	dropped atomic.Uint64
	written atomic.Uint64
	errMu   sync.Mutex
	err     error
	closed  bool
}

// OpenWriter opens (creating or appending to) the four JSONL files in dir,
// creating dir if needed, and starts the disk goroutine. On error nothing
// stays open.
func OpenWriter(dir string, opts WriterOptions) (*Writer, error) {
	if opts.ChunkBytes <= 0 {
		opts.ChunkBytes = 256 << 10
	}
	if opts.QueueChunks <= 0 {
		opts.QueueChunks = 64
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("observe: create events dir %s: %w", dir, err)
	}
	w := &Writer{
		dir:      dir,
		chunkCap: opts.ChunkBytes,
		queue:    make(chan chunk, opts.QueueChunks),
		done:     make(chan struct{}),
	}
	for i, name := range streamFiles {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
		if err != nil {
			for _, g := range w.files[:i] {
				g.Close()
			}
			return nil, fmt.Errorf("observe: open %s: %w", filepath.Join(dir, name), err)
		}
		w.files[i] = f
	}
	go w.drain()
	return w, nil
}

// Dir returns the directory holding the files.
func (w *Writer) Dir() string { return w.dir }

// Write formats ev into the buffer of its type's file. Events flagged
// FlagInternal and notices are ignored; lost events go to every file. Write
// never blocks on the disk.
func (w *Writer) Write(ev *Event) {
	if ev.Flags&FlagInternal != 0 {
		return
	}
	if ev.Type == TypeLost {
		for i := range w.files {
			w.append(i, ev)
		}
		return
	}
	if i := streamOf(ev.Type); i >= 0 {
		w.append(i, ev)
	}
}

func (w *Writer) append(i int, ev *Event) {
	b := w.cur[i]
	if b == nil {
		b = w.newBuf(i)
	}
	b = ev.AppendJSON(b)
	b = append(b, '\n')
	w.cur[i] = b
	w.lines[i]++
	if len(b) >= w.chunkCap {
		w.handOff(i)
	}
}

// newBuf returns an empty buffer for stream i, starting with a lost line
// when lines of that stream were dropped since the last one.
func (w *Writer) newBuf(i int) []byte {
	var b []byte
	if p, ok := w.free.Get().(*[]byte); ok {
		b = (*p)[:0]
	} else {
		b = make([]byte, 0, w.chunkCap+w.chunkCap/4)
	}
	if n := w.pending[i]; n > 0 {
		w.pending[i] = 0
		w.carried[i] = n
		lost := Event{Type: TypeLost, TS: nowNano(), Source: LostWriter, Lost: n}
		b = lost.AppendJSON(b)
		b = append(b, '\n')
	}
	return b
}

func (w *Writer) handOff(i int) {
	b := w.cur[i]
	if len(b) == 0 {
		return
	}
	select {
	case w.queue <- chunk{stream: i, buf: b}:
	default:
		// The buffer's own lost line goes too: carry its count forward.
		w.dropped.Add(w.lines[i])
		w.pending[i] += w.lines[i] + w.carried[i]
		w.recycle(b)
	}
	w.cur[i] = nil
	w.lines[i] = 0
	w.carried[i] = 0
}

func (w *Writer) recycle(b []byte) {
	b = b[:0]
	w.free.Put(&b)
}

// Flush hands every partly filled buffer to the disk goroutine without
// waiting for it to be written (dropping it, counted, if the queue is full).
func (w *Writer) Flush() {
	for i := range w.cur {
		w.handOff(i)
	}
}

// Dropped returns the number of lines dropped so far because the disk was
// slower than the stream.
func (w *Writer) Dropped() uint64 { return w.dropped.Load() }

// Written returns the number of bytes written to the files so far.
func (w *Writer) Written() uint64 { return w.written.Load() }

func (w *Writer) drain() {
	defer close(w.done)
	for c := range w.queue {
		n, err := w.files[c.stream].Write(c.buf)
		w.written.Add(uint64(n))
		if err != nil {
			w.setErr(fmt.Errorf("observe: write %s: %w", w.files[c.stream].Name(), err))
		}
		w.recycle(c.buf)
	}
}

func (w *Writer) setErr(err error) {
	w.errMu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.errMu.Unlock()
}

// Close hands off the remaining buffers, waits until everything queued is
// written, and closes the files. It returns the first write or close error.
// Closing twice is a no-op returning nil.
func (w *Writer) Close() error {
	if w.closed {
		return nil
	}
	w.closed = true
	for i := range w.cur {
		if w.cur[i] == nil && w.pending[i] > 0 {
			w.cur[i] = w.newBuf(i) // report the last drops in the file
		}
		b := w.cur[i]
		if len(b) > 0 {
			w.queue <- chunk{stream: i, buf: b} // the drain goroutine is running: this cannot block forever
		}
		w.cur[i] = nil
	}
	close(w.queue)
	<-w.done
	var errs []error
	w.errMu.Lock()
	if w.err != nil {
		errs = append(errs, w.err)
	}
	w.errMu.Unlock()
	for _, f := range w.files {
		if err := f.Close(); err != nil {
			errs = append(errs, fmt.Errorf("observe: close %s: %w", f.Name(), err))
		}
	}
	return errors.Join(errs...)
}
