package api

import (
	"bytes"
	"io"
	"testing"
)

// FuzzTailLines reads arbitrary event files backwards as ?history=N does:
// every line returned is a whole line of the file that carries a time, in
// file order, at most n of them, within the last maxBytes; when the file is
// small enough to be read whole and every line carries a time, they are
// exactly its last n lines (what reading it forwards gives).
func FuzzTailLines(f *testing.F) {
	f.Add([]byte(`{"type":"proc","ts_ns":5}`+"\n"+`{"type":"net","ts_ns":7}`+"\n"+`{"ts_ns":9`), uint16(1), uint16(1000))
	f.Add([]byte("\n\n"+`{"ts_ns":1}`+"\n"+`x"ts_ns":`+"\n"+`"ts_ns":99999999999999999999`+"\n"), uint16(5), uint16(12))
	f.Add([]byte(`{"ts_ns":3}`+"\n"), uint16(0), uint16(0))
	f.Fuzz(func(t *testing.T, data []byte, n16, max16 uint16) {
		n, maxBytes := int(n16%64), int64(max16)
		got, err := tailLines(bytes.NewReader(data), n, maxBytes)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) > n {
			t.Fatalf("%d lines for history=%d", len(got), n)
		}
		whole := wholeLines(data)
		tail := data[max(0, int64(len(data))-maxBytes):]
		at := 0
		for _, l := range got {
			ts, ok := lineTime(l.line)
			if !ok || ts != l.ts {
				t.Fatalf("line %q returned with time %d (parsed: %d %v)", l.line, l.ts, ts, ok)
			}
			for at < len(whole) && !bytes.Equal(whole[at], l.line) {
				at++
			}
			if at == len(whole) {
				t.Fatalf("line %q is not a whole line of the file after the previous one", l.line)
			}
			at++
			if !bytes.Contains(tail, l.line) {
				t.Fatalf("line %q is not within the last %d bytes", l.line, maxBytes)
			}
		}
		if int64(len(data)) > maxBytes || n == 0 {
			return
		}
		for _, l := range whole {
			if _, ok := lineTime(l); !ok {
				return
			}
		}
		forward, err := tailLines(io.MultiReader(bytes.NewReader(data)), n, maxBytes+1)
		if err != nil {
			t.Fatal(err)
		}
		if len(forward) != len(got) {
			t.Fatalf("backwards %d lines, forwards %d", len(got), len(forward))
		}
		for i := range got {
			if !bytes.Equal(got[i].line, forward[i].line) {
				t.Fatalf("line %d: backwards %q, forwards %q", i, got[i].line, forward[i].line)
			}
		}
	})
}

// wholeLines returns data's newline-terminated lines, trimmed as the
// history reader trims them.
func wholeLines(data []byte) [][]byte {
	var out [][]byte
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			return out
		}
		out = append(out, bytes.TrimSpace(data[:i]))
		data = data[i+1:]
	}
}
