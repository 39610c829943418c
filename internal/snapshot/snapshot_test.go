package snapshot

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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

// TestDiffDeepTree: a jail can nest directories past the kernel's path
// limit (each made relative to the one above). The diff lists what it can
// reach, says it is truncated, and still reads the rest of the tree.
func TestDiffDeepTree(t *testing.T) {
	root := t.TempDir()
	lower, empty, up := filepath.Join(root, "lower"), filepath.Join(root, "empty"), filepath.Join(root, "upper")
	for _, d := range []string{lower, empty, up} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(up, "a/near"), "x")
	write(t, filepath.Join(up, "z/after"), "x")
	const name, depth = "d0123456789", 500 // 6 000 bytes of path
	fd, err := unix.Open(filepath.Join(up, "a"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range depth {
		if err := unix.Mkdirat(fd, name, 0o755); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	unix.Close(fd)

	d, err := Diff(t.Context(), Tree{Lower: lower, Upper: empty}, Tree{Lower: lower, Upper: up}, nil, true)
	if err != nil {
		t.Fatalf("diff of a tree nested past the path limit: %v", err)
	}
	if !d.Truncated {
		t.Fatal("the diff does not say it left out what lies too deep")
	}
	listed := map[string]bool{}
	deepest := 0
	for _, c := range d.Changes {
		listed[c.Path] = true
		deepest = max(deepest, strings.Count(c.Path, name))
	}
	for _, p := range []string{"/a/near", "/z/after", "/a/" + name} {
		if !listed[p] {
			t.Errorf("%s is not listed", p)
		}
	}
	if deepest < 300 {
		t.Errorf("only %d levels listed; a host path of 4 096 bytes holds about 340", deepest)
	}
}

// TestDiffBounded: a tree with more paths than a diff examines gives a
// diff that says it is truncated and lists no more than the bound, however
// the paths are spread (one wide directory, many small ones); under the
// bound every change is listed; and a caller that goes away ends the work.
func TestDiffBounded(t *testing.T) {
	defer func(n int) { maxDiffPaths = n }(maxDiffPaths)
	maxDiffPaths = 500
	root := t.TempDir()
	lower, empty := filepath.Join(root, "lower"), filepath.Join(root, "empty")
	for _, d := range []string{lower, empty} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tree := func(name string, dirs, files int) Tree {
		up := filepath.Join(root, name)
		for i := range dirs {
			for j := range files {
				write(t, filepath.Join(up, fmt.Sprintf("d%d/f%d", i, j)), "x")
			}
		}
		return Tree{Lower: lower, Upper: up}
	}
	base := Tree{Lower: lower, Upper: empty}
	for _, c := range []struct {
		name        string
		dirs, files int
		truncated   bool
	}{
		{"wide", 1, 2000, true},
		{"deep", 200, 5, true},
		{"under", 4, 124, false}, // 4 directories and 496 files: 500 paths
	} {
		t.Run(c.name, func(t *testing.T) {
			d, err := Diff(t.Context(), base, tree(c.name, c.dirs, c.files), nil, false)
			if err != nil {
				t.Fatal(err)
			}
			if d.Truncated != c.truncated {
				t.Fatalf("truncated %v, want %v (%d changes)", d.Truncated, c.truncated, len(d.Changes))
			}
			if len(d.Changes) > maxDiffPaths || d.Added != len(d.Changes) {
				t.Fatalf("%d changes listed, %d added; the bound is %d", len(d.Changes), d.Added, maxDiffPaths)
			}
			if !c.truncated && len(d.Changes) != c.dirs*(c.files+1) {
				t.Fatalf("%d changes listed, want %d", len(d.Changes), c.dirs*(c.files+1))
			}
			for _, ch := range d.Changes {
				if ch.Kind != Added || (ch.Type == "file" && ch.SHA256 == "") {
					t.Fatalf("change %+v", ch)
				}
			}
		})
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := Diff(ctx, base, tree("gone", 2, 10), nil, false); !errors.Is(err, context.Canceled) {
		t.Fatalf("diff for a caller that went away: %v", err)
	}
}
