package oci

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/errdefs"
)

func TestLifecycle(t *testing.T) {
	e := newJailEnv(t, "ready", nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rt := e.rt

	pid, err := rt.Create(ctx, e.id, e.bundle)
	if err != nil {
		t.Fatal(err)
	}
	status, spid, err := rt.State(ctx, e.id)
	if err != nil || status != "created" || spid != pid {
		t.Fatalf("state after create = %q, %d, %v; want created, %d", status, spid, err, pid)
	}
	// The process exists (and has its cgroup) before init runs.
	if len(cgroupDirs(e.cgroupsPath)) == 0 {
		t.Errorf("no cgroup dirs for %s after create", e.id)
	}
	if _, err := rt.Create(ctx, e.id, e.bundle); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("second create: %v, want conflict", err)
	}
	ids, err := rt.List(ctx)
	if err != nil || !slices.Contains(ids, e.id) {
		t.Errorf("list = %v, %v; want it to contain %s", ids, err, e.id)
	}

	if err := rt.Start(ctx, e.id); err != nil {
		t.Fatal(err)
	}
	if status, _, _ := rt.State(ctx, e.id); status != "running" {
		t.Errorf("state after start = %q", status)
	}
	if err := rt.Start(ctx, e.id); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("second start: %v, want conflict", err)
	}
	if err := rt.Resume(ctx, e.id); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("resume of a running container: %v, want conflict", err)
	}
	if err := rt.Pause(ctx, e.id); err != nil {
		t.Fatal(err)
	}
	if status, _, _ := rt.State(ctx, e.id); status != "paused" {
		t.Errorf("state after pause = %q", status)
	}
	if err := rt.Resume(ctx, e.id); err != nil {
		t.Fatal(err)
	}
	if err := rt.Delete(ctx, e.id, false); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("delete of a running container without force: %v, want conflict", err)
	}

	// SIGTERM: the probe exits on it.
	if err := rt.Kill(ctx, e.id, syscall.SIGTERM, false); err != nil {
		t.Fatal(err)
	}
	e.waitStatus(t, "stopped")
	if _, spid, _ := rt.State(ctx, e.id); spid != 0 {
		t.Errorf("pid of a stopped container = %d, want 0", spid)
	}
	if err := rt.Kill(ctx, e.id, syscall.SIGKILL, false); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("kill of a stopped container: %v, want conflict", err)
	}
	if err := rt.Delete(ctx, e.id, false); err != nil {
		t.Fatal(err)
	}
	if err := rt.Delete(ctx, e.id, false); err != nil {
		t.Errorf("second delete: %v, want nil", err)
	}
	e.assertGone(t)

	for name, err := range map[string]error{
		"kill":   rt.Kill(ctx, e.id, syscall.SIGKILL, true),
		"pause":  rt.Pause(ctx, e.id),
		"resume": rt.Resume(ctx, e.id),
		"start":  rt.Start(ctx, e.id),
	} {
		if !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("%s of an unknown container: %v, want not found", name, err)
		}
	}
}

func TestKillAll(t *testing.T) {
	e := newJailEnv(t, "ready", nil)
	e.start(t)
	ctx := context.Background()
	if err := e.rt.Kill(ctx, e.id, syscall.SIGKILL, true); err != nil {
		t.Fatal(err)
	}
	e.waitStatus(t, "stopped")
}

// TestStartFailures covers the start's failure paths (the container
// process gone before it was released, and the readiness handshake's):
// each leaves nothing behind and reports why.
func TestStartFailures(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mode    string
		kill    bool
		timeout time.Duration
		want    []string
		kind    error
	}{
		{name: "killed", mode: "ready", kill: true, want: []string{"the container process exited before it started"}},
		{mode: "fail", want: []string{"exited before it was ready", "probe: failing on purpose"}},
		{mode: "garbage", want: []string{`init wrote "hello" instead of "ready"`}},
		{mode: "silent", timeout: 300 * time.Millisecond, want: []string{"not ready in time"}, kind: errdefs.ErrTimeout},
	} {
		t.Run(cmp.Or(tc.name, tc.mode), func(t *testing.T) {
			e := newJailEnv(t, tc.mode, nil)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			pid, err := e.rt.Create(ctx, e.id, e.bundle)
			if err != nil {
				t.Fatal(err)
			}
			if tc.kill {
				if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			}
			sctx := ctx
			if tc.timeout > 0 {
				var c context.CancelFunc
				sctx, c = context.WithTimeout(ctx, tc.timeout)
				defer c()
			}
			err = e.rt.Start(sctx, e.id)
			if err == nil {
				t.Fatal("start succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if tc.kind != nil && !errors.Is(err, tc.kind) {
				t.Errorf("error %v is not %v", err, tc.kind)
			}
			e.assertGone(t)
		})
	}
}

// TestCreateFailure: a bundle runc refuses leaves nothing and the error
// carries runc's message.
func TestCreateFailure(t *testing.T) {
	e := newJailEnv(t, "ready", nil)
	e.opts.Rootfs = filepath.Join(e.dir, "no-such-rootfs")
	e.writeSpec(t)
	_, err := e.rt.Create(context.Background(), e.id, e.bundle)
	if err == nil {
		t.Fatal("create succeeded")
	}
	if !strings.Contains(err.Error(), "no-such-rootfs") {
		t.Errorf("error %q does not name the missing rootfs", err)
	}
	e.assertGone(t)
}

func TestStateUnknown(t *testing.T) {
	needRoot(t)
	rt := NewRuntime("runc", t.TempDir())
	ctx := context.Background()
	if _, _, err := rt.State(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("state: %v, want not found", err)
	}
	if err := rt.Delete(ctx, "nope", false); err != nil {
		t.Errorf("delete: %v, want nil", err)
	}
	if ids, err := rt.List(ctx); err != nil || len(ids) != 0 {
		t.Errorf("list = %v, %v; want empty", ids, err)
	}
}

// BenchmarkCreateStart measures Create + Start until the trivial init
// reported ready (deletion is outside the timer).
func BenchmarkCreateStart(b *testing.B) {
	e := newJailEnv(b, "ready-exit", nil)
	ctx := context.Background()
	var create, start, del time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("%s-b%d", e.id, i)
		t0 := time.Now()
		if _, err := e.rt.Create(ctx, id, e.bundle); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := e.rt.Start(ctx, id); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		b.StopTimer()
		if err := e.rt.Delete(ctx, id, true); err != nil {
			b.Fatal(err)
		}
		del += time.Since(t2)
		create += t1.Sub(t0)
		start += t2.Sub(t1)
		b.StartTimer()
	}
	n := float64(b.N) * float64(time.Millisecond)
	b.ReportMetric(float64(create)/n, "create-ms/op")
	b.ReportMetric(float64(start)/n, "start-ms/op")
	b.ReportMetric(float64(del)/n, "delete-ms/op")
}

// BenchmarkRuncRun measures `runc run` of the same bundle, which returns
// once the init exited and the container was deleted.
func BenchmarkRuncRun(b *testing.B) {
	e := newJailEnv(b, "ready-exit", nil)
	root := filepath.Join(e.dir, "runc")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("%s-r%d", e.id, i)
		cmd := exec.Command("runc", "--root", root, "run", "--bundle", e.bundle, id)
		out, err := cmd.CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "ready" {
			b.Fatalf("runc run: %v: %s", err, out)
		}
	}
	b.StopTimer()
	if _, err := os.Stat(filepath.Join(root, e.id)); err == nil {
		b.Fatal("runc run left state behind")
	}
}
