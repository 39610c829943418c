package initclient_test

import (
	"syscall"
	"testing"
)

// bareForkExec runs path with no arguments and waits for it.
func bareForkExec(t *testing.T, path string) {
	pid, err := syscall.ForkExec(path, []string{path}, &syscall.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil {
		t.Fatal(err)
	}
}
