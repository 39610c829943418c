package asciicast

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"testing"
	"time"
)

// FuzzReader reads arbitrary bytes as a recording (a recording comes from
// the jail's control directory, which a root process in the jail can
// write): no panic, and the reader ends with io.EOF or an error after at
// most one event per line.
func FuzzReader(f *testing.F) {
	for _, seed := range []string{
		"",
		"\n\n",
		`{"version":2,"width":80,"height":24}` + "\n",
		`{"version":2,"width":80,"height":24}` + "\n" + `[0.5, "o", "hi"]` + "\n" + `[0.7, "o", "tor`,
		`{"version":2,"width":80,"height":24,"env":{"TERM":"xterm"}}` + "\n" + `[1, "r", "100x30"]` + "\n" + `[1.5, "i", "ls\r"]` + "\n",
		`{"version":1,"width":80,"height":24}` + "\n",
		`{"version":2,"width":-1,"height":24}` + "\n",
		`{"version":2,"width":80,"height":24}` + "\n" + `[1, "o"]` + "\n" + `[2, "o", "x"]` + "\n",
		`{"version":2,"width":80,"height":24}` + "\n" + `["1", 2, null]` + "\n",
		`{"version":2,"width":80,"height":24}` + "\n" + `[1e999, "o", "x"]` + "\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		rd, err := NewReader(bytes.NewReader(data))
		if err != nil {
			return
		}
		if h := rd.Header(); h.Version != Version || h.Width <= 0 || h.Height <= 0 {
			t.Fatalf("accepted header %+v", h)
		}
		lines := bytes.Count(data, []byte{'\n'}) + 1
		for n := 0; ; n++ {
			if n > lines {
				t.Fatalf("more events (%d) than lines (%d)", n, lines)
			}
			if _, err := rd.Next(); err != nil {
				return
			}
		}
	})
}

// FuzzRoundTrip writes arbitrary chunks of terminal output and input, cut
// anywhere (inside multi-byte characters too), and reads the recording
// back: each code's data, joined, is the joined chunks as JSON carries
// them (invalid UTF-8 as U+FFFD), event times do not go backwards, and a
// copy cut short at any byte still reads as a prefix of the events
// followed by io.EOF, as a recording interrupted by a crash does.
func FuzzRoundTrip(f *testing.F) {
	f.Add([]byte("a\"b\\c\x1b[0m\r\n\xe2\x82"), []byte("\xac\xff z"), []byte("ls\r"), uint16(7), uint8(3))
	f.Add([]byte("\xf0\x9f"), []byte("\x98\x80"), []byte{}, uint16(0), uint8(0))
	f.Add([]byte("\xc0"), []byte("\x80\x80"), []byte("\xed\xa0\x80"), uint16(1000), uint8(1))
	f.Fuzz(func(t *testing.T, out1, out2, in []byte, cut uint16, resizes uint8) {
		var buf bytes.Buffer
		start := time.Unix(1700000000, 0)
		w, err := NewWriter(&buf, Header{Width: 80, Height: 24, Command: string(out1)}, start)
		if err != nil {
			t.Fatal(err)
		}
		at := start
		step := func() time.Time { at = at.Add(1500 * time.Microsecond); return at }
		for _, ev := range []struct {
			code string
			p    []byte
		}{{Output, out1}, {Input, in}, {Output, out2}} {
			if err := w.Event(step(), ev.code, bytes.Clone(ev.p)); err != nil {
				t.Fatal(err)
			}
		}
		for i := range int(resizes % 4) {
			if err := w.ResizeEvent(step(), 80+i, 24); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(step()); err != nil {
			t.Fatal(err)
		}
		rec := buf.Bytes()

		events := readAll(t, rec)
		got := map[string]string{}
		last := -1.0
		for _, ev := range events {
			if ev.Time < last {
				t.Fatalf("time goes backwards: %v after %v", ev.Time, last)
			}
			last = ev.Time
			got[ev.Code] += ev.Data
		}
		if want := asJSON(t, append(bytes.Clone(out1), out2...)); got[Output] != want {
			t.Fatalf("output %q, want %q", got[Output], want)
		}
		if want := asJSON(t, in); got[Input] != want {
			t.Fatalf("input %q, want %q", got[Input], want)
		}

		// A copy cut short: the events before the cut, then io.EOF.
		n := int(cut) % (len(rec) + 1)
		rd, err := NewReader(bytes.NewReader(rec[:n]))
		if err != nil {
			if n > bytes.IndexByte(rec, '\n') {
				t.Fatalf("cut at %d after the header: %v", n, err)
			}
			return
		}
		for i := 0; ; i++ {
			ev, err := rd.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("cut at %d of %d: event %d: %v", n, len(rec), i, err)
			}
			if i >= len(events) || ev != events[i] {
				t.Fatalf("cut at %d: event %d is %+v, not one of the recording's", n, i, ev)
			}
		}
	})
}

func readAll(t *testing.T, rec []byte) []Event {
	t.Helper()
	rd, err := NewReader(bytes.NewReader(rec))
	if err != nil {
		t.Fatalf("read back: %v\n%q", err, rec)
	}
	var out []Event
	for {
		ev, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("read back: %v\n%q", err, rec)
		}
		out = append(out, ev)
	}
}

// asJSON is p as a JSON string carries it: invalid UTF-8 becomes U+FFFD.
func asJSON(t *testing.T, p []byte) string {
	b, err := json.Marshal(string(p))
	if err != nil {
		t.Fatal(err)
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}
