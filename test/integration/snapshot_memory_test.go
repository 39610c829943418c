package integration

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/testenv"
)

// holderScript starts a python process in a jail holding 64 MiB of random
// bytes (no two pages alike, so only pages alike across jails can merge).
// It writes "PID N SHA256" of the bytes to /workspace/sum at start and at
// each SIGUSR2 (N counts the writes); SIGUSR1 first overwrites the first
// page.
const holderScript = `cat >/workspace/holder.py <<'EOF'
import hashlib, os, signal
b = bytearray(os.urandom(64 << 20))
n = 0
def dump(*_):
    global n
    n += 1
    with open('/workspace/sum.tmp', 'w') as f:
        f.write('%d %d %s' % (os.getpid(), n, hashlib.sha256(b).hexdigest()))
    os.rename('/workspace/sum.tmp', '/workspace/sum')
def write(*_):
    b[0:4096] = b'w' * 4096
    dump()
signal.signal(signal.SIGUSR1, write)
signal.signal(signal.SIGUSR2, dump)
dump()
while True:
    signal.pause()
EOF
setsid -f python3 /workspace/holder.py >/dev/null 2>&1 </dev/null`

// holderPages is the holder's buffer in pages.
const holderPages = 64 << 20 / 4096

// holderSum is what a jail's holder last wrote to /workspace/sum.
type holderSum struct {
	pid, n int
	sum    string
}

func (d *daemon) readHolder(t *testing.T, id string) (holderSum, error) {
	t.Helper()
	out := d.shAs(t, id, "root", "cat /workspace/sum")
	f := strings.Fields(out.Stdout)
	if out.ExitCode != 0 || len(f) != 3 {
		return holderSum{}, fmt.Errorf("jail %s: /workspace/sum: %q", id, out.Stdout)
	}
	pid, _ := strconv.Atoi(f[0])
	n, _ := strconv.Atoi(f[1])
	return holderSum{pid: pid, n: n, sum: f[2]}, nil
}

// signalHolder sends sig to the jail's holder and returns what it wrote
// then.
func (d *daemon) signalHolder(t *testing.T, id, sig string) holderSum {
	t.Helper()
	before, err := d.readHolder(t, id)
	if err != nil {
		t.Fatal(err)
	}
	if res := d.shAs(t, id, "root", fmt.Sprintf("kill -%s %d", sig, before.pid)); res.ExitCode != 0 {
		t.Fatalf("kill -%s in %s: %s", sig, id, &res)
	}
	var after holderSum
	if err := waitFor(30*time.Second, func() error {
		if after, err = d.readHolder(t, id); err != nil {
			return err
		}
		if after.n == before.n {
			return fmt.Errorf("jail %s: the holder did not answer SIG%s", id, sig)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return after
}

// ksmStat reads a field of /proc/PID/ksm_stat ("ksm_merging_pages",
// "ksm_merge_any").
func ksmStat(pid int, field string) (string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/ksm_stat", pid))
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			return strings.TrimSpace(strings.TrimPrefix(rest, ":")), nil
		}
	}
	return "", fmt.Errorf("no %s in /proc/%d/ksm_stat", field, pid)
}

// jailMemory sums, over the processes of a jail, their PSS (KiB) and
// their pages merged by ksmd.
func jailMemory(id string) (pssKiB, merged int64, err error) {
	pids, err := pidsInCgroupOf("memory", id)
	if err != nil {
		return 0, 0, err
	}
	for _, pid := range pids {
		kib, err := rollupKiB(pid, "Pss")
		if err != nil {
			continue // gone meanwhile
		}
		pssKiB += kib
		if v, err := ksmStat(pid, "ksm_merging_pages"); err == nil {
			n, _ := strconv.ParseInt(v, 10, 64)
			merged += n
		}
	}
	return pssKiB, merged, nil
}

func needKSM(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/sys/kernel/mm/ksm/run"); err != nil {
		testenv.Need(t, "the kernel's same-page merging (CONFIG_KSM): "+err.Error())
	}
}

// Branches of a jail share the memory they hold alike, copy-on-write: a
// page one branch writes becomes its own, the others (and the original)
// keep what the snapshot held. The original jail's memory is not open to
// merging. Sharing is the daemon's choice (--share-branch-memory).
func TestSnapshotBranchesShareMemory(t *testing.T) {
	d := newDaemon(t, "--share-branch-memory")
	needKSM(t)
	j := d.createJail(t, map[string]any{"isolation": map[string]any{"resources": map[string]any{"memory_bytes": 512 << 20}}})
	if res := d.shAs(t, j.ID, "", holderScript); res.ExitCode != 0 {
		t.Fatalf("starting the holder: %s", &res)
	}
	var orig holderSum
	if err := waitFor(time.Minute, func() (err error) { orig, err = d.readHolder(t, j.ID); return err }); err != nil {
		t.Fatal(err)
	}
	snap := d.takeSnapshot(t, j.ID, "full")
	branches := d.branch(t, snap.ID, 3)

	// Each branch's holder shares (almost) all its buffer once ksmd went
	// over it, and the three hold it about once between them.
	var pss int64
	if err := waitFor(2*time.Minute, func() error {
		pss = 0
		for _, b := range branches {
			kib, merged, err := jailMemory(b.ID)
			if err != nil {
				return err
			}
			if merged < holderPages*9/10 {
				return fmt.Errorf("branch %s: %d of its %d buffer pages merged", b.ID, merged, holderPages)
			}
			pss += kib
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if private := int64(3 * 64 << 10); pss > private*2/3 {
		t.Errorf("three branches of a 64 MiB holder: PSS %d KiB; private copies would be %d KiB", pss, private)
	}
	t.Logf("PSS of three branches of a 64 MiB holder once merged: %d KiB", pss)

	// The original's memory was never open to merging.
	pids, err := pidsInCgroupOf("memory", j.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if v, err := ksmStat(pid, "ksm_merge_any"); err == nil && v != "no" {
			t.Errorf("pid %d of the original jail: ksm_merge_any %s", pid, v)
		}
	}

	// Copy-on-write: a write in one branch is its own.
	if w := d.signalHolder(t, branches[0].ID, "USR1"); w.sum == orig.sum {
		t.Fatalf("branch %s wrote its first page, and its bytes did not change", branches[0].ID)
	}
	for _, id := range []string{branches[1].ID, branches[2].ID, j.ID} {
		if got := d.signalHolder(t, id, "USR2"); got.sum != orig.sum {
			t.Errorf("jail %s: bytes %s after another branch wrote, want the snapshot's %s", id, got.sum, orig.sum)
		}
	}
}

// By default a restored jail's memory stays its own: no page of it is open
// to the kernel's same-page merging, which would let another restored jail
// tell by timing whether it holds a page.
func TestSnapshotPrivateBranchMemory(t *testing.T) {
	d := shared(t)
	needKSM(t)
	j := d.createJail(t, nil)
	if res := d.shAs(t, j.ID, "", counterScript); res.ExitCode != 0 {
		t.Fatalf("counter: %s", &res)
	}
	d.waitCounting(t, j.ID, 0)
	r := d.restoreSnapshot(t, d.takeSnapshot(t, j.ID, "full").ID)
	pids, err := pidsInCgroupOf("memory", r.ID)
	if err != nil || len(pids) == 0 {
		t.Fatalf("processes of the restored jail: %v %v", pids, err)
	}
	for _, pid := range pids {
		if v, err := ksmStat(pid, "ksm_merge_any"); err != nil || v != "no" {
			t.Errorf("pid %d of the restored jail: ksm_merge_any %q (%v), want no", pid, v, err)
		}
	}
}
