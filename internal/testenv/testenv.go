// Package testenv decides whether a test can run on this machine. A test
// that needs root, a tool or a kernel feature skips on a developer's
// machine, and fails under CI=true, where scripts/setup.sh has installed
// everything and a skipped test would hide a missing install step.
package testenv

import (
	"os"
	"os/exec"
	"testing"
)

// CI reports whether the tests run in CI (the environment has CI=true).
func CI() bool { return os.Getenv("CI") == "true" }

// Need stops tb when missing is not empty: with CI=true it fails, else it
// skips. missing names what the test lacks ("root", "tmux", "cgroup v2 at
// /sys/fs/cgroup/unified"); an empty missing lets the test go on.
func Need(tb testing.TB, missing string) {
	tb.Helper()
	if missing == "" {
		return
	}
	if CI() {
		tb.Fatalf("needs %s (CI=true: a test that cannot run here fails)", missing)
		return
	}
	tb.Skipf("needs %s", missing)
}

// RequireRoot stops tb (see Need) unless the test runs as root.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		Need(tb, "root")
	}
}

// RequireTool returns the path of the program name found on PATH, or
// stops tb (see Need) when there is none.
func RequireTool(tb testing.TB, name string) string {
	tb.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Need(tb, name+" on PATH (scripts/setup.sh installs it)")
	}
	return p
}
