package conformance

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/internal/model"
)

// exposed maps a probe attempt to the Capabilities.Exposes value that
// lets it through. A jail on a kernel of its own (ExposesGuestKernel) may
// do to that kernel what its root could do to a machine's; the attempts
// aimed at the host and other jails (their processes and files) must
// still fail.
var exposed = map[string]string{"see host processes": model.ExposesHostProcesses}

func init() {
	for _, name := range []string{
		"mount tmpfs", "mount proc", "mount cgroup2", "remount /usr read-write", "umount /usr", "umount /proc",
		"pivot_root", "fsopen", "open_tree", "chroot",
		"unshare user namespace", "unshare mount namespace", "unshare net namespace", "unshare user+mount namespaces",
		"clone into a user namespace", "kernel keyrings (add_key, keyctl)", "write /proc/sys", "write /proc/sysrq-trigger",
		"write /sys", "load a kernel module", "bpf()", "raw sockets", "mknod a host disk", "move out of the jail cgroup",
		"setns", "reboot", "set the clock", "open_by_handle_at", "iopl", "ioperm", "kexec_load", "swapon",
	} {
		exposed[name] = model.ExposesGuestKernel
	}
}

// escape runs EscapeProbe in a jail, as its default user and as its root
// when the level grants one, beside another jail: every attempt on the
// host and on the other jail must be stopped, and no host file may leak.
func (h *harness) escape(t *testing.T) {
	varCanary := NewCanary(t, "/var/tmp")
	rootCanary := NewCanary(t, "/root")
	other := h.jail(t, nil)
	otherWS := other.Config.Isolation.Filesystem.WorkspaceRoot
	otherSecret := "other-jail-secret-" + randHex(8)
	if _, err := h.Client.WriteFile(callCtx(t), other.ID, otherWS+"/secret.txt", strings.NewReader(otherSecret), client.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	marker := strconv.Itoa(6000 + int(nameSeq.Add(1)%1000))
	h.sh(t, other.ID, "setsid -f sleep "+marker+" >/dev/null 2>&1 </dev/null")
	otherPids := []int{other.Pid}
	// setsid -f returns before its child has executed sleep: look until
	// it has, for a while.
	p := hostPidOf(t, "sleep\x00"+marker+"\x00")
	for deadline := time.Now().Add(10 * time.Second); p == 0 && has(h.caps.Observers, model.ObserverKernel) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		p = hostPidOf(t, "sleep\x00"+marker+"\x00")
	}
	switch {
	case p > 0:
		otherPids = append(otherPids, p)
	case has(h.caps.Observers, model.ObserverKernel):
		// A level the host kernel observes runs its commands as host
		// processes.
		t.Fatalf("the other jail's sleep %s is not among the host's processes", marker)
	default:
		// A user-space kernel or a virtual machine: the jail's commands
		// are not host processes; its host pid stands for them all.
		t.Logf("the other jail's processes are not host processes: the probe targets its host pid %d", other.Pid)
	}
	j := h.jail(t, nil)

	var root unix.Stat_t
	if err := unix.Stat("/", &root); err != nil {
		t.Fatal(err)
	}
	hostFiles := []map[string]string{
		{"path": varCanary.Path, "sha256": sha256Hex([]byte(varCanary.Content))},
		{"path": rootCanary.Path, "sha256": sha256Hex([]byte(rootCanary.Content))},
		{"path": otherWS + "/secret.txt", "sha256": sha256Hex([]byte(otherSecret))},
	}
	for p, content := range h.DaemonFiles {
		hostFiles = append(hostFiles, map[string]string{"path": p, "sha256": sha256Hex([]byte(content))})
	}
	if b, err := os.ReadFile("/etc/shadow"); err == nil {
		hostFiles = append(hostFiles, map[string]string{"path": "/etc/shadow", "sha256": sha256Hex(b)})
	}
	args, err := json.Marshal(map[string]any{
		"host_pids":  []int{os.Getpid(), h.DaemonPid},
		"other_pids": otherPids,
		"host_files": hostFiles,
		"disk":       []uint32{unix.Major(uint64(root.Dev)), unix.Minor(uint64(root.Dev))},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, user := range []string{"", "root"} {
		label := "the default user"
		if user != "" {
			label = user
		}
		t.Run(label, func(t *testing.T) {
			res, err := h.Client.Exec(callCtx(t), j.ID, client.ExecRequest{
				Cmd: []string{"python3", "-", string(args)}, Stdin: EscapeProbe, User: user, TimeoutMs: 120_000,
			})
			if err != nil && user != "" {
				h.refused(t, "exec as root", err)
				return
			}
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("the probe failed: %+v %v", res, err)
			}
			var results []struct {
				Name    string `json:"name"`
				Escaped bool   `json:"escaped"`
				Detail  string `json:"detail"`
			}
			if err := json.Unmarshal([]byte(res.Stdout), &results); err != nil {
				t.Fatalf("the probe's output: %v\n%s\n%s", err, res.Stdout, res.Stderr)
			}
			if len(results) < 27 {
				t.Fatalf("the probe reported %d attempts, want all of them: %s", len(results), res.Stdout)
			}
			for _, r := range results {
				switch {
				case r.Escaped && has(h.caps.Exposes, exposed[r.Name]):
					t.Logf("%s (as %s): exposed, as the level declares: %s", r.Name, label, r.Detail)
				case r.Escaped:
					t.Errorf("%s (as %s): NOT STOPPED: %s", r.Name, label, r.Detail)
				default:
					t.Logf("%s (as %s): stopped: %s", r.Name, label, r.Detail)
				}
			}
			for _, c := range []*Canary{varCanary, rootCanary} {
				c.Check(t, "escape probe", res.Stdout, res.Stderr)
			}
			if strings.Contains(res.Stdout+res.Stderr, otherSecret) {
				t.Errorf("the other jail's file leaked into the probe's output")
			}
		})
	}
	if got := h.sh(t, other.ID, "cat "+otherWS+"/secret.txt"); got != otherSecret {
		t.Errorf("the other jail's file was changed: %q", got)
	}
}

// hostPidOf returns the host pid of the process whose command line is
// cmdline (NUL-separated), 0 when none.
func hostPidOf(t *testing.T, cmdline string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Equal(b, []byte(cmdline)) {
			return pid
		}
	}
	return 0
}
