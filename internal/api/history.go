package api

import (
	"bytes"
	"container/heap"
	"context"
	"io"
	"strconv"

	"github.com/agentjail/agentjail/internal/errdefs"
)

// History limits of GET /jails/{id}/events?history=N.
const (
	// MaxHistory bounds N.
	MaxHistory = 200_000
	// maxHistoryBytes bounds what is read from the end of one event file.
	maxHistoryBytes = 64 << 20
	// tailBlock is the size of one backwards read.
	tailBlock = 256 << 10
)

// historyStreams maps event types to the stored stream holding them.
var historyStreams = []struct{ typ, stream string }{
	{"syscall", "syscalls"}, {"file", "filesystem"}, {"net", "network"}, {"proc", "processes"},
}

// storedLine is one line of a JSONL event file with its time.
type storedLine struct {
	ts   int64
	line []byte
}

// history returns the last n stored events of the jail of the given types
// (none: all), oldest first, merged from the per-type files by time.
func (s *server) history(ctx context.Context, ref string, types []string, n int) ([]storedLine, error) {
	var runs [][]storedLine
	for _, hs := range historyStreams {
		if len(types) > 0 && !contains(types, hs.typ) {
			continue
		}
		rc, err := s.svc.EventLog(ctx, ref, hs.stream)
		if err != nil {
			return nil, err
		}
		lines, err := tailLines(rc, n, maxHistoryBytes)
		rc.Close()
		if err != nil {
			return nil, err
		}
		runs = append(runs, lines)
	}
	merged := mergeByTime(runs)
	if len(merged) > n {
		merged = merged[len(merged)-n:]
	}
	return merged, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// tailLines returns the last n complete lines of r (at most maxBytes read
// from its end), oldest first. r must be seekable to read less than all
// of it; a reader that is not is read whole, keeping the last n lines.
func tailLines(r io.Reader, n int, maxBytes int64) ([]storedLine, error) {
	if n <= 0 {
		return nil, nil
	}
	rs, ok := r.(io.ReadSeeker)
	if !ok {
		b, err := io.ReadAll(io.LimitReader(r, maxBytes))
		if err != nil {
			return nil, err
		}
		return lastLines(b, n), nil
	}
	end, err := rs.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, err
	}
	var buf []byte
	pos := end
	for pos > 0 && end-pos < maxBytes && bytes.Count(buf, []byte{'\n'}) <= n {
		step := min(int64(tailBlock), pos, maxBytes-(end-pos))
		pos -= step
		chunk := make([]byte, step)
		if _, err := rs.Seek(pos, io.SeekStart); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(rs, chunk); err != nil {
			return nil, err
		}
		buf = append(chunk, buf...)
	}
	if pos > 0 {
		// The first line read may be cut: drop it.
		if i := bytes.IndexByte(buf, '\n'); i >= 0 {
			buf = buf[i+1:]
		} else {
			buf = nil
		}
	}
	return lastLines(buf, n), nil
}

// lastLines splits b into lines (a last one without its newline is being
// written and left out) and keeps the last n that carry a time.
func lastLines(b []byte, n int) []storedLine {
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[:i+1]
	} else {
		return nil
	}
	var out []storedLine
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		line := bytes.TrimSpace(b[:i])
		b = b[i+1:]
		if ts, ok := lineTime(line); ok {
			out = append(out, storedLine{ts: ts, line: line})
		}
	}
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return out
}

// lineTime reads the "ts_ns" field of a stored event line.
func lineTime(line []byte) (int64, bool) {
	const key = `"ts_ns":`
	i := bytes.Index(line, []byte(key))
	if i < 0 {
		return 0, false
	}
	rest := line[i+len(key):]
	j := 0
	for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
		j++
	}
	ts, err := strconv.ParseInt(string(rest[:j]), 10, 64)
	return ts, err == nil
}

// mergeByTime merges runs that are each in time order. A "lost" line is
// stored in every file: identical ones next to each other are kept once.
func mergeByTime(runs [][]storedLine) []storedLine {
	total := 0
	h := &lineHeap{}
	for i, r := range runs {
		total += len(r)
		if len(r) > 0 {
			h.items = append(h.items, cursor{run: i})
		}
	}
	h.runs = runs
	heap.Init(h)
	out := make([]storedLine, 0, total)
	for h.Len() > 0 {
		c := &h.items[0]
		l := runs[c.run][c.pos]
		if n := len(out); n == 0 || !bytes.Equal(out[n-1].line, l.line) {
			out = append(out, l)
		}
		c.pos++
		if c.pos == len(runs[c.run]) {
			heap.Pop(h)
		} else {
			heap.Fix(h, 0)
		}
	}
	return out
}

type cursor struct{ run, pos int }

type lineHeap struct {
	runs  [][]storedLine
	items []cursor
}

func (h *lineHeap) Len() int { return len(h.items) }
func (h *lineHeap) Less(i, j int) bool {
	a, b := h.items[i], h.items[j]
	return h.runs[a.run][a.pos].ts < h.runs[b.run][b.pos].ts
}
func (h *lineHeap) Swap(i, j int) { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *lineHeap) Push(x any)    { h.items = append(h.items, x.(cursor)) }
func (h *lineHeap) Pop() any {
	x := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	return x
}

// parseHistory reads the history query parameter.
func parseHistory(v string) (int, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > MaxHistory {
		return 0, errdefs.Invalidf("history: %q must be a number of events from 0 to %d", v, MaxHistory)
	}
	return n, nil
}
