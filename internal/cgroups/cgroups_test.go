package cgroups

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/testenv"
)

// helperEnv makes the test binary act as a memory hog: it prints "ready",
// waits for a line on stdin, then allocates and touches memory until killed.
const helperEnv = "AGENTJAIL_CGROUPS_TEST_HOG"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		hog()
		return
	}
	os.Exit(m.Run())
}

func hog() {
	in := bufio.NewReader(os.Stdin)
	var keep [][]byte
	grow := func(mib int) {
		for range mib {
			b := make([]byte, 1<<20)
			for j := 0; j < len(b); j += 4096 {
				b[j] = 1
			}
			keep = append(keep, b)
		}
	}
	fmt.Println("ready")
	in.ReadString('\n')
	grow(8)
	fmt.Println("grown")
	in.ReadString('\n')
	grow(1024)
	fmt.Println("survived", len(keep))
}

// testCgroup creates path in the hierarchies of memory, pids and CPU
// accounting and in the unified one, as runc would, and returns the
// directories made.
func testCgroup(t *testing.T, path string) []string {
	t.Helper()
	var made []string
	add := func(d string) {
		if d == "" {
			return
		}
		for _, m := range made {
			if m == d {
				return
			}
		}
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		made = append(made, d)
	}
	for _, c := range []string{"memory", "pids", "cpuacct"} {
		d, _ := dirOf(c, path)
		add(d)
	}
	add(UnifiedDir(path))
	t.Cleanup(func() {
		for _, d := range made {
			unix.Rmdir(d)
		}
	})
	return made
}

func write(t *testing.T, dir, file, val string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, file), []byte(val), 0o644); err != nil {
		t.Fatalf("write %s/%s: %v", dir, file, err)
	}
}

func TestModeMatchesMounts(t *testing.T) {
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err != nil {
		testenv.Need(t, "/sys/fs/cgroup")
	}
	want := "v1"
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		want = "v2"
	} else if err := unix.Statfs("/sys/fs/cgroup/unified", &st); err == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		want = "hybrid"
	}
	if got := Mode(); got != want {
		t.Fatalf("Mode() = %q, want %q", got, want)
	}
	t.Logf("mode %s, swap accounting %v", Mode(), SwapAccounting())
}

func TestReadLimitsAndOOM(t *testing.T) {
	testenv.RequireRoot(t)
	path := fmt.Sprintf("/agentjail-test-%d", os.Getpid())
	dirs := testCgroup(t, path)
	const memLimit = 48 << 20

	memDir, memV2 := dirOf("memory", path)
	if memV2 {
		write(t, memDir, "memory.max", strconv.Itoa(memLimit))
		if fileExists(filepath.Join(memDir, "memory.swap.max")) {
			write(t, memDir, "memory.swap.max", "0")
		}
	} else {
		write(t, memDir, "memory.limit_in_bytes", strconv.Itoa(memLimit))
		if SwapAccounting() {
			write(t, memDir, "memory.memsw.limit_in_bytes", strconv.Itoa(memLimit))
		}
		write(t, memDir, "memory.swappiness", "0")
	}
	pidsDir, _ := dirOf("pids", path)
	write(t, pidsDir, "pids.max", "64")

	if _, err := Read("/agentjail-test-missing"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Read of a missing cgroup: %v, want ErrNotFound", err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := false
	t.Cleanup(func() {
		if !waited {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	out := bufio.NewReader(stdout)
	if line, err := out.ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("helper: %q %v", line, err)
	}
	for _, d := range dirs {
		write(t, d, "cgroup.procs", strconv.Itoa(cmd.Process.Pid))
	}

	// Memory is charged from here on: let the helper take 8 MiB.
	if _, err := io.WriteString(stdin, "grow\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := out.ReadString('\n'); err != nil || line != "grown\n" {
		t.Fatalf("helper: %q %v", line, err)
	}
	s, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if s.MemoryLimitBytes != memLimit || s.PidsLimit != 64 || s.Pids == 0 || s.MemoryBytes < 8<<20 || s.OOMKills != 0 {
		t.Fatalf("stats before the hog runs: %+v", s)
	}

	id, err := ID(path)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(UnifiedDir(path), &st); err != nil || st.Ino != id {
		t.Fatalf("ID %d, inode %d (%v)", id, st.Ino, err)
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", cmd.Process.Pid)); err != nil || !strings.Contains(string(b), "0::"+path+"\n") {
		t.Fatalf("helper's cgroups: %s %v", b, err)
	}

	if err := Remove(path); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("Remove with a process inside: %v, want ErrConflict", err)
	}
	// Read before the kill, through the file OOMKills keeps open: the
	// count read after it through the same file must be the new one.
	if n, err := OOMKills(path); err != nil || n != 0 {
		t.Fatalf("OOMKills before the hog runs = %d, %v; want 0", n, err)
	}

	// Let the hog run into the limit.
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(out)
	err = cmd.Wait()
	waited = true
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("hog ended with %v (%q), want SIGKILL", err, rest)
	}
	s, err = Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if s.OOMKills == 0 || s.CPUTimeNs == 0 || s.Pids != 0 {
		t.Fatalf("stats after the OOM kill: %+v", s)
	}
	if n, err := OOMKills(path); err != nil || n != s.OOMKills {
		t.Fatalf("OOMKills = %d, %v; Read says %d", n, err, s.OOMKills)
	}

	if n := keptOOMFiles(t, memDir); n != 1 {
		t.Fatalf("%d files kept open for OOMKills, want 1", n)
	}
	if err := Remove(path); err != nil {
		t.Fatal(err)
	}
	if d := Dirs(path); len(d) != 0 {
		t.Fatalf("left after Remove: %v", d)
	}
	if n := keptOOMFiles(t, memDir); n != 0 {
		t.Fatalf("%d files of the removed cgroup still open", n)
	}
	if err := Remove(path); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
	if _, err := ID(path); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("ID after Remove: %v, want ErrNotFound", err)
	}
}

func TestRemoveNested(t *testing.T) {
	testenv.RequireRoot(t)
	path := fmt.Sprintf("/agentjail-test-nested-%d", os.Getpid())
	dirs := testCgroup(t, path)
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(d, "a", "b"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if got := Dirs(path); len(got) < len(dirs) {
		t.Fatalf("Dirs = %v, want at least %v", got, dirs)
	}
	if err := Remove(path); err != nil {
		t.Fatal(err)
	}
	if d := Dirs(path); len(d) != 0 {
		t.Fatalf("left after Remove: %v", d)
	}
}

func TestUnlimitedIsReported(t *testing.T) {
	testenv.RequireRoot(t)
	path := fmt.Sprintf("/agentjail-test-unlimited-%d", os.Getpid())
	testCgroup(t, path)
	s, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if s.MemoryLimitBytes != Unlimited || s.PidsLimit != Unlimited {
		t.Fatalf("limits of a fresh cgroup: %+v, want Unlimited", s)
	}
	if err := Remove(path); err != nil {
		t.Fatal(err)
	}
}

// TestOOMKillsKeptFile: the file OOMKills keeps open follows its cgroup
// being removed and made again under it (as the runtime does when a jail
// restarts), and CloseFiles closes it.
func TestOOMKillsKeptFile(t *testing.T) {
	testenv.RequireRoot(t)
	path := fmt.Sprintf("/agentjail-test-kept-%d", os.Getpid())
	memDir, _ := dirOf("memory", path)
	for range 2 {
		dirs := testCgroup(t, path)
		for range 3 {
			if n, err := OOMKills(path); err != nil || n != 0 {
				t.Fatalf("OOMKills = %d, %v", n, err)
			}
		}
		if n := keptOOMFiles(t, memDir); n != 1 {
			t.Fatalf("%d files kept open for OOMKills, want 1", n)
		}
		for _, d := range dirs {
			if err := unix.Rmdir(d); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := OOMKills(path); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("OOMKills of a removed cgroup: %v, want ErrNotFound", err)
	}
	if n := keptOOMFiles(t, memDir); n != 0 {
		t.Fatalf("%d files kept open for a removed cgroup", n)
	}
	testCgroup(t, path)
	if _, err := OOMKills(path); err != nil {
		t.Fatal(err)
	}
	CloseFiles(path)
	if n := keptOOMFiles(t, memDir); n != 0 {
		t.Fatalf("%d files kept open after CloseFiles", n)
	}
}

// keptOOMFiles counts this process's descriptors open on an OOM file in
// dir (a removed file's link ends in " (deleted)").
func keptOOMFiles(t *testing.T, dir string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err == nil && strings.HasPrefix(l, dir+"/memory.") {
			n++
		}
	}
	return n
}
