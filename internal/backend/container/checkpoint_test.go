package container

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/errdefs"
)

// restoreLog is the end of a CRIU restore log that failed (as CRIU 4.1.1
// writes it), a task of the jail dying during the restore.
const restoreLog = `(00.001456) Error (criu/util.c:1595): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted
(00.001581) Add a helper 43 for restoring SID 43
(00.014183)     43: cg: Cgroups 2 inherited from parent
(00.015084)      1: Error (criu/namespaces.c:258): Can't setns 14/mnt: Invalid argument
(00.015408)      1: Error (criu/cr-restore.c:1262): 43 killed by signal 11: Segmentation fault
(00.015501) Error (criu/cr-restore.c:1700): Can't open core data for 44
(00.017257) Error (criu/cr-restore.c:2320): Restoring FAILED.
(00.017881) Error (criu/cgroup.c:1998): cg: cgroupd: recv req error: No such file or directory
`

func TestRestoreErrorNamesProcesses(t *testing.T) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, "restore.log")
	if err := os.WriteFile(logPath, []byte(restoreLog), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, processesRec), []byte(`{"1":"\"agentjail init\" uid 0","43":"\"sleep 3000\" uid 1000","44":"\"python3 -m http.server\" uid 1000"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	err := restoreError(backend.Instance{Name: "web"}, dir, logPath, errors.New("exit status 1"))
	if !errors.Is(err, errdefs.ErrUnprocessable) {
		t.Fatalf("kind: %v", err)
	}
	msg := err.Error()
	for _, want := range []string{"restore of jail web", "Can't setns 14/mnt: Invalid argument", "43 killed by signal 11", `pid 43 in the jail was "sleep 3000" uid 1000`, `pid 44 in the jail was "python3 -m http.server" uid 1000`} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error lacks %q: %s", want, msg)
		}
	}
	for _, noise := range []string{"RLIMIT_NOFILE", "Restoring FAILED", "cgroupd", "pid 1 "} {
		if strings.Contains(msg, noise) {
			t.Errorf("the error holds %q: %s", noise, msg)
		}
	}

	full := strings.Replace(restoreLog, "Invalid argument", "No space left on device", 1)
	if err := os.WriteFile(logPath, []byte(full), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := restoreError(backend.Instance{Name: "web"}, dir, logPath, errors.New("exit status 1")); !errors.Is(err, errdefs.ErrNoSpace) {
		t.Errorf("a full disk: %v, want ErrNoSpace", err)
	}
}
