package hostjail

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
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

// pidsRoot is the mount point of the hierarchy holding the pids controller:
// its own on a cgroup v1 host, the unified one on a cgroup v2 host.
func pidsRoot(t *testing.T) string {
	for _, root := range []string{"/sys/fs/cgroup/pids", "/sys/fs/cgroup"} {
		if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err == nil {
			return root
		}
	}
	testenv.Need(t, "a cgroup hierarchy with the pids controller")
	return ""
}

// TestCgroupOfLayouts checks that a new jail gets a top-level cgroup of its
// own, and that a jail whose cgroup a daemon of the earlier layout made
// (under a shared "/agentjail") keeps it when adopted, until Release has
// removed it.
func TestCgroupOfLayouts(t *testing.T) {
	testenv.RequireRoot(t)
	fresh := randomID(t)
	if got, want := CgroupOf(fresh), Cgroup("/agentjail-"+fresh); got != want {
		t.Errorf("CgroupOf(new jail) = %s, want %s", got, want)
	}
	old := randomID(t)
	if err := os.MkdirAll(filepath.Join(pidsRoot(t), "agentjail", old), 0o755); err != nil {
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
}
