// Package cgroups reads what the runtime enforces on a jail's cgroup. runc
// creates and limits the cgroup from an absolute cgroupsPath such as
// "/agentjail-<id>"; this package finds that path in whichever hierarchy
// holds each controller (cgroup v1, the unified v2 hierarchy, or both on a
// "hybrid" host), reads usage, limits and OOM kills, returns the cgroup id
// that keys kernel-side observation, kills what is left in a cgroup whose
// jail is being destroyed, and removes the directories when a jail is
// gone. It never writes limits: runc owns them.
package cgroups

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/pseudofs"
)

// Unlimited is the value of a limit that is not set.
const Unlimited = math.MaxUint64

// v1Unlimited is the smallest v1 memory limit that means "no limit" (the v1
// controller reports an unset limit as a page-rounded huge number).
const v1Unlimited = 1 << 62

// hierarchy is one mounted cgroup hierarchy.
type hierarchy struct {
	root        string          // mount point
	unified     bool            // cgroup2
	controllers map[string]bool // v1: bound controllers; v2: available ones
}

// layout returns the cgroup hierarchies of the host, read once.
var layout = sync.OnceValues(readLayout)

func readLayout() ([]hierarchy, error) {
	mounts, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) {
		return m.Root != "/" || (m.FSType != "cgroup" && m.FSType != "cgroup2"), false
	})
	if err != nil {
		return nil, fmt.Errorf("cgroups: read mount table: %w", err)
	}
	var out []hierarchy
	seen := map[string]bool{}
	for _, m := range mounts {
		fstype, superOpts := m.FSType, m.VFSOptions
		h := hierarchy{root: m.Mountpoint, controllers: map[string]bool{}}
		switch fstype {
		case "cgroup2":
			h.unified = true
			if b, err := os.ReadFile(filepath.Join(h.root, "cgroup.controllers")); err == nil {
				for _, c := range strings.Fields(string(b)) {
					h.controllers[c] = true
				}
			}
		case "cgroup":
			for _, o := range strings.Split(superOpts, ",") {
				if o != "rw" && o != "ro" && !strings.Contains(o, "=") || strings.HasPrefix(o, "name=") {
					h.controllers[o] = true
				}
			}
		}
		key := fstype + " " + superOpts
		if seen[key] {
			continue // another mount of the same hierarchy
		}
		seen[key] = true
		out = append(out, h)
	}
	return out, nil
}

// Mode reports the host's cgroup layout: "v2" (only the unified hierarchy),
// "hybrid" (v1 controllers plus a unified hierarchy) or "v1".
func Mode() string {
	hs, _ := layout()
	var v1, v2 bool
	for _, h := range hs {
		if h.unified {
			v2 = true
		} else {
			v1 = true
		}
	}
	switch {
	case v2 && !v1:
		return "v2"
	case v2:
		return "hybrid"
	default:
		return "v1"
	}
}

// dirOf returns the directory of path in the hierarchy that holds ctrl, and
// whether that hierarchy is the unified one ("" when no hierarchy has it).
// A controller bound to a v1 hierarchy is read there.
func dirOf(ctrl, path string) (string, bool) {
	hs, _ := layout()
	for _, h := range hs {
		if !h.unified && h.controllers[ctrl] {
			return filepath.Join(h.root, path), false
		}
	}
	for _, h := range hs {
		if h.unified && h.controllers[ctrl] {
			return filepath.Join(h.root, path), true
		}
	}
	return "", false
}

// UnifiedDir returns the directory of path in the unified hierarchy ("" if
// the host has none): where cgroup-attached eBPF programs go.
func UnifiedDir(path string) string {
	hs, _ := layout()
	for _, h := range hs {
		if h.unified {
			return filepath.Join(h.root, path)
		}
	}
	return ""
}

// checkPath validates a cgroup path: absolute, clean, not the root.
func checkPath(path string) error {
	if !strings.HasPrefix(path, "/") || path == "/" || filepath.Clean(path) != path {
		return errdefs.Invalidf("cgroup path %q: must be an absolute, clean path below the root", path)
	}
	return nil
}

// Stats are the usage and limits of a cgroup. A limit that is not set is
// Unlimited.
type Stats struct {
	MemoryBytes      uint64 // memory in use, page cache included
	MemoryLimitBytes uint64
	CPUTimeNs        uint64 // CPU time consumed by the cgroup's processes
	Pids             uint64 // processes and threads
	PidsLimit        uint64
	OOMKills         uint64 // processes killed by the OOM killer in this cgroup
}

// Read reads the stats of cgroup path (e.g. "/agentjail-<id>") from
// whichever hierarchy holds each controller: memory (v1 memory.usage_in_bytes,
// memory.limit_in_bytes, memory.oom_control's oom_kill; v2 memory.current,
// memory.max, memory.events' oom_kill), CPU (v1 cpuacct.usage; v2 cpu.stat's
// usage_usec) and pids (pids.current, pids.max). A controller whose
// directory is missing leaves its fields zero; errdefs.ErrNotFound if the
// cgroup exists in none of them.
func Read(path string) (Stats, error) {
	if err := checkPath(path); err != nil {
		return Stats{}, err
	}
	var s Stats
	found := false
	if dir, v2 := dirOf("memory", path); dir != "" && exists(dir) {
		found = true
		var err error
		if v2 {
			err = firstErr(
				readUint(dir, "memory.current", &s.MemoryBytes),
				readLimit(dir, "memory.max", &s.MemoryLimitBytes),
				readKey(dir, "memory.events", "oom_kill", &s.OOMKills))
		} else {
			err = firstErr(
				readUint(dir, "memory.usage_in_bytes", &s.MemoryBytes),
				readLimit(dir, "memory.limit_in_bytes", &s.MemoryLimitBytes),
				readKey(dir, "memory.oom_control", "oom_kill", &s.OOMKills))
			if s.MemoryLimitBytes >= v1Unlimited {
				s.MemoryLimitBytes = Unlimited
			}
		}
		if err != nil {
			return Stats{}, err
		}
	}
	if dir, _ := dirOf("cpuacct", path); dir != "" && exists(dir) {
		found = true
		if err := readUint(dir, "cpuacct.usage", &s.CPUTimeNs); err != nil {
			return Stats{}, err
		}
	} else if dir := UnifiedDir(path); dir != "" && exists(dir) && Mode() == "v2" {
		// cpu.stat is a core file of every v2 cgroup.
		found = true
		var usec uint64
		if err := readKey(dir, "cpu.stat", "usage_usec", &usec); err != nil {
			return Stats{}, err
		}
		s.CPUTimeNs = usec * 1000
	}
	if dir, _ := dirOf("pids", path); dir != "" && exists(dir) {
		found = true
		if err := firstErr(
			readUint(dir, "pids.current", &s.Pids),
			readLimit(dir, "pids.max", &s.PidsLimit)); err != nil {
			return Stats{}, err
		}
	}
	if !found {
		return Stats{}, errdefs.NotFoundf("cgroup %s does not exist", path)
	}
	return s, nil
}

func exists(dir string) bool {
	st, err := os.Stat(dir)
	return err == nil && st.IsDir()
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// readUint reads a file holding one number.
func readUint(dir, file string, v *uint64) error {
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return fmt.Errorf("cgroup: %s/%s: %w", dir, file, err)
	}
	*v = n
	return nil
}

// readLimit reads a file holding a number or "max" (Unlimited).
func readLimit(dir, file string, v *uint64) error {
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	if strings.TrimSpace(string(b)) == "max" {
		*v = Unlimited
		return nil
	}
	return readUint(dir, file, v)
}

// readKey reads the value of key from a flat-keyed file ("key value" lines);
// a missing key is zero. The files it reads (memory.events,
// memory.oom_control, cpu.stat) are a few short lines, read with bare
// calls: this runs for every exec.
func readKey(dir, file, key string, v *uint64) error {
	var buf [4096]byte
	b, err := pseudofs.Read(filepath.Join(dir, file), buf[:])
	if err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	return parseKey(b, filepath.Join(dir, file), key, v)
}

// parseKey finds key's value in b, the "key value" lines of file (0 when
// key is absent).
func parseKey(b []byte, file, key string, v *uint64) error {
	for _, line := range strings.Split(string(b), "\n") {
		k, val, ok := strings.Cut(line, " ")
		if ok && k == key {
			n, err := strconv.ParseUint(strings.TrimSpace(val), 10, 64)
			if err != nil {
				return fmt.Errorf("cgroup: %s: %s: %w", file, key, err)
			}
			*v = n
			return nil
		}
	}
	*v = 0
	return nil
}

// ID returns the cgroup id of path: the inode number of its directory in the
// unified hierarchy, which is what bpf_get_current_cgroup_id reports for its
// processes. errdefs.ErrNotFound if that directory does not exist,
// errdefs.ErrNotImplemented on a host without a unified hierarchy.
func ID(path string) (uint64, error) {
	if err := checkPath(path); err != nil {
		return 0, err
	}
	dir := UnifiedDir(path)
	if dir == "" {
		return 0, errdefs.NotImplementedf("cgroup id of %s: the host has no cgroup v2 hierarchy", path)
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return 0, errdefs.NotFoundf("cgroup %s does not exist in %s", path, filepath.Dir(dir))
		}
		return 0, fmt.Errorf("cgroup id of %s: %w", path, err)
	}
	return st.Ino, nil
}

// Exists reports whether cgroup path exists, looked up in the hierarchy
// that holds the pids controller, where every jail's cgroup has a
// directory: one stat.
func Exists(path string) bool {
	if checkPath(path) != nil {
		return false
	}
	dir, _ := dirOf("pids", path)
	return dir != "" && exists(dir)
}

// Dirs lists the existing directories of path across all hierarchies (used
// to check for leaks).
func Dirs(path string) []string {
	if checkPath(path) != nil {
		return nil
	}
	hs, _ := layout()
	var out []string
	for _, h := range hs {
		if d := filepath.Join(h.root, path); exists(d) {
			out = append(out, d)
		}
	}
	return out
}

// Remove removes the directories of path, and any child cgroups, in every
// hierarchy, deepest first. Idempotent. errdefs.ErrConflict if a cgroup
// still has processes.
func Remove(path string) error {
	if err := checkPath(path); err != nil {
		return err
	}
	CloseFiles(path)
	for _, top := range Dirs(path) {
		var dirs []string
		err := filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			if d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("remove cgroup %s: %w", path, err)
		}
		sort.Slice(dirs, func(i, j int) bool { return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/") })
		for _, d := range dirs {
			err := unix.Rmdir(d)
			switch {
			case err == nil, errors.Is(err, unix.ENOENT):
			case errors.Is(err, unix.EBUSY):
				if procs, _ := os.ReadFile(filepath.Join(d, "cgroup.procs")); len(strings.TrimSpace(string(procs))) > 0 {
					return errdefs.Conflictf("remove cgroup %s: %s still has processes", path, d)
				}
				return errdefs.Wrap(errdefs.ErrConflict, err, "remove cgroup %s: %s is busy", path, d)
			default:
				return fmt.Errorf("remove cgroup %s: %w", path, err)
			}
		}
	}
	return nil
}

// SwapAccounting reports whether the memory controller accounts swap, so
// that a memory+swap limit can be enforced (memory.memsw.* on v1,
// memory.swap.max on v2).
func SwapAccounting() bool {
	dir, v2 := dirOf("memory", "/")
	if dir == "" {
		return false
	}
	if !v2 {
		return exists(dir) && fileExists(filepath.Join(dir, "memory.memsw.usage_in_bytes"))
	}
	// The v2 root has no memory.swap.max; look at its children.
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range ents {
		if e.IsDir() && fileExists(filepath.Join(dir, e.Name(), "memory.swap.max")) {
			return true
		}
	}
	return false
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// Kill SIGKILLs every process in path's directory of the unified
// hierarchy, again and again, until it holds none or ctx ends. A cgroup
// that does not exist holds none.
func Kill(ctx context.Context, path string) error {
	for {
		pids, err := Pids(path)
		if err != nil || len(pids) == 0 {
			return err
		}
		for _, pid := range pids {
			if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("kill %d in cgroup %s: %w", pid, path, err)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cgroup %s still has processes %v: %w", path, pids, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Pids returns the host pids of the processes in path's directory of the
// unified hierarchy (nil when it has none or does not exist).
func Pids(path string) ([]int, error) {
	if err := checkPath(path); err != nil {
		return nil, err
	}
	dir := UnifiedDir(path)
	if dir == "" {
		return nil, errdefs.NotFoundf("the host has no unified cgroup hierarchy")
	}
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range strings.Fields(string(data)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out, nil
}
