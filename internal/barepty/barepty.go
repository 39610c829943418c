// Package barepty runs a command on a pseudo-terminal of its own and reads
// the terminal's output as fast as it comes, with nothing else on the path:
// the floor that the terminal benchmarks measure agentjail's sessions
// against (same command, same kernel terminal, no session, recording or
// connection).
package barepty

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Run starts argv on a new terminal (its controlling terminal, as a
// session's command has), reads everything it writes there until every
// holder closed the terminal, waits for it, and returns the bytes read and
// the time from start to the last byte.
func Run(argv []string) (int64, time.Duration, error) {
	m, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, 0, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	master := os.NewFile(uintptr(m), "ptmx")
	defer master.Close()
	if err := unix.IoctlSetPointerInt(m, unix.TIOCSPTLCK, 0); err != nil {
		return 0, 0, fmt.Errorf("unlock terminal: %w", err)
	}
	sfd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(m), unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
	if errno != 0 {
		return 0, 0, fmt.Errorf("open terminal: %w", errno)
	}
	slave := os.NewFile(sfd, "pts")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	start := time.Now()
	err = cmd.Start()
	slave.Close()
	if err != nil {
		return 0, 0, err
	}
	buf := make([]byte, 32<<10)
	var n int64
	for {
		k, err := master.Read(buf)
		n += int64(k)
		if err != nil {
			break // EIO: the command and its children closed the terminal
		}
	}
	elapsed := time.Since(start)
	if err := cmd.Wait(); err != nil {
		return n, elapsed, fmt.Errorf("%s: %w", argv[0], err)
	}
	return n, elapsed, nil
}
