package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// inventory is what the host holds on behalf of jails: the resources a
// destroyed or failed jail must not leave behind. Each list is sorted.
type inventory struct {
	// Mounts are mount points under the data dir.
	Mounts []string
	// Loops are loop devices backed by files under the data dir
	// ("/dev/loopN <- file").
	Loops []string
	// Cgroups are the jail cgroups: /sys/fs/cgroup/*/agentjail-* (and the
	// unified hierarchy's).
	Cgroups []string
	// Netns are the files of DATA_DIR/run/netns.
	Netns []string
	// Procs are processes whose cgroup is a jail's ("pid comm cgroup").
	Procs []string
	// Files are the entries of the data dir's per-jail and per-snapshot
	// directories (jails/, pool/disks/, run/runc/, snapshots/,
	// pool/snapshots/, run/snapmnt/).
	Files []string
	// Helpers are the processes working on the data dir (runc, CRIU and
	// the like, which name a path in it), other than the daemon.
	Helpers []string
	// TempDirs are agentjail entries of the temp directories.
	TempDirs []string
	// Links are the host interfaces of the daemon's jail network (named
	// with its --net-prefix): its bridge and the jails' veths.
	Links []string
	// Routes are the host's routes into the daemon's jail subnet.
	Routes []string
	// Nft are the daemon's nftables table ("table NAME") and its chains
	// ("chain NAME"), per-jail ones among them.
	Nft []string
}

// cgroupRoot is where the cgroup hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// takeInventory reads the host's resources related to the data dir dir.
func takeInventory(dir string) inventory {
	var inv inventory
	inv.Mounts = mountsUnder(dir)
	inv.Loops = loopsUnder(dir)
	inv.Cgroups = jailCgroups()
	inv.Netns = dirNames(filepath.Join(dir, "run", "netns"))
	inv.Procs = jailProcs()
	for _, sub := range []string{"jails", "pool/disks", "run/runc", "snapshots", "pool/snapshots", "run/snapmnt"} {
		for _, n := range dirNames(filepath.Join(dir, sub)) {
			inv.Files = append(inv.Files, filepath.Join(sub, n))
		}
	}
	for _, tmp := range []string{os.TempDir(), "/var/tmp", "/run"} {
		for _, n := range dirNames(tmp) {
			// The tests' own data dirs and logs are named agentjail-it-*.
			if strings.Contains(n, "agentjail") && !strings.HasPrefix(n, "agentjail-it-") {
				inv.TempDirs = append(inv.TempDirs, filepath.Join(tmp, n))
			}
		}
	}
	inv.Helpers = helperProcs(dir)
	inv.Links, inv.Routes, inv.Nft = jailNetwork(dir)
	for _, l := range [][]string{inv.Mounts, inv.Loops, inv.Cgroups, inv.Netns, inv.Procs, inv.Files, inv.Helpers, inv.TempDirs, inv.Links, inv.Routes, inv.Nft} {
		sort.Strings(l)
	}
	return inv
}

// added returns what inv holds that base does not, as "kind: item" lines.
func (inv inventory) added(base inventory) []string {
	var out []string
	add := func(kind string, now, before []string) {
		for _, x := range now {
			if !slices.Contains(before, x) {
				out = append(out, kind+": "+x)
			}
		}
	}
	add("mount", inv.Mounts, base.Mounts)
	add("loop", inv.Loops, base.Loops)
	add("cgroup", inv.Cgroups, base.Cgroups)
	add("netns", inv.Netns, base.Netns)
	add("process", inv.Procs, base.Procs)
	add("file", inv.Files, base.Files)
	add("helper", inv.Helpers, base.Helpers)
	add("temp", inv.TempDirs, base.TempDirs)
	add("interface", inv.Links, base.Links)
	add("route", inv.Routes, base.Routes)
	add("nft", inv.Nft, base.Nft)
	return out
}

// waitNoLeak waits until the host holds nothing more of d than base
// (cleanup may finish asynchronously) and returns what is still extra at
// the deadline. Cgroups and processes count when they belong to d's jails;
// ignore drops items that come and go on their own (e.g. warm disks).
func waitNoLeak(d *daemon, base inventory, timeout time.Duration, ignore func(string) bool) []string {
	var extra []string
	_ = waitFor(timeout, func() error {
		extra = extra[:0]
		for _, x := range d.relevant(takeInventory(d.dir).added(base)) {
			if ignore == nil || !ignore(x) {
				extra = append(extra, x)
			}
		}
		if len(extra) > 0 {
			return fmt.Errorf("%d extra", len(extra))
		}
		return nil
	})
	return extra
}

// relevant keeps the inventory lines that concern d: everything under its
// data dir, and the cgroups and processes of its own jails (other daemons
// on the host name theirs the same way).
func (d *daemon) relevant(items []string) []string {
	var out []string
	for _, x := range items {
		global := strings.HasPrefix(x, "cgroup: ") || strings.HasPrefix(x, "process: ")
		if !global || d.owns(x) {
			out = append(out, x)
		}
	}
	return out
}

// mountsUnder lists the mount points at or under dir.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return []string{"(mountinfo: " + err.Error() + ")"}
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeOctal(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out
}

// helperProcs lists the live processes whose command line names a path
// under dir ("pid argv"): the runtime and CRIU at work for a daemon on dir
// (whose own command line names dir itself, not a path below it).
func helperProcs(dir string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil || procState(e.Name()) == "Z" {
			continue
		}
		raw, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(raw, []byte(dir+"/")) {
			continue
		}
		argv := strings.ReplaceAll(strings.TrimRight(string(raw), "\x00"), "\x00", " ")
		if len(argv) > 200 {
			argv = argv[:200]
		}
		out = append(out, e.Name()+" "+argv)
	}
	return out
}

// unescapeOctal undoes mountinfo's \NNN escapes.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// loopsUnder lists loop devices whose backing file is under dir.
func loopsUnder(dir string) []string {
	devs, _ := filepath.Glob("/sys/block/loop*")
	var out []string
	for _, d := range devs {
		b, err := os.ReadFile(filepath.Join(d, "loop", "backing_file"))
		if err != nil {
			continue
		}
		file := strings.TrimSpace(string(b))
		if strings.HasPrefix(file, dir+"/") {
			out = append(out, "/dev/"+filepath.Base(d)+" <- "+file)
		}
	}
	return out
}

// jailCgroups lists the per-jail cgroup directories of every hierarchy.
func jailCgroups() []string {
	var out []string
	for _, pat := range []string{filepath.Join(cgroupRoot, "*", jailCgroupPrefix+"*"), filepath.Join(cgroupRoot, jailCgroupPrefix+"*")} {
		m, _ := filepath.Glob(pat)
		for _, d := range m {
			if st, err := os.Stat(d); err == nil && st.IsDir() && jailCgroupName.MatchString(filepath.Base(d)) {
				out = append(out, d)
			}
		}
	}
	return out
}

// jailCgroupPrefix starts the name of every jail's cgroup, a top-level one
// in each hierarchy.
const jailCgroupPrefix = "agentjail-"

// jailCgroupName matches the name of a jail's cgroup (its id is 12 hex
// digits), and not the cgroups other tests make with the same prefix.
var jailCgroupName = regexp.MustCompile(`^` + jailCgroupPrefix + `[0-9a-f]{12}$`)

// jailCgroupOf is the end of jail id's cgroup path in any hierarchy.
func jailCgroupOf(id string) string { return "/" + jailCgroupPrefix + id }

// jailProcs lists the live processes whose cgroup (in any hierarchy) is
// under an agentjail cgroup. Zombies are left out: they hold nothing but a
// pid, and a jail's init, reparented to the host's PID 1, stays one until
// that reaps it.
func jailProcs() []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cg := procJailCgroup(pid)
		if cg == "" || procState(strconv.Itoa(pid)) == "Z" {
			continue
		}
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		out = append(out, fmt.Sprintf("%d %s %s", pid, strings.TrimSpace(string(comm)), cg))
	}
	return out
}

// procJailCgroup returns the agentjail cgroup path of pid ("" when it is
// in none).
func procJailCgroup(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && strings.HasPrefix(parts[2], "/"+jailCgroupPrefix) {
			return parts[2]
		}
	}
	return ""
}

// jailNetwork lists what the host holds of the jail network of the daemon
// whose data dir is dir: its interfaces, the routes into its subnet, and
// its nftables table with the table's chains. The prefix and subnet are
// the ones the daemon remembers in DATA_DIR/network.json; a daemon that
// never started its network has none.
func jailNetwork(dir string) (links, routes, nft []string) {
	var settings struct {
		Prefix string `json:"prefix"`
		Subnet string `json:"subnet"`
	}
	data, err := os.ReadFile(filepath.Join(dir, "network.json"))
	if err != nil || json.Unmarshal(data, &settings) != nil || settings.Prefix == "" {
		return nil, nil, nil
	}
	all, err := netlink.LinkList()
	if err != nil {
		return []string{"(links: " + err.Error() + ")"}, nil, nil
	}
	for _, l := range all {
		if n := l.Attrs().Name; strings.HasPrefix(n, settings.Prefix+"v") || n == settings.Prefix+"0" {
			links = append(links, n)
		}
	}
	if subnet, err := netip.ParsePrefix(settings.Subnet); err == nil {
		rs, err := netlink.RouteList(nil, netlink.FAMILY_V4)
		if err != nil {
			routes = append(routes, "(routes: "+err.Error()+")")
		}
		for _, r := range rs {
			if r.Dst == nil {
				continue
			}
			if a, ok := netip.AddrFromSlice(r.Dst.IP.To4()); ok && subnet.Contains(a) {
				dev := ""
				if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
					dev = l.Attrs().Name
				}
				routes = append(routes, r.Dst.String()+" dev "+dev)
			}
		}
	}
	table := "agentjail_" + settings.Prefix
	if settings.Prefix == "aj" {
		table = "agentjail"
	}
	c, err := nftables.New()
	if err != nil {
		return links, routes, []string{"(nftables: " + err.Error() + ")"}
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return links, routes, []string{"(nftables: " + err.Error() + ")"}
	}
	if tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet); err == nil {
		for _, t := range tables {
			if t.Name == table {
				nft = append(nft, "table "+t.Name)
			}
		}
	}
	for _, ch := range chains {
		if ch.Table.Name == table {
			nft = append(nft, "chain "+ch.Name)
		}
	}
	return links, routes, nft
}

// dirNames lists a directory's entry names (none when it does not exist).
func dirNames(dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(ents))
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// isNsfs reports whether path is a mounted namespace file.
func isNsfs(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return st.Type == unix.NSFS_MAGIC
}

// pidsInCgroupOf returns the pids in jail id's cgroup of controller (e.g.
// "pids", "memory"), read from the host's hierarchy.
func pidsInCgroupOf(controller, id string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(cgroupRoot, controller, jailCgroupOf(id), "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out, nil
}

// idWatcher records every name ever created in a daemon's jails/ directory:
// the ids of its jails, failed creates included. Host-wide resources
// (cgroups, processes) are attributed to a daemon by these ids, since other
// daemons on the host name theirs the same way.
type idWatcher struct {
	f    *os.File
	mu   sync.Mutex
	ids  map[string]bool
	done chan struct{}
}

// watchIDs starts recording the names created in dir.
func watchIDs(dir string) (*idWatcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("inotify %s: %w", dir, err)
	}
	w := &idWatcher{f: os.NewFile(uintptr(fd), "inotify"), ids: map[string]bool{}, done: make(chan struct{})}
	for _, n := range dirNames(dir) {
		w.ids[n] = true
	}
	go w.run()
	return w, nil
}

func (w *idWatcher) run() {
	defer close(w.done)
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			if len(name) > 0 {
				w.mu.Lock()
				w.ids[string(name)] = true
				w.mu.Unlock()
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
	}
}

// close stops the watcher.
func (w *idWatcher) close() {
	w.f.Close()
	<-w.done
}

// owns reports whether item (a cgroup path or a process line) belongs to
// one of the recorded ids.
func (w *idWatcher) owns(item string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id := range w.ids {
		if strings.Contains(item, jailCgroupOf(id)) {
			return true
		}
	}
	return false
}
