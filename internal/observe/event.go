// Package observe is agentjail's observation layer in user space: the event
// model (syscall, file, network and process events with seed 000's JSON field
// names), the per-jail JSONL writer, the bounded in-memory ring with fan-out
// to subscribers (Bus), and the derivation of file events from the syscall
// stream (FileTracker). The kernel-side capture lives in the bpf
// sub-package, which delivers decoded events to a Sink.
//
// Every consumer here is built so that it never blocks the producer: the
// writer drops and counts when the disk is slower than the stream, and a slow
// subscriber is skipped ahead with a notice event.
package observe

import (
	"strconv"
	"strings"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/jsonstr"
)

// JailKey names the jail an event stream belongs to (the jail id).
type JailKey string

// Type is the kind of an event.
type Type uint8

// The event types. The JSON "type" field carries String().
const (
	TypeSyscall Type = iota + 1 // one system call, recorded at its return
	TypeFile                    // a file operation derived from the syscall stream
	TypeNet                     // a network flow
	TypeProc                    // fork, exec or exit of a process, or one a restore brought back
	TypeLost                    // events that were dropped, with their count
	TypeNotice                  // a note to one subscriber (skipped ahead); never stored
	TypeJail                    // a change in the jail's health (its init stopped or resumed answering)
)

var typeNames = [...]string{
	TypeSyscall: "syscall",
	TypeFile:    "file",
	TypeNet:     "net",
	TypeProc:    "proc",
	TypeLost:    "lost",
	TypeNotice:  "notice",
	TypeJail:    "jail",
}

// String returns the JSON name of t ("syscall", "file", ...).
func (t Type) String() string {
	if int(t) < len(typeNames) && typeNames[t] != "" {
		return typeNames[t]
	}
	return "type(" + strconv.Itoa(int(t)) + ")"
}

// ParseType returns the Type whose JSON name is s; an unknown name is an
// errdefs.ErrInvalid error naming the value.
func ParseType(s string) (Type, error) {
	for i, n := range typeNames {
		if n != "" && n == s {
			return Type(i), nil
		}
	}
	return 0, errdefs.Invalidf("event type %q: unknown (want syscall, file, net, proc, lost or notice)", s)
}

// TypeMask is a set of event types; the zero mask means "all types".
type TypeMask uint32

// MaskOf returns the set holding types.
func MaskOf(types ...Type) TypeMask {
	var m TypeMask
	for _, t := range types {
		m |= 1 << t
	}
	return m
}

// Has reports whether t is in m (always true for the zero mask).
func (m TypeMask) Has(t Type) bool { return m == 0 || m&(1<<t) != 0 }

// Event flags.
const (
	// FlagInternal marks an event delivered only so that others can be
	// derived from it (a syscall the jail's options exclude but that the file
	// tracker needs, a thread's creation or exit). It is neither written nor
	// published.
	FlagInternal uint8 = 1 << iota
)

// Source values of lost events.
const (
	LostKernel = "kernel" // the kernel ring buffer was full
	LostWriter = "writer" // the JSONL writer fell behind the disk
)

// Event is one observation. It is a flat value (no per-type allocation);
// which fields are meaningful depends on Type, as listed per field. Pids
// without a Host prefix are as seen inside the jail's pid namespace.
type Event struct {
	Seq   uint64 // position in the jail's Bus, from 1; 0 before publishing
	Type  Type
	Flags uint8
	TS    int64 // Unix time in nanoseconds (JSON: "ts" in ms, "ts_ns")

	PID, TID         int32  // all types but lost/notice
	HostPID, HostTID int32  // all types but lost/notice
	PPID, HostPPID   int32  // proc
	Comm             string // syscall, file, proc, net

	// syscall. One event may stand for a run of identical calls of one
	// task (same number, arguments and return value; see Count): TS is then
	// the first call's start, LastTS the last one's, DurNS their summed
	// duration.
	NR    int32
	Args  [6]uint64
	Ret   int64
	DurNS uint64
	Path  string   // syscall (first path argument), file
	Path2 string   // syscall (second path argument), file (rename/link target)
	Addr  string   // syscall: the socket address argument, decoded
	FDs   [2]int32 // syscall: the descriptors a successful pipe, pipe2 or socketpair filled in

	// file, proc
	Op    string // file: open, read, write, close, unlink, ...; proc: fork, exec, exit, restored; net: the record kind (netcap.Op*); jail: unresponsive, responsive
	Bytes int64  // file: bytes moved by the reads or writes of one open; net: bytes
	Count int64  // file: number of calls aggregated; syscall: number of identical calls this event stands for (0 and 1: one)
	FD    int32  // file: the descriptor, -1 when none
	Mode  int64  // file: open flags, chmod mode

	// net
	Dir, Proto, Src, Dst string
	Packets              uint64 // net: packets the jail sent
	PacketsIn            uint64 // net: packets the jail received
	FirstTS, LastTS      int64  // Unix ns; syscall: LastTS is the start of the last call of a run
	// net, from the network policy: how the connection went (via: kernel,
	// dns, proxy, ...), the name asked for, the verdict and the rule that
	// decided, HTTP(S) method/path (in Path)/status, bytes received by the
	// jail (Bytes counts those it sent), DNS query type and answers.
	Via, Host, Verdict, Rule string
	Method                   string
	Status                   int32
	BytesIn                  int64
	QType                    string
	Answers                  []string
	Error                    string
	// net, from the network policy: the origin a route sent an HTTP
	// request to, and the names of the credential headers the proxy added.
	Upstream    string
	Credentials []string

	// proc
	Exe           string
	Argv          []string
	ArgvTruncated bool
	Cwd           string
	UID, GID      uint32
	ExitCode      int32 // exit: the status when Signal is 0
	Signal        int32 // exit: the terminating signal, 0 when the process exited
	CoreDumped    bool
	Thread        bool  // fork: a thread of the caller; exit: a thread (not the last one)
	SharedFiles   bool  // fork: shares the caller's descriptor table
	CallerTID     int32 // fork: host tid (or, when HostTID is 0, jail tid) of the thread that called clone; exec: that tid before exec

	// lost, notice, jail
	Lost    uint64 // lost: events dropped; notice: events skipped
	Source  string // lost: LostKernel or LostWriter
	Message string // notice, jail
}

// Calls returns the number of calls a syscall event stands for (at least 1).
func (e *Event) Calls() int64 { return max(e.Count, 1) }

// Name returns the syscall's name for a syscall event ("" when unknown).
func (e *Event) Name() string { return SyscallName(int(e.NR)) }

// MarshalJSON returns the event's JSONL object (without the newline).
func (e *Event) MarshalJSON() ([]byte, error) { return e.AppendJSON(nil), nil }

// AppendJSON appends the event's JSON object (no trailing newline) to b
// and returns the extended buffer. It does not allocate beyond growing b.
func (e *Event) AppendJSON(b []byte) []byte {
	b = append(b, `{"type":"`...)
	b = append(b, e.Type.String()...)
	b = append(b, '"')
	if e.Seq != 0 {
		b = appendUintField(b, "seq", e.Seq)
	}
	b = appendIntField(b, "ts", e.TS/1e6)
	b = appendIntField(b, "ts_ns", e.TS)
	switch e.Type {
	case TypeSyscall:
		b = e.appendIDs(b, true)
		b = appendIntField(b, "nr", int64(e.NR))
		b = appendStringField(b, "name", e.Name())
		b = append(b, `,"args":[`...)
		for i, a := range e.Args {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendUint(b, a, 10)
		}
		b = append(b, ']')
		b = appendIntField(b, "ret", e.Ret)
		b = appendUintField(b, "dur_ns", e.DurNS)
		if e.Count > 1 {
			b = appendIntField(b, "count", e.Count)
			b = appendIntField(b, "last_ts_ns", e.LastTS)
		}
		b = appendOptString(b, "path", e.Path)
		b = appendOptString(b, "path2", e.Path2)
		b = appendOptString(b, "addr", e.Addr)
		if (e.NR == sysPipe || e.NR == sysPipe2 || e.NR == sysSocketpair) && e.Ret == 0 {
			b = append(b, `,"fds":[`...)
			b = strconv.AppendInt(b, int64(e.FDs[0]), 10)
			b = append(b, ',')
			b = strconv.AppendInt(b, int64(e.FDs[1]), 10)
			b = append(b, ']')
		}
	case TypeFile:
		b = e.appendIDs(b, true)
		b = appendStringField(b, "op", e.Op)
		b = appendStringField(b, "path", e.Path)
		b = appendOptString(b, "path2", e.Path2)
		b = appendIntField(b, "bytes", e.Bytes)
		if e.Count != 0 {
			b = appendIntField(b, "count", e.Count)
		}
		if e.FD >= 0 {
			b = appendIntField(b, "fd", int64(e.FD))
		}
		if e.Mode != 0 {
			b = appendIntField(b, "mode", e.Mode)
		}
	case TypeNet:
		b = e.appendIDs(b, false)
		b = appendStringField(b, "dir", e.Dir)
		b = appendStringField(b, "proto", e.Proto)
		b = appendStringField(b, "src", e.Src)
		b = appendStringField(b, "dst", e.Dst)
		b = appendOptString(b, "op", e.Op)
		b = appendIntField(b, "bytes", e.Bytes)
		b = appendUintField(b, "packets", e.Packets)
		if e.PacketsIn != 0 {
			b = appendUintField(b, "packets_in", e.PacketsIn)
		}
		b = appendIntField(b, "first_ts", e.FirstTS/1e6)
		b = appendIntField(b, "last_ts", e.LastTS/1e6)
		b = e.appendPolicy(b)
	case TypeProc:
		b = appendStringField(b, "op", e.Op)
		b = appendIntField(b, "pid", int64(e.PID))
		b = appendIntField(b, "ppid", int64(e.PPID))
		b = appendIntField(b, "tid", int64(e.TID))
		b = appendIntField(b, "host_pid", int64(e.HostPID))
		b = appendIntField(b, "host_ppid", int64(e.HostPPID))
		b = appendStringField(b, "comm", e.Comm)
		switch e.Op {
		case "exec", "restored":
			b = appendStringField(b, "exe", e.Exe)
			b = append(b, `,"argv":[`...)
			for i, a := range e.Argv {
				if i > 0 {
					b = append(b, ',')
				}
				b = jsonstr.Append(b, a)
			}
			b = append(b, ']')
			if e.ArgvTruncated {
				b = append(b, `,"argv_truncated":true`...)
			}
			b = appendStringField(b, "cwd", e.Cwd)
			b = appendUintField(b, "uid", uint64(e.UID))
			b = appendUintField(b, "gid", uint64(e.GID))
		case "exit":
			if e.Signal != 0 {
				b = appendIntField(b, "signal", int64(e.Signal))
				if e.CoreDumped {
					b = append(b, `,"core_dumped":true`...)
				}
			} else {
				b = appendIntField(b, "exit_code", int64(e.ExitCode))
			}
		}
	case TypeLost:
		b = appendStringField(b, "source", e.Source)
		b = appendUintField(b, "count", e.Lost)
	case TypeNotice:
		b = appendStringField(b, "message", e.Message)
		b = appendUintField(b, "skipped", e.Lost)
	case TypeJail:
		b = appendStringField(b, "op", e.Op)
		b = appendStringField(b, "message", e.Message)
	}
	return append(b, '}')
}

func (e *Event) appendIDs(b []byte, tid bool) []byte {
	b = appendIntField(b, "pid", int64(e.PID))
	if tid {
		b = appendIntField(b, "tid", int64(e.TID))
	}
	b = appendIntField(b, "host_pid", int64(e.HostPID))
	if tid {
		b = appendIntField(b, "host_tid", int64(e.HostTID))
	}
	return appendStringField(b, "comm", e.Comm)
}

func appendIntField(b []byte, name string, v int64) []byte {
	b = append(b, ',', '"')
	b = append(b, name...)
	b = append(b, '"', ':')
	return strconv.AppendInt(b, v, 10)
}

func appendUintField(b []byte, name string, v uint64) []byte {
	b = append(b, ',', '"')
	b = append(b, name...)
	b = append(b, '"', ':')
	return strconv.AppendUint(b, v, 10)
}

func appendStringField(b []byte, name, v string) []byte {
	b = append(b, ',', '"')
	b = append(b, name...)
	b = append(b, '"', ':')
	return jsonstr.Append(b, v)
}

func appendOptString(b []byte, name, v string) []byte {
	if v == "" {
		return b
	}
	return appendStringField(b, name, v)
}

// SyscallName returns the x86_64 name of syscall nr, or "" when unknown.
func SyscallName(nr int) string {
	if nr >= 0 && nr < len(syscallNames) {
		return syscallNames[nr]
	}
	return ""
}

// SyscallNumber returns the x86_64 number of the named syscall.
func SyscallNumber(name string) (int, bool) {
	name = strings.TrimSpace(name)
	for nr, n := range syscallNames {
		if n != "" && n == name {
			return nr, true
		}
	}
	return 0, false
}

// MaxSyscall is one more than the highest known syscall number.
const MaxSyscall = len(syscallNames)

// appendPolicy appends the network policy fields of a net event that are set.
func (e *Event) appendPolicy(b []byte) []byte {
	b = appendOptString(b, "via", e.Via)
	b = appendOptString(b, "host", e.Host)
	b = appendOptString(b, "verdict", e.Verdict)
	b = appendOptString(b, "rule", e.Rule)
	b = appendOptString(b, "method", e.Method)
	if e.Method != "" {
		b = appendOptString(b, "path", e.Path)
	}
	if e.Status != 0 {
		b = appendIntField(b, "status", int64(e.Status))
	}
	if e.BytesIn != 0 {
		b = appendIntField(b, "bytes_in", e.BytesIn)
	}
	b = appendOptString(b, "qtype", e.QType)
	if len(e.Answers) > 0 {
		b = append(b, `,"answers":[`...)
		for i, a := range e.Answers {
			if i > 0 {
				b = append(b, ',')
			}
			b = jsonstr.Append(b, a)
		}
		b = append(b, ']')
	}
	b = appendOptString(b, "upstream", e.Upstream)
	if len(e.Credentials) > 0 {
		b = append(b, `,"credentials":[`...)
		for i, c := range e.Credentials {
			if i > 0 {
				b = append(b, ',')
			}
			b = jsonstr.Append(b, c)
		}
		b = append(b, ']')
	}
	return appendOptString(b, "error", e.Error)
}
