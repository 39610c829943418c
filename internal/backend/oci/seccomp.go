package oci

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/config"
)

// seccompArches are the ABIs a jail process can call the kernel through on
// an x86-64 host: native, i386 (int 0x80, also reachable from 64-bit code)
// and x32. A rule names syscalls once; the runtime resolves each name per
// ABI and skips a name an ABI lacks.
var seccompArches = []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32}

// Personality flags (include/uapi/linux/personality.h) the jail may not set.
const (
	// perMmapPageZero maps page 0 at exec, turning kernel NULL dereferences
	// into exploitable reads and writes of user memory.
	perMmapPageZero = 0x0100000
	// perReadImpliesExec makes every readable mapping executable, undoing
	// W^X for the process and everything it executes.
	perReadImpliesExec = 0x0400000
)

// cloneNamespaceFlags are the clone(2) flags that create namespaces.
var cloneNamespaceFlags = []uint64{
	unix.CLONE_NEWNS, unix.CLONE_NEWCGROUP, unix.CLONE_NEWUTS, unix.CLONE_NEWIPC,
	unix.CLONE_NEWUSER, unix.CLONE_NEWPID, unix.CLONE_NEWNET,
}

// deniedSyscalls are refused with EPERM whatever their arguments, grouped
// by the reason they are refused.
var deniedSyscalls = [][]string{
	// The jail's filesystem view is fixed by the runtime: a new mount could
	// cover a masked path, expose a host filesystem or escape the root.
	{"mount", "umount", "umount2", "pivot_root", "chroot",
		"fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr"},
	// New namespaces, above all user namespaces, hand the jail's processes
	// a full capability set over fresh kernel objects, the largest kernel
	// attack surface reachable without privilege; joining one (setns) could
	// leave the jail. Namespace flags of clone are refused by argument below.
	{"unshare", "setns"},
	// Loading code into the kernel or replacing it.
	{"init_module", "finit_module", "delete_module", "create_module",
		"get_kernel_syms", "query_module", "kexec_load", "kexec_file_load"},
	// Kernel tracing and introspection: eBPF programs, perf counters, the
	// kernel log and kernel object ordering leak host state and have a long
	// history of privilege escalations.
	{"bpf", "perf_event_open", "syslog", "lookup_dcookie", "kcmp"},
	// The kernel keyring is not namespaced: keys are shared with the host.
	{"keyctl", "add_key", "request_key"},
	// Host-wide state: power, swap, the system clock, process accounting,
	// disk quotas, the NFS server, the controlling terminals of others.
	{"reboot", "swapon", "swapoff", "settimeofday", "stime", "clock_settime",
		"clock_settime64", "clock_adjtime", "clock_adjtime64", "adjtimex", "acct",
		"quotactl", "quotactl_fd", "nfsservctl", "vhangup"},
	// Raw hardware I/O ports.
	{"iopl", "ioperm"},
	// File handles bypass path-based confinement: a guessed handle opens any
	// file of a mounted filesystem, even outside the jail's root.
	{"open_by_handle_at", "name_to_handle_at"},
	// Exploit primitives with no place in an agent's workload: userfaultfd
	// stalls the kernel at will inside copies, io_uring performs I/O the
	// syscall filter and the syscall observers never see, and the legacy
	// calls below exist for a.out binaries, 16-bit code and vm86 mode.
	{"userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
		"uselib", "modify_ldt", "vm86", "vm86old"},
}

// DefaultSeccomp is the jail's default seccomp filter: every call is
// allowed except the ones that reach beyond the jail, which fail with
// EPERM (a deny list, so ordinary programs keep working unchanged):
//
//   - the calls of deniedSyscalls, whatever their arguments;
//   - clone with any namespace flag (one rule per flag);
//   - clone3 fails with ENOSYS: its flags live in memory the filter cannot
//     read, and ENOSYS makes the C library fall back to clone, which the
//     filter can inspect;
//   - personality setting MMAP_PAGE_ZERO or READ_IMPLIES_EXEC (the query
//     personality(0xffffffff) stays allowed);
//   - mknod and mknodat of a block device;
//   - ioctl TIOCSTI, which pushes input into a terminal the jail shares
//     with a user attached to it.
//
// The ioctl command, declared unsigned int by the kernel, is compared on its
// low 32 bits only: the kernel ignores the upper half a caller may set.
func DefaultSeccomp() *specs.LinuxSeccomp {
	eperm := uint(unix.EPERM)
	enosys := uint(unix.ENOSYS)
	s := &specs.LinuxSeccomp{
		DefaultAction: specs.ActAllow,
		Architectures: append([]specs.Arch{}, seccompArches...),
	}
	for _, names := range deniedSyscalls {
		s.Syscalls = append(s.Syscalls, specs.LinuxSyscall{
			Names: append([]string{}, names...), Action: specs.ActErrno, ErrnoRet: &eperm,
		})
	}
	for _, flag := range cloneNamespaceFlags {
		s.Syscalls = append(s.Syscalls, specs.LinuxSyscall{
			Names: []string{"clone"}, Action: specs.ActErrno, ErrnoRet: &eperm,
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: flag, ValueTwo: flag, Op: specs.OpMaskedEqual}},
		})
	}
	s.Syscalls = append(s.Syscalls, specs.LinuxSyscall{
		Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: &enosys,
	})
	// "flag set and not the query 0xffffffff" needs two comparisons of
	// one argument, which libseccomp does not combine within a rule; it is
	// spelled as the union over every other low bit b of "flag set and b
	// clear" (a value other than the query has some bit clear).
	for _, flag := range []uint64{perMmapPageZero, perReadImpliesExec} {
		for b := uint64(1); b <= 1<<31; b <<= 1 {
			if b == flag {
				continue
			}
			s.Syscalls = append(s.Syscalls, specs.LinuxSyscall{
				Names: []string{"personality"}, Action: specs.ActErrno, ErrnoRet: &eperm,
				Args: []specs.LinuxSeccompArg{{Index: 0, Value: flag | b, ValueTwo: flag, Op: specs.OpMaskedEqual}},
			})
		}
	}
	// Block device nodes: the device cgroup refuses to open them, but a node
	// left in the jail's layer would give block access to any host process
	// that later opens it. The mode is mknod's second argument, mknodat's
	// third.
	for _, c := range []struct {
		name  string
		index uint
	}{{"mknod", 1}, {"mknodat", 2}} {
		s.Syscalls = append(s.Syscalls, specs.LinuxSyscall{
			Names: []string{c.name}, Action: specs.ActErrno, ErrnoRet: &eperm,
			Args: []specs.LinuxSeccompArg{{Index: c.index, Value: unix.S_IFMT, ValueTwo: unix.S_IFBLK, Op: specs.OpMaskedEqual}},
		})
	}
	s.Syscalls = append(s.Syscalls, specs.LinuxSyscall{
		Names: []string{"ioctl"}, Action: specs.ActErrno, ErrnoRet: &eperm,
		Args: []specs.LinuxSeccompArg{{Index: 1, Value: 0xffffffff, ValueTwo: unix.TIOCSTI, Op: specs.OpMaskedEqual}},
	})
	return s
}

// SeccompFromProfile translates a config seccomp profile (seed 002) into
// the runtime's form. It replaces DefaultSeccomp entirely. SCMP_ACT_ERRNO
// fails calls with EPERM; SCMP_ACT_KILL kills the whole process (a killed
// thread would leave its process half-alive). An argument with op
// SCMP_CMP_MASKED_EQ matches when every bit of its value is set in the
// argument. The profile must have been validated (config.Validate).
func SeccompFromProfile(p *config.SeccompProfile) *specs.LinuxSeccomp {
	eperm := uint(unix.EPERM)
	s := &specs.LinuxSeccomp{
		DefaultAction: seccompAction(p.DefaultAction),
		Architectures: append([]specs.Arch{}, seccompArches...),
	}
	if p.DefaultAction == config.ActErrno {
		s.DefaultErrnoRet = &eperm
	}
	for _, sc := range p.Syscalls {
		rule := specs.LinuxSyscall{
			Names:  append([]string{}, sc.Names...),
			Action: seccompAction(sc.Action),
		}
		if sc.Action == config.ActErrno {
			rule.ErrnoRet = &eperm
		}
		for _, a := range sc.Args {
			arg := specs.LinuxSeccompArg{Index: a.Index, Value: a.Value, Op: specs.LinuxSeccompOperator(a.Op)}
			if arg.Op == specs.OpMaskedEqual {
				arg.ValueTwo = a.Value
			}
			rule.Args = append(rule.Args, arg)
		}
		s.Syscalls = append(s.Syscalls, rule)
	}
	return s
}

func seccompAction(a string) specs.LinuxSeccompAction {
	switch a {
	case config.ActAllow:
		return specs.ActAllow
	case config.ActKill:
		return specs.ActKillProcess
	default:
		return specs.ActErrno
	}
}
