// Package confine is the first step of a process-level jail: `agentjail
// confine SPEC` waits until the daemon has placed it in the jail's cgroup
// and attached observation, then, in this order, joins the jail's network
// namespace, sets its resource limits, drops to the jail's unprivileged
// user, forbids gaining privileges, restricts the filesystem with
// Landlock (the listed paths only; signals, ptrace and abstract unix
// sockets kept inside the jail), installs a seccomp filter refusing the
// escape syscalls, and executes the jail's init. Every restriction is
// inherited by everything init starts and cannot be lifted.
package confine

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"syscall"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/landlock-lsm/go-landlock/landlock"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/initproto"
)

// ReleaseFD is the descriptor (a pipe's read end) on which the process
// waits for the daemon's go-ahead: one byte. End of file without it
// aborts.
const ReleaseFD = 3

// Spec is what Run applies before it executes the program.
type Spec struct {
	// Path, Argv, Env and Dir are the program executed once confined.
	Path string   `json:"path"`
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
	// Netns is the path of a network namespace to join ("": keep).
	Netns string `json:"netns,omitempty"`
	// Rlimits are set before the user changes.
	Rlimits []Rlimit `json:"rlimits,omitempty"`
	// UID and GID to run as, without supplementary groups (negative:
	// keep the caller's).
	UID int `json:"uid"`
	GID int `json:"gid"`
	// Landlock restricts the filesystem; nil leaves it open.
	Landlock *Landlock `json:"landlock,omitempty"`
	// Seccomp installs the filter of Denied.
	Seccomp bool `json:"seccomp,omitempty"`
}

// Rlimit is one resource limit (unix.RLIMIT_*).
type Rlimit struct {
	Resource int    `json:"resource"`
	Cur      uint64 `json:"cur"`
	Max      uint64 `json:"max"`
}

// Landlock lists what stays reachable (shared with init, which applies
// one more to the commands).
type Landlock = initproto.Landlock

// Main runs `agentjail confine SPEC` (args after "confine") and returns
// only on failure, with the exit status; on success the process is the
// confined program.
func Main(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "agentjail confine: want one argument, the spec (JSON)")
		return 2
	}
	var spec Spec
	if err := json.Unmarshal([]byte(args[0]), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "agentjail confine: spec: %v\n", err)
		return 2
	}
	if err := waitRelease(); err != nil {
		fmt.Fprintf(os.Stderr, "agentjail confine: %v\n", err)
		return 1
	}
	err := Run(spec)
	fmt.Fprintf(os.Stderr, "agentjail confine: %v\n", err)
	return 1
}

// waitRelease blocks until the daemon writes the go-ahead on ReleaseFD.
func waitRelease() error {
	f := os.NewFile(ReleaseFD, "release")
	defer f.Close()
	var b [1]byte
	if _, err := io.ReadFull(f, b[:]); err != nil {
		return fmt.Errorf("waiting for the daemon's go-ahead: %w", err)
	}
	return nil
}

// Run applies spec to the calling process and executes spec.Path; it
// returns only an error.
func Run(spec Spec) error {
	// Namespaces are per thread: join on this one, and keep it.
	runtime.LockOSThread()
	if spec.Netns != "" {
		if err := joinNetns(spec.Netns); err != nil {
			return err
		}
	}
	for _, r := range spec.Rlimits {
		if err := unix.Setrlimit(r.Resource, &unix.Rlimit{Cur: r.Cur, Max: r.Max}); err != nil {
			return fmt.Errorf("rlimit %d: %w", r.Resource, err)
		}
	}
	if spec.GID >= 0 {
		if err := syscall.Setgroups(nil); err != nil {
			return fmt.Errorf("drop supplementary groups: %w", err)
		}
		if err := syscall.Setresgid(spec.GID, spec.GID, spec.GID); err != nil {
			return fmt.Errorf("gid %d: %w", spec.GID, err)
		}
	}
	if spec.UID >= 0 {
		if err := syscall.Setresuid(spec.UID, spec.UID, spec.UID); err != nil {
			return fmt.Errorf("uid %d: %w", spec.UID, err)
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if err := os.Chdir(spec.Dir); err != nil {
		return fmt.Errorf("working directory: %w", err)
	}
	if spec.Landlock != nil {
		if err := RestrictFS(spec.Landlock); err != nil {
			return err
		}
	}
	if spec.Seccomp {
		if err := seccomp.LoadFilter(seccomp.Filter{NoNewPrivs: true, Flag: seccomp.FilterFlagTSync, Policy: Policy()}); err != nil {
			return fmt.Errorf("seccomp: %w", err)
		}
	}
	err := syscall.Exec(spec.Path, spec.Argv, spec.Env)
	return fmt.Errorf("execute %s: %w", spec.Path, err)
}

func joinNetns(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("network namespace: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("join network namespace %s: %w", path, err)
	}
	return nil
}

// RestrictFS applies l to the calling process (all its threads) with
// Landlock ABI 6 (for the signal and abstract socket scopes): anything the
// kernel cannot restrict is an error, not a silent gap. The process must
// have no_new_privs set or CAP_SYS_ADMIN. Domains stack: a process
// restricted again keeps only what both allow.
func RestrictFS(l *Landlock) error {
	cfg := landlock.V6
	rules := []landlock.Rule{
		landlock.RODirs(l.ReadOnly...),
		landlock.RWDirs(l.ReadWrite...).WithRefer(),
		landlock.ROFiles(l.ReadOnlyFiles...),
		landlock.RWFiles(l.Devices...).WithIoctlDev(),
	}
	// V6 without its network rights: the jail's network is its namespace.
	cfg = landlock.Config{HandledAccessFS: cfg.HandledAccessFS, Scoped: cfg.Scoped}
	if err := cfg.Restrict(rules...); err != nil {
		return fmt.Errorf("landlock: %w", err)
	}
	return nil
}

// Policy is the seccomp policy of a confined jail: the escape syscalls
// answer EPERM (clone3 ENOSYS, so that libc falls back to clone, whose
// namespace flags are refused); everything else is allowed, for Landlock,
// the unprivileged user and the cgroup bound the rest.
func Policy() seccomp.Policy {
	var newNS []seccomp.NameWithConditions
	for _, flag := range []uint64{unix.CLONE_NEWNS, unix.CLONE_NEWUTS, unix.CLONE_NEWIPC, unix.CLONE_NEWUSER,
		unix.CLONE_NEWPID, unix.CLONE_NEWNET, unix.CLONE_NEWCGROUP, unix.CLONE_NEWTIME} {
		newNS = append(newNS, seccomp.NameWithConditions{Name: "clone", Conditions: seccomp.ArgumentConditions{
			{Argument: 0, Operation: seccomp.BitsSet, Value: flag},
		}})
	}
	return seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{Action: seccomp.ActionErrno, Names: Denied},
			{Action: seccomp.ActionErrno, NamesWithCondtions: newNS},
			{Action: seccomp.Action(unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)), Names: []string{"clone3"}},
		},
	}
}

// Denied are the syscalls a confined jail may not make: tracing other
// processes, mounts and namespaces, kernel modules, bpf, keyrings, the
// clock, swap, reboot, raw I/O ports, handle-based opens, and io_uring
// (whose operations would not meet this filter).
var Denied = []string{
	"ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
	"mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree",
	"unshare", "setns",
	"init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
	"bpf", "perf_event_open", "userfaultfd",
	"keyctl", "add_key", "request_key",
	"reboot", "swapon", "swapoff", "syslog", "acct",
	"settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
	"iopl", "ioperm", "open_by_handle_at", "name_to_handle_at", "quotactl", "lookup_dcookie", "vhangup",
	"io_uring_setup", "io_uring_enter", "io_uring_register",
}
