package fsdiff

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/model"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root (whiteouts and trusted.* xattrs)")
		}
		t.Skip("needs root")
	}
}

func write(t *testing.T, p, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// TestUpperFollowsOverlayRules builds a lower and an upper by hand the way
// overlayfs writes them (whiteouts, opaque directories, copied-up files)
// and checks every kind of change; the contents of an added directory are
// listed too.
func TestUpperFollowsOverlayRules(t *testing.T) {
	requireRoot(t)
	lower, upper := t.TempDir(), t.TempDir()
	write(t, filepath.Join(lower, "etc/hosts"), "127.0.0.1 localhost\n", 0o644)
	write(t, filepath.Join(lower, "etc/motd"), "hello\n", 0o644)
	write(t, filepath.Join(lower, "etc/same"), "same\n", 0o644)
	write(t, filepath.Join(lower, "old/a"), "a", 0o644)
	write(t, filepath.Join(lower, "old/b"), "b", 0o644)
	write(t, filepath.Join(lower, "opq/keep-hidden"), "x", 0o644)

	write(t, filepath.Join(upper, "etc/hosts"), "10.0.0.1 db\n", 0o644)                   // modified content
	write(t, filepath.Join(upper, "etc/same"), "same\n", 0o600)                           // mode change only
	write(t, filepath.Join(upper, "workspace/new.txt"), "new", 0o644)                     // added in a new dir
	if err := unix.Mknod(filepath.Join(upper, "etc/motd"), unix.S_IFCHR, 0); err != nil { // whiteout
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(upper, "opq"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(upper, "opq"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(upper, "opq/fresh"), "f", 0o644)
	if err := os.MkdirAll(filepath.Join(upper, ".agentjail/run"), 0o700); err != nil {
		t.Fatal(err)
	}

	changes, err := Upper(lower, upper, SkipInternal)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]model.Change{}
	for _, c := range changes {
		got[c.Kind+" "+c.Path] = c
	}
	want := []string{
		"modified /etc/hosts", "modified /etc/same", "deleted /etc/motd", "added /workspace", "added /workspace/new.txt",
		"deleted /opq/keep-hidden", "added /opq/fresh",
	}
	for _, w := range want {
		if _, ok := got[w]; !ok {
			t.Errorf("missing change %q in %v", w, changes)
		}
	}
	if len(changes) != len(want) {
		t.Errorf("got %d changes, want %d: %+v", len(changes), len(want), changes)
	}
	if c := got["modified /etc/same"]; c.Mode != "0600" || c.OldMode != "0644" || c.SHA256 != c.OldSHA256 {
		t.Errorf("mode-only change: %+v", c)
	}
	if c := got["modified /etc/hosts"]; c.SHA256 == c.OldSHA256 || c.Size != int64(len("10.0.0.1 db\n")) {
		t.Errorf("content change: %+v", c)
	}
	sum := Summary(changes)
	if sum.Added != 3 || sum.Changed != 2 || sum.Deleted != 2 {
		t.Errorf("summary %+v", sum)
	}
}
