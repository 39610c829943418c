package asciicast

import (
	"bytes"
	"io"
	"testing"
	"time"
)

func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	start := time.Unix(1700000000, 0)
	w, err := NewWriter(&buf, Header{Width: 80, Height: 24, Command: "sh", JailID: "j1"}, start)
	if err != nil {
		t.Fatal(err)
	}
	euro := []byte("€") // 3 bytes, split across two chunks
	events := []struct {
		at   time.Duration
		code string
		data []byte
	}{
		{100 * time.Millisecond, Output, append([]byte("a\"b\\c\x1b[0m\r\n"), euro[:2]...)},
		{200 * time.Millisecond, Output, append(euro[2:], 0xff, 'z')},
		{300 * time.Millisecond, Input, []byte("ls\r")},
	}
	for _, ev := range events {
		if err := w.Event(start.Add(ev.at), ev.code, ev.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.ResizeEvent(start.Add(time.Second), 100, 30); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(start.Add(2 * time.Second)); err != nil {
		t.Fatal(err)
	}
	rd, err := NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if h := rd.Header(); h.Version != 2 || h.Timestamp != 1700000000 || h.JailID != "j1" {
		t.Fatalf("header %+v", h)
	}
	want := []Event{
		{0.1, Output, "a\"b\\c\x1b[0m\r\n"},
		{0.2, Output, "€\ufffdz"},
		{0.3, Input, "ls\r"},
		{1, Resize, "100x30"},
	}
	for i, w := range want {
		ev, err := rd.Next()
		if err != nil || ev != w {
			t.Fatalf("event %d: %+v %v, want %+v", i, ev, err, w)
		}
	}
	if _, err := rd.Next(); err != io.EOF {
		t.Fatalf("after the last event: %v", err)
	}
}

func TestTornLastLine(t *testing.T) {
	rd, err := NewReader(bytes.NewReader([]byte(`{"version":2,"width":80,"height":24}` + "\n" + `[0.5, "o", "hi"]` + "\n" + `[0.7, "o", "tor`)))
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := rd.Next(); err != nil || ev.Data != "hi" {
		t.Fatalf("%+v %v", ev, err)
	}
	if _, err := rd.Next(); err != io.EOF {
		t.Fatalf("a torn last line: %v", err)
	}
}
