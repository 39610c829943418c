package container

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	runc "github.com/containerd/go-runc"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/atomicfile"
	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/backend/hostjail"
	"github.com/agentjail/agentjail/internal/backend/oci"
	"github.com/agentjail/agentjail/internal/cgroups"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/lazyre"
	"github.com/agentjail/agentjail/internal/storage"
	"github.com/agentjail/agentjail/internal/timerslack"
)

// Process checkpoints are runc's (`runc checkpoint --leave-running`,
// `runc restore` under a new id), which drive CRIU. Facts of this host
// shape the code below:
//
//   - CRIU's hardware breakpoints never fire in this virtual machine, so
//     every CRIU run gets CRIU_FAULT=130 (CRIU's switch to stop on the
//     parasite's syscalls instead); without it a dump hangs for ever.
//   - The filesystem copy must match the process images: CRIU runs an
//     action script while the jail's processes are frozen, at
//     "network-lock" (right after it froze them, before it dumps them),
//     or at "post-dump" for a jail in the host's network namespace, where
//     CRIU locks no network. The script (hookScript) freezes the jail's
//     XFS disk (which quiesces its log, so the copy mounts clean),
//     reflinks its image and thaws it. The freeze alone takes 30-60 ms
//     here (three RCU grace periods and a log force): CRIU as
//     scripts/build-criu.sh builds it lets the network-lock script leave
//     the copy running beside its dump of the processes' memory
//     (CRIU_SCRIPT_ASYNC) and waits for the copy's status before they run
//     again, so the copy no longer adds to the time the jail is frozen.
//     Freezing the cgroup beforehand (runc pause) does not work: CRIU's
//     parasite then never runs and the dump hangs.
//   - runc skips the network namespace: a restored jail gets the fresh
//     namespace the daemon made for it, passed by path in its bundle.
//     Established TCP connections are dumped (--tcp-established) and
//     restored closed (tcp-close): the new namespace has other addresses.
//   - CRIU checks the size of every open file on restore, so the files of
//     the control dir (init's log) are saved with the images and put in
//     the new jail's control dir.

const (
	// criuMinMajor and criuMinMinor are the oldest CRIU that works on the
	// kernels this project runs on (3.17 fails on >= 6.13).
	criuMinMajor, criuMinMinor = 4, 1
	// criuNoBreakpoints is CRIU's fault-injection code that makes it trace
	// syscalls instead of setting hardware breakpoints.
	criuNoBreakpoints = "CRIU_FAULT=130"
	// restoreTimeout bounds a restore and init's readiness after it.
	restoreTimeout = time.Minute
	// checkpointTimeout bounds one checkpoint.
	checkpointTimeout = 5 * time.Minute
	// ioctlFIFREEZE and ioctlFITHAW are _IOWR('X', 119/120, int).
	ioctlFIFREEZE = 0xc0045877
	ioctlFITHAW   = 0xc0045878
)

// Names inside a checkpoint's directory.
const (
	imagesDir     = "criu"
	workDir       = "criu-work"
	savedControl  = "control"
	checkpointRec = "checkpoint.json"
	dumpConf      = "criu-dump.conf"
	// processesRec names the checkpoint's processes by their pid in the
	// jail (for restore errors, whose pids are those).
	processesRec = "processes.json"
	// restoreWorkDir, in a jail's directory, is CRIU's working directory
	// while the jail is restored.
	restoreWorkDir = "criu-restore"
)

// hookScript is the CRIU action script of a process checkpoint. It acts at
// one action (AGENTJAIL_COPY_AT), while the jail's processes are frozen; a
// non-zero exit, or a copy that failed, fails the checkpoint (and CRIU
// resumes the jail). A CRIU that lets the script leave work running beside
// its own hands it descriptor 3 (see scripts/criu-wait-async-scripts.patch):
// the copy then runs in the background and reports its status there, and
// CRIU waits for that before the processes run again.
const hookScript = `#!/bin/sh
# agentjail: CRIU action script of a jail checkpoint. At the action the
# daemon names the jail's processes are frozen: copy its control files and
# its disk so that they match the process images. The jail may be frozen
# while this runs, so it starts as few programs as it can.
[ "$CRTOOLS_SCRIPT_ACTION" = "$AGENTJAIL_COPY_AT" ] || exit 0
copy() {
	set --
	for f in "$AGENTJAIL_CONTROL"/*; do
		if [ -f "$f" ] && [ ! -L "$f" ]; then
			set -- "$@" "$f"
		fi
	done
	if [ $# -gt 0 ]; then
		cp -p "$@" "$AGENTJAIL_SAVE_CONTROL"/ || return 1
	fi
	fsfreeze -f "$AGENTJAIL_DISK_MOUNT" || return 1
	cp --reflink=always "$AGENTJAIL_DISK_IMAGE" "$AGENTJAIL_DISK_COPY"
	rc=$?
	fsfreeze -u "$AGENTJAIL_DISK_MOUNT" || return 1
	return $rc
}
# Descriptor 3, when CRIU gives it, takes the copy's status; CRIU waits for
# it before the jail's processes run again.
if { true >&3; } 2>/dev/null; then
	{ copy; echo $? >&3; } &
	exit 0
fi
copy
`

// restoreHookScript is the CRIU action script of a process restore. It acts
// at pre-resume, when the jail's processes are restored and stopped just
// before they run again: it hands the daemon init's pid, CRIU's and its
// own (runc runs CRIU in the jail's cgroup) and waits for the answer; the
// daemon then starts observing the jail. What CRIU did in the jail's
// cgroup is not the jail's doing and stays out of its record.
const restoreHookScript = `#!/bin/sh
# agentjail: CRIU action script of a jail restore. At pre-resume the jail's
# processes are restored and stopped: let the daemon attach its observers
# before they run.
[ "$CRTOOLS_SCRIPT_ACTION" = pre-resume ] || exit 0
echo "$CRTOOLS_INIT_PID $PPID $$" >"$AGENTJAIL_RESTORED" || exit 1
read -r answer <"$AGENTJAIL_OBSERVED" || exit 1
[ "$answer" = ok ]
`

// dumpConfig is the CRIU configuration of a checkpoint. The network is not
// locked while the jail is dumped: a restored jail gets a new network
// namespace with other addresses and its TCP connections closed
// (tcp-close), so the connections' state in the images is never used, and
// the running jail's network keeps working through the dump.
func dumpConfig(hook string) string {
	return "action-script " + hook + "\nnetwork-lock skip\n"
}

// checkpointInfo is the backend's record of a process checkpoint.
type checkpointInfo struct {
	// InitBinary is the init binary the jail ran; a restore binds the same
	// file (CRIU checks the executable of every process).
	InitBinary string `json:"init_binary"`
	// Runtime is the runtime's version line.
	Runtime string `json:"runtime"`
	// CRIU is the CRIU binary used.
	CRIU string `json:"criu"`
}

// probeCheckpoint looks for a CRIU that works here: the one given, else
// /usr/local/sbin/criu (where scripts/build-criu.sh installs it) or the one
// on PATH, at least 4.1, passing `criu check`, with iptables present. It
// returns the path, or "" and why checkpointing is unavailable.
func probeCheckpoint(given string) (string, string) {
	var candidates []string
	look := []string{"/usr/local/sbin/criu", "criu"}
	if given != "" {
		look = []string{given}
	}
	for _, c := range look {
		if p, err := exec.LookPath(c); err == nil && !containsStr(candidates, p) {
			candidates = append(candidates, p)
		}
	}
	if len(candidates) == 0 {
		if given != "" {
			return "", fmt.Sprintf("CRIU %s is not an executable", given)
		}
		return "", "CRIU is not installed (run scripts/build-criu.sh for CRIU >= 4.1)"
	}
	var reasons []string
	for _, c := range candidates {
		out, err := exec.Command(c, "--version").Output()
		if err != nil {
			reasons = append(reasons, fmt.Sprintf("%s --version: %v", c, err))
			continue
		}
		major, minor, ok := criuVersion(string(out))
		if !ok {
			reasons = append(reasons, fmt.Sprintf("%s: unreadable version %q", c, strings.TrimSpace(string(out))))
			continue
		}
		if major < criuMinMajor || (major == criuMinMajor && minor < criuMinMinor) {
			reasons = append(reasons, fmt.Sprintf("%s is CRIU %d.%d; %d.%d or newer is needed (scripts/build-criu.sh)", c, major, minor, criuMinMajor, criuMinMinor))
			continue
		}
		if out, err := exec.Command(c, "check").CombinedOutput(); err != nil {
			reasons = append(reasons, fmt.Sprintf("%s check failed: %s", c, lastLine(string(out))))
			continue
		}
		if _, err := exec.LookPath("iptables"); err != nil {
			return "", "iptables is not installed (CRIU needs it to lock the jail's network)"
		}
		for _, tool := range []string{"fsfreeze", "cp"} {
			if _, err := exec.LookPath(tool); err != nil {
				return "", tool + " is not installed"
			}
		}
		return c, ""
	}
	return "", strings.Join(reasons, "; ")
}

var criuVersionRE = lazyre.New(`(?m)^Version:\s*(\d+)\.(\d+)`)

func criuVersion(out string) (int, int, bool) {
	m := criuVersionRE().FindStringSubmatch(out)
	if m == nil {
		return 0, 0, false
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	return major, minor, true
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func containsStr(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// criuRunc returns a go-runc handle on the backend's runtime state, and a
// context carrying the environment every CRIU run needs plus env.
func (b *Backend) criuRunc(ctx context.Context, env ...string) (*runc.Runc, context.Context) {
	rc := &runc.Runc{Command: b.opts.RuntimeBinary, Root: filepath.Join(b.opts.DataDir, "run", "runc")}
	path := filepath.Dir(b.criu) + string(os.PathListSeparator) + os.Getenv("PATH")
	env = append([]string{criuNoBreakpoints, "PATH=" + path}, env...)
	return rc, runc.WithExtraEnv(ctx, env...)
}

// hookPath writes an action script (once per content) under name in the
// daemon's run directory and returns its path.
func (b *Backend) hookPath(name, script string) (string, error) {
	p := filepath.Join(b.opts.DataDir, "run", name)
	if cur, err := os.ReadFile(p); err == nil && string(cur) == script {
		return p, nil
	}
	if err := atomicfile.WriteFile(p, []byte(script), 0o700); err != nil {
		return "", fmt.Errorf("CRIU action script: %w", err)
	}
	return p, nil
}

// Checkpoint implements backend.Checkpointer.
func (b *Backend) Checkpoint(ctx context.Context, inst backend.Instance, opts backend.CheckpointOptions) (backend.CheckpointResult, error) {
	p := b.paths(inst)
	if !opts.Processes {
		return b.checkpointFS(inst, p, opts)
	}
	if !b.caps.Checkpoint {
		return backend.CheckpointResult{}, errdefs.NotImplementedf("process checkpoints are unavailable: %s (mode fs still works)", b.caps.CheckpointReason)
	}
	// The daemon's connections to init are sockets of its own network
	// namespace, which CRIU cannot save: those of finished calls must be
	// closed on init's side too, and a live one (a command's stream)
	// refuses the snapshot, as does a terminal session (CRIU does not
	// restore its controlling terminal).
	ready, err := initclient.New(b.InitDialer(inst)).ReadyForCheckpoint(ctx)
	switch {
	case err != nil:
		return backend.CheckpointResult{}, fmt.Errorf("jail %s: readying init for the checkpoint: %w", inst.Name, err)
	case ready.Terminals > 0:
		return backend.CheckpointResult{}, errdefs.Conflictf("jail %s runs %d terminal sessions; a snapshot of its processes cannot include a terminal yet: end the session (exit its shell) first, or take a snapshot of mode fs", inst.Name, ready.Terminals)
	case ready.OpenConnections > 0:
		return backend.CheckpointResult{}, errdefs.Conflictf("jail %s has %d open command streams; a snapshot of its processes cannot save them: wait for the commands, or take a snapshot of mode fs", inst.Name, ready.OpenConnections)
	}
	hook, err := b.hookPath("criu-snapshot-hook.sh", hookScript)
	if err != nil {
		return backend.CheckpointResult{}, err
	}
	conf := filepath.Join(opts.Dir, dumpConf)
	if err := os.WriteFile(conf, []byte(dumpConfig(hook)), 0o600); err != nil {
		return backend.CheckpointResult{}, fmt.Errorf("checkpoint config: %w", err)
	}
	info := checkpointInfo{InitBinary: b.jailInitBinary(p.dir), Runtime: b.caps.Runtime, CRIU: b.criu}
	data, _ := json.MarshalIndent(info, "", "  ")
	if err := os.WriteFile(filepath.Join(opts.Dir, checkpointRec), data, 0o600); err != nil {
		return backend.CheckpointResult{}, fmt.Errorf("checkpoint record: %w", err)
	}
	if err := os.Mkdir(filepath.Join(opts.Dir, savedControl), 0o700); err != nil {
		return backend.CheckpointResult{}, fmt.Errorf("checkpoint control copy: %w", err)
	}
	images := filepath.Join(opts.Dir, imagesDir)
	work := filepath.Join(opts.Dir, workDir)
	ctx, cancel := context.WithTimeout(ctx, checkpointTimeout)
	defer cancel()
	copyAt := "network-lock"
	if hostNetwork(inst.Config) {
		copyAt = "post-dump"
	}
	rc, cctx := b.criuRunc(ctx,
		"CRIU_CONFIG_FILE="+conf,
		// CRIU built by scripts/build-criu.sh starts the script at that
		// action only, and at network-lock lets it leave the copy
		// running while it dumps the processes; others start it at every
		// action and it exits where it has nothing to do.
		"CRIU_SCRIPT_ACTIONS="+copyAt,
		"CRIU_SCRIPT_ASYNC=network-lock",
		"AGENTJAIL_COPY_AT="+copyAt,
		"AGENTJAIL_CONTROL="+p.control,
		"AGENTJAIL_SAVE_CONTROL="+filepath.Join(opts.Dir, savedControl),
		"AGENTJAIL_DISK_MOUNT="+p.disk,
		"AGENTJAIL_DISK_IMAGE="+b.opts.Pool.DiskPath(inst.ID),
		"AGENTJAIL_DISK_COPY="+opts.DiskImage,
	)
	// Flush the jail's disk while it still runs: the action script's
	// freeze then writes back only what changed since, instead of all the
	// jail wrote since its last flush, while the jail is frozen.
	presync(p.disk)
	err = rc.Checkpoint(cctx, inst.ID, &runc.CheckpointOpts{
		ImagePath:    images,
		WorkDir:      work,
		AllowOpenTCP: true,
		FileLocks:    true,
	}, runc.LeaveRunning)
	if err != nil {
		// CRIU thaws the jail whatever happened; make sure of the disk too.
		_ = thawFS(p.disk)
		if dir := fullDisk(opts.Dir, filepath.Dir(opts.DiskImage)); dir != "" {
			// CRIU's log may not even have been written.
			return backend.CheckpointResult{}, errdefs.Wrap(errdefs.ErrNoSpace, err, "checkpoint of jail %s failed; the jail keeps running: the disk of %s is full", inst.Name, dir)
		}
		return backend.CheckpointResult{}, dumpError(inst, filepath.Join(work, "dump.log"), err)
	}
	if err := sameSize(b.opts.Pool.DiskPath(inst.ID), opts.DiskImage); err != nil {
		return backend.CheckpointResult{}, fmt.Errorf("checkpoint of jail %s: the disk copy was not made: %w", inst.Name, err)
	}
	if err := recordProcesses(filepath.Join(opts.Dir, processesRec), string(hostjail.CgroupOf(inst.ID))); err != nil {
		return backend.CheckpointResult{}, fmt.Errorf("checkpoint of jail %s: %w", inst.Name, err)
	}
	if err := durable(opts.Dir, opts.DiskImage); err != nil {
		return backend.CheckpointResult{}, fmt.Errorf("checkpoint of jail %s: %w", inst.Name, err)
	}
	res := backend.CheckpointResult{Frozen: frozenTime(filepath.Join(work, "dump.log"))}
	res.ProcessBytes, _ = dirSize(images)
	return res, nil
}

// durable makes a checkpoint survive a power loss before the caller
// records it as complete: the process images (one syncfs of their
// filesystem, written by CRIU without fsync) and the disk copy (a reflink,
// whose fsync logs its extents).
func durable(dir, diskImage string) error {
	for _, path := range []string{dir, diskImage} {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		if path == dir {
			err = unix.Syncfs(int(f.Fd()))
		} else {
			err = f.Sync()
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("sync %s: %w", path, err)
		}
	}
	return nil
}

// fullDisk returns the first of dirs whose filesystem is (almost) full,
// or "".
func fullDisk(dirs ...string) string {
	const nearlyFull = 4 << 20
	for _, d := range dirs {
		var st unix.Statfs_t
		if unix.Statfs(d, &st) == nil && st.Bavail*uint64(st.Bsize) < nearlyFull {
			return d
		}
	}
	return ""
}

// sameSize checks that copy exists with the size of src.
func sameSize(src, copy string) error {
	a, err := os.Stat(src)
	if err != nil {
		return err
	}
	b, err := os.Stat(copy)
	if err != nil {
		return err
	}
	if a.Size() != b.Size() {
		return fmt.Errorf("%s has %d bytes, %s %d", copy, b.Size(), src, a.Size())
	}
	return nil
}

// checkpointFS records the jail's disk only: freeze the filesystem (which
// flushes it and blocks writers at a consistent point), reflink the image,
// thaw. The jail's processes are not stopped.
func (b *Backend) checkpointFS(inst backend.Instance, p paths, opts backend.CheckpointOptions) (backend.CheckpointResult, error) {
	mounted, err := storage.IsMounted(p.disk)
	if err != nil {
		return backend.CheckpointResult{}, err
	}
	if !mounted {
		return backend.CheckpointResult{}, errdefs.Conflictf("snapshot of jail %s: its disk is not mounted", inst.Name)
	}
	fd, err := unix.Open(p.disk, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return backend.CheckpointResult{}, fmt.Errorf("snapshot of jail %s: %w", inst.Name, err)
	}
	defer unix.Close(fd)
	start := time.Now()
	if err := unix.IoctlSetInt(fd, ioctlFIFREEZE, 0); err != nil {
		return backend.CheckpointResult{}, fmt.Errorf("snapshot of jail %s: freeze %s: %w", inst.Name, p.disk, err)
	}
	cerr := storage.CloneFile(b.opts.Pool.DiskPath(inst.ID), opts.DiskImage)
	terr := unix.IoctlSetInt(fd, ioctlFITHAW, 0)
	frozen := time.Since(start)
	if cerr != nil {
		return backend.CheckpointResult{}, fmt.Errorf("snapshot of jail %s: %w", inst.Name, cerr)
	}
	if terr != nil {
		return backend.CheckpointResult{}, fmt.Errorf("snapshot of jail %s: thaw %s: %w", inst.Name, p.disk, terr)
	}
	return backend.CheckpointResult{Frozen: frozen}, nil
}

// presync writes back the filesystem mounted at dir (syncfs). It only
// shortens the freeze that follows, which flushes the filesystem itself:
// an error here shows there, and is not reported twice.
func presync(dir string) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	_ = unix.Syncfs(fd)
	unix.Close(fd)
}

// thawFS thaws the filesystem mounted at dir; not being frozen is fine.
func thawFS(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetInt(fd, ioctlFITHAW, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("thaw %s: %w", dir, err)
	}
	return nil
}

// dumpErrorRE finds CRIU's error lines; pidRE the pids they name.
var (
	dumpErrorRE = lazyre.New(`Error \([^)]*\): (.*)$`)
	pidRE       = lazyre.New(`\(pid:? (\d+)\)|\bpid (\d+)\b|\b(\d+)'s\b|\bzombie (\d+)\b|\bfrom (\d+):`)
)

// dumpError turns a failed dump into an error that names what could not
// be recorded: CRIU's own error lines, with the jail process (command and
// pid) they name.
func dumpError(inst backend.Instance, logPath string, err error) error {
	f, ferr := os.Open(logPath)
	if ferr != nil {
		return fmt.Errorf("checkpoint of jail %s: %w", inst.Name, err)
	}
	defer f.Close()
	var msgs []string
	procs := map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m := dumpErrorRE().FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		msg := strings.TrimSpace(m[1])
		if strings.Contains(msg, "rlimit: Can't setup RLIMIT_NOFILE for self") || strings.HasPrefix(msg, "Dumping FAILED") {
			continue
		}
		for _, pm := range pidRE().FindAllStringSubmatch(msg, -1) {
			for _, pid := range pm[1:] {
				if pid != "" {
					procs[pid] = processName(pid)
				}
			}
		}
		if !containsStr(msgs, msg) {
			msgs = append(msgs, msg)
		}
	}
	if len(msgs) == 0 {
		return fmt.Errorf("checkpoint of jail %s: %w (see %s)", inst.Name, err, logPath)
	}
	if len(msgs) > 4 {
		msgs = msgs[len(msgs)-4:]
	}
	detail := strings.Join(msgs, "; ")
	var names []string
	for pid, name := range procs {
		names = append(names, fmt.Sprintf("pid %s is %s", pid, name))
	}
	if len(names) > 0 {
		detail += " (" + strings.Join(names, ", ") + ")"
	}
	kind := errdefs.ErrUnprocessable
	if strings.Contains(detail, "No space left on device") {
		kind = errdefs.ErrNoSpace
	}
	return errdefs.New(kind, "checkpoint of jail %s failed; the jail keeps running: %s", inst.Name, detail)
}

// processName describes a host pid: its command line and uid.
func processName(pid string) string {
	cmd, err := os.ReadFile("/proc/" + pid + "/cmdline")
	if err != nil || len(cmd) == 0 {
		comm, _ := os.ReadFile("/proc/" + pid + "/comm")
		return strconv.Quote(strings.TrimSpace(string(comm)))
	}
	args := strings.Split(strings.TrimRight(string(cmd), "\x00"), "\x00")
	s := strings.Join(args, " ")
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	uid := ""
	if st, err := os.ReadFile("/proc/" + pid + "/status"); err == nil {
		for _, line := range strings.Split(string(st), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
				uid = " uid " + f[1]
			}
		}
	}
	return strconv.Quote(s) + uid
}

// logStampRE reads the (SS.UUUUUU) stamp CRIU puts before each log line.
var logStampRE = lazyre.New(`^\((\d+)\.(\d{6})\)`)

// frozenTime reads from a dump log how long the jail's processes were
// frozen: from the cgroup freeze to the release of the tasks.
func frozenTime(logPath string) time.Duration {
	f, err := os.Open(logPath)
	if err != nil {
		return 0
	}
	defer f.Close()
	var from, to time.Duration
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		m := logStampRE().FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s, _ := strconv.Atoi(m[1])
		us, _ := strconv.Atoi(m[2])
		ts := time.Duration(s)*time.Second + time.Duration(us)*time.Microsecond
		switch {
		case from == 0 && strings.Contains(line, "freezing cgroup"):
			from = ts
		case from != 0 && (strings.Contains(line, "Unfreezing tasks") || strings.Contains(line, "Unseizing")):
			to = ts
		}
	}
	if to > from {
		return to - from
	}
	return 0
}

// dirSize sums the sizes of the regular files below dir.
func dirSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += fi.Size()
		}
		return nil
	})
	return n, err
}

// Restore implements backend.Checkpointer.
func (b *Backend) Restore(ctx context.Context, inst backend.Instance, src backend.RestoreSource) (st backend.Status, err error) {
	p := b.paths(inst)
	defer func() {
		if err != nil {
			if derr := b.Destroy(context.WithoutCancel(ctx), inst); derr != nil {
				b.opts.Log.Error("releasing a jail whose restore failed", "jail", inst.ID, "err", derr)
			}
		}
	}()
	if src.Processes && !b.caps.Checkpoint {
		return backend.Status{}, errdefs.NotImplementedf("process restores are unavailable: %s", b.caps.CheckpointReason)
	}
	if err := storage.CloneFile(src.DiskImage, b.opts.Pool.DiskPath(inst.ID)); err != nil {
		return backend.Status{}, fmt.Errorf("jail disk: %w", err)
	}
	if !src.Processes {
		return b.Start(ctx, inst)
	}
	ctx, cancel := context.WithTimeout(ctx, restoreTimeout)
	defer cancel()
	att, err := b.prepare(ctx, inst, p)
	if err != nil {
		return backend.Status{}, err
	}
	if err := b.writeControl(inst, p, att.Env); err != nil {
		return backend.Status{}, err
	}
	if err := restoreControl(filepath.Join(src.Dir, savedControl), p.control); err != nil {
		return backend.Status{}, err
	}
	if err := b.writeBundle(inst, p, att.HostNetwork); err != nil {
		return backend.Status{}, err
	}
	if err := b.pinInitBinary(src.Dir, p.dir); err != nil {
		return backend.Status{}, err
	}
	pid, err := b.runRestore(ctx, inst, p, src, func(pid int, foreign []int) error {
		if inst.OnCreated == nil {
			return nil
		}
		return inst.OnCreated(backend.Status{Running: true, Pid: pid, Foreign: foreign})
	})
	if err != nil {
		return backend.Status{}, err
	}
	if err := waitInit(ctx, filepath.Join(p.control, initproto.SocketName)); err != nil {
		return backend.Status{}, fmt.Errorf("restored jail %s: %w", inst.Name, err)
	}
	return backend.Status{Running: true, Pid: pid}, nil
}

// runRestore runs `runc restore --detach` and returns the restored init's
// host pid. restored is called with that pid, and the host pids of CRIU's
// processes in the jail's cgroup, once the processes are restored and
// before they resume (see restoreHookScript); its error fails the
// restore. The restored processes' stdio are pipes whose daemon ends are
// drained until the jail exits.
func (b *Backend) runRestore(ctx context.Context, inst backend.Instance, p paths, src backend.RestoreSource, restored func(pid int, foreign []int) error) (int, error) {
	hook, err := b.hookPath("criu-restore-hook.sh", restoreHookScript)
	if err != nil {
		return 0, err
	}
	conf := filepath.Join(p.dir, "criu-restore.conf")
	if err := os.WriteFile(conf, []byte("tcp-close\naction-script "+hook+"\n"), 0o600); err != nil {
		return 0, fmt.Errorf("restore config: %w", err)
	}
	pipes, err := runc.NewPipeIO(0, 0)
	if err != nil {
		return 0, fmt.Errorf("restore %s: stdio pipes: %w", inst.ID, err)
	}
	// In the jail's dir: a daemon killed meanwhile leaves it to go with
	// the jail.
	tmp, err := os.MkdirTemp(p.dir, ".restore-")
	if err != nil {
		pipes.Close()
		return 0, fmt.Errorf("restore %s: pid file dir: %w", inst.ID, err)
	}
	defer os.RemoveAll(tmp)
	pidFile := filepath.Join(tmp, "pid")
	h, err := newResumeHandshake(tmp, restored)
	if err != nil {
		pipes.Close()
		return 0, fmt.Errorf("restore %s: %w", inst.ID, err)
	}
	rc, cctx := b.criuRunc(context.WithoutCancel(ctx), append([]string{"CRIU_CONFIG_FILE=" + conf,
		// CRIU built by scripts/build-criu.sh starts the script at
		// pre-resume only; others start it at every action and it exits.
		"CRIU_SCRIPT_ACTIONS=pre-resume",
		"AGENTJAIL_RESTORED=" + h.restoredPath, "AGENTJAIL_OBSERVED=" + h.observedPath}, b.restoreEnv()...)...)
	cctx, cancel := context.WithTimeout(cctx, restoreTimeout)
	defer cancel()
	work := filepath.Join(p.dir, restoreWorkDir)
	// CRIU does not keep the processes' timer slack: every restored
	// process gets the one of the thread that started the restore, which
	// must be the ordinary one of the jail's commands (init and the shims
	// of a restored jail run with it too).
	err = timerslack.StartOrdinary(func() error {
		_, err := rc.Restore(cctx, inst.ID, p.dir, &runc.RestoreOpts{
			CheckpointOpts: runc.CheckpointOpts{
				ImagePath: filepath.Join(src.Dir, imagesDir),
				WorkDir:   work,
				FileLocks: true,
			},
			IO:      pipes,
			Detach:  true,
			PidFile: pidFile,
		})
		return err
	})
	_ = pipes.Stdin().Close()
	herr := h.close()
	if err != nil {
		pipes.Close()
		return 0, restoreError(inst, src.Dir, filepath.Join(work, "restore.log"), err)
	}
	go drain(pipes)
	if herr != nil {
		return 0, herr
	}
	return oci.ReadPidFile(pidFile)
}

// resumeHandshake is the daemon's end of restoreHookScript: two FIFOs, one
// the script writes its pids to, one it reads the answer from.
type resumeHandshake struct {
	restoredPath, observedPath string
	restored, observed         *os.File
	done                       chan struct{}
	err                        error // valid once done is closed
	called                     bool
}

// newResumeHandshake makes the FIFOs in dir and serves them: when the
// script reports, fn runs with init's pid and CRIU's and the script's, and
// the script gets "ok", or "fail" when fn failed.
func newResumeHandshake(dir string, fn func(pid int, foreign []int) error) (*resumeHandshake, error) {
	h := &resumeHandshake{restoredPath: filepath.Join(dir, "restored"), observedPath: filepath.Join(dir, "observed"), done: make(chan struct{})}
	for _, f := range []string{h.restoredPath, h.observedPath} {
		if err := unix.Mkfifo(f, 0o600); err != nil {
			return nil, fmt.Errorf("resume handshake: %w", err)
		}
	}
	// Read-write opens do not wait for the other end, and a read sees no
	// end of file before the script writes; closing ends a pending read.
	var err error
	if h.restored, err = os.OpenFile(h.restoredPath, os.O_RDWR, 0); err != nil {
		return nil, fmt.Errorf("resume handshake: %w", err)
	}
	if h.observed, err = os.OpenFile(h.observedPath, os.O_RDWR, 0); err != nil {
		h.restored.Close()
		return nil, fmt.Errorf("resume handshake: %w", err)
	}
	go h.serve(fn)
	return h, nil
}

func (h *resumeHandshake) serve(fn func(pid int, foreign []int) error) {
	defer close(h.done)
	line, err := bufio.NewReader(h.restored).ReadString('\n')
	if err != nil {
		return // closed: the restore ended before its pre-resume
	}
	h.called = true
	var pids []int
	for _, f := range strings.Fields(line) {
		if n, err := strconv.Atoi(f); err == nil && n > 0 {
			pids = append(pids, n)
		}
	}
	if len(pids) != 3 {
		h.err = fmt.Errorf("resume handshake: the action script sent %q", strings.TrimSpace(line))
	} else {
		h.err = fn(pids[0], pids[1:])
	}
	answer := "ok\n"
	if h.err != nil {
		answer = "fail\n"
	}
	_, _ = h.observed.WriteString(answer)
}

// close ends the handshake once the restore has ended and returns fn's
// error, or (meaningful after a restore that succeeded) an error when the
// processes resumed without fn having run.
func (h *resumeHandshake) close() error {
	h.restored.Close()
	<-h.done
	h.observed.Close()
	if !h.called {
		return errors.New("restore: CRIU resumed the jail without running its action script at pre-resume")
	}
	return h.err
}

// drain reads the restored jail's stdout and stderr until every writer is
// gone (the jail exited), then closes the daemon's ends.
func drain(pipes runc.IO) {
	done := make(chan struct{}, 2)
	for _, r := range []io.Reader{pipes.Stdout(), pipes.Stderr()} {
		go func() {
			_, _ = io.Copy(io.Discard, r)
			done <- struct{}{}
		}()
	}
	<-done
	<-done
	pipes.Close()
}

// restoreLineRE reads a CRIU restore log's error lines: the pid (in the
// jail) of the task that logged it, if any, and the message.
var restoreLineRE = lazyre.New(`^\([0-9.]+\)\s+(?:(\d+): )?Error \([^)]*\): (.*)$`)

// restorePidRE finds the task a restore message is about.
var restorePidRE = lazyre.New(`^(\d+) (?:killed|exited)\b|\bfor (\d+)$|\(pid:? (\d+)\)`)

// restoreError turns a failed restore into an error naming CRIU's reason
// and the checkpoint's processes it concerns (from the record snapDir
// holds): ErrUnprocessable, or ErrNoSpace when a disk was full.
func restoreError(inst backend.Instance, snapDir, logPath string, err error) error {
	f, ferr := os.Open(logPath)
	if ferr != nil {
		return fmt.Errorf("restore of jail %s: %w", inst.Name, err)
	}
	defer f.Close()
	var msgs []string
	var pids []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m := restoreLineRE().FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		msg := strings.TrimSpace(m[2])
		if strings.Contains(msg, "RLIMIT_NOFILE for self") || msg == "Restoring FAILED." || strings.Contains(msg, "cgroupd: recv req error") {
			continue
		}
		named := []string{m[1]}
		if k := restorePidRE().FindStringSubmatch(msg); k != nil {
			named = k[1:]
		}
		for _, pid := range named {
			if pid != "" && pid != "1" && !containsStr(pids, pid) {
				pids = append(pids, pid)
			}
		}
		if !containsStr(msgs, msg) {
			msgs = append(msgs, msg)
		}
	}
	if len(msgs) == 0 {
		return fmt.Errorf("restore of jail %s: %w (see %s)", inst.Name, err, logPath)
	}
	if len(msgs) > 4 {
		msgs = msgs[len(msgs)-4:]
	}
	detail := strings.Join(msgs, "; ")
	if names := processNames(filepath.Join(snapDir, processesRec), pids); names != "" {
		detail += " (" + names + ")"
	}
	kind := errdefs.ErrUnprocessable
	if strings.Contains(detail, "No space left on device") {
		kind = errdefs.ErrNoSpace
	}
	return errdefs.New(kind, "restore of jail %s from its snapshot failed: %s", inst.Name, detail)
}

// recordProcesses writes to path a description of each process in the
// jail's cgroup by its pid in the jail ("sleep 1000" uid 1000).
func recordProcesses(path, cgroup string) error {
	hostPids, err := cgroups.Pids(cgroup)
	if err != nil {
		return fmt.Errorf("the jail's processes: %w", err)
	}
	names := map[string]string{}
	for _, hp := range hostPids {
		if pid := jailPid(hp); pid != "" {
			names[pid] = processName(strconv.Itoa(hp))
		}
	}
	data, err := json.Marshal(names)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("the jail's processes: %w", err)
	}
	return nil
}

// jailPid is host process hp's pid in its innermost pid namespace ("" when
// it is gone).
func jailPid(hp int) string {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", hp))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(st), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				return f[len(f)-1]
			}
		}
	}
	return ""
}

// processNames describes pids (in the jail) from a checkpoint's record of
// its processes: "pid 43 was "sleep 3000" uid 1000, ...".
func processNames(record string, pids []string) string {
	data, err := os.ReadFile(record)
	if err != nil || len(pids) == 0 {
		return ""
	}
	var names map[string]string
	if json.Unmarshal(data, &names) != nil {
		return ""
	}
	var out []string
	for _, pid := range pids {
		if n, ok := names[pid]; ok {
			out = append(out, fmt.Sprintf("pid %s in the jail was %s", pid, n))
		}
	}
	return strings.Join(out, ", ")
}

// restoreControl copies the control files saved with a checkpoint into a
// new jail's control dir, keeping the new jail's own init.json.
func restoreControl(saved, control string) error {
	entries, err := os.ReadDir(saved)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("saved control files: %w", err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || e.Name() == initproto.ConfigName {
			continue
		}
		if err := copyFile(filepath.Join(saved, e.Name()), filepath.Join(control, e.Name())); err != nil {
			return fmt.Errorf("saved control files: %w", err)
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	if st, ok := fi.Sys().(*unix.Stat_t); ok {
		return os.Lchown(dst, int(st.Uid), int(st.Gid))
	}
	return nil
}

// pinInitBinary points the restored bundle's init binary mount at the
// binary the checkpointed jail ran, when that differs from the daemon's
// current one (a daemon upgrade between checkpoint and restore).
func (b *Backend) pinInitBinary(snapDir, bundle string) error {
	info, err := readCheckpointInfo(snapDir)
	if err != nil {
		return fmt.Errorf("checkpoint record: %w", err)
	}
	if info.InitBinary == "" || info.InitBinary == b.opts.InitBinary {
		return nil
	}
	if _, err := os.Stat(info.InitBinary); err != nil {
		return errdefs.Wrap(errdefs.ErrConflict, err, "the checkpointed jail ran init binary %s, which is gone", info.InitBinary)
	}
	cfgPath := filepath.Join(bundle, "config.json")
	raw, err := os.ReadFile(cfgPath)
	if err != nil {
		return err
	}
	var spec map[string]any
	if err := json.Unmarshal(raw, &spec); err != nil {
		return fmt.Errorf("bundle config: %w", err)
	}
	mounts, _ := spec["mounts"].([]any)
	for _, m := range mounts {
		if mm, ok := m.(map[string]any); ok && mm["source"] == b.opts.InitBinary {
			mm["source"] = info.InitBinary
		}
	}
	out, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(cfgPath, out, 0o600)
}

// jailInitBinary is the host path of the init binary the jail's bundle
// binds: the daemon's binary of when the jail started, which an upgrade of
// the daemon since then has made differ from the current one. It is the
// current one when the bundle names none.
func (b *Backend) jailInitBinary(bundle string) string {
	var spec struct {
		Mounts []struct {
			Destination string `json:"destination"`
			Source      string `json:"source"`
		} `json:"mounts"`
	}
	if raw, err := os.ReadFile(filepath.Join(bundle, "config.json")); err == nil && json.Unmarshal(raw, &spec) == nil {
		for _, m := range spec.Mounts {
			if m.Destination == oci.InitPath && m.Source != "" {
				return m.Source
			}
		}
	}
	return b.opts.InitBinary
}

// waitInit waits until init answers on its control socket.
func waitInit(ctx context.Context, sock string) error {
	c := initclient.New(initclient.UnixSocket(sock))
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := c.Ping(pctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return errdefs.Wrap(errdefs.ErrTimeout, err, "init did not answer on %s", sock)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Recover implements backend.Checkpointer. A checkpoint that a killed
// daemon started goes on without it and resumes the jail when it ends;
// Recover waits for that first (CRIU stopped half-way would leave its
// parasite code in the jail's processes).
func (b *Backend) Recover(ctx context.Context, inst backend.Instance) error {
	p := b.paths(inst)
	wctx, cancel := context.WithTimeout(ctx, checkpointTimeout)
	left := b.runtime.WaitStrays(wctx, inst.ID, "checkpoint")
	cancel()
	if len(left) > 0 {
		return fmt.Errorf("jail %s: the checkpoint a previous daemon started (runtime pids %v) did not end within %v", inst.Name, left, checkpointTimeout)
	}
	errs := []error{thawFS(p.disk)}
	if st, _, err := b.runtime.State(ctx, inst.ID); err == nil && st == "paused" {
		errs = append(errs, b.runtime.Resume(ctx, inst.ID))
	}
	return errors.Join(errs...)
}
