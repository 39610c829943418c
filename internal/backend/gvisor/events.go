package gvisor

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"

	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/observe"
)

// The jail's events come from gVisor's runtime monitoring: a trace session
// in the sentry whose points (every syscall's exit, clone, execve, task
// exit, exit notification) go to its "remote" sink, a SOCK_SEQPACKET
// socket the daemon listens on. Each message is an 8-byte header
// (header size, message type, points dropped so far; little-endian) and
// one points_go_proto message. The session is made with
// `runsc trace create` once the sandbox exists and before the jail's init
// runs (and again for a re-adopted jail), so one path serves both.

// Syscalls whose schematized points carry what the raw points cannot:
// the path argument (open, openat, creat, chdir) and the socket address
// (connect). Every other syscall is traced through its raw point (number,
// six arguments, result).
var schematized = map[int]string{
	2: "open", 42: "connect", 80: "chdir", 85: "creat", 257: "openat",
}

// lastRawSyscall is the highest syscall number the sentry has raw points
// for (pkg/sentry/seccheck/metadata_amd64.go).
const lastRawSyscall = 441

// sessionName names the trace session in each sandbox (the sentry has one,
// named "Default").
const sessionName = "Default"

// maxMessage bounds one message from the sentry; a longer one (an execve
// with a huge argv) is counted lost.
const maxMessage = 1 << 20

// idlePeriod is how often the sink hears Idle while no event comes.
const idlePeriod = 50 * time.Millisecond

// traceTimeout bounds `runsc trace create`.
const traceTimeout = 20 * time.Second

// sessionConfig is the trace session's configuration (runsc's
// seccheck.SessionConfig as JSON) for a jail traced in mode with the
// syscalls nrs, its remote sink at endpoint.
func sessionConfig(endpoint string, nrs []int) ([]byte, error) {
	type point struct {
		Name          string   `json:"name"`
		ContextFields []string `json:"context_fields,omitempty"`
	}
	ids := []string{"time", "thread_id", "group_id", "process_name"}
	procFields := append(ids, "cwd", "credentials", "parent_thread_group_id")
	points := []point{
		{Name: "sentry/clone", ContextFields: ids},
		{Name: "sentry/execve", ContextFields: procFields},
		{Name: "sentry/task_exit", ContextFields: ids},
		{Name: "sentry/exit_notify_parent", ContextFields: ids},
	}
	for _, nr := range nrs {
		if name, ok := schematized[nr]; ok {
			points = append(points, point{Name: "syscall/" + name + "/exit", ContextFields: ids})
		} else if nr <= lastRawSyscall {
			points = append(points, point{Name: "syscall/sysno/" + strconv.Itoa(nr) + "/exit", ContextFields: ids})
		}
	}
	return json.Marshal(map[string]any{
		"name":   sessionName,
		"points": points,
		// A syscall point of a number the sentry does not implement is
		// not registered; leave it out rather than fail.
		"ignore_missing": true,
		"sinks": []map[string]any{{
			"name": "remote",
			// A full socket makes the sentry retry briefly, then drop
			// the point and count it (reported as lost events).
			"config": map[string]any{"endpoint": endpoint, "retries": 3},
		}},
	})
}

// tracedSyscalls returns the syscalls to trace for tr and which of them
// only feed the file tracker (left out of the record).
func tracedSyscalls(tr config.Tracing) (nrs []int, internal map[int32]bool, err error) {
	user := map[int]bool{}
	if tr.Mode != config.TraceNoSyscalls {
		if len(tr.Include) == 0 {
			for nr := 0; nr <= lastRawSyscall; nr++ {
				if observe.SyscallName(nr) != "" {
					user[nr] = true
				}
			}
		}
		for _, name := range tr.Include {
			nr, ok := observe.SyscallNumber(name)
			if !ok {
				return nil, nil, fmt.Errorf("tracing.include: unknown syscall %q", name)
			}
			user[nr] = true
		}
		for _, name := range tr.Exclude {
			nr, ok := observe.SyscallNumber(name)
			if !ok {
				return nil, nil, fmt.Errorf("tracing.exclude: unknown syscall %q", name)
			}
			delete(user, nr)
		}
	}
	internal = map[int32]bool{}
	// prctl carries init's marks of the threads whose calls are recorded
	// (initproto.RecordOption): traced always.
	for _, nr := range append(observe.FileSyscalls(), unix.SYS_PRCTL) {
		if !user[nr] {
			internal[int32(nr)] = true
			user[nr] = true
		}
	}
	for nr := range user {
		nrs = append(nrs, nr)
	}
	return nrs, internal, nil
}

// Events implements backend.EventSource: a trace session in the jail's
// sandbox streams its points to a socket of the jail's directory, mapped
// to observe's events by one goroutine until stop or the sandbox's end.
func (b *Backend) Events(inst backend.Instance, st backend.Status, sink observe.Sink) (func() error, error) {
	nrs, internal, err := tracedSyscalls(inst.Config.Tracing)
	if err != nil {
		return nil, err
	}
	endpoint := filepath.Join(inst.Dir, "gvisor-events.sock")
	if err := os.Remove(endpoint); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("events socket: %w", err)
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: endpoint, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("events socket: %w", err)
	}
	defer func() {
		ln.Close()
		os.Remove(endpoint)
	}()
	conf, err := sessionConfig(endpoint, nrs)
	if err != nil {
		return nil, err
	}
	confPath := filepath.Join(inst.Dir, "gvisor-trace.json")
	if err := os.WriteFile(confPath, conf, 0o600); err != nil {
		return nil, fmt.Errorf("trace session config: %w", err)
	}
	defer os.Remove(confPath)

	// runsc connects, shakes hands and hands the connection to the
	// sentry; accept and answer while it runs.
	ctx, cancel := context.WithTimeout(context.Background(), traceTimeout)
	defer cancel()
	accepted := make(chan *net.UnixConn, 1)
	acceptErr := make(chan error, 1)
	go func() {
		c, err := acceptSink(ctx, ln)
		if err != nil {
			acceptErr <- err
			return
		}
		accepted <- c
	}()
	out, err := exec.CommandContext(ctx, b.runsc, "--root", b.root,
		"trace", "create", "--force", "--config", confPath, inst.ID).CombinedOutput()
	if err != nil {
		ln.Close()
		select {
		case c := <-accepted:
			c.Close()
		case <-acceptErr:
		}
		return nil, fmt.Errorf("runsc trace create: %w: %s", err, strings.TrimSpace(string(out)))
	}
	var conn *net.UnixConn
	select {
	case conn = <-accepted:
	case err := <-acceptErr:
		return nil, fmt.Errorf("trace session of jail %s: %w", inst.Name, err)
	}
	r := &reader{conn: conn, sink: sink, internal: internal, plumbing: map[int32]bool{}, recorded: map[int32]bool{}, done: make(chan struct{})}
	go r.run()
	return r.stop, nil
}

// acceptSink accepts runsc's connection on ln and answers its handshake
// (a pb.Handshake with the wire version each way).
func acceptSink(ctx context.Context, ln *net.UnixListener) (*net.UnixConn, error) {
	if d, ok := ctx.Deadline(); ok {
		ln.SetDeadline(d)
	}
	c, err := ln.AcceptUnix()
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(traceTimeout))
	buf := make([]byte, 1024)
	n, err := c.Read(buf)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("handshake: %w", err)
	}
	var hs pb.Handshake
	if err := proto.Unmarshal(buf[:n], &hs); err != nil || hs.Version < wireVersion {
		c.Close()
		return nil, fmt.Errorf("handshake: version %d (%v); want %d", hs.Version, err, wireVersion)
	}
	reply, _ := proto.Marshal(&pb.Handshake{Version: wireVersion})
	if _, err := c.Write(reply); err != nil {
		c.Close()
		return nil, fmt.Errorf("handshake: %w", err)
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// wireVersion is the remote sink protocol version spoken
// (pkg/sentry/seccheck/sinks/remote/wire.CurrentVersion).
const wireVersion = 1

// headerSize is the smallest header of a message (wire.HeaderStructSize).
const headerSize = 8

// reader maps one sandbox's points to events.
type reader struct {
	conn     *net.UnixConn
	sink     observe.Sink
	internal map[int32]bool // syscalls that only feed the file tracker
	// plumbing holds the jail's own processes (init's children, the
	// command shims, and their children until they execute the command),
	// whose syscalls are left out as the kernel tracer leaves them out.
	plumbing map[int32]bool
	// recorded holds init's threads marked as recorded (the files API's
	// operations); init's other calls are plumbing too. At most init's
	// thread count.
	recorded map[int32]bool
	dropped  uint32 // the sentry's count of dropped points, last seen
	ev       observe.Event
	done     chan struct{}
	once     sync.Once
}

// initPid is the jail's init in the sentry: the root container's first
// process, in the sandbox's root PID namespace.
const initPid = 1

func (r *reader) stop() error {
	r.once.Do(func() { r.conn.Close() })
	<-r.done
	return nil
}

func (r *reader) run() {
	defer close(r.done)
	buf := make([]byte, maxMessage)
	for {
		r.conn.SetReadDeadline(time.Now().Add(idlePeriod))
		n, _, flags, _, err := r.conn.ReadMsgUnix(buf, nil)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				r.sink.Idle()
				continue
			}
			r.sink.Idle()
			return
		}
		if n == 0 {
			r.sink.Idle()
			return
		}
		if flags&unix.MSG_TRUNC != 0 || n < headerSize {
			r.lost(1)
			continue
		}
		hsize := int(binary.LittleEndian.Uint16(buf[0:]))
		typ := pb.MessageType(binary.LittleEndian.Uint16(buf[2:]))
		dropped := binary.LittleEndian.Uint32(buf[4:])
		if d := dropped - r.dropped; d > 0 {
			r.lost(uint64(d))
		}
		r.dropped = dropped
		if hsize < headerSize || hsize > n {
			r.lost(1)
			continue
		}
		if err := r.message(typ, buf[hsize:n]); err != nil {
			r.lost(1)
		}
	}
}

// lost reports n points the sentry (or this reader) could not deliver.
func (r *reader) lost(n uint64) {
	r.ev = observe.Event{Type: observe.TypeLost, TS: time.Now().UnixNano(), Lost: n, Source: observe.LostKernel}
	r.sink.Handle(&r.ev)
}

// message maps one point to events.
func (r *reader) message(typ pb.MessageType, data []byte) error {
	switch typ {
	case pb.MessageType_MESSAGE_SYSCALL_RAW:
		var m pb.Syscall
		if err := proto.Unmarshal(data, &m); err != nil {
			return err
		}
		r.syscall(m.ContextData, m.Sysno, m.Exit, [6]uint64{m.Arg1, m.Arg2, m.Arg3, m.Arg4, m.Arg5, m.Arg6}, "", "")
	case pb.MessageType_MESSAGE_SYSCALL_OPEN:
		var m pb.Open
		if err := proto.Unmarshal(data, &m); err != nil {
			return err
		}
		var a [6]uint64
		switch m.Sysno {
		case unix.SYS_OPEN:
			a[1], a[2] = uint64(m.Flags), uint64(m.Mode)
		case unix.SYS_CREAT:
			a[1] = uint64(m.Mode)
		default: // openat
			a[0], a[2], a[3] = uint64(m.Fd), uint64(m.Flags), uint64(m.Mode)
		}
		r.syscall(m.ContextData, m.Sysno, m.Exit, a, m.Pathname, "")
	case pb.MessageType_MESSAGE_SYSCALL_CHDIR:
		var m pb.Chdir
		if err := proto.Unmarshal(data, &m); err != nil {
			return err
		}
		r.syscall(m.ContextData, m.Sysno, m.Exit, [6]uint64{}, m.Pathname, "")
	case pb.MessageType_MESSAGE_SYSCALL_CONNECT:
		var m pb.Connect
		if err := proto.Unmarshal(data, &m); err != nil {
			return err
		}
		r.syscall(m.ContextData, m.Sysno, m.Exit, [6]uint64{uint64(m.Fd), 0, uint64(len(m.Address))}, "", observe.Sockaddr(m.Address))
	case pb.MessageType_MESSAGE_SENTRY_CLONE:
		var m pb.CloneInfo
		if err := proto.Unmarshal(data, &m); err != nil {
			return err
		}
		r.clone(&m)
	case pb.MessageType_MESSAGE_SENTRY_EXEC:
		var m pb.ExecveInfo
		if err := proto.Unmarshal(data, &m); err != nil {
			return err
		}
		r.exec(&m)
	case pb.MessageType_MESSAGE_SENTRY_TASK_EXIT:
		var m pb.TaskExit
		if err := proto.Unmarshal(data, &m); err != nil {
			return err
		}
		r.taskExit(&m)
	case pb.MessageType_MESSAGE_SENTRY_EXIT_NOTIFY_PARENT:
		var m pb.ExitNotifyParentInfo
		if err := proto.Unmarshal(data, &m); err != nil {
			return err
		}
		r.exitNotify(&m)
	}
	return nil
}

// header fills the fields every event of the task of c has. The jail's
// processes are not host processes: the host ids stay 0.
func (r *reader) header(typ observe.Type, c *pb.ContextData) *observe.Event {
	r.ev = observe.Event{Type: typ}
	ev := &r.ev
	if c != nil {
		ev.TS, ev.PID, ev.TID, ev.Comm = c.TimeNs, c.ThreadGroupId, c.ThreadId, c.ProcessName
	}
	if ev.TS == 0 {
		ev.TS = time.Now().UnixNano()
	}
	return ev
}

func (r *reader) syscall(c *pb.ContextData, nr uint64, exit *pb.Exit, args [6]uint64, path, addr string) {
	ev := r.header(observe.TypeSyscall, c)
	if r.plumbing[ev.PID] && nr != unix.SYS_EXECVE && nr != unix.SYS_EXECVEAT {
		return
	}
	if ev.PID == initPid {
		if nr == unix.SYS_PRCTL && args[0] == initproto.RecordOption {
			if args[1] != 0 {
				r.recorded[ev.TID] = true
			} else {
				delete(r.recorded, ev.TID)
			}
			return
		}
		if !r.recorded[ev.TID] {
			return
		}
	}
	ev.NR, ev.Args, ev.Path, ev.Addr = int32(nr), args, path, addr
	ev.FDs = [2]int32{-1, -1}
	if exit != nil {
		ev.Ret = exit.Result
		if exit.Errorno != 0 {
			ev.Ret = -exit.Errorno
		}
	}
	if r.internal[ev.NR] {
		ev.Flags |= observe.FlagInternal
	}
	r.sink.Handle(ev)
}

func (r *reader) clone(m *pb.CloneInfo) {
	ev := r.header(observe.TypeProc, m.ContextData)
	parent, caller := ev.PID, ev.TID
	if parent == initPid || r.plumbing[parent] {
		r.plumbing[m.CreatedThreadGroupId] = true
	}
	ev.Op = "fork"
	ev.PPID, ev.CallerTID = parent, caller
	ev.PID, ev.TID = m.CreatedThreadGroupId, m.CreatedThreadId
	ev.Thread = m.Flags&unix.CLONE_THREAD != 0
	ev.SharedFiles = m.Flags&unix.CLONE_FILES != 0
	if m.CreatedThreadStartTimeNs != 0 {
		ev.TS = m.CreatedThreadStartTimeNs
	}
	r.sink.Handle(ev)
}

func (r *reader) exec(m *pb.ExecveInfo) {
	ev := r.header(observe.TypeProc, m.ContextData)
	if c := m.ContextData; c != nil {
		// A shim's child that executes is the command, recorded from
		// here on.
		if c.ParentThreadGroupId != initPid {
			delete(r.plumbing, ev.PID)
		}
		ev.PPID, ev.Cwd = c.ParentThreadGroupId, c.Cwd
		if cr := c.Credentials; cr != nil {
			ev.UID, ev.GID = cr.EffectiveUid, cr.EffectiveGid
		}
	}
	ev.Op, ev.CallerTID = "exec", ev.TID
	ev.Exe, ev.Argv = m.BinaryPath, m.Argv
	r.sink.Handle(ev)
}

// taskExit is one thread's end: the file tracker's cue to let its
// descriptors go. A thread group's end is exitNotify.
func (r *reader) taskExit(m *pb.TaskExit) {
	ev := r.header(observe.TypeProc, m.ContextData)
	ev.Op, ev.Thread = "exit", true
	if ev.PID == ev.TID {
		// The leader: the process's exit follows as exitNotify.
		ev.Flags |= observe.FlagInternal
	}
	ev.ExitCode = m.ExitStatus
	r.sink.Handle(ev)
}

// exitNotify is a process's end, with its wait status.
func (r *reader) exitNotify(m *pb.ExitNotifyParentInfo) {
	ev := r.header(observe.TypeProc, m.ContextData)
	delete(r.plumbing, ev.PID)
	ws := unix.WaitStatus(m.ExitStatus)
	ev.Op, ev.TID = "exit", ev.PID
	if ws.Signaled() {
		ev.Signal, ev.CoreDumped = int32(ws.Signal()), ws.CoreDump()
	} else {
		ev.ExitCode = int32(ws.ExitStatus())
	}
	r.sink.Handle(ev)
}
