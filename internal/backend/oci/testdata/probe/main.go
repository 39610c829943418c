// Command probe stands in for the jail's init in the oci package's tests.
// Run as "/.agentjail/agentjail init" inside a container, it reads its mode
// from /.agentjail/run/mode:
//
//	probe       run every isolation probe, write result.json to the control
//	            dir, print "ready", wait for SIGTERM
//	ready       print "ready", wait for SIGTERM
//	ready-exit  print "ready" and exit 0
//	fail        write a message on stderr and exit 3 before "ready"
//	garbage     print "hello" instead of "ready", wait for SIGTERM
//	silent      print nothing, wait for SIGTERM
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

const runDir = "/.agentjail/run"

func main() {
	mode, err := os.ReadFile(runDir + "/mode")
	if err != nil {
		fmt.Fprintln(os.Stderr, "probe: read mode:", err)
		os.Exit(2)
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	switch strings.TrimSpace(string(mode)) {
	case "probe":
		data, _ := json.MarshalIndent(probes(), "", "  ")
		if err := os.WriteFile(runDir+"/result.json", data, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "probe: write result:", err)
			os.Exit(2)
		}
		fmt.Println("ready")
	case "ready":
		fmt.Println("ready")
	case "ready-exit":
		fmt.Println("ready")
		return
	case "fail":
		fmt.Fprintln(os.Stderr, "probe: failing on purpose")
		os.Exit(3)
	case "garbage":
		fmt.Println("hello")
	case "silent":
	default:
		fmt.Fprintf(os.Stderr, "probe: unknown mode %q\n", mode)
		os.Exit(2)
	}
	<-term
}

// outcome describes a call's result: "ok" or the errno's name.
func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return unix.ErrnoName(errno)
	}
	return err.Error()
}

func raw(nr uintptr, args ...uintptr) string {
	var a [6]uintptr
	copy(a[:], args)
	_, _, e := unix.RawSyscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5])
	if e != 0 {
		return unix.ErrnoName(e)
	}
	return "ok"
}

func spawn(flags uintptr) string {
	cmd := exec.Command("/usr/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags}
	return outcome(cmd.Run())
}

func openWrite(path string) string {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err == nil {
		f.Close()
	}
	return outcome(err)
}

// mountFlags lists the ro, nosuid, nodev and noexec flags of path's mount.
func mountFlags(path string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return outcome(err)
	}
	var out []string
	for _, f := range []struct {
		bit  int64
		name string
	}{{unix.ST_RDONLY, "ro"}, {unix.ST_NOSUID, "nosuid"}, {unix.ST_NODEV, "nodev"}, {unix.ST_NOEXEC, "noexec"}} {
		if int64(st.Flags)&f.bit != 0 {
			out = append(out, f.name)
		}
	}
	return strings.Join(out, ",")
}

func statusLines() map[string]string {
	out := map[string]string{}
	data, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

func rlimit(res int) string {
	var r unix.Rlimit
	if err := unix.Getrlimit(res, &r); err != nil {
		return outcome(err)
	}
	return fmt.Sprintf("%d/%d", r.Cur, r.Max)
}

func probes() map[string]string {
	r := map[string]string{}
	r["pid"] = fmt.Sprint(os.Getpid())
	r["env"] = strings.Join(os.Environ(), " ")
	r["hostname"], _ = os.Hostname()

	_ = os.Mkdir("/tmp/m", 0o755)
	r["mount"] = outcome(unix.Mount("tmpfs", "/tmp/m", "tmpfs", 0, ""))
	r["unshare_user"] = outcome(unix.Unshare(unix.CLONE_NEWUSER))
	r["unshare_ns"] = outcome(unix.Unshare(unix.CLONE_NEWNS))
	r["setns"] = outcome(unix.Setns(-1, 0))
	r["clone_newuser"] = spawn(unix.CLONE_NEWUSER)
	r["clone_newns"] = spawn(unix.CLONE_NEWNS)
	r["clone_plain"] = spawn(0)
	r["clone3"] = raw(unix.SYS_CLONE3, 0, 0)
	_, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
	r["socket_raw"] = outcome(err)
	r["mknod_block"] = outcome(unix.Mknod("/tmp/blk", unix.S_IFBLK|0o600, int(unix.Mkdev(7, 0))))
	r["dev_mem"] = outcome(unix.Mknod("/tmp/mem", unix.S_IFCHR|0o600, int(unix.Mkdev(1, 1))))
	if r["dev_mem"] == "ok" {
		_, err := os.ReadFile("/tmp/mem")
		r["dev_mem"] += " " + outcome(err)
	}
	r["reboot"] = outcome(unix.Reboot(unix.LINUX_REBOOT_CMD_CAD_OFF))
	r["clock_settime"] = outcome(unix.ClockSettime(unix.CLOCK_MONOTONIC, &unix.Timespec{Sec: 1}))
	r["bpf"] = raw(unix.SYS_BPF, unix.BPF_MAP_CREATE, 0, 0)
	r["perf_event_open"] = raw(unix.SYS_PERF_EVENT_OPEN, 0, 0, ^uintptr(0), ^uintptr(0), 0)
	_, err = unix.KeyctlGetKeyringID(unix.KEY_SPEC_SESSION_KEYRING, false)
	r["keyctl"] = outcome(err)
	r["io_uring_setup"] = raw(unix.SYS_IO_URING_SETUP, 1, 0)
	r["userfaultfd"] = raw(unix.SYS_USERFAULTFD, 0)
	r["open_by_handle_at"] = raw(unix.SYS_OPEN_BY_HANDLE_AT, ^uintptr(0), 0, 0)
	r["personality_read_implies_exec"] = raw(unix.SYS_PERSONALITY, 0x0400000)
	r["personality_query"] = raw(unix.SYS_PERSONALITY, 0xffffffff)
	c := byte('x')
	r["tiocsti"] = raw(unix.SYS_IOCTL, 0, unix.TIOCSTI, uintptr(unsafe.Pointer(&c)))
	r["sethostname"] = outcome(unix.Sethostname([]byte(r["hostname"])))

	r["write_sysrq_trigger"] = openWrite("/proc/sysrq-trigger")
	r["write_proc_sys"] = openWrite("/proc/sys/kernel/hostname")
	var st unix.Statfs_t
	if err := unix.Statfs("/sys", &st); err == nil {
		r["sys_readonly"] = fmt.Sprint(int64(st.Flags)&unix.ST_RDONLY != 0)
	}
	r["flags_init_binary"] = mountFlags("/.agentjail/agentjail")
	r["flags_control_dir"] = mountFlags("/.agentjail/run")
	r["flags_usr"] = mountFlags("/usr")
	r["write_usr"] = openWrite("/usr/probe-file")
	r["write_tmp"] = openWrite("/tmp/probe-file")
	r["write_ro_mount"] = openWrite("/data-ro/probe-file")
	r["write_rw_mount"] = openWrite("/data-rw/probe-file")

	st2 := statusLines()
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"} {
		r[k] = st2[k]
	}
	r["rlimit_nofile"] = rlimit(unix.RLIMIT_NOFILE)
	r["rlimit_core"] = rlimit(unix.RLIMIT_CORE)
	r["rlimit_as"] = rlimit(unix.RLIMIT_AS)
	if b, err := os.ReadFile("/proc/self/oom_score_adj"); err == nil {
		r["oom_score_adj"] = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/self/uid_map"); err == nil {
		r["uid_map"] = strings.Join(strings.Fields(string(b)), " ")
	}

	b, err := os.ReadFile("/etc/secret")
	r["read_blocked_file"] = fmt.Sprintf("%s %q", outcome(err), b)
	ents, err := os.ReadDir("/secretdir")
	r["list_blocked_dir"] = fmt.Sprintf("%s %d", outcome(err), len(ents))
	for _, f := range []string{"/proc/timer_list", "/proc/keys"} {
		b, err = os.ReadFile(f)
		r["read"+strings.ReplaceAll(f, "/", "_")] = fmt.Sprintf("%s %d", outcome(err), len(b))
	}
	b, err = os.ReadFile("/data-ro/hello")
	r["read_ro_mount"] = fmt.Sprintf("%s %q", outcome(err), b)
	var devs []string
	ents, _ = os.ReadDir("/dev")
	for _, e := range ents {
		devs = append(devs, e.Name())
	}
	r["dev"] = strings.Join(devs, " ")
	return r
}
