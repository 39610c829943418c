package hostjail

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"

	"github.com/agentjail/agentjail/internal/cgroups"
	"github.com/agentjail/agentjail/internal/testenv"
)

func randomID(t *testing.T) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// TestCgroupOfLayouts checks that a new jail gets a top-level cgroup of its
// own, and that a jail whose cgroup a daemon of the earlier layout made
// (under a shared "/agentjail") keeps it when adopted.
func TestCgroupOfLayouts(t *testing.T) {
	testenv.RequireRoot(t)
	fresh := randomID(t)
	if got, want := CgroupOf(fresh), Cgroup("/agentjail-"+fresh); got != want {
		t.Errorf("CgroupOf(new jail) = %s, want %s", got, want)
	}
	old := randomID(t)
	dir := cgroups.UnifiedDir("/agentjail/" + old)
	if dir == "" {
		testenv.Need(t, "a unified cgroup hierarchy")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cgroups.Remove("/agentjail/" + old); err != nil {
			t.Error(err)
		}
	})
	if got, want := CgroupOf(old), Cgroup("/agentjail/"+old); got != want {
		t.Errorf("CgroupOf(jail of the earlier layout) = %s, want %s", got, want)
	}
	// The answer is kept: a new jail's stays what it was before runc made
	// its directories.
	if got, want := CgroupOf(fresh), Cgroup("/agentjail-"+fresh); got != want {
		t.Errorf("CgroupOf(new jail), asked again = %s, want %s", got, want)
	}
}
