package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// loopMu serialises loop allocation within the daemon: LOOP_CTL_GET_FREE
// hands the same free device to callers that race, so only one of them could
// bind it. Other processes racing for the device are handled by retrying.
var loopMu sync.Mutex

// maxLoopAttempts bounds the retries when other processes keep taking the
// free loop device before it is bound.
const maxLoopAttempts = 64

// attachLoop binds a free loop device to the open file backing and returns
// the device path and an open descriptor of it. The device carries
// LO_FLAGS_AUTOCLEAR: it is unbound when its last user (the returned
// descriptor, or a mount made from it) goes away, so the caller mounts it
// and then closes the descriptor; closing without mounting releases it.
//
// It also asks for direct I/O (LO_FLAGS_DIRECT_IO; the kernel falls back
// to buffered I/O where the backing file cannot do it): without it, what a
// jail writes is cached once by its filesystem, in its memory cgroup, and
// again as the backing file's page cache (and a third time for the pool's
// own image), outside any jail's limits, with the copies done by the
// kernel's threads on the jail's behalf.
//
// readOnly binds the device read-only (LO_FLAGS_READ_ONLY): nothing
// written through it reaches backing.
func attachLoop(backing *os.File, readOnly bool) (string, int, error) {
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", -1, fmt.Errorf("open /dev/loop-control: %w", err)
	}
	defer unix.Close(ctl)

	cfg := unix.LoopConfig{Fd: uint32(backing.Fd())}
	cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO
	if readOnly {
		cfg.Info.Flags |= unix.LO_FLAGS_READ_ONLY
	}
	copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], backing.Name())

	loopMu.Lock()
	defer loopMu.Unlock()
	for range maxLoopAttempts {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", -1, fmt.Errorf("find a free loop device: %w", err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", -1, fmt.Errorf("open %s: %w", dev, err)
		}
		err = unix.IoctlLoopConfigure(fd, &cfg)
		if err == nil {
			return dev, fd, nil
		}
		unix.Close(fd)
		if !errors.Is(err, unix.EBUSY) {
			return "", -1, fmt.Errorf("bind %s to %s: %w", dev, backing.Name(), err)
		}
	}
	return "", -1, fmt.Errorf("bind a loop device to %s: every free device was taken by others %d times", backing.Name(), maxLoopAttempts)
}

// detachLoop unbinds the loop device dev (a no-op when it is not bound).
func detachLoop(dev string) error {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dev, err)
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("detach %s: %w", dev, err)
	}
	return nil
}

// backingFile returns the file bound to the loop block device whose sysfs
// directory is sysDir ("" when it is not a bound loop device). A backing file
// deleted since binding is reported under its former path.
func backingFile(sysDir string) string {
	b, err := os.ReadFile(filepath.Join(sysDir, "loop", "backing_file"))
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), " (deleted)")
}

// backingOfDevice returns the backing file of the loop device with the given
// device numbers ("" when it is not a bound loop device).
func backingOfDevice(major, minor uint32) string {
	return backingFile(fmt.Sprintf("/sys/dev/block/%d:%d", major, minor))
}

// LoopDevicesFor lists the loop devices (as /dev/loopN) bound to files at
// or below dir.
func LoopDevicesFor(dir string) ([]string, error) {
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		dir = r
	}
	entries, err := os.ReadDir("/sys/block")
	if err != nil {
		return nil, fmt.Errorf("list block devices: %w", err)
	}
	var out []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		if b := backingFile(filepath.Join("/sys/block", e.Name())); b != "" && within(b, dir) {
			out = append(out, "/dev/"+e.Name())
		}
	}
	return out, nil
}
