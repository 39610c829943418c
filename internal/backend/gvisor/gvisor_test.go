package gvisor

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/errdefs"
)

// TestMissingRunsc: without runsc the level is unavailable, and says how
// to get it.
func TestMissingRunsc(t *testing.T) {
	_, err := New(backend.Host{}, filepath.Join(t.TempDir(), "runsc"))
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "runsc not built; run make gvisor") {
		t.Fatalf("New without runsc: %v", err)
	}
}

// TestAdjustSpec: the container level's spec as runsc needs it.
func TestAdjustSpec(t *testing.T) {
	limit := int64(48)
	s := &specs.Spec{
		Process: &specs.Process{},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Options: []string{"nosuid"}},
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Options: []string{"ro"}},
		},
		Linux: &specs.Linux{
			Resources: &specs.LinuxResources{Pids: &specs.LinuxPids{Limit: &limit}},
			Seccomp: &specs.LinuxSeccomp{Syscalls: []specs.LinuxSyscall{
				{Names: []string{"clone3"}, Action: specs.ActErrno},
				{Names: []string{"ptrace"}, Action: specs.ActErrno},
			}},
		},
	}
	adjustSpec(s)
	if len(s.Mounts) != 1 || !slices.Contains(s.Mounts[0].Options, "ro") {
		t.Errorf("mounts: %+v", s.Mounts)
	}
	if len(s.Linux.Seccomp.Syscalls) != 1 || s.Linux.Seccomp.Syscalls[0].Names[0] != "ptrace" {
		t.Errorf("seccomp rules: %+v", s.Linux.Seccomp.Syscalls)
	}
	if got := *s.Linux.Resources.Pids.Limit; got != sandboxPids(48) {
		t.Errorf("host pids limit %d, want %d", got, sandboxPids(48))
	}
	if r := s.Process.Rlimits; len(r) != 1 || r[0].Type != "RLIMIT_NPROC" || r[0].Hard != 47 {
		t.Errorf("rlimits: %+v", r)
	}
}
