package oci

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/initproto"
)

// expectResults compares probe results with want, reporting every mismatch.
func expectResults(t *testing.T, got, want map[string]string) {
	t.Helper()
	for k, w := range want {
		if got[k] != w {
			t.Errorf("probe %s = %q, want %q", k, got[k], w)
		}
	}
}

// TestIsolation runs the probe as the init of a real runc container made
// from Spec with the default config and checks every isolation property
// from inside, and the cgroup limits from outside.
func TestIsolation(t *testing.T) {
	e := newJailEnv(t, "probe", nil)
	pid := e.start(t)

	// The daemon is not the jail's (sub)reaper: init was reparented away.
	stat := readTrim(t, fmt.Sprintf("/proc/%d/stat", pid))
	fields := strings.Fields(stat[strings.LastIndexByte(stat, ')')+1:])
	if ppid, _ := strconv.Atoi(fields[1]); ppid == os.Getpid() {
		t.Errorf("container init's parent is the test process")
	}

	r := e.results(t)
	caps := capMask(config.DefaultCapabilities)
	sysrqWant := "EROFS"
	if _, err := os.Stat("/proc/sysrq-trigger"); err != nil {
		sysrqWant = "ENOENT" // the host kernel has no magic SysRq
	}
	expectResults(t, r, map[string]string{
		"pid": "1",
		// runc adds HOME (from the rootfs's /etc/passwd) when the spec has none.
		"env":      strings.Join(initEnv, " ") + " HOME=/root",
		"hostname": "jail-" + e.id,

		"mount":                         "EPERM",
		"unshare_user":                  "EPERM",
		"unshare_ns":                    "EPERM",
		"setns":                         "EPERM",
		"clone_newuser":                 "EPERM",
		"clone_newns":                   "EPERM",
		"clone_plain":                   "ok",
		"clone3":                        "ENOSYS",
		"socket_raw":                    "EPERM",
		"mknod_block":                   "EPERM",
		"dev_mem":                       "EPERM",
		"reboot":                        "EPERM",
		"clock_settime":                 "EPERM",
		"bpf":                           "EPERM",
		"perf_event_open":               "EPERM",
		"keyctl":                        "EPERM",
		"io_uring_setup":                "EPERM",
		"userfaultfd":                   "EPERM",
		"open_by_handle_at":             "EPERM",
		"personality_read_implies_exec": "EPERM",
		"personality_query":             "ok",
		"tiocsti":                       "EPERM",
		"sethostname":                   "EPERM",

		"write_sysrq_trigger": sysrqWant,
		"write_proc_sys":      "EROFS",
		"sys_readonly":        "true",
		"flags_init_binary":   "ro,nosuid,nodev",
		"flags_control_dir":   "nosuid,nodev,noexec",
		"flags_usr":           "ro,nosuid,nodev",
		"write_usr":           "EROFS",
		"write_tmp":           "ok",
		"write_ro_mount":      "EROFS",
		"write_rw_mount":      "ok",
		"read_ro_mount":       `ok "hello from the host"`,

		"CapEff":     caps,
		"CapPrm":     caps,
		"CapBnd":     caps,
		"CapInh":     "0000000000000000",
		"CapAmb":     "0000000000000000",
		"NoNewPrivs": "1",
		"Seccomp":    "2",

		"rlimit_nofile": "1024/1024",
		"rlimit_core":   "0/0",
		"rlimit_as":     fmt.Sprintf("%d/%d", 4*config.GiB, 4*config.GiB),
		"oom_score_adj": strconv.Itoa(initproto.InitOOMScoreAdj),

		"read_blocked_file":    `ok ""`,
		"list_blocked_dir":     "ok 0",
		"read_proc_timer_list": "ok 0",
		"read_proc_keys":       "ok 0",
	})
	for _, d := range strings.Fields(r["dev"]) {
		switch d {
		case "null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "shm", "mqueue", "fd", "stdin", "stdout", "stderr", "core":
		default:
			t.Errorf("unexpected /dev entry %q (all: %s)", d, r["dev"])
		}
	}
	if _, err := os.Stat(filepath.Join(e.dir, "data-rw", "probe-file")); err != nil {
		t.Errorf("write through the read-write mount is not visible on the host: %v", err)
	}

	// The limits reached the cgroups.
	cg := func(ctrl, file string) string {
		return readTrim(t, filepath.Join(cgroupRoot, ctrl, e.cgroupsPath, file))
	}
	if got := cg("memory", "memory.limit_in_bytes"); got != strconv.FormatInt(256*config.MiB, 10) {
		t.Errorf("memory.limit_in_bytes = %s", got)
	}
	if swapAccounting() {
		if got := cg("memory", "memory.memsw.limit_in_bytes"); got != strconv.FormatInt(256*config.MiB, 10) {
			t.Errorf("memory.memsw.limit_in_bytes = %s, want equal to the memory limit (no swap)", got)
		}
	}
	if got := cg("pids", "pids.max"); got != "64" {
		t.Errorf("pids.max = %s", got)
	}
	if got := cg("cpu", "cpu.shares"); got != strconv.Itoa(config.DefaultCPUShares) {
		t.Errorf("cpu.shares = %s", got)
	}
	if got := cg("cpu", "cpu.cfs_quota_us"); got != "50000" {
		t.Errorf("cpu.cfs_quota_us = %s", got)
	}
	if got := cg("unified", "cgroup.procs"); !strings.Contains("\n"+got+"\n", fmt.Sprintf("\n%d\n", pid)) {
		t.Errorf("init (pid %d) is not in its unified cgroup: %q", pid, got)
	}
	devices := cg("devices", "devices.list")
	for _, rule := range strings.Split(devices, "\n") {
		if strings.HasPrefix(rule, "b ") && strings.ContainsAny(strings.Fields(rule)[2], "rw") {
			t.Errorf("block devices readable or writable: %q", rule)
		}
		if rule == "a *:* rwm" {
			t.Errorf("device cgroup allows everything")
		}
	}
}

// TestSeccompWithCapabilities grants the capabilities the dangerous calls
// need, so that each EPERM below comes from the seccomp filter alone, and
// shows the capabilities are in force (sethostname, raw sockets work).
func TestSeccompWithCapabilities(t *testing.T) {
	added := []string{"CAP_SYS_ADMIN", "CAP_SYS_TIME", "CAP_SYS_BOOT", "CAP_BPF", "CAP_PERFMON", "CAP_NET_RAW", "CAP_MKNOD"}
	e := newJailEnv(t, "probe", func(c *config.Config) {
		c.Isolation.Process.Capabilities = added
	})
	e.start(t)
	r := e.results(t)
	want := capMask(append(append([]string{}, config.DefaultCapabilities...), added...))
	expectResults(t, r, map[string]string{
		"CapEff":          want,
		"sethostname":     "ok",
		"socket_raw":      "ok",
		"mount":           "EPERM",
		"unshare_user":    "EPERM",
		"unshare_ns":      "EPERM",
		"setns":           "EPERM",
		"clone_newns":     "EPERM",
		"reboot":          "EPERM",
		"clock_settime":   "EPERM",
		"bpf":             "EPERM",
		"perf_event_open": "EPERM",
		"keyctl":          "EPERM",
		// The filter refuses block device nodes even with CAP_MKNOD; the
		// device cgroup refuses to open other character devices.
		"mknod_block": "EPERM",
		"dev_mem":     "ok EPERM",
	})
}

// TestDropAllCapabilities checks an empty capability set.
func TestDropAllCapabilities(t *testing.T) {
	e := newJailEnv(t, "probe", func(c *config.Config) {
		c.Isolation.Process.DropCapabilities = []string{"ALL"}
	})
	e.start(t)
	expectResults(t, e.results(t), map[string]string{
		"CapEff": "0000000000000000",
		"CapBnd": "0000000000000000",
		// /tmp is world-writable: no capability is needed.
		"write_tmp": "ok",
	})
}

// TestUserNamespace maps the jail's ids to a host range.
func TestUserNamespace(t *testing.T) {
	const base = testUIDBase
	e := newJailEnv(t, "probe", func(c *config.Config) {
		t := true
		c.Isolation.Process.Namespaces = &config.Namespaces{User: &t}
	})
	// runc mounts the rootfs from inside the user namespace: every directory
	// above it must be searchable by the mapped ids.
	if err := os.Chmod(filepath.Dir(e.dir), 0o755); err != nil {
		t.Fatal(err)
	}
	// The jail's root creates mount points in its root directory, as it
	// would on an id-shifted overlay.
	for _, p := range []string{e.rootfs, e.control, filepath.Join(e.rootfs, "tmp"), filepath.Join(e.dir, "data-rw")} {
		if err := os.Chown(p, base, base); err != nil {
			t.Fatal(err)
		}
	}
	e.start(t)
	r := e.results(t)
	expectResults(t, r, map[string]string{
		"uid_map":      fmt.Sprintf("0 %d %d", base, IDMapSize),
		"CapEff":       capMask(config.DefaultCapabilities),
		"pid":          "1",
		"mount":        "EPERM",
		"unshare_user": "EPERM",
		"socket_raw":   "EPERM",
		"write_tmp":    "ok",
		"sys_readonly": "true",
		"NoNewPrivs":   "1",
		"Seccomp":      "2",
	})
}

// TestCustomSeccompProfile replaces the default filter with a profile from
// the config.
func TestCustomSeccompProfile(t *testing.T) {
	e := newJailEnv(t, "probe", func(c *config.Config) {
		c.Isolation.Process.SeccompProfile = &config.SeccompProfile{
			DefaultAction: config.ActAllow,
			Syscalls: []config.SeccompSyscall{
				{Names: []string{"sethostname", "keyctl"}, Action: config.ActErrno},
				// personality(READ_IMPLIES_EXEC) only.
				{Names: []string{"personality"}, Action: config.ActErrno, Args: []config.SeccompArg{{Index: 0, Value: 0x0400000, Op: "SCMP_CMP_EQ"}}},
			},
		}
	})
	e.start(t)
	expectResults(t, e.results(t), map[string]string{
		"keyctl":                        "EPERM",
		"personality_read_implies_exec": "EPERM",
		"personality_query":             "ok",
		// No longer filtered: the kernel answers.
		"setns":  "EBADF",
		"clone3": "EINVAL",
	})
}

// TestSeccomp386 runs the probe as an i386 binary: the filter covers the
// 32-bit ABI too (int 0x80 reaches the kernel with AUDIT_ARCH_I386).
func TestSeccomp386(t *testing.T) {
	needRoot(t)
	bin := probeBinary(t, "386")
	// A host kernel without (or with disabled) IA32 emulation cannot run the
	// 32-bit ABI at all; the probe, missing its mode file, exits 2 when it
	// does run.
	if err := exec.Command(bin).Run(); errors.Is(err, syscall.ENOEXEC) {
		t.Skipf("this host cannot execute i386 binaries: %v", err)
	}
	e := newJailEnv(t, "probe", nil)
	e.opts.InitBinary = bin
	e.writeSpec(t)
	e.start(t)
	expectResults(t, e.results(t), map[string]string{
		"Seccomp":                       "2",
		"mount":                         "EPERM",
		"unshare_user":                  "EPERM",
		"setns":                         "EPERM",
		"clone_newuser":                 "EPERM",
		"clone_plain":                   "ok",
		"clone3":                        "ENOSYS",
		"keyctl":                        "EPERM",
		"bpf":                           "EPERM",
		"io_uring_setup":                "EPERM",
		"reboot":                        "EPERM",
		"clock_settime":                 "EPERM",
		"mknod_block":                   "EPERM",
		"personality_read_implies_exec": "EPERM",
		"personality_query":             "ok",
		"tiocsti":                       "EPERM",
	})
}
