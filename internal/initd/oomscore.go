package initd

import (
	"bytes"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// oomScore is the shim's own oom_score_adj, raised to the commands' score
// (initproto.CommandOOMScoreAdj) while the shim forks one, so that the
// command has it from its first instruction: a score written after the
// exec would miss whatever the command read or started before it.
//
// Any process may raise its score and lower it again down to the least a
// privileged writer gave it (the kernel's oom_score_adj_min); the runtime
// set the shim's own score with that privilege, so the shim can return to
// it. A nil *oomScore leaves scores as they are.
type oomScore struct {
	fd          int
	raised, own []byte
}

// openOOMScore opens the shim's score, to be raised to adj around each
// fork, and checks that the shim can return from adj to its own score.
func openOOMScore(adj int) (_ *oomScore, err error) {
	fd, err := unix.Open("/proc/self/oom_score_adj", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /proc/self/oom_score_adj: %w", err)
	}
	defer func() {
		if err != nil {
			unix.Close(fd)
		}
	}()
	buf := make([]byte, 16)
	n, err := unix.Pread(fd, buf, 0)
	if err != nil {
		return nil, fmt.Errorf("read /proc/self/oom_score_adj: %w", err)
	}
	o := &oomScore{fd: fd, raised: []byte(strconv.Itoa(adj)), own: bytes.TrimSpace(buf[:n])}
	if err = o.write(o.raised); err != nil {
		return nil, err
	}
	if err = o.write(o.own); err != nil {
		return nil, fmt.Errorf("return to the shim's own score %s: %w", o.own, err)
	}
	return o, nil
}

// raise gives the shim the commands' score.
func (o *oomScore) raise() {
	if o != nil {
		o.report(o.write(o.raised))
	}
}

// restore gives the shim its own score back.
func (o *oomScore) restore() {
	if o != nil {
		o.report(o.write(o.own))
	}
}

func (o *oomScore) write(b []byte) error {
	if _, err := unix.Pwrite(o.fd, b, 0); err != nil {
		return fmt.Errorf("write %s to /proc/self/oom_score_adj: %w", b, err)
	}
	return nil
}

func (o *oomScore) report(err error) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "agentjail shim: %v\n", err)
	}
}
