// Package asciicast writes and reads terminal recordings in the asciicast
// v2 format (a JSON header line, then one JSON array per event:
// [seconds, code, data]). The writer is used by the in-jail init, so the
// package depends on the standard library only.
//
// Event codes: "o" is output of the terminal, "i" is input typed into it,
// "r" is a resize whose data is "COLSxROWS". Event data must be valid
// UTF-8: the writer carries an incomplete multi-byte sequence at the end of
// one chunk over to the next event of the same code, and replaces invalid
// bytes with U+FFFD.
package asciicast

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/agentjail/agentjail/internal/jsonstr"
)

// Version is the asciicast format version written and accepted.
const Version = 2

// Event codes.
const (
	Output = "o"
	Input  = "i"
	Resize = "r"
)

// Header is the first line of a recording. JailID and SessionID are
// agentjail's additions; players ignore keys they do not know.
type Header struct {
	Version   int               `json:"version"`
	Width     int               `json:"width"`
	Height    int               `json:"height"`
	Timestamp int64             `json:"timestamp"`
	Command   string            `json:"command,omitempty"`
	Title     string            `json:"title,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	JailID    string            `json:"jail_id,omitempty"`
	SessionID string            `json:"session_id,omitempty"`
}

// Writer appends events to a recording. It is not safe for concurrent
// use; the caller serialises calls.
type Writer struct {
	w       *bufio.Writer
	start   time.Time
	pending map[string][]byte // incomplete UTF-8 tail per event code
	line    []byte
}

// NewWriter writes h (Version is set to 2, Timestamp to start when zero)
// to w and returns a Writer whose event times are relative to start.
// Events are buffered; call Flush to push them to w.
func NewWriter(w io.Writer, h Header, start time.Time) (*Writer, error) {
	h.Version = Version
	if h.Timestamp == 0 {
		h.Timestamp = start.Unix()
	}
	b, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("asciicast header: %w", err)
	}
	bw := bufio.NewWriterSize(w, 256<<10)
	bw.Write(b)
	if err := bw.WriteByte('\n'); err != nil {
		return nil, fmt.Errorf("asciicast header: %w", err)
	}
	return &Writer{w: bw, start: start, pending: map[string][]byte{}}, nil
}

// Event appends an event of code at time at with data p. For Output and
// Input, an incomplete UTF-8 sequence at the end of p is held back and
// prepended to the next event of the same code; an event left with no
// data is not written.
func (w *Writer) Event(at time.Time, code string, p []byte) error {
	if prev := w.pending[code]; len(prev) > 0 {
		p = append(prev, p...)
		w.pending[code] = nil
	}
	if cut := incompleteTail(p); cut > 0 {
		w.pending[code] = append([]byte(nil), p[len(p)-cut:]...)
		p = p[:len(p)-cut]
	}
	if len(p) == 0 {
		return nil
	}
	return w.write(at, code, p)
}

// ResizeEvent appends a resize event ("COLSxROWS").
func (w *Writer) ResizeEvent(at time.Time, cols, rows int) error {
	return w.write(at, Resize, []byte(strconv.Itoa(cols)+"x"+strconv.Itoa(rows)))
}

func (w *Writer) write(at time.Time, code string, p []byte) error {
	secs := at.Sub(w.start).Seconds()
	if secs < 0 {
		secs = 0
	}
	l := append(w.line[:0], '[')
	l = strconv.AppendFloat(l, secs, 'f', 6, 64)
	l = append(l, ", \""...)
	l = append(l, code...)
	l = append(l, "\", "...)
	l = jsonstr.Append(l, p)
	l = append(l, "]\n"...)
	w.line = l[:0]
	_, err := w.w.Write(l)
	return err
}

// Flush writes buffered events (not a held-back UTF-8 tail) to the
// underlying writer.
func (w *Writer) Flush() error { return w.w.Flush() }

// Close writes the held-back tails (as U+FFFD) and flushes. It does not
// close the underlying writer.
func (w *Writer) Close(at time.Time) error {
	for _, code := range []string{Output, Input} {
		if p := w.pending[code]; len(p) > 0 {
			w.pending[code] = nil
			if err := w.write(at, code, p); err != nil {
				return err
			}
		}
	}
	return w.Flush()
}

// incompleteTail returns how many bytes at the end of p start a UTF-8
// sequence that is not complete yet (0 when p ends cleanly).
func incompleteTail(p []byte) int {
	for i := 1; i <= 3 && i <= len(p); i++ {
		c := p[len(p)-i]
		if c < 0x80 {
			return 0
		}
		if c >= 0xC0 { // a start byte: does its sequence fit?
			need := 2
			switch {
			case c >= 0xF0:
				need = 4
			case c >= 0xE0:
				need = 3
			}
			if need > i {
				return i
			}
			return 0
		}
	}
	return 0
}

// Event is one event of a recording.
type Event struct {
	// Time is seconds since the start of the recording.
	Time float64
	// Code is Output, Input, Resize or another code.
	Code string
	Data string
}

// Reader reads a recording.
type Reader struct {
	r      *bufio.Reader
	header Header
	line   int
}

// maxLine bounds one line of a recording.
const maxLine = 64 << 20

// NewReader reads and checks the header (version 2, positive width and
// height).
func NewReader(r io.Reader) (*Reader, error) {
	rd := &Reader{r: bufio.NewReaderSize(r, 256<<10)}
	line, err := rd.next()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("asciicast: empty recording (no header line)")
		}
		return nil, err
	}
	if err := json.Unmarshal(line, &rd.header); err != nil {
		return nil, fmt.Errorf("asciicast header: %w", err)
	}
	if rd.header.Version != Version {
		return nil, fmt.Errorf("asciicast header: version %d is not supported (want %d)", rd.header.Version, Version)
	}
	if rd.header.Width <= 0 || rd.header.Height <= 0 {
		return nil, fmt.Errorf("asciicast header: width %d and height %d must be positive", rd.header.Width, rd.header.Height)
	}
	return rd, nil
}

// Header returns the recording's header.
func (rd *Reader) Header() Header { return rd.header }

// next returns the next non-empty line.
func (rd *Reader) next() ([]byte, error) {
	var buf []byte
	for {
		chunk, err := rd.r.ReadSlice('\n')
		buf = append(buf, chunk...)
		if errors.Is(err, bufio.ErrBufferFull) {
			if len(buf) > maxLine {
				return nil, fmt.Errorf("asciicast: line %d is longer than %d bytes", rd.line+1, maxLine)
			}
			continue
		}
		if err != nil && !(errors.Is(err, io.EOF) && len(bytes.TrimSpace(buf)) > 0) {
			return nil, err
		}
		rd.line++
		if l := bytes.TrimSpace(buf); len(l) > 0 {
			return l, nil
		}
		buf = buf[:0]
	}
}

// Next returns the next event, or io.EOF after the last one. A line cut
// short at the end (a recording that was interrupted while written) is
// treated as the end.
func (rd *Reader) Next() (Event, error) {
	line, err := rd.next()
	if err != nil {
		return Event{}, err
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(line, &raw); err != nil || len(raw) != 3 {
		if _, perr := rd.r.Peek(1); errors.Is(perr, io.EOF) {
			return Event{}, io.EOF // a torn last line
		}
		return Event{}, fmt.Errorf("asciicast: line %d is not an event [time, code, data]", rd.line)
	}
	var ev Event
	if err := json.Unmarshal(raw[0], &ev.Time); err != nil {
		return Event{}, fmt.Errorf("asciicast: line %d: time: %w", rd.line, err)
	}
	if err := json.Unmarshal(raw[1], &ev.Code); err != nil {
		return Event{}, fmt.Errorf("asciicast: line %d: code: %w", rd.line, err)
	}
	if err := json.Unmarshal(raw[2], &ev.Data); err != nil {
		return Event{}, fmt.Errorf("asciicast: line %d: data: %w", rd.line, err)
	}
	return ev, nil
}
