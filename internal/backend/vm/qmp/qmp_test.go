package qmp_test

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/backend/vm/qmp"
	"github.com/agentjail/agentjail/internal/testenv"
)

// startQEMU runs a QEMU without a machine (nothing to boot) whose monitor
// listens on the returned socket; it is killed when the test ends.
func startQEMU(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		testenv.Need(t, "qemu-system-x86_64 (make setup)")
	}
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	cmd := exec.Command(bin, "-M", "none", "-nodefaults", "-no-user-config", "-display", "none", "-S",
		"-qmp", "unix:"+sock+",server=on,wait=off")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return sock
}

// dial connects to sock, retrying while QEMU starts listening.
func dial(t *testing.T, ctx context.Context, sock string) *qmp.Conn {
	t.Helper()
	for {
		q, err := qmp.Dial(ctx, sock)
		if err == nil {
			t.Cleanup(func() { q.Close() })
			return q
		}
		if ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestCommands(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q := dial(t, ctx, startQEMU(t))
	st, err := q.Status(ctx)
	if err != nil || st != "prelaunch" {
		t.Fatalf("status of a machine started with -S: %q %v, want prelaunch", st, err)
	}
	// A command QEMU rejects is an *Error naming it.
	err = q.Run(ctx, "no-such-command", nil)
	var qe *qmp.Error
	if !errors.As(err, &qe) || qe.Command != "no-such-command" || qe.Class != "CommandNotFound" {
		t.Errorf("unknown command: %v, want a CommandNotFound *qmp.Error", err)
	}
	// Arguments reach QEMU.
	raw, err := q.Execute(ctx, "qom-get", map[string]any{"path": "/machine", "property": "type"})
	if err != nil || string(raw) != `"none-machine"` {
		t.Errorf("qom-get /machine type: %s %v", raw, err)
	}
	// No migration has run: WaitMigration ends at once neither way but
	// reports the state it found within the deadline.
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	if err := q.WaitMigration(short, 10*time.Millisecond); err == nil {
		t.Errorf("WaitMigration without a migration succeeded")
	}
}

func TestDialRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := qmp.Dial(ctx, filepath.Join(t.TempDir(), "none.sock")); err == nil {
		t.Fatal("Dial of a missing socket succeeded")
	}
}
