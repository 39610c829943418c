// Package initproto is the wire format between the agentjail daemon and the
// in-jail init (PID 1 of every jail): the in-jail paths of the control
// directory, init's configuration file, and a framed request/stream protocol
// carried over the unix stream socket init listens on.
//
// # Framing
//
// Every message is a frame: one type byte, a 4-byte big-endian payload
// length, then the payload. Control messages carry JSON payloads; stream
// messages (stdin, stdout, stderr, file data) carry raw bytes.
//
// # Connections
//
// A connection carries one operation, unless it is a keep-alive
// connection (below). The client sends one request frame (a Msg* request
// type below), then the operation proceeds:
//
//   - Ping, Signal, Kill, List, Sessions, Stat, ReadDir, Mkdir, Symlink,
//     Remove, Rename, Access: init answers with one MsgOK frame (JSON result,
//     possibly empty) or one MsgError frame (JSON Error).
//   - Exec: init answers MsgStarted (JSON Started) or MsgError. After
//     MsgStarted the client may send MsgStdin / MsgStdinClose (when the
//     request asked for a stdin stream) and init sends MsgStdout / MsgStderr
//     chunks as they are produced, then exactly one MsgExit (JSON ExitStatus)
//     and closes the connection. A client that closes the connection before
//     MsgExit gets the command and all its descendants killed. Another
//     connection may Signal or Kill the process by its pid. A Brief exec
//     (no stdin stream, terminal or Detach) is answered without MsgStarted:
//     the output chunks and MsgExit (which carries the pid) come first, or
//     MsgError; its client may half-close the connection (or close it) to
//     have the command killed.
//   - ReadFile: init answers MsgOK (JSON FileInfo) or MsgError, then after
//     MsgOK streams MsgData frames ended by MsgEOF, or by MsgError when
//     reading fails midway.
//   - WriteFile: init answers MsgOK (empty: ready) or MsgError; after MsgOK
//     the client streams MsgData frames ended by MsgEOF, and init answers
//     MsgOK (JSON FileInfo of the written file) or MsgError.
//
// # Keep-alive connections
//
// A connection whose first frame is MsgKeepAlive (empty payload) carries
// operations one after another, so that the daemon does not connect once
// per call. Init answers MsgOK, then reads the next request after each
// operation ends. The client may send its first request right behind
// MsgKeepAlive without waiting: an init that predates keep-alive answers
// MsgError and closes the connection without reading further. Only the
// operations answered by one frame (Ping, Signal, Kill, List, Sessions,
// Shims without Checkpoint, Input, SetSize, Stat, ReadDir, Mkdir, Symlink,
// Remove, Rename, Access) and an Exec without a stdin stream, terminal or Detach
// may be sent on it;
// another request is answered MsgError and the connection closed. An Exec
// on a keep-alive connection ends with the client's MsgRelease after init's
// MsgExit (init ignores a MsgRelease where it awaits a request, as after
// an exec that could not start), except a Brief one, after whose MsgExit
// the connection carries the next request at once (the client sends
// nothing while it runs); closing the connection before MsgExit kills the
// command as on any connection. Init closes a keep-alive
// connection only between operations, before reading a request (when a
// checkpoint is being prepared, see MsgShims, or after IdleTimeout
// without a request): a request sent on a connection that init closed
// without answering anything was not run, and may be sent again on a new
// connection.
//
// # Terminal sessions
//
// An Exec whose request carries PTY options starts a terminal session: init
// allocates a pseudo-terminal inside the jail and runs the command as the
// leader of a new session with the terminal as its controlling terminal
// (stdin, stdout and stderr all on it). Init answers MsgStarted (JSON
// Started with its Session), and the connection becomes the session's
// first attachment. MsgAttach (JSON AttachRequest) attaches another
// connection to a running session: init answers MsgStarted, then sends the
// session's recent output (its scrollback) followed by the live output.
//
// On an attachment, init sends MsgStdout chunks of terminal output and,
// when the command exits, one MsgExit (JSON ExitStatus) before closing the
// connection. The client may send MsgStdin (bytes typed into the terminal;
// ignored on a read-only attachment), MsgResize (JSON ResizeRequest) and
// MsgPTYSignal (JSON SignalRequest, Pid ignored: the signal goes to the
// terminal's foreground process group). Closing an attachment detaches it:
// the session keeps running. An attachment that does not read fast enough
// has output dropped for it (it gets a notice in the stream when it
// catches up); it never slows the session or the other attachments down.
//
// Signal and Kill with a session's pid act on its command as on any other.
//
// # Detached commands
//
// An Exec whose request sets Detach (and carries no PTY options) starts a
// command that outlives its connection: the connection is its first
// attachment, and closing it only detaches. MsgAttach with the command's
// Pid attaches another connection: init answers MsgStarted, then sends the
// MsgStdout and MsgStderr chunks the command writes from then on (there is
// no replay), and MsgExit when it exits. On an attachment the client may
// send MsgStdin and MsgStdinClose (when the command was started with
// Stdin). Output written while nobody is attached is dropped; it never
// blocks the command. After a detached command or a terminal session
// ended, an attach by its Pid still gets MsgStarted and MsgExit for
// EndedRetention.
//
// MsgInput (JSON InputRequest, answered MsgOK or MsgError) writes to the
// stdin of a detached command, or types into a terminal session, by pid,
// without attaching; MsgSetSize (JSON SizeRequest) resizes a terminal
// session by pid.
//
// # Ports
//
// MsgDial (JSON DialRequest) connects, from inside the jail, to a TCP port
// of the jail's loopback (127.0.0.1, else ::1): init answers MsgOK (JSON
// DialAnswer) or MsgError (not_found when nothing listens there), and after MsgOK the
// connection carries that TCP connection's bytes both ways, unframed,
// until either side closes. A checkpoint's preparation closes such
// connections (see MsgShims).
//
// # Watches
//
// MsgWatch (JSON WatchRequest) watches a directory with inotify: init
// answers MsgOK (empty) or MsgError, then sends one MsgOK frame (JSON
// WatchEvent) per change until the client closes the connection, or one
// MsgError when the watch fails (the directory was removed, the event
// queue overflowed).
package initproto

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"time"
)

// In-jail paths of init's binary and control directory.
const (
	// JailDir holds everything agentjail places inside a jail.
	JailDir = "/.agentjail"
	// Binary is the agentjail binary inside the jail (a read-only bind mount).
	Binary = "/.agentjail/agentjail"
	// ControlDir is the control directory (0700, root), bind-mounted from
	// the jail's run/ directory on the host.
	ControlDir = "/.agentjail/run"
	// SocketName is init's control socket in ControlDir.
	SocketName = "init.sock"
	// ConfigName is init's configuration (InitConfig as JSON) in ControlDir.
	ConfigName = "init.json"
	// LogName is init's log in ControlDir.
	LogName = "init.log"
	// RecordingsName is the directory in ControlDir where init writes the
	// recordings of terminal sessions: {session}.cast.part while the
	// session runs, renamed to {session}.cast once it ended and the file
	// is complete.
	RecordingsName = "recordings"
)

// RecordOption is the prctl option with which init marks a thread whose
// syscalls the jail's observation records (prctl(RecordOption, 1)) and
// unmarks it (prctl(RecordOption, 0)). No kernel knows the option (the call
// fails with EINVAL); the kernel-side tracer reads it from init's own
// calls (INIT_RECORD_OPTION in internal/observe/bpf/csrc/observe.h). Init's
// other calls are plumbing and not recorded.
const RecordOption = 0x4147524a

// The oom_score_adj of a jail's processes. Both are above the daemon's
// (0), so that on host-wide memory pressure the kernel picks jail
// processes first. Commands are far above init and its shims, so that
// when the jail's own memory limit is reached the kernel kills a command,
// not init (whose end ends the jail); the OOM score weighs the difference
// by the limit: half of it here. Init and its shims get InitOOMScoreAdj
// from the runtime; each shim raises its command to CommandOOMScoreAdj
// when init's config says so (InitConfig.CommandOOMScoreAdj). A process
// may raise its own score, and lower it back no further than the value a
// privileged writer gave it: init's.
const (
	InitOOMScoreAdj    = 1
	CommandOOMScoreAdj = 500
)

// ReadyLine is what init writes to its original stdout once its socket
// accepts connections.
const ReadyLine = "ready\n"

// MsgType is the type byte of a frame.
type MsgType uint8

// Request types: the first frame of a connection.
const (
	MsgPing      MsgType = 0x01 // empty payload
	MsgExec      MsgType = 0x02 // ExecRequest
	MsgAttach    MsgType = 0x03 // AttachRequest
	MsgSignal    MsgType = 0x04 // SignalRequest
	MsgKill      MsgType = 0x05 // KillRequest
	MsgList      MsgType = 0x06 // empty payload; OK carries []ProcessInfo
	MsgSessions  MsgType = 0x07 // empty payload; OK carries []SessionInfo
	MsgShims     MsgType = 0x08 // ShimsRequest
	MsgInput     MsgType = 0x09 // InputRequest
	MsgSetSize   MsgType = 0x0a // SizeRequest
	MsgWatch     MsgType = 0x0b // WatchRequest
	MsgKeepAlive MsgType = 0x0c // empty payload; the connection carries operations one after another
	MsgStat      MsgType = 0x10 // PathRequest; OK carries FileInfo
	MsgReadDir   MsgType = 0x11 // PathRequest; OK carries []FileInfo
	MsgReadFile  MsgType = 0x12 // PathRequest
	MsgWriteFile MsgType = 0x13 // WriteRequest
	MsgMkdir     MsgType = 0x14 // MkdirRequest; OK carries FileInfo
	MsgRemove    MsgType = 0x15 // RemoveRequest
	MsgRename    MsgType = 0x16 // RenameRequest
	MsgAccess    MsgType = 0x17 // AccessRequest; OK carries AccessResult
	MsgDial      MsgType = 0x18 // DialRequest; OK carries DialAnswer, then the connection is the TCP stream
	MsgSymlink   MsgType = 0x19 // SymlinkRequest; OK carries FileInfo
	// MsgListDir lists a directory of any size: OK carries ListDirAnswer,
	// then Data frames each carry a JSON array of FileInfo, then EOF.
	MsgListDir MsgType = 0x1a // ListDirRequest
)

// Stream types sent by the client after a request.
const (
	MsgStdin      MsgType = 0x20 // raw bytes for the process's stdin
	MsgStdinClose MsgType = 0x21 // empty: close the process's stdin
	MsgResize     MsgType = 0x22 // ResizeRequest
	MsgPTYSignal  MsgType = 0x23 // SignalRequest to a terminal's foreground process group
	MsgRelease    MsgType = 0x24 // empty: a keep-alive connection's exec ended, the next request follows
)

// Types sent in either direction within an operation.
const (
	MsgData MsgType = 0x30 // raw file bytes
	MsgEOF  MsgType = 0x31 // empty: end of MsgData frames
)

// Reply and stream types sent by init.
const (
	MsgOK      MsgType = 0x40 // JSON result of the operation (may be empty)
	MsgError   MsgType = 0x41 // Error
	MsgStarted MsgType = 0x42 // Started
	MsgStdout  MsgType = 0x43 // raw bytes of the process's stdout
	MsgStderr  MsgType = 0x44 // raw bytes of the process's stderr
	MsgExit    MsgType = 0x45 // ExitStatus
)

// IdleTimeout is how long init keeps a keep-alive connection that
// carries no request open.
const IdleTimeout = 5 * time.Minute

// HeaderSize is the size of a frame header.
const HeaderSize = 5

// MaxPayload bounds a frame's payload; ReadFrame rejects larger frames.
const MaxPayload = 4 << 20

// ChunkSize is the size of the data chunks init and the client send.
const ChunkSize = 64 << 10

// String names a message type for diagnostics.
func (t MsgType) String() string {
	if n, ok := msgNames[t]; ok {
		return n
	}
	return fmt.Sprintf("msg(0x%02x)", uint8(t))
}

var msgNames = map[MsgType]string{
	MsgPing: "ping", MsgExec: "exec", MsgAttach: "attach", MsgSignal: "signal", MsgKill: "kill",
	MsgList: "list", MsgSessions: "sessions", MsgShims: "shims", MsgInput: "input", MsgSetSize: "set-size", MsgWatch: "watch", MsgStat: "stat", MsgReadDir: "readdir", MsgReadFile: "readfile",
	MsgWriteFile: "writefile", MsgMkdir: "mkdir", MsgSymlink: "symlink", MsgListDir: "listdir", MsgRemove: "remove", MsgRename: "rename",
	MsgAccess: "access", MsgDial: "dial", MsgStdin: "stdin", MsgStdinClose: "stdin-close", MsgResize: "resize",
	MsgPTYSignal: "pty-signal", MsgKeepAlive: "keep-alive", MsgRelease: "release",
	MsgData: "data", MsgEOF: "eof", MsgOK: "ok", MsgError: "error", MsgStarted: "started",
	MsgStdout: "stdout", MsgStderr: "stderr", MsgExit: "exit",
}

// AppendFrame appends the frame (t, payload) to dst and returns the result.
func AppendFrame(dst []byte, t MsgType, payload []byte) []byte {
	dst = append(dst, byte(t), 0, 0, 0, 0)
	binary.BigEndian.PutUint32(dst[len(dst)-4:], uint32(len(payload)))
	return append(dst, payload...)
}

// WriteFrame writes one frame with a single Write call, so that frames
// written by concurrent callers holding a common lock never interleave. It
// fails when payload exceeds MaxPayload.
func WriteFrame(w io.Writer, t MsgType, payload []byte) error {
	if len(payload) > MaxPayload {
		return fmt.Errorf("write %s frame: payload of %d bytes exceeds %d", t, len(payload), MaxPayload)
	}
	_, err := w.Write(AppendFrame(make([]byte, 0, HeaderSize+len(payload)), t, payload))
	return err
}

// WriteJSON writes one frame whose payload is v encoded as JSON (an empty
// payload when v is nil).
func WriteJSON(w io.Writer, t MsgType, v any) error {
	if v == nil {
		return WriteFrame(w, t, nil)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s frame: %w", t, err)
	}
	return WriteFrame(w, t, b)
}

// ReadFrame reads one frame. The payload is read into buf when it fits
// (buf is reused by the caller across calls) and into a new slice
// otherwise; it is valid until the next call that passes the same buf. A
// clean end of stream before a header returns io.EOF; a stream that ends
// inside a frame returns io.ErrUnexpectedEOF.
func ReadFrame(r io.Reader, buf []byte) (MsgType, []byte, error) {
	var hdr [HeaderSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	t := MsgType(hdr[0])
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxPayload {
		return 0, nil, fmt.Errorf("read %s frame: payload of %d bytes exceeds %d", t, n, MaxPayload)
	}
	if int(n) > cap(buf) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return t, buf, nil
}

// Decode unmarshals a JSON payload of a frame of type t into v, naming the
// frame type in its error.
func Decode(t MsgType, payload []byte, v any) error {
	if err := json.Unmarshal(payload, v); err != nil {
		return fmt.Errorf("decode %s frame: %w", t, err)
	}
	return nil
}
