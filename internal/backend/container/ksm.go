package container

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Jails restored from one process checkpoint (a restore, the branches of a
// snapshot) start with the same memory. CRIU gives each restored process
// private pages, so ten branches of a jail with 256 MiB resident hold
// 2.5 GiB. With Options.ShareRestoredMemory the restored processes' memory
// is open to the kernel's same-page merging (KSM): CRIU built by
// scripts/build-criu.sh, given CRIU_MEMORY_MERGE=1, sets
// PR_SET_MEMORY_MERGE on itself before it forks the jail's processes, which
// inherit it (and pass it on to their children and across exec), and ksmd
// merges the pages that restored processes hold alike into one page shared
// copy-on-write: a write gives the writer its own copy again. Memory of
// jails that were never restored is not merged.
//
// Other ways give no sharing: CRIU's lazy restore (userfaultfd) copies
// every page into each process, those it touches on fault and all the
// others right after the restore; mapping the page images copy-on-write
// (MAP_PRIVATE) shares page-cache pages but turns anonymous memory into a
// file mapping, which MADV_DONTNEED refills from the file instead of
// zeroing (allocators and runtimes rely on the zeros) and which a snapshot
// of the branch cannot dump.

const (
	// ksmDir holds the kernel's same-page merging controls.
	ksmDir = "/sys/kernel/mm/ksm"
	// ksmPagesToScan is the least number of pages ksmd scans each time it
	// wakes (every sleep_millisecs, 20 ms by default) while restored
	// memory is shared: 2000 pages (≈ 100 000 pages, 390 MiB, a second)
	// merge ten branches of a 256 MiB jail in ≈ 15 s, where the kernel's
	// default of 100 takes minutes.
	ksmPagesToScan = 2000
	// criuMemoryMerge makes CRIU's restored processes mergeable.
	criuMemoryMerge = "CRIU_MEMORY_MERGE=1"
)

// enableKSM starts ksmd through the controls in dir (ksmDir) and raises
// its scan rate to ksmPagesToScan pages per wake-up if it is lower. Both
// settings are the host's: they stay after the daemon exits, and only
// memory marked mergeable (restored jails', virtual machines' that ask for
// it) is scanned.
func enableKSM(dir string) error {
	run := filepath.Join(dir, "run")
	cur, err := os.ReadFile(run)
	if errors.Is(err, fs.ErrNotExist) {
		return errors.New("this kernel has no same-page merging (CONFIG_KSM)")
	}
	if err != nil {
		return fmt.Errorf("same-page merging: %w", err)
	}
	if strings.TrimSpace(string(cur)) != "1" {
		if err := os.WriteFile(run, []byte("1\n"), 0); err != nil {
			return fmt.Errorf("starting ksmd: %w", err)
		}
	}
	scan := filepath.Join(dir, "pages_to_scan")
	cur, err = os.ReadFile(scan)
	if err != nil {
		return fmt.Errorf("same-page merging: %w", err)
	}
	if n, err := strconv.Atoi(strings.TrimSpace(string(cur))); err != nil || n < ksmPagesToScan {
		if err := os.WriteFile(scan, []byte(strconv.Itoa(ksmPagesToScan)+"\n"), 0); err != nil {
			return fmt.Errorf("ksmd's scan rate: %w", err)
		}
	}
	return nil
}

// restoreEnv returns the environment CRIU runs with for a restore: the
// switch that makes the restored memory mergeable, once ksmd runs, when
// the backend shares restored memory.
func (b *Backend) restoreEnv() []string {
	if !b.opts.ShareRestoredMemory {
		return nil
	}
	b.ksmOnce.Do(func() {
		if err := enableKSM(ksmDir); err != nil {
			b.ksmErr = err
			b.opts.Log.Warn("restored jails will not share their memory", "err", err)
		}
	})
	if b.ksmErr != nil {
		return nil
	}
	return []string{criuMemoryMerge}
}
