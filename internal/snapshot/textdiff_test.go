package snapshot

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/testenv"
)

// seqText is `seq from to` with a prefix on every line.
func seqText(prefix string, from, to int) string {
	var sb strings.Builder
	for i := from; i <= to; i++ {
		fmt.Fprintf(&sb, "%s%d\n", prefix, i)
	}
	return sb.String()
}

// TestUnifiedPatches checks random edits both ways with patch(1): the
// unified diff of a → b applied to a gives b.
func TestUnifiedPatches(t *testing.T) {
	testenv.RequireTool(t, "patch")
	dir := t.TempDir()
	rnd := rand.New(rand.NewPCG(1, 2))
	words := []string{"a\n", "b\n", "c\n", "d\n", "e\n", "tail"}
	gen := func() string {
		var sb strings.Builder
		n := rnd.IntN(40)
		for i := 0; i < n; i++ {
			w := words[rnd.IntN(len(words)-1)]
			sb.WriteString(w)
		}
		if rnd.IntN(4) == 0 {
			sb.WriteString(words[len(words)-1])
		}
		return sb.String()
	}
	for i := 0; i < 200; i++ {
		a, b := gen(), gen()
		d := Unified("a/f", "b/f", a, b, rnd.IntN(4))
		if (d == "") != (a == b) {
			t.Fatalf("a=%q b=%q: diff %q", a, b, d)
		}
		if d == "" {
			continue
		}
		f := filepath.Join(dir, "f")
		if err := os.WriteFile(f, []byte(a), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("patch", "-s", "--no-backup-if-mismatch", f)
		cmd.Stdin = strings.NewReader(d)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("a=%q b=%q\n%s\npatch: %v %s", a, b, d, err, out)
		}
		got, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != b {
			t.Fatalf("a=%q b=%q\n%s\npatched: %q", a, b, d, got)
		}
	}
}

// allocated runs f and returns the bytes it allocated.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestUnifiedBounded diffs texts that differ on every line, at 5 000
// lines and at the byte cap: the work stays linear in the input (the
// quadratic frontier copies needed gigabytes here).
func TestUnifiedBounded(t *testing.T) {
	big := func(p string) string {
		var sb strings.Builder
		for i := 0; sb.Len() < maxTextDiff-16; i++ {
			fmt.Fprintf(&sb, "%s%d\n", p, i)
		}
		return sb.String()
	}
	for _, tc := range []struct{ name, a, b string }{
		{"5000 lines", seqText("", 1, 5000), seqText("x", 1, 5000)},
		{"1 MiB", big("a"), big("b")},
	} {
		var d string
		start := time.Now()
		n := allocated(func() { d = Unified("a/f", "b/f", tc.a, tc.b, 3) })
		took := time.Since(start)
		in := uint64(len(tc.a) + len(tc.b))
		t.Logf("%s: %d bytes in, %d allocated (%.1f×), %s", tc.name, in, n, float64(n)/float64(in), took)
		if n > 16*in {
			t.Errorf("%s: %d bytes allocated for %d in", tc.name, n, in)
		}
		if !strings.HasPrefix(d, "--- a/f\n+++ b/f\n@@ -1,") {
			t.Errorf("%s: diff starts %q", tc.name, d[:min(len(d), 40)])
		}
		if strings.Count(d, "\n-") != strings.Count(tc.a, "\n") || strings.Count(d, "\n+") < strings.Count(tc.b, "\n") {
			t.Errorf("%s: not every line is replaced", tc.name)
		}
	}
}

func entryOf(t *testing.T, p, data string) *entry {
	t.Helper()
	write(t, p, data)
	e, ok := (&resolver{t: Tree{Upper: filepath.Dir(p)}}).resolve("/" + filepath.Base(p))
	if !ok {
		t.Fatalf("%s not found", p)
	}
	return e
}

// TestTextDiffMarks checks the files that get a line instead of a diff:
// binary, over the byte cap, past the call's output budget, slower than
// the time bound.
func TestTextDiffMarks(t *testing.T) {
	dir := t.TempDir()
	small := entryOf(t, filepath.Join(dir, "small"), "one\n")
	other := entryOf(t, filepath.Join(dir, "other"), "two\n")
	bin := entryOf(t, filepath.Join(dir, "bin"), "a\x00b\n")
	huge := entryOf(t, filepath.Join(dir, "huge"), strings.Repeat("z\n", maxTextDiff/2+1))
	marked := func(d string) bool { return strings.Contains(d, "binary or too large") }
	ctx := t.Context()
	full := func() *textBudget { return &textBudget{left: maxTextOutput} }

	if d := textDiff(ctx, "/f", small, other, full()); marked(d) || !strings.Contains(d, "-one\n+two\n") {
		t.Errorf("text: %q", d)
	}
	if d := textDiff(ctx, "/f", nil, other, full()); !strings.HasPrefix(d, "--- /dev/null\n+++ b/f\n") {
		t.Errorf("added: %q", d)
	}
	if d := textDiff(ctx, "/f", small, bin, full()); !marked(d) {
		t.Errorf("binary: %q", d)
	}
	if d := textDiff(ctx, "/f", huge, nil, full()); d != "Files a/f and /dev/null differ (binary or too large for a text diff)\n" {
		t.Errorf("too large: %q", d)
	}
	b := &textBudget{left: 10}
	if d := textDiff(ctx, "/f", small, other, b); !marked(d) || b.left != 0 {
		t.Errorf("over budget: %q, %d left", d, b.left)
	}
	if d := textDiff(ctx, "/f", small, other, b); !marked(d) {
		t.Errorf("spent budget: %q", d)
	}

	old := textDiffTime
	textDiffTime = time.Nanosecond
	t.Cleanup(func() { textDiffTime = old })
	a := entryOf(t, filepath.Join(dir, "a"), seqText("", 1, 60000))
	z := entryOf(t, filepath.Join(dir, "z"), seqText("x", 1, 60000))
	if d := textDiff(ctx, "/f", a, z, full()); !marked(d) {
		t.Errorf("slow: %d bytes of diff", len(d))
	}
	// The slow diff still holds its slot until it ends; every slot comes back.
	for range textDiffSlots {
		slots <- struct{}{}
	}
	for range textDiffSlots {
		<-slots
	}
}
