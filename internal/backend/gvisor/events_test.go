package gvisor

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"

	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/observe"
)

// collect is a sink that keeps copies of what it is handed.
type collect struct{ evs []observe.Event }

func (c *collect) Handle(ev *observe.Event) { c.evs = append(c.evs, *ev) }
func (c *collect) Idle()                    {}

func feed(t *testing.T, r *reader, typ pb.MessageType, m proto.Message) {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.message(typ, b); err != nil {
		t.Fatal(err)
	}
}

func ctxData(pid, tid int32, comm string) *pb.ContextData {
	return &pb.ContextData{TimeNs: 1, ThreadGroupId: pid, ThreadId: tid, ProcessName: comm}
}

// TestReaderMapsPoints: the sentry's points become the events the kernel
// tracer would have recorded, with the jail's own plumbing (init's
// children until they execute the command) left out of the syscalls.
func TestReaderMapsPoints(t *testing.T) {
	c := &collect{}
	r := &reader{sink: c, internal: map[int32]bool{unix.SYS_CLOSE: true}, plumbing: map[int32]bool{}, recorded: map[int32]bool{}}
	// init's own calls are left out but on a thread it marks (3) for a
	// file operation of the files API, between the marks.
	feed(t, r, pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{ContextData: ctxData(1, 1, "agentjail"), Sysno: unix.SYS_GETPID, Exit: &pb.Exit{Result: 1}})
	feed(t, r, pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{ContextData: ctxData(1, 3, "agentjail"), Sysno: unix.SYS_PRCTL,
		Arg1: initproto.RecordOption, Arg2: 1, Exit: &pb.Exit{Result: -1, Errorno: int64(unix.EINVAL)}})
	feed(t, r, pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{ContextData: ctxData(1, 1, "agentjail"), Sysno: unix.SYS_PIPE2})
	feed(t, r, pb.MessageType_MESSAGE_SYSCALL_OPEN, &pb.Open{ContextData: ctxData(1, 3, "agentjail"), Sysno: unix.SYS_OPENAT,
		Fd: unix.AT_FDCWD, Pathname: "/workspace/up", Flags: unix.O_WRONLY, Exit: &pb.Exit{Result: 7}})
	feed(t, r, pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{ContextData: ctxData(1, 3, "agentjail"), Sysno: unix.SYS_PRCTL,
		Arg1: initproto.RecordOption, Arg2: 0, Exit: &pb.Exit{Result: -1, Errorno: int64(unix.EINVAL)}})
	feed(t, r, pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{ContextData: ctxData(1, 3, "agentjail"), Sysno: unix.SYS_GETPID, Exit: &pb.Exit{Result: 1}})
	// init (1) starts a shim (5), which starts the command (6).
	feed(t, r, pb.MessageType_MESSAGE_SENTRY_CLONE, &pb.CloneInfo{ContextData: ctxData(1, 1, "agentjail"), CreatedThreadId: 5, CreatedThreadGroupId: 5})
	feed(t, r, pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{ContextData: ctxData(5, 5, "agentjail"), Sysno: unix.SYS_GETPID, Exit: &pb.Exit{Result: 5}})
	feed(t, r, pb.MessageType_MESSAGE_SENTRY_CLONE, &pb.CloneInfo{ContextData: ctxData(5, 5, "agentjail"), CreatedThreadId: 6, CreatedThreadGroupId: 6})
	feed(t, r, pb.MessageType_MESSAGE_SENTRY_EXEC, &pb.ExecveInfo{
		ContextData: &pb.ContextData{ThreadGroupId: 6, ThreadId: 6, ProcessName: "cat", ParentThreadGroupId: 5, Cwd: "/w",
			Credentials: &pb.Credentials{EffectiveUid: 1000, EffectiveGid: 1000}},
		BinaryPath: "/usr/bin/cat", Argv: []string{"cat", "f"},
	})
	feed(t, r, pb.MessageType_MESSAGE_SYSCALL_OPEN, &pb.Open{ContextData: ctxData(6, 6, "cat"), Sysno: unix.SYS_OPENAT,
		Fd: unix.AT_FDCWD, Pathname: "f", Flags: unix.O_RDONLY, Exit: &pb.Exit{Result: 3}})
	feed(t, r, pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{ContextData: ctxData(6, 6, "cat"), Sysno: unix.SYS_READ,
		Arg1: 3, Exit: &pb.Exit{Result: -1, Errorno: int64(unix.EINTR)}})
	feed(t, r, pb.MessageType_MESSAGE_SYSCALL_RAW, &pb.Syscall{ContextData: ctxData(6, 6, "cat"), Sysno: unix.SYS_CLOSE, Arg1: 3})
	feed(t, r, pb.MessageType_MESSAGE_SYSCALL_CONNECT, &pb.Connect{ContextData: ctxData(6, 6, "cat"), Sysno: unix.SYS_CONNECT,
		Fd: 4, Address: []byte{2, 0, 0, 80, 10, 0, 0, 1}})
	feed(t, r, pb.MessageType_MESSAGE_SENTRY_TASK_EXIT, &pb.TaskExit{ContextData: ctxData(6, 6, "cat")})
	feed(t, r, pb.MessageType_MESSAGE_SENTRY_EXIT_NOTIFY_PARENT, &pb.ExitNotifyParentInfo{ContextData: ctxData(6, 6, "cat"), ExitStatus: 2 << 8})

	var got []string
	for _, e := range c.evs {
		s := e.Type.String() + " " + e.Op + " " + e.Comm
		if e.Type == observe.TypeSyscall {
			s += " " + e.Name()
		}
		if e.Flags&observe.FlagInternal != 0 {
			s += " internal"
		}
		got = append(got, s)
	}
	want := []string{
		"syscall  agentjail openat",
		"proc fork agentjail",
		// the shim's getpid is plumbing: left out
		"proc fork agentjail",
		"proc exec cat",
		"syscall  cat openat",
		"syscall  cat read",
		"syscall  cat close internal",
		"syscall  cat connect",
		"proc exit cat internal",
		"proc exit cat",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("events:\n%q\nwant\n%q", got, want)
	}
	if up := c.evs[0]; up.Path != "/workspace/up" || up.TID != 3 {
		t.Errorf("init's marked openat: %+v", up)
	}
	fork, exec, open, read, conn, exit := c.evs[2], c.evs[3], c.evs[4], c.evs[5], c.evs[7], c.evs[9]
	if fork.PID != 6 || fork.PPID != 5 || fork.CallerTID != 5 || fork.HostPID != 0 {
		t.Errorf("fork: %+v", fork)
	}
	if exec.Exe != "/usr/bin/cat" || exec.Cwd != "/w" || exec.UID != 1000 || !slices.Equal(exec.Argv, []string{"cat", "f"}) {
		t.Errorf("exec: %+v", exec)
	}
	if open.Path != "f" || int32(open.Args[0]) != unix.AT_FDCWD || open.Ret != 3 {
		t.Errorf("openat: %+v", open)
	}
	if read.Ret != -int64(unix.EINTR) || read.Args[0] != 3 {
		t.Errorf("read: %+v", read)
	}
	if conn.Addr != "10.0.0.1:80" {
		t.Errorf("connect: %+v", conn)
	}
	if exit.ExitCode != 2 || exit.Signal != 0 || exit.Thread {
		t.Errorf("exit: %+v", exit)
	}
}

// TestTracedSyscalls: no-syscalls traces only what the file tracker needs,
// as internal; include and exclude pick the recorded syscalls.
func TestTracedSyscalls(t *testing.T) {
	nrs, internal, err := tracedSyscalls(config.Tracing{Mode: config.TraceNoSyscalls})
	if err != nil {
		t.Fatal(err)
	}
	if len(nrs) != len(internal) || !internal[unix.SYS_OPENAT] {
		t.Errorf("no-syscalls: %d traced, %d internal", len(nrs), len(internal))
	}
	nrs, internal, err = tracedSyscalls(config.Tracing{Include: []string{"getpid", "openat"}, Exclude: []string{"openat"}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(nrs, unix.SYS_GETPID) || internal[unix.SYS_GETPID] || !internal[unix.SYS_OPENAT] {
		t.Errorf("include getpid, exclude openat: internal %v", internal)
	}
	if !slices.Contains(nrs, unix.SYS_PRCTL) || !internal[unix.SYS_PRCTL] {
		t.Errorf("include getpid: prctl (init's marks) is not traced as internal: %v", internal)
	}
	if _, _, err := tracedSyscalls(config.Tracing{Include: []string{"nope"}}); err == nil {
		t.Error("an unknown syscall name was accepted")
	}
	conf, err := sessionConfig("/x.sock", []int{unix.SYS_OPENAT, unix.SYS_GETPID})
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Points []struct{ Name string }
	}
	if err := json.Unmarshal(conf, &s); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range s.Points {
		names = append(names, p.Name)
	}
	for _, want := range []string{"syscall/openat/exit", "syscall/sysno/39/exit", "sentry/execve"} {
		if !slices.Contains(names, want) {
			t.Errorf("session points %v lack %s", names, want)
		}
	}
}

// TestSinkProtocol: the daemon's side of the remote sink protocol over a
// real SOCK_SEQPACKET socket: the handshake, a point per message after
// the header, the sentry's dropped count reported as lost events, and the
// end of the stream when the sandbox goes.
func TestSinkProtocol(t *testing.T) {
	path := filepath.Join(t.TempDir(), "events.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	accepted := make(chan *net.UnixConn, 1)
	go func() {
		c, err := acceptSink(ctx, ln)
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	// The sentry's side: connect, shake hands, send points.
	sentry, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	hs, _ := proto.Marshal(&pb.Handshake{Version: wireVersion})
	if _, err := sentry.Write(hs); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := sentry.Read(buf)
	var reply pb.Handshake
	if err != nil || proto.Unmarshal(buf[:n], &reply) != nil || reply.Version != wireVersion {
		t.Fatalf("handshake reply: %v %v", reply.Version, err)
	}
	conn := <-accepted
	if conn == nil {
		t.FailNow()
	}
	send := func(typ pb.MessageType, dropped uint32, m proto.Message) {
		payload, _ := proto.Marshal(m)
		hdr := make([]byte, headerSize)
		binary.LittleEndian.PutUint16(hdr[0:], headerSize)
		binary.LittleEndian.PutUint16(hdr[2:], uint16(typ))
		binary.LittleEndian.PutUint32(hdr[4:], dropped)
		if _, err := sentry.Write(append(hdr, payload...)); err != nil {
			t.Fatal(err)
		}
	}
	c := &collect{}
	r := &reader{conn: conn, sink: c, internal: map[int32]bool{}, plumbing: map[int32]bool{}, recorded: map[int32]bool{}, done: make(chan struct{})}
	go r.run()
	send(pb.MessageType_MESSAGE_SYSCALL_RAW, 0, &pb.Syscall{ContextData: ctxData(7, 7, "sh"), Sysno: unix.SYS_GETPID, Exit: &pb.Exit{Result: 7}})
	send(pb.MessageType_MESSAGE_SYSCALL_RAW, 5, &pb.Syscall{ContextData: ctxData(7, 7, "sh"), Sysno: unix.SYS_GETPPID, Exit: &pb.Exit{Result: 1}})
	// A header claiming more than the message holds is one lost point.
	if _, err := sentry.Write([]byte{200, 0, 6, 0, 5, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	sentry.Close()
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the reader did not end with the stream")
	}
	var got []string
	for _, e := range c.evs {
		switch e.Type {
		case observe.TypeSyscall:
			got = append(got, e.Name())
		case observe.TypeLost:
			got = append(got, "lost "+strconv.FormatUint(e.Lost, 10))
		}
	}
	if want := []string{"getpid", "lost 5", "getppid", "lost 1"}; !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
	if err := r.stop(); err != nil {
		t.Error(err)
	}
}
