package snapshot

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/testenv"
)

func TestUnified(t *testing.T) {
	got := Unified("a/f", "b/f", "one\ntwo\nthree\n", "one\n2\nthree\nfour", 3)
	want := "--- a/f\n+++ b/f\n@@ -1,3 +1,4 @@\n one\n-two\n+2\n three\n+four\n\\ No newline at end of file\n"
	if got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	if Unified("a", "b", "same\n", "same\n", 3) != "" {
		t.Fatal("equal texts must give no diff")
	}
}

func write(t *testing.T, p, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestDiffOverlayRules compares two uppers over one lower: whiteouts,
// opaque directories, additions and modifications.
func TestDiffOverlayRules(t *testing.T) {
	if os.Getuid() != 0 {
		testenv.Need(t, "root (whiteouts are 0/0 character devices)")
	}
	root := t.TempDir()
	lower, ua, ub := filepath.Join(root, "lower"), filepath.Join(root, "a"), filepath.Join(root, "b")
	write(t, filepath.Join(lower, "etc/keep"), "k\n")
	write(t, filepath.Join(lower, "etc/gone"), "g\n")
	write(t, filepath.Join(lower, "opt/x/1"), "1\n")
	write(t, filepath.Join(ua, "etc/keep"), "k\n") // copied up unchanged
	if err := os.MkdirAll(ub, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(ub, "etc/keep"), "changed\n")
	if err := unix.Mknod(filepath.Join(ub, "etc/gone"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(ub, "opt/x/2"), "2\n")
	if err := unix.Setxattr(filepath.Join(ub, "opt/x"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	d, err := Diff(t.Context(), Tree{Lower: lower, Upper: ua}, Tree{Lower: lower, Upper: ub}, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"/etc/keep": Modified, "/etc/gone": Deleted, "/opt/x/1": Deleted, "/opt/x/2": Added}
	if len(d.Changes) != len(want) {
		t.Fatalf("changes: %+v", d.Changes)
	}
	for _, c := range d.Changes {
		if want[c.Path] != c.Kind {
			t.Errorf("%s: want %q, got %q", c.Path, want[c.Path], c.Kind)
		}
		if c.Path == "/etc/keep" && c.Diff == "" {
			t.Errorf("no text diff for %s", c.Path)
		}
	}
}
