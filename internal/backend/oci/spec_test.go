package oci

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
)

func testOptions(mutate func(*config.Config)) SpecOptions {
	c := &config.Config{}
	c.Isolation.Filesystem.BlockedPaths = []string{"/etc/shadow"}
	if mutate != nil {
		mutate(c)
	}
	c.ApplyDefaults()
	return SpecOptions{
		ID:          "j1",
		Config:      c,
		Rootfs:      "/data/jails/j1/rootfs/merged",
		NetnsPath:   "/data/run/netns/j1",
		CgroupsPath: "/agentjail/j1",
		InitBinary:  "/data/bin/agentjail",
		ControlDir:  "/data/jails/j1/run",
		Mounts:      []Mount{{Source: "/usr", Target: "/usr", ReadOnly: true}},
	}
}

func mustSpec(t *testing.T, o SpecOptions) *specs.Spec {
	t.Helper()
	s, err := Spec(o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func findMount(s *specs.Spec, dst string) *specs.Mount {
	for i := range s.Mounts {
		if s.Mounts[i].Destination == dst {
			return &s.Mounts[i]
		}
	}
	return nil
}

func TestSpecDefaults(t *testing.T) {
	s := mustSpec(t, testOptions(nil))
	p := s.Process
	if !reflect.DeepEqual(p.Args, []string{"/.agentjail/agentjail", "init"}) || p.Cwd != "/" || p.Terminal ||
		p.User.UID != 0 || p.User.GID != 0 || !reflect.DeepEqual(p.Env, initEnv) {
		t.Errorf("process = %+v", p)
	}
	caps := config.DefaultCapabilities
	if !reflect.DeepEqual(p.Capabilities.Bounding, caps) || !reflect.DeepEqual(p.Capabilities.Effective, caps) ||
		!reflect.DeepEqual(p.Capabilities.Permitted, caps) || p.Capabilities.Inheritable != nil || p.Capabilities.Ambient != nil {
		t.Errorf("capabilities = %+v", p.Capabilities)
	}
	if !p.NoNewPrivileges || p.OOMScoreAdj == nil || *p.OOMScoreAdj <= 0 {
		t.Errorf("noNewPrivileges %v, oomScoreAdj %v", p.NoNewPrivileges, p.OOMScoreAdj)
	}
	wantRl := []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}, {Type: "RLIMIT_CORE"}}
	if !reflect.DeepEqual(p.Rlimits, wantRl) {
		t.Errorf("rlimits = %+v", p.Rlimits)
	}
	if s.Hostname != "j1" || s.Root.Path != "/data/jails/j1/rootfs/merged" || s.Root.Readonly {
		t.Errorf("hostname %q root %+v", s.Hostname, s.Root)
	}

	l := s.Linux
	var ns []string
	for _, n := range l.Namespaces {
		ns = append(ns, string(n.Type)+"="+n.Path)
	}
	if want := []string{"pid=", "mount=", "ipc=", "uts=", "cgroup=", "network=/data/run/netns/j1"}; !reflect.DeepEqual(ns, want) {
		t.Errorf("namespaces = %v, want %v", ns, want)
	}
	if l.UIDMappings != nil || l.GIDMappings != nil {
		t.Errorf("id mappings without a user namespace")
	}
	if l.CgroupsPath != "/agentjail/j1" {
		t.Errorf("cgroupsPath = %q", l.CgroupsPath)
	}
	if !slices.Contains(l.MaskedPaths, "/etc/shadow") || !slices.Contains(l.MaskedPaths, "/proc/kcore") {
		t.Errorf("maskedPaths = %v", l.MaskedPaths)
	}
	if !slices.Contains(l.ReadonlyPaths, "/proc/sysrq-trigger") || !slices.Contains(l.ReadonlyPaths, "/proc/sys") {
		t.Errorf("readonlyPaths = %v", l.ReadonlyPaths)
	}

	var dsts []string
	for _, m := range s.Mounts {
		dsts = append(dsts, m.Destination)
	}
	want := []string{"/proc", "/dev", "/dev/pts", "/dev/shm", "/dev/mqueue", "/sys", "/sys/fs/cgroup", "/usr", InitPath, ControlPath}
	if !reflect.DeepEqual(dsts, want) {
		t.Errorf("mount destinations = %v, want %v", dsts, want)
	}
	if m := findMount(s, "/tmp"); m != nil {
		t.Errorf("/tmp is mounted: %+v", m)
	}
	if m := findMount(s, InitPath); m.Source != "/data/bin/agentjail" || !slices.Contains(m.Options, "ro") || !slices.Contains(m.Options, "nosuid") {
		t.Errorf("init mount = %+v", m)
	}
	if m := findMount(s, ControlPath); !slices.Contains(m.Options, "noexec") || slices.Contains(m.Options, "ro") {
		t.Errorf("control mount = %+v", m)
	}
	if m := findMount(s, "/sys"); m.Type != "sysfs" || !slices.Contains(m.Options, "ro") {
		t.Errorf("sys mount = %+v", m)
	}
	if m := findMount(s, "/usr"); !reflect.DeepEqual(m.Options, []string{"bind", "ro", "nosuid", "nodev"}) {
		t.Errorf("/usr mount = %+v", m)
	}

	r := l.Resources
	if *r.Memory.Limit != config.DefaultMemory || r.Memory.Swap != nil {
		t.Errorf("memory = %+v", r.Memory)
	}
	if *r.CPU.Shares != config.DefaultCPUShares || *r.CPU.Period != config.DefaultCPUPeriod || r.CPU.Quota != nil {
		t.Errorf("cpu = %+v", r.CPU)
	}
	if *r.Pids.Limit != config.DefaultPids {
		t.Errorf("pids = %d", *r.Pids.Limit)
	}
	if d := r.Devices[0]; d.Allow || d.Access != "rwm" || d.Type != "" {
		t.Errorf("first device rule = %+v, want deny all", d)
	}
	for _, d := range r.Devices[1:] {
		if !d.Allow || d.Type != "c" {
			t.Errorf("device rule %+v", d)
		}
	}
	if !reflect.DeepEqual(l.Seccomp, DefaultSeccomp()) {
		t.Errorf("seccomp is not the default filter")
	}
}

func TestSpecResources(t *testing.T) {
	o := testOptions(func(c *config.Config) {
		r := &c.Isolation.Resources
		r.MemoryBytes = 128 * config.MiB
		r.MemorySwapBytes = 256 * config.MiB
		r.CPUQuota = 50000
		r.AsLimit = uint64(config.GiB)
		r.CoreLimit = 4096
		r.NofileLimit = 2048
	})
	o.Hostname = "box"
	_, err := Spec(o)
	if !errors.Is(err, errdefs.ErrUnprocessable) || !strings.Contains(err.Error(), "isolation.resources.memory_swap_bytes") {
		t.Fatalf("swap without accounting: %v", err)
	}
	o.SwapAccounting = true
	s := mustSpec(t, o)
	if *s.Linux.Resources.Memory.Swap != 256*config.MiB || *s.Linux.Resources.CPU.Quota != 50000 {
		t.Errorf("resources = %+v %+v", s.Linux.Resources.Memory, s.Linux.Resources.CPU)
	}
	want := []specs.POSIXRlimit{
		{Type: "RLIMIT_NOFILE", Hard: 2048, Soft: 2048},
		{Type: "RLIMIT_CORE", Hard: 4096, Soft: 4096},
		{Type: "RLIMIT_AS", Hard: uint64(config.GiB), Soft: uint64(config.GiB)},
	}
	if !reflect.DeepEqual(s.Process.Rlimits, want) {
		t.Errorf("rlimits = %+v", s.Process.Rlimits)
	}
	if s.Hostname != "box" {
		t.Errorf("hostname = %q", s.Hostname)
	}

	// Equal swap and memory: no swap, whatever the host.
	o = testOptions(nil)
	o.Config.Hostname = "named"
	s = mustSpec(t, o)
	if s.Linux.Resources.Memory.Swap != nil || s.Hostname != "named" {
		t.Errorf("swap %v hostname %q", s.Linux.Resources.Memory.Swap, s.Hostname)
	}
	o.SwapAccounting = true
	s = mustSpec(t, o)
	if *s.Linux.Resources.Memory.Swap != *s.Linux.Resources.Memory.Limit {
		t.Errorf("swap %d != limit %d", *s.Linux.Resources.Memory.Swap, *s.Linux.Resources.Memory.Limit)
	}
}

func TestSpecConfigMounts(t *testing.T) {
	s := mustSpec(t, testOptions(func(c *config.Config) {
		c.Isolation.Filesystem.ReadOnlyMounts = []config.Mount{
			{Source: "/srv/a", Target: "/a", Options: []string{"rw"}},
			{Source: "/srv/b", Target: "/b", Options: []string{"rbind", "noexec"}},
		}
		c.Isolation.Filesystem.ReadWriteMounts = []config.Mount{
			{Source: "/srv/c", Target: "/c"},
			{Source: "/srv/d", Target: "/d", Options: []string{"ro"}},
		}
	}))
	for dst, want := range map[string][]string{
		"/a": {"bind", "ro", "nosuid", "nodev"},
		"/b": {"rbind", "rnosuid", "rnodev", "rro", "ro", "nosuid", "nodev", "noexec"},
		"/c": {"bind", "rw", "nosuid", "nodev"},
		"/d": {"bind", "ro", "nosuid", "nodev"},
	} {
		m := findMount(s, dst)
		if m == nil || m.Type != "bind" || !reflect.DeepEqual(m.Options, want) {
			t.Errorf("mount %s = %+v, want options %v", dst, m, want)
		}
	}
	// Config mounts come before the control binds, which nothing covers.
	if s.Mounts[len(s.Mounts)-1].Destination != ControlPath {
		t.Errorf("last mount is %s", s.Mounts[len(s.Mounts)-1].Destination)
	}

	for _, target := range []string{"/proc", "/proc/sys", "/sys/fs", "/dev", "/.agentjail", "/.agentjail/run"} {
		_, err := Spec(testOptions(func(c *config.Config) {
			c.Isolation.Filesystem.ReadWriteMounts = []config.Mount{{Source: "/srv", Target: "/ok"}, {Source: "/srv", Target: target}}
		}))
		if !errors.Is(err, errdefs.ErrUnprocessable) || !strings.Contains(err.Error(), "isolation.filesystem.read_write_mounts[1].target") {
			t.Errorf("mount at %s: %v", target, err)
		}
	}
	if _, err := Spec(testOptions(func(c *config.Config) {
		c.Isolation.Filesystem.ReadOnlyMounts = []config.Mount{{Source: "/srv", Target: "/process"}}
	})); err != nil {
		t.Errorf("/process is not under /proc: %v", err)
	}
}

func TestSpecUserNamespace(t *testing.T) {
	on := true
	o := testOptions(func(c *config.Config) { c.Isolation.Process.Namespaces = &config.Namespaces{User: &on} })
	if _, err := Spec(o); !errors.Is(err, errdefs.ErrUnprocessable) || !strings.Contains(err.Error(), "isolation.process.namespaces.user") {
		t.Errorf("user namespace without a range: %v", err)
	}
	o.UIDMapBase = 1 << 31
	s := mustSpec(t, o)
	want := []specs.LinuxIDMapping{{ContainerID: 0, HostID: 1 << 31, Size: IDMapSize}}
	if !reflect.DeepEqual(s.Linux.UIDMappings, want) || !reflect.DeepEqual(s.Linux.GIDMappings, want) {
		t.Errorf("mappings = %+v %+v", s.Linux.UIDMappings, s.Linux.GIDMappings)
	}
	if n := s.Linux.Namespaces[len(s.Linux.Namespaces)-1]; n.Type != specs.UserNamespace || n.Path != "" {
		t.Errorf("last namespace = %+v", n)
	}
	if m := findMount(s, "/sys"); m.Type != "bind" || !slices.Contains(m.Options, "rro") {
		t.Errorf("sys mount in a user namespace = %+v", m)
	}
	o.UIDMapBase = 1<<32 - 100
	if _, err := Spec(o); !errors.Is(err, errdefs.ErrUnprocessable) {
		t.Errorf("overflowing range: %v", err)
	}
}

func TestSpecInvalidOptions(t *testing.T) {
	for name, mutate := range map[string]func(*SpecOptions){
		"id":          func(o *SpecOptions) { o.ID = "" },
		"config":      func(o *SpecOptions) { o.Config = nil },
		"rootfs":      func(o *SpecOptions) { o.Rootfs = "rootfs" },
		"netns":       func(o *SpecOptions) { o.NetnsPath = "" },
		"cgroupsPath": func(o *SpecOptions) { o.CgroupsPath = "agentjail/j1" },
		"init":        func(o *SpecOptions) { o.InitBinary = "" },
		"control":     func(o *SpecOptions) { o.ControlDir = "run" },
		"mount":       func(o *SpecOptions) { o.Mounts = []Mount{{Source: "usr", Target: "/usr"}} },
	} {
		o := testOptions(nil)
		mutate(&o)
		if _, err := Spec(o); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: %v, want invalid", name, err)
		}
	}
}

func TestWriteBundle(t *testing.T) {
	dir := t.TempDir()
	s := mustSpec(t, testOptions(nil))
	for i := 0; i < 2; i++ { // the second write replaces the first
		if err := WriteBundle(dir, s); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var back specs.Spec
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&back, s) {
		t.Errorf("config.json does not round-trip")
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("bundle dir holds %d entries, want only config.json", len(ents))
	}
	if err := WriteBundle(filepath.Join(dir, "missing"), s); err == nil {
		t.Errorf("write into a missing dir succeeded")
	}
}

func TestDefaultSeccomp(t *testing.T) {
	s := DefaultSeccomp()
	if s.DefaultAction != specs.ActAllow || !reflect.DeepEqual(s.Architectures, []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32}) {
		t.Errorf("default %s arches %v", s.DefaultAction, s.Architectures)
	}
	denied := map[string]bool{}
	for _, r := range s.Syscalls {
		if r.Action != specs.ActErrno || r.ErrnoRet == nil {
			t.Errorf("rule %+v is not an errno rule", r)
			continue
		}
		if len(r.Args) == 0 {
			for _, n := range r.Names {
				denied[n] = *r.ErrnoRet == uint(unix.EPERM)
			}
		}
		if slices.Contains(r.Names, "clone3") && *r.ErrnoRet != uint(unix.ENOSYS) {
			t.Errorf("clone3 fails with %d, want ENOSYS", *r.ErrnoRet)
		}
	}
	for _, n := range []string{
		"mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick",
		"move_mount", "open_tree", "mount_setattr", "kexec_load", "kexec_file_load", "init_module",
		"finit_module", "delete_module", "bpf", "perf_event_open", "keyctl", "add_key", "request_key",
		"reboot", "swapon", "swapoff", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
		"setns", "unshare", "userfaultfd", "acct", "quotactl", "quotactl_fd", "lookup_dcookie",
		"nfsservctl", "iopl", "ioperm", "syslog", "vhangup", "open_by_handle_at", "name_to_handle_at",
		"io_uring_setup", "io_uring_enter", "io_uring_register", "uselib", "create_module",
		"get_kernel_syms", "query_module", "kcmp",
	} {
		if !denied[n] {
			t.Errorf("%s is not denied with EPERM", n)
		}
	}
	if denied["clone"] || denied["personality"] || denied["ioctl"] {
		t.Errorf("clone, personality or ioctl denied regardless of arguments")
	}
}

func TestSeccompFromProfile(t *testing.T) {
	s := SeccompFromProfile(&config.SeccompProfile{
		DefaultAction: config.ActErrno,
		Syscalls: []config.SeccompSyscall{
			{Names: []string{"read", "write"}, Action: config.ActAllow},
			{Names: []string{"ptrace"}, Action: config.ActKill},
			{Names: []string{"personality"}, Action: config.ActErrno, Args: []config.SeccompArg{
				{Index: 0, Value: 8, Op: "SCMP_CMP_NE"},
				{Index: 1, Value: 0x30, Op: "SCMP_CMP_MASKED_EQ"},
			}},
		},
	})
	eperm := uint(unix.EPERM)
	want := &specs.LinuxSeccomp{
		DefaultAction:   specs.ActErrno,
		DefaultErrnoRet: &eperm,
		Architectures:   []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32},
		Syscalls: []specs.LinuxSyscall{
			{Names: []string{"read", "write"}, Action: specs.ActAllow},
			{Names: []string{"ptrace"}, Action: specs.ActKillProcess},
			{Names: []string{"personality"}, Action: specs.ActErrno, ErrnoRet: &eperm, Args: []specs.LinuxSeccompArg{
				{Index: 0, Value: 8, Op: specs.OpNotEqual},
				{Index: 1, Value: 0x30, ValueTwo: 0x30, Op: specs.OpMaskedEqual},
			}},
		},
	}
	if !reflect.DeepEqual(s, want) {
		got, _ := json.Marshal(s)
		exp, _ := json.Marshal(want)
		t.Errorf("profile translated to\n%s\nwant\n%s", got, exp)
	}
}

// TestSpecUnheldCapability: a capability outside the daemon's bounding set
// is refused up front rather than by the runtime at create.
func TestSpecUnheldCapability(t *testing.T) {
	check := func(missing string) {
		_, err := Spec(testOptions(func(c *config.Config) { c.Isolation.Process.Capabilities = []string{missing} }))
		if !errors.Is(err, errdefs.ErrUnprocessable) || !strings.Contains(err.Error(), "isolation.process.capabilities: "+missing) {
			t.Errorf("unheld %s: %v", missing, err)
		}
	}
	for i, c := range config.AllCapabilities {
		if held, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(i), 0, 0, 0); err != nil || held != 1 {
			check(c)
			return
		}
	}
	// This process holds every capability (root): drop one from the
	// bounding set of a thread of its own (the set is per thread), check
	// there, and let the thread end with its goroutine.
	if os.Geteuid() != 0 {
		t.Fatal("every capability is held, but not as root")
	}
	last := len(config.AllCapabilities) - 1
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(last), 0, 0, 0); err != nil {
			done <- err
			return
		}
		check(config.AllCapabilities[last])
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatalf("dropping %s from a thread's bounding set: %v", config.AllCapabilities[last], err)
	}
}
