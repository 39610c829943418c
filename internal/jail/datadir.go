package jail

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/errdefs"
)

// dataDirLock is the file of the data dir a manager holds an exclusive
// flock on for as long as it uses the data dir; it names the holder's pid.
const dataDirLock = "daemon.lock"

// lockDataDir takes dataDir for this process, so that a second daemon (or
// a teardown) on a data dir in use fails before it touches anything there:
// its jails, ready disks and records belong to the first. The lock is the
// kernel's, released however the process ends; Close of the returned file
// releases it sooner.
func lockDataDir(dataDir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dataDir, dataDirLock), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder, _ := io.ReadAll(io.LimitReader(f, 32))
		f.Close()
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("data dir: lock %s: %w", filepath.Join(dataDir, dataDirLock), err)
		}
		who := "another agentjail daemon"
		if pid, err := strconv.Atoi(strings.TrimSpace(string(holder))); err == nil {
			who = fmt.Sprintf("another agentjail daemon (pid %d)", pid)
		}
		return nil, errdefs.Conflictf("data dir %s is in use by %s: stop it first, or give this one a --data-dir of its own", dataDir, who)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}
