// Package guest is PID 1 of a vm-level jail's guest kernel: the daemon's
// own binary, started from the initramfs the daemon builds (`agentjail
// vminit`). It loads the virtio modules, opens the control port
// (vmproto.PortName) and serves the daemon over it: on Boot it mounts the
// jail's root (a read-only erofs tree, the jail's disk as writable
// layer, overlayfs, and the host's /usr read-only for host-rootfs jails),
// configures the network, clock and host name, switches into the root and
// runs the same init as every other level (internal/initd) on the port's
// streams; it answers usage queries and powers the machine off when init
// ends.
package guest

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/backend/vm/vmproto"
	"github.com/agentjail/agentjail/internal/initd"
	"github.com/agentjail/agentjail/internal/initproto"
)

// portTimeout bounds the wait for the control port to appear.
const portTimeout = 30 * time.Second

// modulesDir holds the kernel modules in the initramfs, loaded in the
// order of its file "order".
const modulesDir = "/lib/modules"

var logger = log.New(os.Stderr, "agentjail vminit: ", log.Lmicroseconds)

// Main runs PID 1 of the guest and does not return: it powers the machine
// off when init ends, or on a start failure (which it prints on the
// console first).
func Main() {
	if err := run(); err != nil {
		logger.Printf("fatal: %v", err)
	}
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	// With -no-reboot QEMU exits on a reboot too.
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	select {}
}

// g is the guest's state.
type g struct {
	port *os.File
	// sessMu guards in, the input of the current session (nil: parked).
	sessMu sync.Mutex
	in     *io.PipeWriter
	inR    *io.PipeReader
	// outMu serializes the writes to the port and guards out, the one
	// session whose frames may reach it (nil: none).
	outMu sync.Mutex
	out   *sessionOut
	// initConns feeds init's server with the KindInit streams.
	initConns *chanListener
	// events are the jail's process events.
	events   *events
	booted   chan struct{}
	bootOnce sync.Once
	mu       sync.Mutex
	boot     *vmproto.Boot
	// initDone is closed when init's server has ended.
	initDone chan error
}

func run() error {
	for _, m := range []struct{ src, dst, typ string }{
		{"devtmpfs", "/dev", "devtmpfs"}, {"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"},
	} {
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.src, m.dst, m.typ, unix.MS_NOSUID, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	// The kernel gives PID 1 a console only when the initramfs has
	// /dev/console; it has devtmpfs's.
	if c, err := os.OpenFile("/dev/console", os.O_RDWR, 0); err == nil {
		for fd := 0; fd <= 2; fd++ {
			_ = unix.Dup3(int(c.Fd()), fd, 0)
		}
		c.Close()
	}
	if err := loadModules(); err != nil {
		return err
	}
	logger.Printf("modules loaded")
	portPath, err := findPort(vmproto.PortName)
	if err != nil {
		return err
	}
	port, err := os.OpenFile(portPath, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open control port: %w", err)
	}
	st := &g{
		port: port, initConns: newChanListener(), booted: make(chan struct{}),
		initDone: make(chan error, 1), events: newEvents(),
	}
	go st.servePort()
	<-st.booted
	return <-st.initDone
}

// loadModules loads the modules of the initramfs in their order.
func loadModules() error {
	order, err := os.ReadFile(filepath.Join(modulesDir, "order"))
	if err != nil {
		return fmt.Errorf("module order: %w", err)
	}
	for _, name := range strings.Fields(string(order)) {
		f, err := os.Open(filepath.Join(modulesDir, name))
		if err != nil {
			return err
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("load module %s: %w", name, err)
		}
	}
	return nil
}

// findPort waits for the virtio-serial port named name and returns its
// device path.
func findPort(name string) (string, error) {
	deadline := time.Now().Add(portTimeout)
	for {
		ents, _ := os.ReadDir("/sys/class/virtio-ports")
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join("/sys/class/virtio-ports", e.Name(), "name"))
			if err == nil && strings.TrimSpace(string(b)) == name {
				dev := "/dev/" + e.Name()
				if _, err := os.Stat(dev); err == nil {
					return dev, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no virtio-serial port %q after %v", name, portTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// servePort is the only reader of the control port. Parked (at boot,
// after the daemon went away or asked to park), it looks for
// vmproto.WakeLine in what arrives, answers a hello line and starts a
// yamux session whose input is what follows; a session lasts until the
// daemon hangs up or parks it.
func (st *g) servePort() {
	buf := make([]byte, 64<<10)
	var scan []byte
	for {
		n, err := st.port.Read(buf)
		if errors.Is(err, os.ErrClosed) {
			return
		}
		if n == 0 {
			if err != nil && !errors.Is(err, io.EOF) {
				logger.Printf("control port: %v", err)
			}
			// The daemon hung up (or never came): end the session and
			// wait for a connection.
			logger.Printf("control port: the daemon is away (%v)", err)
			st.hangUp()
			scan = scan[:0]
			st.waitHost()
			continue
		}
		data := buf[:n]
		st.sessMu.Lock()
		in := st.in
		st.sessMu.Unlock()
		if in != nil {
			// A session that ended takes nothing more.
			_, _ = in.Write(data)
			continue
		}
		scan = append(scan, data...)
		i := bytes.Index(scan, []byte(vmproto.WakeLine))
		if i < 0 {
			if keep := len(vmproto.WakeLine) - 1; len(scan) > keep {
				scan = append(scan[:0], scan[len(scan)-keep:]...)
			}
			continue
		}
		rest := append([]byte(nil), scan[i+len(vmproto.WakeLine):]...)
		scan = scan[:0]
		pr, pw := io.Pipe()
		out := &sessionOut{st: st, in: pw}
		st.outMu.Lock()
		_, err = fmt.Fprintf(st.port, "\n%s\n", vmproto.HelloLine)
		if err == nil {
			st.out = out
		}
		st.outMu.Unlock()
		if err != nil {
			logger.Printf("control port: %v", err)
			continue
		}
		logger.Printf("control session starts")
		st.sessMu.Lock()
		st.in, st.inR = pw, pr
		st.sessMu.Unlock()
		go st.session(pr, out)
		if len(rest) > 0 {
			_, _ = pw.Write(rest)
		}
	}
}

// hangUp ends the current session when the daemon went away: its input
// ends and it writes nothing more; the port's next bytes are scanned for
// the wake line.
func (st *g) hangUp() {
	st.sessMu.Lock()
	in := st.in
	st.in = nil
	st.sessMu.Unlock()
	st.outMu.Lock()
	st.out = nil
	st.outMu.Unlock()
	if in != nil {
		in.CloseWithError(io.EOF)
	}
}

// park ends out's session at the daemon's request, made on stream last:
// the port's next bytes are scanned for the wake line, and the session
// writes nothing after its answer on last (its first data frame there).
func (st *g) park(out *sessionOut, last uint32) {
	st.sessMu.Lock()
	if st.in == out.in {
		st.in = nil
	}
	st.sessMu.Unlock()
	st.outMu.Lock()
	out.last = last
	st.outMu.Unlock()
}

// waitHost waits until the daemon is connected to the port (poll reports
// no hang-up).
func (st *g) waitHost() {
	fds := []unix.PollFd{{Fd: int32(st.port.Fd()), Events: unix.POLLIN}}
	for {
		fds[0].Revents = 0
		if _, err := unix.Poll(fds, 1000); err != nil && !errors.Is(err, unix.EINTR) {
			logger.Printf("control port: %v", err)
			time.Sleep(time.Second)
			continue
		}
		if fds[0].Revents&unix.POLLHUP == 0 {
			return
		}
		// Poll returns at once while the host is away.
		time.Sleep(20 * time.Millisecond)
	}
}

// pipeConn is a session's connection: input from the port's reader,
// output to the port through the session's gate.
type pipeConn struct {
	r   *io.PipeReader
	out *sessionOut
}

func (p pipeConn) Read(b []byte) (int, error)  { return p.r.Read(b) }
func (p pipeConn) Write(b []byte) (int, error) { return p.out.Write(b) }
func (p pipeConn) Close() error                { return p.r.Close() }

// sessionOut is one session's output to the port. Each yamux frame (its
// header and body, which yamux writes apart) reaches the port in one
// write, and only while the session is the port's current one: frames of
// a session that parked or ended never mix with the next session's (the
// daemon's next connection, here or in a machine restored from a
// snapshot taken while parked). A refused write fails, so what it
// carried is not taken for sent (the process events keep it for the next
// session).
type sessionOut struct {
	st *g
	// in is the session's input, closed when the session may write no
	// more.
	in *io.PipeWriter
	// hdr holds a data frame's header until its body comes.
	hdr []byte
	// last, when not 0, is the stream whose first data frame is the
	// session's last write (guarded by st.outMu).
	last uint32
}

// yamux's frame header: version, type, flags, stream id and length, the
// numbers big-endian; a data frame's body (length bytes) follows.
const (
	frameHeaderLen = 12
	frameTypeData  = 0
)

var errSessionOver = errors.New("control session: parked or ended")

func (o *sessionOut) Write(b []byte) (int, error) {
	if o.hdr == nil && len(b) == frameHeaderLen && b[1] == frameTypeData && binary.BigEndian.Uint32(b[8:]) > 0 {
		o.hdr = append([]byte(nil), b...)
		return len(b), nil
	}
	frame := b
	if o.hdr != nil {
		frame = append(o.hdr, b...)
		o.hdr = nil
	}
	st := o.st
	st.outMu.Lock()
	defer st.outMu.Unlock()
	if st.out != o {
		return 0, errSessionOver
	}
	if _, err := st.port.Write(frame); err != nil {
		return 0, err
	}
	if o.last != 0 && len(frame) > frameHeaderLen && frame[1] == frameTypeData && binary.BigEndian.Uint32(frame[4:]) == o.last {
		st.out = nil
		o.in.CloseWithError(io.EOF)
	}
	return len(b), nil
}

// session serves one yamux session until its input ends.
func (st *g) session(in *io.PipeReader, out *sessionOut) {
	cfg := yamux.DefaultConfig()
	cfg.EnableKeepAlive = false
	cfg.LogOutput = io.Discard
	cfg.MaxStreamWindowSize = 1 << 20
	s, err := yamux.Server(pipeConn{in, out}, cfg)
	if err != nil {
		logger.Printf("control session: %v", err)
		return
	}
	defer s.Close()
	for {
		c, err := s.Accept()
		if err != nil {
			logger.Printf("control session ends: %v", err)
			// Park, unless a new session already replaced this one.
			st.sessMu.Lock()
			if st.in != nil && st.inR == in {
				st.in = nil
			}
			st.sessMu.Unlock()
			st.outMu.Lock()
			if st.out == out {
				st.out = nil
			}
			st.outMu.Unlock()
			return
		}
		go st.stream(c, out)
	}
}

// initStream is a control stream served by init. Its session ends when
// the daemon hangs up (or parks the guest), which init must see even
// with input of the daemon's still queued on the stream.
type initStream struct{ *yamux.Stream }

var _ initd.HangUpReporter = initStream{}

// PeerClosed reports whether the stream's session has ended.
func (s initStream) PeerClosed() bool { return s.Session().IsClosed() }

// stream dispatches one stream of out's session by its first byte.
func (st *g) stream(c net.Conn, out *sessionOut) {
	var kind [1]byte
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadFull(c, kind[:]); err != nil {
		c.Close()
		return
	}
	c.SetReadDeadline(time.Time{})
	switch kind[0] {
	case vmproto.KindInit:
		select {
		case <-st.booted:
			st.initConns.put(initStream{c.(*yamux.Stream)})
		default:
			c.Close()
		}
	case vmproto.KindBoot:
		var b vmproto.Boot
		st.request(c, &b, func() error { return st.doBoot(&b) })
	case vmproto.KindResume:
		var r vmproto.Resume
		st.request(c, &r, func() error { return st.resume(&r) })
	case vmproto.KindEvents:
		st.events.serve(c)
	case vmproto.KindPark:
		var req struct{}
		// Bytes after this request's are the next session's: the daemon
		// parks the guest before the machine is saved.
		st.request(c, &req, func() error { st.park(out, c.(*yamux.Stream).StreamID()); return nil })
	case vmproto.KindShutdown:
		var req struct{}
		// Init ends gracefully on SIGTERM (its commands get it first);
		// the machine powers off when it has.
		st.request(c, &req, func() error { return unix.Kill(os.Getpid(), unix.SIGTERM) })
	case vmproto.KindHostname:
		var h vmproto.Hostname
		st.request(c, &h, func() error { return unix.Sethostname([]byte(h.Name)) })
	case vmproto.KindStats:
		defer c.Close()
		s := st.stats()
		_ = json.NewEncoder(c).Encode(s)
	default:
		c.Close()
	}
}

// request reads one JSON line into req, runs do and answers a Reply.
func (st *g) request(c net.Conn, req any, do func() error) {
	defer c.Close()
	line, err := bufio.NewReaderSize(c, 64<<10).ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(line, req)
	}
	if err == nil {
		err = do()
	}
	var rep vmproto.Reply
	if err != nil {
		rep.Error = err.Error()
		logger.Print(err)
	}
	_ = json.NewEncoder(c).Encode(rep)
}

// doBoot makes the guest the jail and starts init; it returns once init
// serves.
func (st *g) doBoot(b *vmproto.Boot) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.boot != nil {
		return errors.New("already booted")
	}
	logger.Printf("boot request")
	setClock(b.UnixNano)
	if err := mountRoot(b); err != nil {
		return err
	}
	if err := unix.Sethostname([]byte(b.Hostname)); err != nil {
		return fmt.Errorf("host name: %w", err)
	}
	if err := configureNet(b.Net); err != nil {
		return err
	}
	if err := writeNetFiles(&b.Resume); err != nil {
		return err
	}
	if err := jailCgroup(b.PidsLimit, b.Limits); err != nil {
		return err
	}
	// From before init runs, so that every process of the jail is seen.
	if err := st.events.start(); err != nil {
		// The jail runs; its record lacks its processes.
		logger.Printf("process events: %v", err)
	}
	if n := b.Limits.Nofile; n > 0 {
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: n, Max: n}); err != nil {
			return fmt.Errorf("nofile limit: %w", err)
		}
	}
	dir := initproto.ControlDir
	data, err := json.Marshal(b.Init)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, initproto.ConfigName), data, 0o600); err != nil {
		return fmt.Errorf("init config: %w", err)
	}
	ready := make(chan struct{})
	go func() {
		err := initd.Run(dir, st.initConns, func() error { close(ready); return nil })
		st.initDone <- err
	}()
	select {
	case <-ready:
	case err := <-st.initDone:
		st.initDone <- err
		return fmt.Errorf("init did not start: %v", err)
	}
	logger.Printf("jail %s: init serves", b.Init.JailID)
	st.boot = b
	st.bootOnce.Do(func() { close(st.booted) })
	return nil
}

// resume applies what changed after a restore.
func (st *g) resume(r *vmproto.Resume) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	setClock(r.UnixNano)
	if r.Hostname != "" {
		if err := unix.Sethostname([]byte(r.Hostname)); err != nil {
			return fmt.Errorf("host name: %w", err)
		}
	}
	if err := configureNet(r.Net); err != nil {
		return err
	}
	return writeNetFiles(r)
}

// setClock sets the wall clock (the guest has no clock of its own: the
// machine has no RTC, and a restored one continues from its snapshot's
// time).
func setClock(unixNano int64) {
	if unixNano <= 0 {
		return
	}
	tv := unix.NsecToTimeval(unixNano)
	if err := unix.Settimeofday(&tv); err != nil {
		logger.Printf("set clock: %v", err)
	}
}

// chanListener is a net.Listener of connections handed to it.
type chanListener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newChanListener() *chanListener {
	return &chanListener{ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *chanListener) put(c net.Conn) {
	select {
	case l.ch <- c:
	case <-l.done:
		c.Close()
	}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return portAddr{} }

type portAddr struct{}

func (portAddr) Network() string { return "virtio-serial" }
func (portAddr) String() string  { return vmproto.PortName }
