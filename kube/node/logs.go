package node

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/node/api"
)

// maxLogFile bounds a container's log file: past it the file becomes the
// previous one (".1", replacing an older one) and a new file starts, so a
// container keeps at most twice this on disk.
const maxLogFile = 8 << 20

// maxLogLine is the longest line kept whole: longer output is cut into
// partial lines (tag P) as the kubelet does.
const maxLogLine = 16 << 10

// containerLog is a container's output in the kubelet's (CRI) log format:
// one line per output line, "TIMESTAMP STREAM TAG CONTENT", the tag F for
// a full line and P for a part of a longer one. Writers are the one
// goroutine that reads the container's output; readers follow it.
type containerLog struct {
	path string

	mu      sync.Mutex
	f       *os.File
	size    int64
	partial map[string][]byte
	// changed is closed (and replaced) on every write and when the log
	// ends, waking followers.
	changed chan struct{}
	ended   bool
}

func openLog(path string) (*containerLog, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &containerLog{path: path, f: f, size: st.Size(), partial: map[string][]byte{}, changed: make(chan struct{})}, nil
}

// Write appends output of stream ("stdout" or "stderr").
func (l *containerLog) write(stream string, data []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return errors.New("log closed")
	}
	now := time.Now().UTC().Format(time.RFC3339Nano)
	var buf bytes.Buffer
	p := append(l.partial[stream], data...)
	for {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			break
		}
		line := p[:i]
		for len(line) > maxLogLine {
			fmt.Fprintf(&buf, "%s %s P %s\n", now, stream, line[:maxLogLine])
			line = line[maxLogLine:]
		}
		fmt.Fprintf(&buf, "%s %s F %s\n", now, stream, line)
		p = p[i+1:]
	}
	for len(p) >= maxLogLine {
		fmt.Fprintf(&buf, "%s %s P %s\n", now, stream, p[:maxLogLine])
		p = p[maxLogLine:]
	}
	l.partial[stream] = append([]byte(nil), p...)
	return l.append(buf.Bytes())
}

// append writes b to the file, rotating it first when it would grow past
// maxLogFile; called with l.mu held.
func (l *containerLog) append(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if l.size+int64(len(b)) > maxLogFile && l.size > 0 {
		if err := l.f.Close(); err != nil {
			return err
		}
		if err := os.Rename(l.path, l.path+".1"); err != nil {
			return err
		}
		f, err := os.OpenFile(l.path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o640)
		if err != nil {
			l.f = nil
			return err
		}
		l.f, l.size = f, 0
	}
	n, err := l.f.Write(b)
	l.size += int64(n)
	close(l.changed)
	l.changed = make(chan struct{})
	return err
}

// end writes what is left of unfinished lines and wakes followers for the
// last time; a later instance of the container (a restart) continues the
// log with resume.
func (l *containerLog) end() {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now().UTC().Format(time.RFC3339Nano)
	var buf bytes.Buffer
	for stream, p := range l.partial {
		if len(p) > 0 {
			fmt.Fprintf(&buf, "%s %s F %s\n", now, stream, p)
		}
		delete(l.partial, stream)
	}
	if l.f != nil {
		_ = l.append(buf.Bytes())
	}
	l.ended = true
	close(l.changed)
	l.changed = make(chan struct{})
}

// resume marks the log live again (the container restarted).
func (l *containerLog) resume() {
	l.mu.Lock()
	l.ended = false
	l.mu.Unlock()
}

// close ends the log and closes its file.
func (l *containerLog) close() {
	l.end()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
}

// logLine is one parsed line of the log file.
type logLine struct {
	ts      time.Time
	full    bool
	content []byte
}

// parseLine parses "TS STREAM TAG CONTENT".
func parseLine(b []byte) (logLine, bool) {
	f := bytes.SplitN(b, []byte(" "), 4)
	if len(f) < 3 {
		return logLine{}, false
	}
	ts, err := time.Parse(time.RFC3339Nano, string(f[0]))
	if err != nil {
		return logLine{}, false
	}
	ll := logLine{ts: ts, full: string(f[2]) == "F"}
	if len(f) == 4 {
		ll.content = f[3]
	}
	return ll, true
}

// render writes a line as `kubectl logs` shows it.
func render(w *bufio.Writer, ll logLine, opts api.ContainerLogOpts) {
	if opts.Timestamps {
		w.WriteString(ll.ts.Format(time.RFC3339Nano))
		w.WriteByte(' ')
	}
	w.Write(ll.content)
	if ll.full {
		w.WriteByte('\n')
	}
}

// read returns the log as `kubectl logs` asks: since a time, the last
// Tail lines, with timestamps, at most LimitBytes, and with Follow until
// the container's log ends or ctx is done.
func (l *containerLog) read(ctx context.Context, opts api.ContainerLogOpts) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(l.stream(ctx, pw, opts))
	}()
	return pr
}

func (l *containerLog) stream(ctx context.Context, out io.Writer, opts api.ContainerLogOpts) error {
	since := opts.SinceTime
	if opts.SinceSeconds > 0 {
		since = time.Now().Add(-time.Duration(opts.SinceSeconds) * time.Second)
	}
	var lw io.Writer = out
	if opts.LimitBytes > 0 {
		lw = &limitWriter{w: out, n: int64(opts.LimitBytes)}
	}
	w := bufio.NewWriter(lw)
	keep := func(ll logLine) bool { return since.IsZero() || !ll.ts.Before(since) }

	// What is there now: the previous file, then the current one.
	l.mu.Lock()
	changed, ended := l.changed, l.ended
	l.mu.Unlock()
	var lines []logLine
	var offset int64
	for _, p := range []string{l.path + ".1", l.path} {
		b, err := os.ReadFile(p)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if p == l.path {
			offset = int64(len(b))
		}
		for _, raw := range bytes.Split(b, []byte("\n")) {
			if ll, ok := parseLine(raw); ok && keep(ll) {
				lines = append(lines, ll)
			}
		}
	}
	if opts.Tail > 0 && len(lines) > opts.Tail {
		lines = lines[len(lines)-opts.Tail:]
	}
	for _, ll := range lines {
		render(w, ll, opts)
	}
	if err := w.Flush(); err != nil || !opts.Follow {
		return ignoreLimit(err)
	}
	// Follow: read what the writer appends.
	for !ended {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
		l.mu.Lock()
		changed, ended = l.changed, l.ended
		l.mu.Unlock()
		f, err := os.Open(l.path)
		if err != nil {
			return err
		}
		st, err := f.Stat()
		if err == nil && st.Size() < offset {
			offset = 0 // rotated
		}
		b, err := io.ReadAll(io.NewSectionReader(f, offset, 1<<62))
		f.Close()
		if err != nil {
			return err
		}
		// Only whole lines; the rest is read next time.
		if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
			b = b[:i+1]
		} else {
			b = nil
		}
		offset += int64(len(b))
		for _, raw := range bytes.Split(b, []byte("\n")) {
			if ll, ok := parseLine(raw); ok && keep(ll) {
				render(w, ll, opts)
			}
		}
		if err := w.Flush(); err != nil {
			return ignoreLimit(err)
		}
	}
	return nil
}

// errLimit ends a read that reached LimitBytes.
var errLimit = errors.New("log limit reached")

func ignoreLimit(err error) error {
	if errors.Is(err, errLimit) {
		return nil
	}
	return err
}

// limitWriter passes at most n bytes, then fails with errLimit.
type limitWriter struct {
	w io.Writer
	n int64
}

func (lw *limitWriter) Write(p []byte) (int, error) {
	if lw.n <= 0 {
		return 0, errLimit
	}
	short := false
	if int64(len(p)) > lw.n {
		p, short = p[:lw.n], true
	}
	n, err := lw.w.Write(p)
	lw.n -= int64(n)
	if err == nil && short {
		err = errLimit
	}
	return n, err
}
