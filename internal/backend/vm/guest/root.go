package guest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/backend/vm/vmproto"
	"github.com/agentjail/agentjail/internal/initproto"
)

// Where the guest mounts the parts of the jail's root before it switches
// into it (they stay mounted below the new root, out of the jail's view).
const (
	lowerDir = "/mnt/lower"
	diskDir  = "/mnt/disk"
	newRoot  = "/mnt/root"
	// jailCgroupDir is the cgroup of everything init starts.
	jailCgroupDir = "/sys/fs/cgroup/jail"
)

// diskBySerial returns the device of the virtio disk with serial s.
func diskBySerial(s string) (string, error) {
	ents, _ := os.ReadDir("/sys/block")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "serial"))
		if err == nil && strings.TrimSpace(string(b)) == s {
			return "/dev/" + e.Name(), nil
		}
	}
	return "", fmt.Errorf("no disk with serial %q", s)
}

func mount(src, dst, typ string, flags uintptr, data string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(src, dst, typ, flags, data); err != nil {
		return fmt.Errorf("mount %s on %s: %w", typ, dst, err)
	}
	return nil
}

// mountRoot mounts the jail's root and switches into it.
func mountRoot(b *vmproto.Boot) error {
	lower, err := diskBySerial(vmproto.DiskLower)
	if err != nil {
		return err
	}
	upper, err := diskBySerial(vmproto.DiskUpper)
	if err != nil {
		return err
	}
	if err := mount(lower, lowerDir, "erofs", unix.MS_RDONLY, ""); err != nil {
		return err
	}
	// The jail's disk from the daemon's storage pool: XFS, every disk a
	// copy of one template (hence nouuid).
	if err := mount(upper, diskDir, "xfs", unix.MS_NOATIME, "nouuid"); err != nil {
		return err
	}
	for _, d := range []string{"upper", "work"} {
		if err := os.MkdirAll(filepath.Join(diskDir, d), 0o755); err != nil {
			return err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work", lowerDir, diskDir, diskDir)
	if err := mount("overlay", newRoot, "overlay", 0, opts); err != nil {
		return err
	}
	if b.Usr {
		usr, err := diskBySerial(vmproto.DiskUsr)
		if err != nil {
			return err
		}
		if err := mount(usr, newRoot+"/usr", "erofs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
			return err
		}
	}
	for _, m := range []struct {
		src, dst, typ string
		flags         uintptr
		data          string
	}{
		{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"cgroup2", "/sys/fs/cgroup", "cgroup2", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, ""},
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620,gid=5"},
		{"tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=755"},
		// Init's control dir: in memory, never in the jail's layer.
		{"tmpfs", "/.agentjail", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=700"},
	} {
		if err := mount(m.src, newRoot+m.dst, m.typ, m.flags, m.data); err != nil {
			return err
		}
	}
	_ = os.Remove(newRoot + "/dev/ptmx")
	if err := os.Symlink("pts/ptmx", newRoot+"/dev/ptmx"); err != nil {
		return fmt.Errorf("/dev/ptmx: %w", err)
	}
	if err := os.MkdirAll(newRoot+initproto.ControlDir, 0o700); err != nil {
		return err
	}
	// switch_root: the new root becomes / for init and everything after.
	if err := unix.Chdir(newRoot); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move the root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	return nil
}

// jailCgroup makes the cgroup of the jail's processes (init included,
// so everything it starts is there, as in a container's cgroup), with
// the jail's limits.
func jailCgroup(pidsLimit int64, l vmproto.Limits) error {
	if err := os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte("+pids +memory +cpu"), 0); err != nil {
		return fmt.Errorf("cgroup controllers: %w", err)
	}
	if err := os.MkdirAll(jailCgroupDir, 0o755); err != nil {
		return err
	}
	set := func(file, value string) error {
		if err := os.WriteFile(filepath.Join(jailCgroupDir, file), []byte(value), 0); err != nil {
			return fmt.Errorf("limit %s %s: %w", file, value, err)
		}
		return nil
	}
	if pidsLimit > 0 {
		if err := set("pids.max", strconv.FormatInt(pidsLimit, 10)); err != nil {
			return err
		}
	}
	if l.MemoryBytes > 0 {
		if err := set("memory.max", strconv.FormatInt(l.MemoryBytes, 10)); err != nil {
			return err
		}
	}
	if l.CPUQuota > 0 && l.CPUPeriod > 0 {
		if err := set("cpu.max", strconv.FormatInt(l.CPUQuota, 10)+" "+strconv.FormatUint(l.CPUPeriod, 10)); err != nil {
			return err
		}
	}
	if err := os.WriteFile(jailCgroupDir+"/cgroup.procs", []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
		return fmt.Errorf("join the jail's cgroup: %w", err)
	}
	return nil
}

// stats reads the guest's usage.
func (st *g) stats() vmproto.Stats {
	var s vmproto.Stats
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		unit := uint64(si.Unit)
		s.MemoryTotalBytes = si.Totalram * unit
		s.MemoryBytes = (si.Totalram - si.Freeram - si.Bufferram) * unit
	}
	s.Pids = readUint(jailCgroupDir + "/pids.current")
	s.PidsLimit = readUint(jailCgroupDir + "/pids.max")
	if ev, err := os.ReadFile(jailCgroupDir + "/memory.events"); err == nil {
		for _, l := range bytes.Split(ev, []byte("\n")) {
			if v, ok := bytes.CutPrefix(l, []byte("oom_kill ")); ok {
				s.OOMKills, _ = strconv.ParseUint(string(v), 10, 64)
			}
		}
	}
	// The writable layer's disk, below the root init switched into: the
	// jail's root shows its usage through the overlay.
	var fs unix.Statfs_t
	if unix.Statfs("/", &fs) == nil {
		s.DiskTotalBytes = fs.Blocks * uint64(fs.Bsize)
		s.DiskUsedBytes = (fs.Blocks - fs.Bfree) * uint64(fs.Bsize)
	}
	return s
}

func readUint(path string) uint64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return v
}
