package guest

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/backend/vm/vmproto"
)

// maxPending bounds the events kept while no daemon reads them; beyond it
// they are counted as lost.
const maxPending = 1 << 16

// events watches the guest kernel's process events (the proc connector)
// from before init starts, describes each in the jail's terms (command
// line, executable, working directory and user read from /proc at exec)
// and keeps them until a daemon's KindEvents stream takes them.
type events struct {
	mu      sync.Mutex
	cond    *sync.Cond
	pending []vmproto.ProcEvent
	lost    uint64
}

func newEvents() *events {
	e := &events{}
	e.cond = sync.NewCond(&e.mu)
	return e
}

// start subscribes to the kernel's process events (the proc connector).
// (netlink.ProcEventMonitor would also open route, xfrm and netfilter
// sockets, which the guest kernel's modules do not all provide.)
func (e *events) start() error {
	sock, err := nl.Subscribe(unix.NETLINK_CONNECTOR, netlink.CN_IDX_PROC)
	if err != nil {
		return err
	}
	req := nl.NetlinkRequest{NlMsghdr: unix.NlMsghdr{
		Len: unix.SizeofNlMsghdr, Type: unix.NLMSG_DONE, Pid: uint32(os.Getpid()),
	}}
	req.AddData(nl.NewCnMsg(netlink.CN_IDX_PROC, netlink.CN_VAL_PROC, netlink.PROC_CN_MCAST_LISTEN))
	if err := sock.Send(&req); err != nil {
		sock.Close()
		return err
	}
	// The reader is a real-time thread: woken by an exec's event, it runs
	// before the program can go on, and reads its command line from /proc
	// before a short-lived program is gone.
	go func() {
		runtime.LockOSThread()
		attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: 10}
		if err := unix.SchedSetAttr(0, &attr, 0); err != nil {
			logger.Printf("process events: real-time reader: %v", err)
		}
		for {
			msgs, from, err := sock.Receive()
			if err != nil {
				logger.Printf("process events: %v", err)
				return
			}
			if from.Pid != nl.PidKernel {
				continue
			}
			for _, m := range msgs {
				if ev, ok := parseProcEvent(m); ok {
					if pe, ok := describe(ev); ok {
						e.add(pe)
					}
				}
			}
		}
	}()
	return nil
}

// parseProcEvent decodes one proc connector message: a connector header,
// the event header, then the event of its kind.
func parseProcEvent(m syscall.NetlinkMessage) (netlink.ProcEvent, bool) {
	var ev netlink.ProcEvent
	if m.Header.Type != unix.NLMSG_DONE {
		return ev, false
	}
	r := bytes.NewReader(m.Data)
	var cn nl.CnMsg
	if binary.Read(r, binary.NativeEndian, &cn) != nil || binary.Read(r, binary.NativeEndian, &ev.ProcEventHeader) != nil {
		return ev, false
	}
	switch ev.What {
	case netlink.PROC_EVENT_FORK:
		ev.Msg = &netlink.ForkProcEvent{}
	case netlink.PROC_EVENT_EXEC:
		ev.Msg = &netlink.ExecProcEvent{}
	case netlink.PROC_EVENT_EXIT:
		ev.Msg = &netlink.ExitProcEvent{}
	default:
		return ev, false
	}
	return ev, binary.Read(r, binary.NativeEndian, ev.Msg) == nil
}

func (e *events) add(pe vmproto.ProcEvent) {
	e.mu.Lock()
	if len(e.pending) < maxPending {
		e.pending = append(e.pending, pe)
	} else {
		e.lost++
	}
	e.mu.Unlock()
	e.cond.Broadcast()
}

// serve sends the events to c, as JSON lines, until the daemon closes
// the stream (it writes nothing on it) or a write fails: what a failed
// write did not deliver is kept for the next stream.
func (e *events) serve(c net.Conn) {
	defer c.Close()
	closed := false
	go func() {
		var b [1]byte
		c.Read(b[:])
		e.mu.Lock()
		closed = true
		e.mu.Unlock()
		e.cond.Broadcast()
	}()
	var buf bytes.Buffer
	for {
		e.mu.Lock()
		for len(e.pending) == 0 && e.lost == 0 && !closed {
			e.cond.Wait()
		}
		if closed {
			e.mu.Unlock()
			return
		}
		batch, lost := e.pending, e.lost
		e.pending, e.lost = nil, 0
		e.mu.Unlock()
		buf.Reset()
		enc := json.NewEncoder(&buf)
		if lost > 0 {
			enc.Encode(vmproto.ProcEvent{Op: vmproto.OpLost, TS: time.Now().UnixNano(), Lost: lost})
		}
		for i := range batch {
			enc.Encode(&batch[i])
		}
		if _, err := c.Write(buf.Bytes()); err != nil {
			e.mu.Lock()
			e.pending = append(batch, e.pending...)
			e.lost += lost
			e.mu.Unlock()
			return
		}
	}
}

// describe maps a kernel process event to the jail's terms; false for
// what is not the jail's (the guest's own PID 1 and kernel threads).
func describe(ev netlink.ProcEvent) (vmproto.ProcEvent, bool) {
	pe := vmproto.ProcEvent{TS: time.Now().UnixNano()}
	switch m := ev.Msg.(type) {
	case *netlink.ForkProcEvent:
		if m.ParentTgid == 1 && m.ChildTgid == 1 || m.ParentTgid == 2 || m.ParentTgid == 0 {
			return pe, false
		}
		pe.Op, pe.PID, pe.PPID = "fork", int32(m.ChildTgid), int32(m.ParentTgid)
		pe.Thread = m.ChildPid != m.ChildTgid
		pe.Comm = comm(int(m.ChildTgid))
	case *netlink.ExecProcEvent:
		pid := int(m.ProcessTgid)
		pe.Op, pe.PID = "exec", int32(pid)
		dir := "/proc/" + strconv.Itoa(pid)
		if b, err := os.ReadFile(dir + "/cmdline"); err == nil {
			pe.Argv = strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		}
		pe.Exe, _ = os.Readlink(dir + "/exe")
		pe.Cwd, _ = os.Readlink(dir + "/cwd")
		pe.Comm = comm(pid)
		if st, err := os.ReadFile(dir + "/status"); err == nil {
			for _, l := range strings.Split(string(st), "\n") {
				k, v, _ := strings.Cut(l, ":")
				f := strings.Fields(v)
				switch {
				case k == "PPid" && len(f) > 0:
					n, _ := strconv.Atoi(f[0])
					pe.PPID = int32(n)
				case (k == "Uid" || k == "Gid") && len(f) > 1:
					n, _ := strconv.ParseUint(f[1], 10, 32)
					if k == "Uid" {
						pe.UID = uint32(n)
					} else {
						pe.GID = uint32(n)
					}
				}
			}
		}
	case *netlink.ExitProcEvent:
		if m.ProcessTgid <= 2 {
			return pe, false
		}
		pe.Op, pe.PID, pe.PPID = "exit", int32(m.ProcessTgid), int32(m.ParentTgid)
		pe.Thread = m.ProcessPid != m.ProcessTgid
		if sig := m.ExitCode & 0x7f; sig != 0 {
			pe.Signal = int32(sig)
		} else {
			pe.ExitCode = int32(m.ExitCode >> 8 & 0xff)
		}
	default:
		return pe, false
	}
	return pe, true
}

func comm(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return strings.TrimSpace(string(b))
}
