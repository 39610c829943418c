package atomicfile

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/testenv"
)

// helperEnv makes the test binary write one file with WriteFile and exit,
// so that strace can watch the system calls of exactly that.
const helperEnv = "AGENTJAIL_ATOMICFILE_HELPER"

func TestMain(m *testing.M) {
	if path := os.Getenv(helperEnv); path != "" {
		if err := WriteFile(path, []byte("new"), 0o640); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// entries lists dir's names.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestWriteFileReplacesWithExactMode(t *testing.T) {
	old := unix.Umask(0o077)
	defer unix.Umask(old)
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	if err := os.WriteFile(path, []byte("old content"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(path, []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil || string(got) != "new" {
		t.Fatalf("content %q, %v", got, err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v, %v (umask 077 must not apply)", st.Mode(), err)
	}
	if names := entries(t, dir); len(names) != 1 {
		t.Fatalf("directory holds %v, want only state.json", names)
	}
}

func TestFailureLeavesTargetAndNoTemporary(t *testing.T) {
	dir := t.TempDir()
	// The target is a non-empty directory: the rename fails after the
	// temporary file was written and synced.
	target := filepath.Join(dir, "busy")
	if err := os.MkdirAll(filepath.Join(target, "child"), 0o700); err != nil {
		t.Fatal(err)
	}
	err := WriteFile(target, []byte("x"), 0o600)
	if err == nil || !strings.Contains(err.Error(), target) {
		t.Fatalf("err = %v, want an error naming %s", err, target)
	}
	if !errors.Is(err, syscall.EEXIST) && !errors.Is(err, syscall.EISDIR) && !errors.Is(err, syscall.ENOTEMPTY) {
		t.Fatalf("err = %v, want the rename's errno", err)
	}
	if names := entries(t, dir); len(names) != 1 || names[0] != "busy" {
		t.Fatalf("directory holds %v after a failed write", names)
	}
	// A missing directory: nothing is made.
	if err := WriteFile(filepath.Join(dir, "missing", "f"), nil, 0o600); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err = %v, want ErrNotExist", err)
	}
}

func TestCreateAbortAndCommitOnce(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rec.cast")
	f, err := Create(path, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("partial"); err != nil {
		t.Fatal(err)
	}
	f.Abort()
	f.Abort()
	if err := f.Commit(); err == nil {
		t.Fatal("Commit after Abort succeeded")
	}
	if names := entries(t, dir); len(names) != 0 {
		t.Fatalf("an aborted file left %v", names)
	}
	f, err = Create(path, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Abort() // a no-op once committed
	if _, err := f.WriteString("whole"); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); got != nil {
		t.Fatalf("the target exists before Commit: %q", got)
	}
	if err := f.Commit(); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != "whole" {
		t.Fatalf("after Commit: %q", got)
	}
}

func TestRenameMovesAndSyncs(t *testing.T) {
	dir := t.TempDir()
	from, to := filepath.Join(dir, "x.part"), filepath.Join(dir, "x")
	if err := os.WriteFile(from, []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Rename(from, to); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(to); err != nil || string(got) != "data" {
		t.Fatalf("%q, %v", got, err)
	}
	if err := Rename(from, to); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("renaming a missing file: %v", err)
	}
}

// TestDiskFullKeepsTheOldFile fills a small tmpfs: the write fails with
// ENOSPC, the old content stays whole and no temporary file is left.
func TestDiskFullKeepsTheOldFile(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	path := filepath.Join(dir, "jail.json")
	if err := WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := WriteFile(path, bytes.Repeat([]byte("x"), 256<<10), 0o600)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("err = %v, want ENOSPC", err)
	}
	if got, err := os.ReadFile(path); err != nil || string(got) != "old" {
		t.Fatalf("old file after a failed write: %q, %v", got, err)
	}
	if names := entries(t, dir); len(names) != 1 {
		t.Fatalf("directory holds %v", names)
	}
}

// TestWriteFileSyncsFileThenDirectory watches a write with strace: the
// temporary file is synced before the rename, its directory after it.
func TestWriteFileSyncsFileThenDirectory(t *testing.T) {
	strace := testenv.RequireTool(t, "strace")
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	cmd := exec.Command(strace, "-f", "-qq", "-e", "trace=fsync,fdatasync,rename,renameat,renameat2,openat", os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"="+path)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// Map descriptors to what they name, then read the order of events.
	openRE := regexp.MustCompile(`openat\(AT_FDCWD, "([^"]+)".*= (\d+)$`)
	syncRE := regexp.MustCompile(`f(?:data)?sync\((\d+)\)\s+= 0`)
	fds := map[string]string{}
	var order []string
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(line)
		if i := strings.Index(line, "] "); strings.HasPrefix(line, "[pid") && i > 0 {
			line = line[i+2:]
		}
		switch {
		case openRE.MatchString(line):
			m := openRE.FindStringSubmatch(line)
			fds[m[2]] = m[1]
		case syncRE.MatchString(line):
			fd := syncRE.FindStringSubmatch(line)[1]
			switch name := fds[fd]; {
			case name == dir:
				order = append(order, "sync dir")
			case strings.HasPrefix(filepath.Base(name), ".f.tmp-"):
				order = append(order, "sync file")
			}
		case strings.HasPrefix(line, "rename") && strings.Contains(line, `"`+path+`"`):
			order = append(order, "rename")
		}
	}
	if got := strings.Join(order, ", "); got != "sync file, rename, sync dir" {
		t.Fatalf("order %q, want the file synced, renamed, then its directory synced\n%s", got, out)
	}
}

func TestRefresh(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.json")
	ino := func() uint64 {
		t.Helper()
		st, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		return st.Sys().(*syscall.Stat_t).Ino
	}
	check := func(want string, mode os.FileMode) {
		t.Helper()
		st, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want || st.Mode() != mode {
			t.Fatalf("%s holds %q with mode %v, want %q with %v", path, got, st.Mode(), want, mode)
		}
		if names := entries(t, dir); len(names) != 1 {
			t.Fatalf("%s holds %q, want the file alone", dir, names)
		}
	}
	if err := Refresh(path, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	check("one", 0o600)
	first := ino()
	// The same content again leaves the file alone.
	if err := Refresh(path, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if ino() != first {
		t.Error("refreshing a file with the content it holds replaced it")
	}
	for _, c := range []struct {
		data string
		mode os.FileMode
	}{{"two", 0o600}, {"twoo", 0o600}, {"twoo", 0o644}} {
		before := ino()
		if err := Refresh(path, []byte(c.data), c.mode); err != nil {
			t.Fatal(err)
		}
		check(c.data, c.mode)
		if ino() == before {
			t.Errorf("%q with mode %v was written in place, not replaced", c.data, c.mode)
		}
	}
	// A link to a file holding the content is replaced, not followed.
	other := filepath.Join(t.TempDir(), "other")
	if err := os.WriteFile(other, []byte("three"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(other, path); err != nil {
		t.Fatal(err)
	}
	if err := Refresh(path, []byte("three"), 0o600); err != nil {
		t.Fatal(err)
	}
	check("three", 0o600)
	// A FIFO in its place is replaced without blocking on it.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Refresh(path, []byte("four"), 0o600); err != nil {
		t.Fatal(err)
	}
	check("four", 0o600)
	if err := Refresh(filepath.Join(dir, "missing", "x"), []byte("x"), 0o600); err == nil {
		t.Error("refreshing a file in a missing directory succeeded")
	}
}

func TestSync(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := Refresh(path, []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Sync(path); err != nil {
		t.Fatalf("sync of a written file: %v", err)
	}
	if err := Sync(path + ".missing"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("sync of a missing file: %v, want ErrNotExist", err)
	}
}
