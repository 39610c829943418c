// Package audit is the daemon's audit log: one JSON object per line for
// every request that changes state (or tries to), saying who asked, what,
// when, and how it ended. The log is DATA_DIR/audit.jsonl; past its size
// bound it is renamed audit.jsonl.1 (one older generation is kept) and a
// new one begins. Lines are written whole with one write each, so a crash
// loses at most the line being written.
package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Entry is one line of the log.
type Entry struct {
	// Time is when the request ended.
	Time time.Time `json:"ts"`
	// Surface is where the request came in: "api", "e2b", "mcp".
	Surface string `json:"surface"`
	// Who is "token", "key:<id>", or "anonymous" for a request without a
	// valid credential.
	Who     string `json:"who"`
	KeyName string `json:"key_name,omitempty"`
	// Tenant and Role are the credential's (empty when anonymous).
	Tenant string `json:"tenant,omitempty"`
	Role   string `json:"role,omitempty"`
	// Action is the operation: the route ("POST /jails/{id}/exec") or the
	// tool's name.
	Action string `json:"action"`
	// Target is what it acted on: the request's path, or the tool's
	// resource.
	Target string `json:"target,omitempty"`
	// Status is the HTTP status of the answer (or its equivalent).
	Status int `json:"status"`
	// Result is "ok", "denied" (401, 403, 429) or "error".
	Result string `json:"result"`
	// Error is the error's message when the result is not ok.
	Error      string  `json:"error,omitempty"`
	DurationMs float64 `json:"duration_ms"`
	// Remote is the client's address.
	Remote string `json:"remote,omitempty"`
}

// ResultOf is the Result of a request answered with status.
func ResultOf(status int) string {
	switch {
	case status < 400:
		return "ok"
	case status == 401 || status == 403 || status == 429:
		return "denied"
	default:
		return "error"
	}
}

// FileName is the log's file in the data directory.
const FileName = "audit.jsonl"

// DefaultMaxBytes is the size past which the log is rotated.
const DefaultMaxBytes = 64 << 20

// Log appends entries to a file. It is safe for concurrent use; a nil
// *Log discards entries.
type Log struct {
	path string
	max  int64
	mu   sync.Mutex
	f    *os.File
	size int64
}

// Open opens (or starts) the log at path (mode 0600), rotated past max
// bytes (DefaultMaxBytes when 0).
func Open(path string, max int64) (*Log, error) {
	if max <= 0 {
		max = DefaultMaxBytes
	}
	l := &Log{path: path, max: max}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *Log) open() error {
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("audit log: %w", err)
	}
	l.f, l.size = f, st.Size()
	return nil
}

// Path is the log's file.
func (l *Log) Path() string { return l.path }

// Write appends e (its Time set to now when zero). A failure to write is
// returned; the request it records has happened regardless.
func (l *Log) Write(e Entry) error {
	if l == nil {
		return nil
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	e.Time = e.Time.UTC()
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return fmt.Errorf("audit log: closed")
	}
	if l.size+int64(len(b)) > l.max && l.size > 0 {
		if err := l.rotateLocked(); err != nil {
			return err
		}
	}
	n, err := l.f.Write(b)
	l.size += int64(n)
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	return nil
}

func (l *Log) rotateLocked() error {
	l.f.Close()
	l.f = nil
	if err := os.Rename(l.path, l.path+".1"); err != nil {
		return fmt.Errorf("audit log: rotate: %w", err)
	}
	return l.open()
}

// Close closes the file.
func (l *Log) Close() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// maxTail bounds how much of the log Tail reads.
const maxTail = 8 << 20

// Tail returns the newest entries (at most limit) for which keep is
// true, oldest first; it reads at most the last 8 MiB of the current
// file.
func (l *Log) Tail(limit int, keep func(*Entry) bool) ([]Entry, error) {
	f, err := os.Open(l.path)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	off := max(st.Size()-maxTail, 0)
	data, err := io.ReadAll(io.NewSectionReader(f, off, st.Size()-off))
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	if off > 0 {
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			data = data[i+1:]
		}
	}
	var out []Entry
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), maxTail)
	for sc.Scan() {
		var e Entry
		if json.Unmarshal(sc.Bytes(), &e) != nil || !keep(&e) {
			continue
		}
		out = append(out, e)
		if len(out) > limit {
			out = out[1:]
		}
	}
	return out, sc.Err()
}
