package integration

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Per-level samples of BenchmarkLevels.
const (
	levelCreates = 10     // create → first exec
	levelExecs   = 40     // exec round trips of `true`
	levelDDBytes = 200000 // dd bs=1: two syscalls per byte
	levelIdle    = 5      // idle jails whose memory is averaged
)

// levelFigures are one level's measures.
type levelFigures struct {
	create, exec, dd time.Duration
	// initPrivate is the private memory of an idle jail's init (and its
	// idle shims, for the levels whose init is a host process), cgroup
	// its cgroup's usage, both in MiB per jail.
	initPrivate, cgroup float64
}

// levelsOnce holds the measures of every level, taken once: one run of
// BenchmarkLevels measures them all side by side on one daemon.
var levelsOnce = struct {
	sync.Once
	order   []string
	figures map[string]*levelFigures
	// Raw runc's `run` of an equivalent bundle and `exec` in a jail's
	// container, and dd on the bare host: the references.
	runcRun, runcExec, hostDD time.Duration
	// runsc runs the reference bundle directly (`runsc run`: echo, and
	// dd bs=1 as dd itself times it), the one the gvisor level uses
	// against Debian's: taken when the gvisor level is offered.
	runsc *runscFigures
	err   error
}{}

// runscFigures compares two runsc binaries on the reference bundle.
type runscFigures struct {
	run, debianRun, dd, debianDD time.Duration
	debianPlatform               string
}

// BenchmarkLevels measures every isolation level the daemon offers, side
// by side: create → first exec (against raw `runc run` for the container
// level, and against the container level for the others), the exec round
// trip of `true` (against `runc exec`, and the container level), the
// syscall cost of `dd bs=1` of 200000 bytes (against dd on the bare host;
// tracing on, as jails are made), and an idle jail's memory (init's
// private memory and the cgroup's usage). docs/levels.md quotes them.
func BenchmarkLevels(b *testing.B) {
	requireEnv(b)
	levelsOnce.Do(func() { levelsOnce.err = measureLevels(b) })
	if levelsOnce.err != nil {
		b.Fatal(levelsOnce.err)
	}
	lo := &levelsOnce
	ref := func(level string, own time.Duration, get func(*levelFigures) time.Duration) time.Duration {
		if c, ok := lo.figures["container"]; ok && level != "container" {
			return get(c)
		}
		return own
	}
	for _, level := range lo.order {
		f := lo.figures[level]
		b.Run("create-first-exec/"+level, func(b *testing.B) {
			reportOne(b, f.create, ref(level, lo.runcRun, func(c *levelFigures) time.Duration { return c.create }))
		})
		b.Run("exec-true/"+level, func(b *testing.B) {
			reportOne(b, f.exec, ref(level, lo.runcExec, func(c *levelFigures) time.Duration { return c.exec }))
		})
		b.Run("dd-bs1/"+level, func(b *testing.B) {
			reportOne(b, f.dd, lo.hostDD)
			b.ReportMetric(float64(f.dd.Nanoseconds())/(2*levelDDBytes), "ns/syscall")
		})
		if r := lo.runsc; level == "gvisor" && r != nil {
			b.Run("runsc-run-vs-debian/gvisor", func(b *testing.B) { reportOne(b, r.run, r.debianRun) })
			b.Run("runsc-dd-bs1-vs-debian/gvisor", func(b *testing.B) {
				reportOne(b, r.dd, r.debianDD)
				b.ReportMetric(float64(r.dd.Nanoseconds())/(2*levelDDBytes), "ns/syscall")
			})
		}
		if level != "none" {
			b.Run("idle-memory/"+level, func(b *testing.B) {
				b.ReportMetric(f.initPrivate, "init-private-MiB")
				b.ReportMetric(f.cgroup, "cgroup-MiB")
			})
		}
	}
}

// reportOne reports a measure and its reference.
func reportOne(b *testing.B, ours, ref time.Duration) {
	b.ReportMetric(ms(ours), "ms")
	b.ReportMetric(ms(ref), "ref-ms")
	if ref > 0 {
		b.ReportMetric(float64(ours)/float64(ref), "x-ref")
	}
}

// measureLevels takes every measure of BenchmarkLevels.
func measureLevels(b *testing.B) error {
	d := newDaemon(b, "--unsafe-none-level")
	var h struct {
		Levels []struct {
			Name      string `json:"name"`
			Available bool   `json:"available"`
		} `json:"levels"`
	}
	d.api.want(b, http.StatusOK, "GET", "/health", nil, &h)
	levelsOnce.figures = map[string]*levelFigures{}
	for _, l := range h.Levels {
		if !l.Available {
			continue
		}
		f, err := measureLevel(b, d, l.Name)
		if err != nil {
			return fmt.Errorf("level %s: %w", l.Name, err)
		}
		levelsOnce.order = append(levelsOnce.order, l.Name)
		levelsOnce.figures[l.Name] = f
	}
	rb := newRefBundle(b, []string{"echo", "hi"})
	var runs []time.Duration
	for i := range levelCreates {
		start := time.Now()
		if out := rb.run(b, fmt.Sprintf("lvl-%d-%d", os.Getpid(), i)); out != "hi\n" {
			return fmt.Errorf("runc run printed %q", out)
		}
		runs = append(runs, time.Since(start))
	}
	levelsOnce.runcRun = median(runs)
	j := d.createJail(b, map[string]any{"isolation": map[string]any{"level": "container"}})
	state, ctr := runcContainer(b, d, j.ID)
	var execs []time.Duration
	for range levelExecs {
		start := time.Now()
		if out, err := exec.Command("runc", "--root", state, "exec", ctr, "true").CombinedOutput(); err != nil {
			return fmt.Errorf("runc exec: %v: %s", err, out)
		}
		execs = append(execs, time.Since(start))
	}
	levelsOnce.runcExec = median(execs)
	var dds []time.Duration
	for range 3 {
		start := time.Now()
		if out, err := exec.Command("dd", "if=/dev/zero", "of=/dev/null", "bs=1", "count="+strconv.Itoa(levelDDBytes)).CombinedOutput(); err != nil {
			return fmt.Errorf("dd on the host: %v: %s", err, out)
		}
		dds = append(dds, time.Since(start))
	}
	levelsOnce.hostDD = median(dds)
	if _, ok := levelsOnce.figures["gvisor"]; ok {
		r, err := measureRunsc(b)
		if err != nil {
			return err
		}
		levelsOnce.runsc = r
	}
	return nil
}

// debianRunsc is Debian's runsc package (bookworm: 0.0~20221219, older
// than the systrap platform, so it runs on ptrace, its default).
const debianRunsc = "/usr/bin/runsc"

// measureRunsc runs the reference bundle with the gvisor level's runsc
// (systrap) and with Debian's: `echo hi` start to end, and `dd bs=1` as
// dd reports its own copy time.
func measureRunsc(b *testing.B) (*runscFigures, error) {
	echo := newRefBundle(b, []string{"echo", "hi"})
	dd := newRefBundle(b, []string{"dd", "if=/dev/zero", "of=/dev/null", "bs=1", "count=" + strconv.Itoa(levelDDBytes)})
	r := &runscFigures{debianPlatform: "ptrace"}
	for _, c := range []struct {
		bin   string
		flags []string
		run   *time.Duration
		dd    *time.Duration
	}{
		// The gvisor level's flags: systrap, and a gofer network
		// namespace of its own (not one pinned under the state root).
		{"/usr/local/sbin/runsc", []string{"--platform", "systrap", "--gofer-network-namespace", "new"}, &r.run, &r.dd},
		{debianRunsc, []string{"--platform", r.debianPlatform}, &r.debianRun, &r.debianDD},
	} {
		var runs, dds []time.Duration
		for i := range levelCreates {
			start := time.Now()
			out, err := runscRun(c.bin, c.flags, echo, i)
			if err != nil || out != "hi\n" {
				return nil, fmt.Errorf("%s run: %q %v", c.bin, out, err)
			}
			runs = append(runs, time.Since(start))
		}
		for i := range 3 {
			out, err := runscRun(c.bin, c.flags, dd, levelCreates+i)
			if err != nil {
				return nil, fmt.Errorf("%s run dd: %v", c.bin, err)
			}
			took, err := ddCopyTime(out)
			if err != nil {
				return nil, fmt.Errorf("%s run dd: %w", c.bin, err)
			}
			dds = append(dds, took)
		}
		*c.run, *c.dd = median(runs), median(dds)
	}
	return r, nil
}

// runscRun runs bundle rb to completion with `runsc run` of bin with
// flags (and no network) and returns its stdout and stderr.
func runscRun(bin string, flags []string, rb *refBundle, n int) (string, error) {
	id := fmt.Sprintf("runsc-%d-%d", os.Getpid(), n)
	args := append([]string{"--root", rb.state, "--network", "none"}, flags...)
	out, err := exec.Command(bin, append(args, "run", "--bundle", rb.dir, id)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%v: %s", err, out)
	}
	return string(out), nil
}

// ddCopyTime reads the copy time dd reports ("..., 0.123 s, 1.6 MB/s").
func ddCopyTime(out string) (time.Duration, error) {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, ", ")
		if len(f) >= 3 && strings.HasSuffix(f[len(f)-2], " s") {
			sec, err := strconv.ParseFloat(strings.TrimSuffix(f[len(f)-2], " s"), 64)
			if err == nil {
				return time.Duration(sec * float64(time.Second)), nil
			}
		}
	}
	return 0, fmt.Errorf("no copy time in dd's output %q", out)
}

// levelSpec is the create body of a jail at level (the none level runs on
// the host's network).
func levelSpec(b *testing.B, level string) map[string]any {
	iso := map[string]any{"level": level}
	if level == "none" {
		iso["network"] = map[string]any{"mode": "host"}
	}
	return map[string]any{"name": uniqueName(b), "isolation": iso}
}

// measureLevel takes the measures of one level.
func measureLevel(b *testing.B, d *daemon, level string) (*levelFigures, error) {
	f := &levelFigures{}
	var creates []time.Duration
	for range levelCreates {
		start := time.Now()
		var j jailInfo
		d.api.want(b, http.StatusCreated, "POST", "/jails", levelSpec(b, level), &j)
		res := d.exec(b, j.ID, execReq{Cmd: []string{"echo", "hi"}})
		creates = append(creates, time.Since(start))
		d.destroy(b, j.ID)
		if res.Stdout != "hi\n" {
			return nil, fmt.Errorf("first exec: %s", &res)
		}
	}
	f.create = median(creates)
	var j jailInfo
	d.api.want(b, http.StatusCreated, "POST", "/jails", levelSpec(b, level), &j)
	defer d.destroy(b, j.ID)
	var execs []time.Duration
	for range levelExecs {
		start := time.Now()
		res := d.exec(b, j.ID, execReq{Cmd: []string{"true"}})
		execs = append(execs, time.Since(start))
		if res.ExitCode != 0 {
			return nil, fmt.Errorf("exec true: %s", &res)
		}
	}
	f.exec = median(execs)
	var dds []time.Duration
	for range 3 {
		res := d.exec(b, j.ID, execReq{Cmd: []string{"dd", "if=/dev/zero", "of=/dev/null", "bs=1", "count=" + strconv.Itoa(levelDDBytes)}, TimeoutMs: 120_000})
		if res.ExitCode != 0 {
			return nil, fmt.Errorf("dd: %s", &res)
		}
		dds = append(dds, time.Duration(res.DurationMs*float64(time.Millisecond)))
	}
	f.dd = median(dds)
	if level == "none" {
		return f, nil
	}
	jails := idleJailsAt(b, d, level, levelIdle)
	var priv, cg int64
	for _, j := range jails {
		k, err := privateKiB(j.Pid)
		if err != nil {
			return nil, err
		}
		priv += k
		raw, err := os.ReadFile(filepath.Join(cgroupRoot, "memory", jailCgroupOf(j.ID), "memory.usage_in_bytes"))
		if err != nil {
			return nil, err
		}
		v, _ := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
		cg += v
	}
	f.initPrivate = float64(priv) / 1024 / levelIdle
	f.cgroup = float64(cg) / mib / levelIdle
	return f, nil
}

// idleJailsAt creates n started jails at level, one after the other;
// they are destroyed when the benchmark ends.
func idleJailsAt(b *testing.B, d *daemon, level string, n int) []jailInfo {
	var out []jailInfo
	for range n {
		var j jailInfo
		d.api.want(b, http.StatusCreated, "POST", "/jails", levelSpec(b, level), &j)
		b.Cleanup(func() { d.destroy(b, j.ID) })
		out = append(out, j)
	}
	return out
}
