package integration

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/image/imagetest"
)

// Snapshot benchmarks: a small idle jail (a counter loop) and ones with
// 256 MB and 1 GB resident (a python process holding random bytes: no two
// pages alike, so only what branches hold alike can be merged). Each iteration
// takes a full snapshot, restores it, deletes both; a raw `runc checkpoint`
// of the same container five times is the reference; branch ×10 is
// measured three times and the fs-only snapshot five times (medians), with
// the first exec in a branch after the branch call answered and the
// proportional memory (PSS) of the ten branches, when the call answered
// and once ksmd merged what they hold alike. Targets: snapshot ≤ 250 ms,
// frozen ≤ 150 ms, restore ≤ 250 ms, branch ×10 ≤ 2 s and ≤ 1.5× the small
// jail's, first exec in a branch ≤ 100 ms, the merged PSS of ten branches
// about one jail's, fs-only of an unchanged jail ≤ 50 ms with ≈ 0 extra
// disk. Beside the frozen time of a jail with memory resident: the time to
// write as many bytes into the page cache of the snapshots' filesystem
// (frozen-copy-floor-ms), which a dump without dirty tracking adds at
// least. Beside the branch ×10 of such a jail: the time to read the
// snapshot's memory pages into ten fresh processes' worth of memory at
// once (branch10-copy-floor-ms), which a restore that copies pages (CRIU's
// only way that shares nothing with a live process) adds at least to the
// small jail's branch ×10.

func benchSnapshot(b *testing.B, resident string, wantMem uint64) {
	// Restored jails share memory only when the daemon is told to.
	d := newDaemon(b, "--share-branch-memory")
	j := d.createJail(b, map[string]any{"isolation": map[string]any{"resources": map[string]any{"memory_bytes": max(1<<30, 2*wantMem)}}})
	if res := d.shAs(b, j.ID, "", counterScript); res.ExitCode != 0 {
		b.Fatalf("counter: %s", &res)
	}
	if resident != "" {
		if res := d.shAs(b, j.ID, "", resident); res.ExitCode != 0 {
			b.Fatalf("resident memory: %s", &res)
		}
	}
	if err := waitFor(time.Minute, func() error {
		if st := d.getJail(b, j.ID).Stats; st == nil || st.MemoryBytes < wantMem {
			return fmt.Errorf("jail memory below %d bytes", wantMem)
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	d.waitCounting(b, j.ID, 0)
	var snap, frozen, restore []time.Duration
	var procBytes int64
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		var s snapshotInfo
		d.api.want(b, http.StatusCreated, "POST", "/jails/"+j.ID+"/snapshot", map[string]any{}, &s)
		snap = append(snap, time.Since(start))
		frozen = append(frozen, time.Duration(s.FrozenMs*float64(time.Millisecond)))
		procBytes = s.ProcessBytes
		start = time.Now()
		var r jailInfo
		d.api.want(b, http.StatusCreated, "POST", "/snapshots/"+s.ID+"/restore", map[string]any{}, &r)
		restore = append(restore, time.Since(start))
		b.StopTimer()
		d.destroy(b, r.ID)
		d.api.want(b, http.StatusNoContent, "DELETE", "/snapshots/"+s.ID, nil, nil)
		b.StartTimer()
	}
	b.StopTimer()

	// The reference: raw `runc checkpoint --leave-running` of the jail's
	// container with CRIU's required switches only (no disk copy, no
	// drained shims, no network lock skipped), into a scratch directory.
	state, ctr := runcContainer(b, d, j.ID)
	var ref []time.Duration
	for i := range 5 {
		dir := filepath.Join(b.TempDir(), fmt.Sprint(i))
		cmd := exec.Command("runc", "--root", state, "checkpoint", "--leave-running", "--tcp-established", "--file-locks",
			"--image-path", dir, "--work-path", dir, ctr)
		cmd.Env = append(os.Environ(), "CRIU_FAULT=130", "PATH=/usr/local/sbin:"+os.Getenv("PATH"))
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("runc checkpoint: %v\n%s", err, out)
		}
		ref = append(ref, time.Since(start))
	}

	// The floor of the frozen time's growth with memory: CRIU copies every
	// page while the jail is frozen (this kernel has no soft-dirty
	// tracking for incremental dumps), so writing as many bytes into a
	// file beside the snapshots (page cache only, as CRIU's images are
	// written) is what the bigger jail must add at least.
	var copyFloor []time.Duration
	if wantMem > 0 {
		buf := make([]byte, wantMem)
		if _, err := rand.Read(buf); err != nil {
			b.Fatal(err)
		}
		for i := range 5 {
			path := filepath.Join(d.dir, fmt.Sprintf("copy-floor-%d", i))
			start := time.Now()
			if err := os.WriteFile(path, buf, 0o600); err != nil {
				b.Fatal(err)
			}
			copyFloor = append(copyFloor, time.Since(start))
			if err := os.Remove(path); err != nil {
				b.Fatal(err)
			}
		}
	}

	// Branch ×10 from one snapshot, three times.
	var s snapshotInfo
	d.api.want(b, http.StatusCreated, "POST", "/jails/"+j.ID+"/snapshot", map[string]any{}, &s)
	var branch10, firstExec, branchMerge []time.Duration
	var branchPSS, branchPSSFirst int64
	for i := range 3 {
		start := time.Now()
		var out struct {
			Jails []jailInfo `json:"jails"`
		}
		d.api.want(b, http.StatusCreated, "POST", "/snapshots/"+s.ID+"/branch",
			map[string]any{"count": 10, "name_prefix": fmt.Sprintf("%s-b%d", uniqueName(b), i)}, &out)
		branch10 = append(branch10, time.Since(start))
		// A branch is done when it runs commands: the first exec in the
		// last branch made, timed from the branch call's answer.
		start = time.Now()
		if res := d.exec(b, out.Jails[len(out.Jails)-1].ID, execReq{Cmd: []string{"true"}}); res.ExitCode != 0 {
			b.Fatalf("first exec in a branch: %s", &res)
		}
		firstExec = append(firstExec, time.Since(start))
		// What the ten branches hold in memory (PSS: pages shared
		// between them count once in all) when the branch call answers,
		// and once ksmd has gone over them and merged what they hold
		// alike (merged pages stop growing over two of its full scans).
		answered := time.Now()
		branchPSSFirst, _ = branchesMemory(b, out.Jails)
		var merged int64
		scans := ksmFullScans(b)
		for waited := 0; waited < 2 && time.Since(answered) < 2*time.Minute; {
			if err := waitFor(2*time.Minute, func() error {
				if ksmFullScans(b) <= scans {
					return errors.New("ksmd has not finished a scan")
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
			scans = ksmFullScans(b)
			var m int64
			branchPSS, m = branchesMemory(b, out.Jails)
			if m > merged {
				merged, waited = m, 0
				branchMerge = append(branchMerge, time.Since(answered))
				continue
			}
			waited++
		}
		for _, bj := range out.Jails {
			d.destroy(b, bj.ID)
		}
	}
	var branchFloor []time.Duration
	if wantMem > 0 {
		for range 3 {
			branchFloor = append(branchFloor, readPagesTenTimes(b, filepath.Join(d.dir, "snapshots", s.ID)))
		}
	}
	d.api.want(b, http.StatusNoContent, "DELETE", "/snapshots/"+s.ID, nil, nil)

	// Five fs-only snapshots of the (unchanged) jail, and the pool's
	// growth per snapshot.
	const fsRuns = 5
	var fsOnly []time.Duration
	var fsSnaps []string
	poolBefore := poolUsed(b, d)
	for range fsRuns {
		start := time.Now()
		d.api.want(b, http.StatusCreated, "POST", "/jails/"+j.ID+"/snapshot", map[string]any{"mode": "fs"}, &s)
		fsOnly = append(fsOnly, time.Since(start))
		fsSnaps = append(fsSnaps, s.ID)
	}
	poolAfter := poolUsed(b, d)
	for _, id := range fsSnaps {
		d.api.want(b, http.StatusNoContent, "DELETE", "/snapshots/"+id, nil, nil)
	}

	b.ReportMetric(ms(median(snap)), "snapshot-ms")
	b.ReportMetric(ms(median(ref)), "runc-checkpoint-ms")
	b.ReportMetric(float64(median(snap))/float64(median(ref)), "snapshot-x-runc")
	b.ReportMetric(ms(median(frozen)), "frozen-ms")
	if len(copyFloor) > 0 {
		b.ReportMetric(ms(median(copyFloor)), "frozen-copy-floor-ms")
	}
	b.ReportMetric(ms(median(restore)), "restore-ms")
	b.ReportMetric(ms(median(branch10)), "branch10-ms")
	if len(branchFloor) > 0 {
		b.ReportMetric(ms(median(branchFloor)), "branch10-copy-floor-ms")
	}
	b.ReportMetric(ms(median(firstExec)), "branch-first-exec-ms")
	b.ReportMetric(float64(branchPSSFirst)/1024, "branch10-pss-answered-MiB")
	b.ReportMetric(float64(branchPSS)/1024, "branch10-pss-MiB")
	if len(branchMerge) > 0 {
		b.ReportMetric(branchMerge[len(branchMerge)-1].Seconds(), "branch10-merged-s")
	}
	b.ReportMetric(ms(median(fsOnly)), "fs-only-ms")
	b.ReportMetric(float64(poolAfter-poolBefore)/fsRuns/mib, "fs-only-extra-disk-MiB")
	b.ReportMetric(float64(procBytes)/mib, "process-image-MiB")
	// Hundreds of MiB of images were written and deleted: the benchmarks
	// that follow start on a quiet disk.
	syscall.Sync()
}

// readPagesTenTimes reads the memory pages of a process snapshot (CRIU's
// pages-*.img under dir) into ten fresh anonymous mappings at once, as ten
// restores copy them, and returns the wall time.
func readPagesTenTimes(b *testing.B, dir string) time.Duration {
	b.Helper()
	pages, err := filepath.Glob(filepath.Join(dir, "*", "pages-*.img"))
	if err != nil || len(pages) == 0 {
		b.Fatalf("no pages images under %s: %v", dir, err)
	}
	var size int64
	sizes := make([]int, len(pages))
	for i, p := range pages {
		fi, err := os.Stat(p)
		if err != nil {
			b.Fatal(err)
		}
		sizes[i] = int(fi.Size())
		size += fi.Size()
	}
	errs := make(chan error, 10)
	start := time.Now()
	for range 10 {
		go func() {
			mem, err := syscall.Mmap(-1, 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
			if err != nil {
				errs <- err
				return
			}
			defer syscall.Munmap(mem)
			off := 0
			for i, p := range pages {
				f, err := os.Open(p)
				if err != nil {
					errs <- err
					return
				}
				_, err = io.ReadFull(f, mem[off:off+sizes[i]])
				f.Close()
				if err != nil {
					errs <- err
					return
				}
				off += sizes[i]
			}
			errs <- nil
		}()
	}
	for range 10 {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start)
}

// branchesMemory sums the PSS (KiB) of the processes of jails, and their
// pages merged by ksmd.
func branchesMemory(b *testing.B, jails []jailInfo) (pssKiB, merged int64) {
	b.Helper()
	for _, j := range jails {
		kib, m, err := jailMemory(j.ID)
		if err != nil {
			b.Fatal(err)
		}
		pssKiB += kib
		merged += m
	}
	return pssKiB, merged
}

// ksmFullScans is how many times ksmd went over all mergeable memory.
func ksmFullScans(b *testing.B) int64 {
	b.Helper()
	data, err := os.ReadFile("/sys/kernel/mm/ksm/full_scans")
	if err != nil {
		b.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// poolUsed is the storage pool's used bytes (statfs of DATA_DIR/pool).
func poolUsed(b *testing.B, d *daemon) int64 {
	b.Helper()
	syscall.Sync() // btrfs accounts written blocks lazily
	var st syscall.Statfs_t
	if err := syscall.Statfs(filepath.Join(d.dir, "pool"), &st); err != nil {
		b.Fatal(err)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize
}

func BenchmarkSnapshotSmallJail(b *testing.B) { benchSnapshot(b, "", 0) }

func BenchmarkSnapshot256MBJail(b *testing.B) { benchSnapshot(b, randomResident(256), 256<<20) }

func BenchmarkSnapshot1GBJail(b *testing.B) { benchSnapshot(b, randomResident(1024), 1<<30) }

// randomResident starts a python process holding mib MiB of random bytes.
func randomResident(mib int) string {
	return fmt.Sprintf(`setsid -f python3 -c 'import os, time; b=os.urandom(%d<<20); time.sleep(3600)' >/dev/null 2>&1 </dev/null`, mib)
}

// BenchmarkSnapshotTransfer moves a small jail's snapshot (a counter loop
// and a 3 MB file of random bytes on a 1 GiB disk) through an OCI
// registry on loopback: each iteration takes a full snapshot (the
// reference), pushes it, pulls it back as a new snapshot and restores
// that. ms is push + pull, the cost of moving a snapshot to another node
// beside the cost of taking it.
func BenchmarkSnapshotTransfer(b *testing.B) {
	reg := imagetest.NewRegistry(b)
	d := newDaemon(b, "--insecure-registry", reg.Host)
	j := d.createJail(b, nil)
	if res := d.shAs(b, j.ID, "", counterScript+"; head -c 3000000 /dev/urandom > /workspace/blob"); res.ExitCode != 0 {
		b.Fatalf("counter: %s", &res)
	}
	d.waitCounting(b, j.ID, 0)
	var snap, push, pull, move, restore []time.Duration
	var bytes int64
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		var s snapshotInfo
		d.api.want(b, http.StatusCreated, "POST", "/jails/"+j.ID+"/snapshot", map[string]any{}, &s)
		snap = append(snap, time.Since(start))
		start = time.Now()
		var p snapshotPush
		d.api.want(b, http.StatusOK, "POST", "/snapshots/"+s.ID+"/push", map[string]any{"ref": fmt.Sprintf("%s/bench/snap:%d", reg.Host, i)}, &p)
		push = append(push, time.Since(start))
		bytes = p.Bytes
		start = time.Now()
		var pulled snapshotInfo
		d.api.want(b, http.StatusCreated, "POST", "/snapshots/pull", map[string]any{"ref": p.Ref}, &pulled)
		pull = append(pull, time.Since(start))
		move = append(move, push[len(push)-1]+pull[len(pull)-1])
		start = time.Now()
		var r jailInfo
		d.api.want(b, http.StatusCreated, "POST", "/snapshots/"+pulled.ID+"/restore", map[string]any{}, &r)
		restore = append(restore, time.Since(start))
		b.StopTimer()
		d.destroy(b, r.ID)
		for _, sid := range []string{s.ID, pulled.ID} {
			d.api.want(b, http.StatusNoContent, "DELETE", "/snapshots/"+sid, nil, nil)
		}
		b.StartTimer()
	}
	b.StopTimer()
	// No target: the reference is what it is set beside.
	b.ReportMetric(ms(median(move)), "ms")
	b.ReportMetric(ms(median(snap)), "ref-ms")
	b.ReportMetric(float64(median(move))/float64(median(snap)), "x-ref")
	b.ReportMetric(ms(median(push)), "push-ms")
	b.ReportMetric(ms(median(pull)), "pull-ms")
	b.ReportMetric(ms(median(restore)), "restore-pulled-ms")
	b.ReportMetric(float64(bytes)/1e6, "artifact-MB")
}
