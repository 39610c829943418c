package vm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/backend/vm/vmproto"
)

// Files of a jail's machine in its run directory (inst.Dir/vm).
const (
	pidFile     = "qemu.pid"
	controlSock = "control.sock"
	qmpSock     = "qmp.sock"
	consoleLog  = "console.log"
)

// maxReply bounds one JSON reply of the guest.
const maxReply = 1 << 20

// machineSpec is what one QEMU process runs.
type machineSpec struct {
	// dir is the machine's run directory.
	dir string
	// accel is "kvm" or "tcg".
	accel string
	// kernel and initrd are the guest kernel and initramfs.
	kernel, initrd string
	// tscKHz is the host's TSC frequency (0: unknown).
	tscKHz int
	// cpus and memMiB size the machine.
	cpus, memMiB int
	// lower (read-only erofs), usr (read-only erofs, optional) and upper
	// (the jail's disk) are the disks' image files.
	lower, usr, upper string
	// tap, when not nil, is the open tap device of the machine's network
	// interface, mac its address.
	tap *os.File
	mac string
	// incoming, when set, starts the machine paused, waiting for a
	// migration stream.
	incoming bool
}

func (s machineSpec) path(name string) string { return filepath.Join(s.dir, name) }

// tcgCacheMiB bounds TCG's cache of translated code (QEMU's default is a
// gigabyte per machine, which a busy guest fills over time).
const tcgCacheMiB = 128

// accelOpts is the -accel option.
func (s machineSpec) accelOpts() string {
	if s.accel == "tcg" {
		return "tcg,tb-size=" + strconv.Itoa(tcgCacheMiB)
	}
	return s.accel
}

// args is QEMU's command line (after the binary).
func (s machineSpec) args() []string {
	cmdline := []string{
		"console=ttyS0", "panic=-1", "reboot=t",
		"rdinit=/agentjail", "-", "vminit",
	}
	if s.tscKHz > 0 {
		cmdline = append([]string{"tsc_early_khz=" + strconv.Itoa(s.tscKHz), "tsc=reliable"}, cmdline...)
	}
	// The kernel passes what follows "--" to init.
	for i, a := range cmdline {
		if a == "-" {
			cmdline[i] = "--"
		}
	}
	a := []string{
		// mem-merge=off: the guest's RAM is never offered to the host's
		// same-page merging, which would let one jail's machine learn by
		// timing what another's memory holds.
		"-M", "microvm,x-option-roms=off,pit=off,pic=off,rtc=off,isa-serial=on,mem-merge=off",
		"-accel", s.accelOpts(),
		"-cpu", "max",
		"-smp", strconv.Itoa(s.cpus),
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-kernel", s.kernel, "-initrd", s.initrd,
		"-append", strings.Join(cmdline, " "),
		"-serial", "file:" + s.path(consoleLog),
		"-chardev", "socket,id=ctl,path=" + s.path(controlSock) + ",server=on,wait=off",
		"-device", "virtio-serial-device",
		"-device", "virtserialport,chardev=ctl,name=" + vmproto.PortName,
		"-qmp", "unix:" + s.path(qmpSock) + ",server=on,wait=off",
		"-pidfile", s.path(pidFile),
		"-daemonize",
	}
	a = append(a, "-m", strconv.Itoa(s.memMiB)+"M")
	disk := func(id, file string, ro bool) {
		opt := "id=" + id + ",file=" + file + ",format=raw,if=none,cache=none,aio=threads"
		if ro {
			opt += ",readonly=on"
		}
		a = append(a, "-drive", opt, "-device", "virtio-blk-device,drive="+id+",serial="+id)
	}
	disk(vmproto.DiskLower, s.lower, true)
	if s.usr != "" {
		disk(vmproto.DiskUsr, s.usr, true)
	}
	disk(vmproto.DiskUpper, s.upper, false)
	if s.tap != nil {
		// The tap is the first descriptor after stdio (cmd.ExtraFiles).
		a = append(a, "-netdev", "tap,id=net0,fd=3,vhost=off", "-device", "virtio-net-device,netdev=net0,mac="+s.mac)
	}
	if s.incoming {
		// Paused once loaded: observation attaches before it runs on.
		a = append(a, "-incoming", "defer", "-S")
	}
	return a
}

// launch starts QEMU for s and returns its pid once it runs (QEMU
// daemonizes: the machine outlives the daemon, which re-adopts it).
func launch(ctx context.Context, qemu string, s machineSpec) (int, error) {
	for _, n := range []string{pidFile, controlSock, qmpSock, consoleLog} {
		if err := os.Remove(s.path(n)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return 0, err
		}
	}
	cmd := exec.CommandContext(ctx, qemu, s.args()...)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if s.tap != nil {
		cmd.ExtraFiles = []*os.File{s.tap}
	}
	cmd.SysProcAttr = &unix.SysProcAttr{Setsid: true}
	// The parent exits once the machine is set up; its child runs on.
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("start qemu: %w: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	pid, err := readPid(s.dir)
	if err != nil {
		return 0, fmt.Errorf("start qemu: %w", err)
	}
	return pid, nil
}

// readPid returns the pid of the machine of run directory dir when it
// runs, 0 when it does not.
func readPid(dir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dir, pidFile))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("bad pid file %s: %q", filepath.Join(dir, pidFile), b)
	}
	// The pid is the machine's only while that process runs QEMU with
	// this directory's pid file.
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Contains(cmdline, []byte(filepath.Join(dir, pidFile))) {
		return 0, nil
	}
	return pid, nil
}

// session is the daemon's side of a machine's control channel: a yamux
// session over the virtio-serial port's unix socket.
type session struct {
	dir string
	// opening holds a token while someone opens the session, or keeps
	// it from being opened (a checkpoint): waiting for it respects the
	// waiter's context, so nobody waits on a guest that does not answer
	// beyond their own deadline.
	opening chan struct{}
	// ready is closed once the guest serves (booted, resumed after a
	// restore, or found running by a new daemon): the event stream
	// connects only then, so that it never wakes a machine that is
	// booting or paused.
	ready     chan struct{}
	readyOnce sync.Once

	mu   sync.Mutex // guards conn and ys
	conn net.Conn   // ys's connection, or the one being woken
	ys   *yamux.Session
}

func newSession(dir string) *session {
	return &session{dir: dir, opening: make(chan struct{}, 1), ready: make(chan struct{})}
}

// markReady records that the guest serves.
func (s *session) markReady() { s.readyOnce.Do(func() { close(s.ready) }) }

// hold keeps everyone else from opening the session until release is
// called; it waits for whoever holds it now at most until ctx ends.
func (s *session) hold(ctx context.Context) (release func(), err error) {
	select {
	case s.opening <- struct{}{}:
		return func() { <-s.opening }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("machine control channel: busy opening: %w", context.Cause(ctx))
	}
}

// live returns the session when it is open, else nil.
func (s *session) live() *yamux.Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ys != nil && !s.ys.IsClosed() {
		return s.ys
	}
	return nil
}

// open returns the live yamux session, connecting when there is none
// (the first time, or after the machine or the daemon started again).
func (s *session) open(ctx context.Context) (*yamux.Session, error) {
	if ys := s.live(); ys != nil {
		return ys, nil
	}
	release, err := s.hold(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	if ys := s.live(); ys != nil {
		return ys, nil
	}
	s.close()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", filepath.Join(s.dir, controlSock))
	if err != nil {
		return nil, fmt.Errorf("machine control channel: %w", err)
	}
	// close (a destroy) ends the wait for the guest, as does ctx.
	s.mu.Lock()
	s.conn = c
	s.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	err = wake(ctx, c)
	if !stop() {
		err = errors.Join(err, ctx.Err())
	}
	if err == nil {
		cfg := yamux.DefaultConfig()
		cfg.EnableKeepAlive = false
		cfg.LogOutput = io.Discard
		cfg.MaxStreamWindowSize = 1 << 20
		cfg.StreamOpenTimeout = 30 * time.Second
		var ys *yamux.Session
		if ys, err = yamux.Client(c, cfg); err == nil {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.conn != c { // closed meanwhile
				ys.Close()
				return nil, errors.New("machine control channel: closed while opening")
			}
			s.ys = ys
			return ys, nil
		}
	}
	s.mu.Lock()
	if s.conn == c {
		s.conn = nil
	}
	s.mu.Unlock()
	c.Close()
	return nil, fmt.Errorf("machine control channel: %w", err)
}

// wakeEvery is how long the daemon waits for the guest's hello before it
// sends the wake line again, if the guest wrote anything meanwhile: it was
// still in a session of an earlier connection, which the line ended. (A
// guest that is still booting has written nothing, and gets the line
// once: more would reach its session.)
const wakeEvery = 5 * time.Second

// wake starts a session on c: it writes the wake line and reads up to and
// including the guest's hello line, a byte at a time so that nothing
// after it is consumed; whatever the guest wrote before is skipped.
func wake(ctx context.Context, c net.Conn) error {
	defer c.SetDeadline(time.Time{})
	var line []byte
	b := make([]byte, 1)
	for {
		if _, err := io.WriteString(c, vmproto.WakeLine); err != nil {
			return err
		}
		got := false
		for {
			dl := time.Now().Add(wakeEvery)
			if d := deadlineOf(ctx); d.Before(dl) {
				dl = d
			}
			c.SetReadDeadline(dl)
			_, err := c.Read(b)
			if errors.Is(err, os.ErrDeadlineExceeded) && time.Now().Before(deadlineOf(ctx)) {
				if got {
					break
				}
				continue
			}
			if err != nil {
				return fmt.Errorf("waiting for the guest: %w", err)
			}
			got = true
			if b[0] != '\n' {
				if len(line) < 256 {
					line = append(line, b[0])
				}
				continue
			}
			if string(line) == vmproto.HelloLine {
				return nil
			}
			line = line[:0]
		}
	}
}

// deadlineOf is ctx's deadline, or far in the future.
func deadlineOf(ctx context.Context) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return time.Now().Add(time.Hour)
}

// close ends the session, or the connection being woken (the machine
// keeps running). It does not wait for anyone.
func (s *session) close() {
	s.mu.Lock()
	ys, c := s.ys, s.conn
	s.ys, s.conn = nil, nil
	s.mu.Unlock()
	if ys != nil {
		ys.Close()
	}
	if c != nil {
		c.Close()
	}
}

// stream opens a stream of kind.
func (s *session) stream(ctx context.Context, kind byte) (net.Conn, error) {
	ys, err := s.open(ctx)
	if err != nil {
		return nil, err
	}
	c, err := ys.Open()
	if err != nil {
		s.close()
		return nil, fmt.Errorf("machine control channel: %w", err)
	}
	if _, err := c.Write([]byte{kind}); err != nil {
		c.Close()
		return nil, fmt.Errorf("machine control channel: %w", err)
	}
	return streamConn{c}, nil
}

// streamConn is a stream of the control session that reports a passed
// deadline as every other connection does (os.ErrDeadlineExceeded), which
// its readers tell apart from a broken connection.
type streamConn struct{ net.Conn }

func (c streamConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	return n, deadlineErr(err)
}

func (c streamConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	return n, deadlineErr(err)
}

func deadlineErr(err error) error {
	if errors.Is(err, yamux.ErrTimeout) {
		return os.ErrDeadlineExceeded
	}
	return err
}

// request sends req on a new stream of kind and reads the guest's reply
// into rep (a vmproto.Reply unless the kind answers otherwise).
func (s *session) request(ctx context.Context, kind byte, req, rep any) error {
	c, err := s.stream(ctx, kind)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if req != nil {
		b, err := json.Marshal(req)
		if err != nil {
			return err
		}
		if _, err := c.Write(append(b, '\n')); err != nil {
			return fmt.Errorf("machine control channel: %w", err)
		}
	}
	line, err := bufio.NewReader(io.LimitReader(c, maxReply)).ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("machine control channel: no reply: %w", err)
	}
	if err := json.Unmarshal(line, rep); err != nil {
		return fmt.Errorf("machine control channel: bad reply %q: %w", line, err)
	}
	if r, ok := rep.(*vmproto.Reply); ok && r.Error != "" {
		return errors.New(r.Error)
	}
	return nil
}
