package observe

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
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
	// ReserveBytes is free space the Writer leaves on the filesystem of
	// its files: a write that would leave less free is refused as a full
	// disk would refuse it (its lines counted lost, Health failing) until
	// there is room again. The storage pool's image grows on the same
	// filesystem as the jails write their disks; events alone must not take
	// its last bytes. 0 keeps no reserve.
	ReserveBytes int64
	// MaxFileBytes bounds each file: a write that would take a file past
	// it is refused (its lines counted lost and OverBound, Health failing),
	// so that one jail's flood of events cannot take the data dir's space
	// from the others. Only the lines counting what was lost go past it,
	// when the Writer closes. 0 is no bound.
	MaxFileBytes int64
}

// ErrBound is what a write refused to keep a file within the Writer's
// MaxFileBytes fails with.
var ErrBound = errors.New("reached its bound")

// ErrReserve is what a write refused to keep the Writer's reserve of free
// space fails with (it wraps syscall.ENOSPC).
var ErrReserve = fmt.Errorf("the free space left is kept for the jails' disks: %w", syscall.ENOSPC)

// How often the Writer reads its filesystem's free space while it keeps a
// reserve: after this many bytes written, or this much time.
const (
	reserveCheckBytes = 16 << 20
	reserveCheckEvery = 100 * time.Millisecond
)

type chunk struct {
	stream int
	buf    []byte
	// lines is the number of event lines in buf; carried the count its
	// lost line at the head reports.
	lines, carried uint64
	// written, when set, makes the chunk a marker instead (see
	// waitWritten): it is closed once the chunks queued before it are
	// written or refused.
	written chan struct{}
	// last marks the lost lines written when the Writer closes, which may
	// go past MaxFileBytes.
	last bool
}

// Writer appends a jail's events to its JSONL files (events/syscalls.jsonl,
// filesystem.jsonl, network.jsonl, processes.jsonl, jail.jsonl), one JSON object per
// line. Formatting happens in the caller; the disk is written by a goroutine
// of the Writer's own, fed through a bounded queue. When the queue is full the
// Writer drops the buffer instead of waiting, counts its lines, and writes a
// "lost" line (source "writer") at the head of the stream's next buffer.
//
// A file only ever holds whole lines: a write the disk takes only part of
// (the disk is full) is cut back to the last whole line and its lines are
// counted lost, and reported in the file with the next write that
// succeeds; opening a file that ends in a part of a line (the daemon died
// while writing it) cuts that part off first.
//
// Write, Flush and Close must be called from one goroutine at a time (the
// event source's); Dropped may be called from any.
type Writer struct {
	dir   string
	files [len(streamFiles)]*os.File
	// sizes are the files' lengths up to their last whole line (the disk
	// goroutine's).
	sizes [len(streamFiles)]int64
	// diskLost counts, per file, the lines a failed write lost and no
	// lost line reported yet; failing is set while the last write of a
	// file failed.
	diskLost [len(streamFiles)]atomic.Uint64
	failing  [len(streamFiles)]atomic.Bool
	cur      [len(streamFiles)][]byte
	lines    [len(streamFiles)]uint64 // lines in cur
	pending  [len(streamFiles)]uint64 // lines dropped, not yet reported in the file
	carried  [len(streamFiles)]uint64 // drops reported by the lost line at the head of cur
	chunkCap int

	// The reserve of free space (the disk goroutine's): the free bytes the
	// last check found, when it was, and the bytes written since.
	reserve     int64
	maxFile     int64
	freeBytes   int64
	freeChecked time.Time
	sinceCheck  int64

	queue chan chunk
	free  sync.Pool
	done  chan struct{}

	dropped atomic.Uint64
	lost    atomic.Uint64 // lines lost to failed writes, in all
	bounded atomic.Uint64 // of which refused by MaxFileBytes
	written atomic.Uint64
	errMu   sync.Mutex
	err     error
	overErr error // the latest bound reached, kept once set
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
		reserve:  opts.ReserveBytes,
		maxFile:  opts.MaxFileBytes,
		queue:    make(chan chunk, opts.QueueChunks),
		done:     make(chan struct{}),
	}
	for i, name := range streamFiles {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o640)
		if err == nil {
			w.sizes[i], err = wholeLines(f)
			if err != nil {
				f.Close()
			}
		}
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

// wholeLines cuts a regular file that does not end with a newline back
// to its last one and returns its length.
func wholeLines(f *os.File) (int64, error) {
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() == 0 {
		return 0, err
	}
	end := fi.Size()
	buf := make([]byte, 64<<10)
	for off := end; off > 0; {
		n := int64(len(buf))
		if n > off {
			n = off
		}
		off -= n
		if _, err := f.ReadAt(buf[:n], off); err != nil {
			return 0, err
		}
		if i := bytes.LastIndexByte(buf[:n], '\n'); i >= 0 {
			if keep := off + int64(i) + 1; keep != end {
				return keep, f.Truncate(keep)
			}
			return end, nil
		}
	}
	return 0, f.Truncate(0)
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
	if n := w.pending[i] + w.diskLost[i].Swap(0); n > 0 {
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
	case w.queue <- chunk{stream: i, buf: b, lines: w.lines[i], carried: w.carried[i]}:
	default:
		// The buffer's own lost line goes too: carry its count forward.
		w.dropped.Add(w.lines[i])
		streamCounts[i].dropped.Add(w.lines[i])
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

// streamCounts are the event lines every Writer of the process wrote
// and dropped, by stream.
var streamCounts [len(streamFiles)]struct{ written, dropped atomic.Uint64 }

// StreamTotal is what the Writers of the process did with one stream's
// events: lines written to disk, and lines dropped (the disk was slower
// than the stream, or refused them).
type StreamTotal struct {
	// Stream is the file's name without ".jsonl" ("syscalls", ...).
	Stream           string
	Written, Dropped uint64
}

// StreamTotals returns the totals of every stream since the process
// started.
func StreamTotals() []StreamTotal {
	out := make([]StreamTotal, len(streamFiles))
	for i, f := range streamFiles {
		out[i] = StreamTotal{Stream: strings.TrimSuffix(f, ".jsonl"), Written: streamCounts[i].written.Load(), Dropped: streamCounts[i].dropped.Load()}
	}
	return out
}

// waitWritten waits until the disk goroutine has written (or the disk
// refused) every chunk handed off so far: the files then hold what they
// will hold of them.
func (w *Writer) waitWritten() {
	done := make(chan struct{})
	w.queue <- chunk{written: done}
	<-done
}

// Dropped returns the number of lines dropped so far because the disk was
// slower than the stream.
func (w *Writer) Dropped() uint64 { return w.dropped.Load() }

// sizeString writes n bytes in MiB when it is a whole number of them.
func sizeString(n int64) string {
	if n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

// OverBound returns the number of lines refused so far because their file
// reached MaxFileBytes (they are counted in Health's lost too) and, when
// there are any, the error naming the file and the bound (an ErrBound),
// which stays once a file has reached it, whatever is written after.
func (w *Writer) OverBound() (uint64, error) {
	n := w.bounded.Load()
	if n == 0 {
		return 0, nil
	}
	w.errMu.Lock()
	defer w.errMu.Unlock()
	return n, w.overErr
}

// Written returns the number of bytes written to the files so far.
func (w *Writer) Written() uint64 { return w.written.Load() }

func (w *Writer) drain() {
	defer close(w.done)
	for c := range w.queue {
		if c.written != nil {
			close(c.written)
			continue
		}
		w.writeChunk(c)
		w.recycle(c.buf)
	}
}

// writeChunk appends c to its file, or, when the disk takes only part of
// it, cuts the file back to its last whole line and counts c's lines lost.
func (w *Writer) writeChunk(c chunk) {
	f := w.files[c.stream]
	var n int
	var err error
	if w.maxFile > 0 && !c.last && w.sizes[c.stream]+int64(len(c.buf)) > w.maxFile {
		err = fmt.Errorf("%s %w of %s", streamFiles[c.stream], ErrBound, sizeString(w.maxFile))
		// Before the count: whoever sees lines over the bound sees why.
		w.errMu.Lock()
		w.overErr = err
		w.errMu.Unlock()
		w.bounded.Add(c.lines)
	} else {
		err = w.keepReserve(len(c.buf))
	}
	if err == nil {
		n, err = f.Write(c.buf)
	}
	if err == nil {
		w.sizes[c.stream] += int64(n)
		w.written.Add(uint64(n))
		streamCounts[c.stream].written.Add(c.lines)
		w.failing[c.stream].Store(false)
		return
	}
	if n > 0 {
		if terr := f.Truncate(w.sizes[c.stream]); terr != nil {
			err = errors.Join(err, fmt.Errorf("cutting back the part written: %w", terr))
		}
	}
	// The chunk's own lost line goes too: carry its count forward.
	w.diskLost[c.stream].Add(c.lines + c.carried)
	w.lost.Add(c.lines)
	streamCounts[c.stream].dropped.Add(c.lines)
	w.failing[c.stream].Store(true)
	w.setErr(fmt.Errorf("observe: %w", err))
}

// keepReserve returns ErrReserve when writing n more bytes would leave less
// free space than the reserve. The free space is read again when the last
// reading is older than reserveCheckEvery or reserveCheckBytes were
// written since, and always while writes are refused.
func (w *Writer) keepReserve(n int) error {
	if w.reserve <= 0 {
		return nil
	}
	if w.sinceCheck >= reserveCheckBytes || time.Since(w.freeChecked) >= reserveCheckEvery ||
		w.freeBytes-w.sinceCheck-int64(n) < w.reserve {
		var st syscall.Statfs_t
		if err := syscall.Statfs(w.dir, &st); err != nil {
			return fmt.Errorf("free space of %s: %w", w.dir, err)
		}
		w.freeBytes = int64(st.Bavail) * st.Bsize
		w.freeChecked = time.Now()
		w.sinceCheck = 0
	}
	if w.freeBytes-w.sinceCheck-int64(n) < w.reserve {
		return fmt.Errorf("%s: %d MiB free, %d MiB kept: %w", w.dir, w.freeBytes>>20, w.reserve>>20, ErrReserve)
	}
	w.sinceCheck += int64(n)
	return nil
}

// setErr records the latest write error.
func (w *Writer) setErr(err error) {
	w.errMu.Lock()
	w.err = err
	w.errMu.Unlock()
}

// Health reports the lines lost so far because the disk refused them (a
// full disk), and the error of the last failed write while the file it
// concerns still fails (nil once every file takes writes again). Safe
// from any goroutine.
func (w *Writer) Health() (lost uint64, err error) {
	for i := range w.failing {
		if w.failing[i].Load() {
			w.errMu.Lock()
			err = w.err
			w.errMu.Unlock()
			break
		}
	}
	return w.lost.Load(), err
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
		if w.cur[i] == nil && (w.pending[i] > 0 || w.diskLost[i].Load() > 0) {
			w.cur[i] = w.newBuf(i) // report the last drops in the file
		}
		b := w.cur[i]
		if len(b) > 0 {
			w.queue <- chunk{stream: i, buf: b, lines: w.lines[i], carried: w.carried[i]} // the drain goroutine is running: this cannot block forever
		}
		w.cur[i] = nil
	}
	close(w.queue)
	<-w.done
	// Report what the last writes lost, if the disk takes it now.
	for i := range w.files {
		if n := w.diskLost[i].Swap(0); n > 0 {
			lost := Event{Type: TypeLost, TS: nowNano(), Source: LostWriter, Lost: n}
			w.writeChunk(chunk{stream: i, buf: append(lost.AppendJSON(nil), '\n'), carried: n, last: true})
		}
	}
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
