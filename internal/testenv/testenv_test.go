package testenv

import (
	"testing"
)

// recorder is a testing.TB that records how the test was stopped.
type recorder struct {
	testing.TB
	failed, skipped bool
	msg             string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed, r.msg = true, format
}
func (r *recorder) Skipf(format string, args ...any) {
	r.skipped, r.msg = true, format
}

func TestNeedFailsUnderCIAndSkipsElsewhere(t *testing.T) {
	for _, c := range []struct {
		ci         string
		missing    string
		fail, skip bool
	}{
		{"true", "root", true, false},
		{"", "root", false, true},
		{"false", "tmux", false, true},
		{"true", "", false, false},
		{"", "", false, false},
	} {
		t.Setenv("CI", c.ci)
		r := &recorder{TB: t}
		Need(r, c.missing)
		if r.failed != c.fail || r.skipped != c.skip {
			t.Errorf("CI=%q missing=%q: failed=%v skipped=%v, want %v %v", c.ci, c.missing, r.failed, r.skipped, c.fail, c.skip)
		}
	}
}

func TestRequireToolFindsAndMisses(t *testing.T) {
	t.Setenv("CI", "true")
	r := &recorder{TB: t}
	if p := RequireTool(r, "sh"); p == "" || r.failed {
		t.Fatalf("sh: %q failed=%v", p, r.failed)
	}
	RequireTool(r, "agentjail-no-such-tool")
	if !r.failed {
		t.Fatal("a missing tool did not fail under CI=true")
	}
}
