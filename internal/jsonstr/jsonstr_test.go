package jsonstr

import (
	"encoding/json"
	"testing"
)

// valid is s with each byte of invalid UTF-8 replaced by U+FFFD, as a
// decoder of Append's output must see it.
func valid(s string) string { return string([]rune(s)) }

func check(t *testing.T, s string) {
	t.Helper()
	for _, enc := range [][]byte{Append(nil, s), Append(nil, []byte(s))} {
		var back string
		if err := json.Unmarshal(enc, &back); err != nil {
			t.Fatalf("%q: %s does not decode: %v", s, enc, err)
		}
		if back != valid(s) {
			t.Fatalf("%q: %s decodes to %q", s, enc, back)
		}
	}
}

func TestAppendRoundTrips(t *testing.T) {
	for _, s := range []string{"", "plain", "q\"b\\s", "nl\n\ttab\r\x01\x00\x1f\x7f", "bad\xffutf8", "\xe2\x82", "ünïcødé ✓ 🙂", "<>&\u2028"} {
		check(t, s)
	}
}

func TestAppendExactBytes(t *testing.T) {
	for in, want := range map[string]string{
		"a\"b":      `"a\"b"`,
		"\x01\n":    `"\u0001\n"`,
		"x\xffy":    `"x\ufffdy"`,
		"<&>":       `"<&>"`,
		"\u00e9":    "\"\u00e9\"",
		"tab\there": `"tab\there"`,
	} {
		if got := string(Append([]byte("pre:"), in)); got != "pre:"+want {
			t.Errorf("%q: %s, want pre:%s", in, got, want)
		}
	}
}

func TestAppendDoesNotAllocate(t *testing.T) {
	buf := make([]byte, 0, 256)
	s := "ünï\xff\"code\"\n🙂"
	if n := testing.AllocsPerRun(100, func() { buf = Append(buf[:0], s) }); n != 0 {
		t.Fatalf("%v allocations per call", n)
	}
}

// FuzzAppend: whatever the bytes, the output decodes with encoding/json
// to the input with invalid UTF-8 replaced.
func FuzzAppend(f *testing.F) {
	for _, s := range []string{"", "a\"b\\", "\x00\x1f", "\xff\xfe", "🙂\xf0\x9f", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { check(t, s) })
}

func BenchmarkAppend(b *testing.B) {
	buf := make([]byte, 0, 256)
	s := "/usr/lib/x86_64-linux-gnu/libc.so.6 \"quoted\"\tand ünï"
	b.SetBytes(int64(len(s)))
	for b.Loop() {
		buf = Append(buf[:0], s)
	}
}
