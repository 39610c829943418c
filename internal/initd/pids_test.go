package initd_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/testenv"
)

// pidsRoot is the cgroup v1 pids hierarchy.
const pidsRoot = "/sys/fs/cgroup/pids"

// TestPID1FullPidsCgroup runs init in a pids cgroup that has no task to
// spare. Files calls, many at once, are served (init made its threads
// when it started); a command cannot start, and says so as a shell's
// failed fork does, whether init could not fork its shim or the shim
// could not make its threads; once tasks are free again commands run.
func TestPID1FullPidsCgroup(t *testing.T) {
	testenv.RequireRoot(t)
	if _, err := os.Stat(filepath.Join(pidsRoot, "cgroup.procs")); err != nil {
		testenv.Need(t, "the cgroup v1 pids controller at "+pidsRoot)
	}
	p := startPID1(t)
	cg := filepath.Join(pidsRoot, fmt.Sprintf("agentjail-initd-test-%d", os.Getpid()))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Out of the cgroup before it is removed: the namespace may
		// outlive the test's own cleanup order.
		_ = os.WriteFile(filepath.Join(pidsRoot, "cgroup.procs"), []byte(strconv.Itoa(p.pid)), 0)
		_ = os.Remove(cg)
	})
	write := func(file, v string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(cg, file), []byte(v), 0); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	current := func() int {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(cg, "pids.current"))
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return n
	}
	write("cgroup.procs", strconv.Itoa(p.pid))
	ctx := context.Background()

	refused := func(what string) {
		t.Helper()
		var stderr bytes.Buffer
		st, err := p.c.Exec(ctx, initproto.ExecRequest{Argv: []string{"true"}}, nil, io.Discard, &stderr)
		if err != nil {
			t.Fatalf("%s: exec: %v (init's log: %s)", what, err, readFile(filepath.Join(p.ctl, initproto.LogName)))
		}
		if st.Code != 126 || !strings.Contains(stderr.String(), "resource temporarily unavailable") {
			t.Errorf("%s: exit %+v, stderr %q; want 126 and EAGAIN's message", what, st, stderr.String())
		}
	}
	// One task free: init forks the shim, which cannot make a thread.
	write("pids.max", strconv.Itoa(current()+1))
	refused("one task free")
	if log := readFile(filepath.Join(p.ctl, initproto.LogName)); !strings.Contains(log, "could not make its threads") {
		t.Errorf("init's log does not say why the shim could not start:\n%s", log)
	}
	// None free: the fork itself fails.
	write("pids.max", strconv.Itoa(current()))
	refused("no task free")

	data := bytes.Repeat([]byte("agentjail"), 1<<17)
	var wg sync.WaitGroup
	errs := make(chan error, 48)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("/tmp/agentjail-initd-full-%d-%d", os.Getpid(), i)
			defer os.Remove(name)
			if _, err := p.c.WriteFile(ctx, name, bytes.NewReader(data), initproto.WriteOptions{}); err != nil {
				errs <- fmt.Errorf("write %s: %w", name, err)
				return
			}
			_, r, err := p.c.ReadFile(ctx, name)
			if err != nil {
				errs <- fmt.Errorf("read %s: %w", name, err)
				return
			}
			got, err := io.ReadAll(r)
			r.Close()
			if err != nil || !bytes.Equal(got, data) {
				errs <- fmt.Errorf("read %s back: %d bytes, %v", name, len(got), err)
			}
			if _, err := p.c.ReadDir(ctx, "/usr/bin"); err != nil {
				errs <- fmt.Errorf("list /usr/bin: %w", err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	failed := false
	for err := range errs {
		t.Errorf("in a full cgroup: %v", err)
		failed = true
	}
	if failed {
		t.Fatalf("init's log:\n%s", readFile(filepath.Join(p.ctl, initproto.LogName)))
	}

	write("pids.max", "max")
	var stdout bytes.Buffer
	st, err := p.c.Exec(ctx, initproto.ExecRequest{Argv: []string{"echo", "again"}}, nil, &stdout, io.Discard)
	if err != nil || st.Code != 0 || stdout.String() != "again\n" {
		t.Fatalf("after the cgroup had room again: %+v %q %v (init's log: %s)", st, stdout.String(), err, readFile(filepath.Join(p.ctl, initproto.LogName)))
	}
}
