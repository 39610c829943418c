package bpf

import (
	"encoding/binary"
	"strings"
	"unsafe"

	"github.com/agentjail/agentjail/internal/observe"
)

// Record kinds (enum ev_kind in observe.h).
const (
	evSyscall = 1
	evFork    = 2
	evExec    = 3
	evExit    = 4

	forkThread      = 1
	forkSharedFiles = 2

	strMax = 512
	cwdMax = 1024
)

var (
	hdrSize    = int(unsafe.Sizeof(observeHdr{}))
	sysEvSize  = int(unsafe.Sizeof(observeSysEv{}))
	forkEvSize = int(unsafe.Sizeof(observeForkEv{}))
	execEvSize = int(unsafe.Sizeof(observeExecEv{}))
	exitEvSize = int(unsafe.Sizeof(observeExitEv{}))
)

// decoder turns ring records into events. It reuses one Event and interns
// command names; it belongs to the reader goroutine.
type decoder struct {
	ev    observe.Event
	comms map[[16]int8]string
}

func cgroupOf(raw []byte) uint64 { return binary.LittleEndian.Uint64(raw[8:16]) }

func (d *decoder) comm(c *[16]int8) string {
	if s, ok := d.comms[*c]; ok {
		return s
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(&c[0])), len(c))
	s := cstring(b)
	if len(d.comms) > 4096 {
		clear(d.comms)
	}
	d.comms[*c] = s
	return s
}

// nsOr returns the namespace id, or the host id when the task is not
// visible in its own namespace's numbering (0).
func nsOr(ns, host uint32) int32 {
	if ns == 0 {
		return int32(host)
	}
	return int32(ns)
}

// decode fills d.ev from raw; it reports false for records it does not
// understand.
func (d *decoder) decode(raw []byte, monoOff int64, st *watchState) bool {
	h := (*observeHdr)(unsafe.Pointer(&raw[0]))
	ev := &d.ev
	*ev = observe.Event{
		TS:      int64(h.Ts) + monoOff,
		PID:     nsOr(h.NsTgid, h.Tgid),
		TID:     nsOr(h.NsTid, h.Tid),
		HostPID: int32(h.Tgid),
		HostTID: int32(h.Tid),
		Comm:    d.comm(&h.Comm),
		FD:      -1,
	}
	switch h.Kind {
	case evSyscall:
		if len(raw) < sysEvSize {
			return false
		}
		e := (*observeSysEv)(unsafe.Pointer(&raw[0]))
		ev.Type = observe.TypeSyscall
		ev.NR = int32(e.Nr)
		ev.Args = e.Args
		ev.Ret = e.Ret
		ev.DurNS = e.Dur
		ev.FDs = [2]int32{e.Aux[0], e.Aux[1]}
		if e.Count > 1 {
			// Repetitions the kernel counted in a run.
			ev.Count = int64(e.Count)
			ev.LastTS = int64(e.LastTs) + monoOff
		}
		if int(e.Nr) >= len(st.user) || !st.user[e.Nr] {
			ev.Flags |= observe.FlagInternal
		}
		if e.Len0 > 0 && len(raw) >= sysEvSize+strMax {
			s0 := raw[sysEvSize : sysEvSize+min(int(e.Len0), strMax)]
			if specHasSockaddr(argSpecs[int(e.Nr)]) {
				ev.Addr = observe.Sockaddr(s0)
			} else {
				ev.Path = cstring(s0)
			}
		}
		if e.Len1 > 0 && len(raw) >= sysEvSize+2*strMax {
			ev.Path2 = cstring(raw[sysEvSize+strMax : sysEvSize+strMax+min(int(e.Len1), strMax)])
		}
	case evFork:
		if len(raw) < forkEvSize {
			return false
		}
		e := (*observeForkEv)(unsafe.Pointer(&raw[0]))
		ev.Type = observe.TypeProc
		ev.Op = "fork"
		ev.CallerTID = int32(h.Tid)
		ev.PID = nsOr(e.ChildNsTgid, e.ChildTgid)
		ev.TID = nsOr(e.ChildNsTid, e.ChildTid)
		ev.HostPID = int32(e.ChildTgid)
		ev.HostTID = int32(e.ChildTid)
		ev.PPID = int32(e.NsPpid)
		ev.HostPPID = int32(e.Ppid)
		ev.Thread = e.Fflags&forkThread != 0
		ev.SharedFiles = e.Fflags&forkSharedFiles != 0
		if ev.Thread {
			ev.Flags |= observe.FlagInternal
		}
	case evExec:
		if len(raw) < execEvSize {
			return false
		}
		e := (*observeExecEv)(unsafe.Pointer(&raw[0]))
		ev.Type = observe.TypeProc
		ev.Op = "exec"
		ev.CallerTID = int32(e.OldTid)
		ev.PPID = int32(e.NsPpid)
		ev.HostPPID = int32(e.Ppid)
		ev.UID = e.Uid
		ev.GID = e.Gid
		ev.Exe = cstring(int8s(e.File[:min(int(e.FileLen), len(e.File))]))
		ev.Argv = splitArgv(int8s(e.Argv[:min(int(e.ArgvLen), len(e.Argv))]))
		ev.ArgvTruncated = e.ArgvTrunc != 0
		ev.Cwd = joinCwd(int8s(e.Cwd[:min(int(e.CwdLen), len(e.Cwd))]), int(e.CwdLen) >= cwdMax)
	case evExit:
		if len(raw) < exitEvSize {
			return false
		}
		e := (*observeExitEv)(unsafe.Pointer(&raw[0]))
		ev.Type = observe.TypeProc
		ev.Op = "exit"
		ev.PPID = int32(e.NsPpid)
		ev.HostPPID = int32(e.Ppid)
		code := e.ExitCode
		if sig := code & 0x7f; sig != 0 {
			ev.Signal = sig
			ev.CoreDumped = code&0x80 != 0
		} else {
			ev.ExitCode = (code >> 8) & 0xff
		}
		if e.GroupDead == 0 {
			ev.Thread = true
			ev.Flags |= observe.FlagInternal
		}
	default:
		return false
	}
	return true
}

func int8s(s []int8) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s))
}

// cstring returns b up to its first NUL.
func cstring(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// splitArgv splits the NUL-separated argument area of a process.
func splitArgv(b []byte) []string {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	if len(b) == 0 {
		return nil
	}
	return strings.Split(string(b), "\x00")
}

// joinCwd builds a path from NUL-terminated components listed leaf first.
// A truncated walk is marked with a leading "/...".
func joinCwd(b []byte, truncated bool) string {
	var parts []string
	for len(b) > 0 {
		i := 0
		for i < len(b) && b[i] != 0 {
			i++
		}
		if i > 0 {
			parts = append(parts, string(b[:i]))
		}
		if i == len(b) {
			break
		}
		b = b[i+1:]
	}
	var sb strings.Builder
	if truncated {
		sb.WriteString("/...")
	}
	for i := len(parts) - 1; i >= 0; i-- {
		sb.WriteByte('/')
		sb.WriteString(parts[i])
	}
	if sb.Len() == 0 {
		return "/"
	}
	return sb.String()
}
