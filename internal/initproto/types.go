package initproto

import (
	"fmt"
	"strings"
	"time"
)

// InitConfig is init's configuration, written by the daemon as JSON to
// ControlDir/ConfigName before the jail starts.
type InitConfig struct {
	// JailID is the jail's id (for logs).
	JailID string `json:"jail_id"`
	// DefaultUser runs commands that name no user: a name from the jail's
	// /etc/passwd or a numeric uid.
	DefaultUser string `json:"default_user"`
	// DefaultGroup overrides the default user's primary group (a name from
	// the jail's /etc/group or a numeric gid); empty keeps the passwd entry's.
	DefaultGroup string `json:"default_group,omitempty"`
	// Workspace is the default working directory of commands.
	Workspace string `json:"workspace"`
	// Env is the base environment ("K=V") of every command. Init adds HOME,
	// USER and LOGNAME for the target user; a request's Env overrides both.
	Env []string `json:"env,omitempty"`
	// BlockedPaths are jail paths the file operations refuse: a path is
	// blocked when its fully resolved form equals one of them or is under one.
	BlockedPaths []string `json:"blocked_paths,omitempty"`
	// IdleShims is how many started shims init keeps ready for the next
	// commands (each costs a few tasks of the jail's pids limit; 0: none).
	IdleShims int `json:"idle_shims,omitempty"`
	// Home, when set, is the HOME of a user whose /etc/passwd entry names
	// none (the process level runs as a host uid without an entry).
	Home string `json:"home,omitempty"`
	// CommandLandlock, when set, confines every command further than
	// init: each shim restricts itself (and so the commands it starts) to
	// these paths before running any (the process level keeps init's
	// control directory, its log and the recordings out of the jail's
	// reach this way).
	CommandLandlock *Landlock `json:"command_landlock,omitempty"`
	// CommandOOMScoreAdj, when not 0, is every command's oom_score_adj
	// (CommandOOMScoreAdj where init has InitOOMScoreAdj): its shim sets
	// it as the command starts, and the command's descendants inherit it.
	CommandOOMScoreAdj int `json:"command_oom_score_adj,omitempty"`
}

// Landlock lists the paths a Landlock domain leaves reachable; everything
// else is refused.
type Landlock struct {
	// ReadOnly and ReadWrite are directory trees (read includes execute).
	ReadOnly  []string `json:"read_only,omitempty"`
	ReadWrite []string `json:"read_write,omitempty"`
	// ReadOnlyFiles and Devices are single files; Devices are read and
	// written, ioctls included (terminals).
	ReadOnlyFiles []string `json:"read_only_files,omitempty"`
	Devices       []string `json:"devices,omitempty"`
}

// ExecRequest starts a command (MsgExec).
type ExecRequest struct {
	// Argv is the command line; Argv[0] is looked up in the PATH of the
	// command's environment unless it contains a slash.
	Argv []string `json:"argv"`
	// Env entries ("K=V") override the base environment.
	Env []string `json:"env,omitempty"`
	// Cwd is an absolute jail path (default: InitConfig.Workspace).
	Cwd string `json:"cwd,omitempty"`
	// User is a name or numeric uid (default: InitConfig.DefaultUser);
	// "root" is allowed.
	User string `json:"user,omitempty"`
	// TimeoutMs kills the command and all its descendants when it expires
	// (0: no timeout).
	TimeoutMs int64 `json:"timeout_ms,omitempty"`
	// Stdin is true when the client streams stdin with MsgStdin frames
	// (ended by MsgStdinClose); false gives the command an empty stdin.
	Stdin bool `json:"stdin,omitempty"`
	// Detach makes the command outlive its connection (see the package
	// documentation); ignored with PTY, whose sessions always do.
	Detach bool `json:"detach,omitempty"`
	// Brief asks for no MsgStarted and, on a keep-alive connection, no
	// MsgRelease (see the package documentation); only without Stdin,
	// Detach and PTY. An init that predates it ignores it and answers as
	// to any exec.
	Brief bool `json:"brief,omitempty"`
	// PTY makes the command a terminal session (see the package
	// documentation). Argv may then be empty: the user's login shell from
	// the jail's /etc/passwd runs, as a login shell ("-l").
	PTY *PTYOptions `json:"pty,omitempty"`
}

// PTYOptions are the settings of a terminal session.
type PTYOptions struct {
	// Rows and Cols are the window size (default 24x80).
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
	// Term is the TERM of the command (default DefaultTerm); an Env entry
	// for TERM overrides it.
	Term string `json:"term,omitempty"`
	// RecordInput records typed input in the session's recording (output
	// and resizes are always recorded). Input typed while the terminal
	// does not echo in canonical mode (a password prompt) is never
	// recorded.
	RecordInput bool `json:"record_input,omitempty"`
}

// DefaultTerm is the TERM of a terminal session that names none.
const DefaultTerm = "xterm-256color"

// ResizeRequest changes a terminal session's window size (MsgResize).
type ResizeRequest struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// AttachRequest attaches a connection to a running terminal session or
// detached command (MsgAttach).
type AttachRequest struct {
	// Session is the session's id (SessionInfo.ID); or
	Session string `json:"session,omitempty"`
	// Pid is the pid of a detached command or of a session's command.
	Pid int `json:"pid,omitempty"`
	// ReadOnly attachments see the output but cannot type or resize.
	ReadOnly bool `json:"read_only,omitempty"`
	// NoScrollback skips a session's recent output: only new output
	// follows MsgStarted.
	NoScrollback bool `json:"no_scrollback,omitempty"`
}

// EndedRetention is how long init remembers how a detached command or a
// terminal session ended, for attaches by pid.
const EndedRetention = 30 * time.Second

// InputRequest feeds a detached command's stdin or types into a terminal
// session, by pid (MsgInput).
type InputRequest struct {
	Pid  int    `json:"pid"`
	Data []byte `json:"data,omitempty"`
	// Close ends a detached command's stdin after Data.
	Close bool `json:"close,omitempty"`
}

// MaxInputWait bounds how long a MsgInput waits for a command that does
// not read its input.
const MaxInputWait = 10 * time.Second

// SizeRequest resizes a terminal session by its command's pid (MsgSetSize).
type SizeRequest struct {
	Pid  int    `json:"pid"`
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// WatchRequest watches a directory (MsgWatch).
type WatchRequest struct {
	// Path is the absolute jail path of the directory.
	Path string `json:"path"`
	// Recursive watches its subdirectories too, those made later included.
	Recursive bool `json:"recursive,omitempty"`
}

// Watch event operations.
const (
	WatchCreate = "create"
	WatchWrite  = "write"
	WatchRemove = "remove"
	WatchRename = "rename"
	WatchChmod  = "chmod"
)

// WatchEvent is one change in a watched directory.
type WatchEvent struct {
	// Name is the changed path relative to the watched directory.
	Name string `json:"name"`
	// Op is one of the Watch* operations.
	Op string `json:"op"`
}

// MaxWatches bounds the directories one recursive watch follows.
const MaxWatches = 8192

// SessionInfo describes a running terminal session.
type SessionInfo struct {
	// ID identifies the session in the jail (hex); its recording is
	// ControlDir/recordings/{ID}.cast.
	ID        string    `json:"id"`
	Pid       int       `json:"pid"`
	Argv      []string  `json:"argv"`
	Cwd       string    `json:"cwd"`
	User      string    `json:"user"`
	Term      string    `json:"term"`
	Rows      uint16    `json:"rows"`
	Cols      uint16    `json:"cols"`
	StartedAt time.Time `json:"started_at"`
	// Attached counts the connections attached now.
	Attached int `json:"attached"`
	// Recording is false when init could not record the session.
	Recording bool `json:"recording"`
}

// Started is init's answer to an accepted ExecRequest.
type Started struct {
	// Pid is the command's pid inside the jail (0 when the executable could
	// not be started; the exit status then says why).
	Pid int `json:"pid"`
	// Session describes the terminal session of a PTY exec or an attach.
	Session *SessionInfo `json:"session,omitempty"`
}

// ExitStatus is how a command ended.
type ExitStatus struct {
	// Code is the exit code, or 128+signal number when Signal is set.
	Code int `json:"code"`
	// Signal is the name of the signal that killed the command ("SIGKILL"),
	// or empty.
	Signal string `json:"signal,omitempty"`
	// TimedOut is set when the command was killed by its timeout.
	TimedOut bool `json:"timed_out,omitempty"`
	// DurationNs is the time from start to exit.
	DurationNs int64 `json:"duration_ns"`
	// Pid is the command's pid inside the jail.
	Pid int `json:"pid"`
}

// SignalRequest sends a signal to a running command (MsgSignal).
type SignalRequest struct {
	// Pid is the command's in-jail pid, as reported by Started.
	Pid int `json:"pid"`
	// Signal is a name ("SIGTERM" or "TERM") or a decimal number.
	Signal string `json:"signal"`
}

// KillRequest kills a running command and all its descendants (MsgKill).
type KillRequest struct {
	Pid int `json:"pid"`
}

// ShimsRequest sets init's pool of idle shims (MsgShims). With Idle false
// the idle shims exit, and init answers once they have, so that a
// checkpoint has fewer processes to dump; the pool fills again at the next
// command or at a request with Idle true, which starts filling it in the
// background.
//
// With Checkpoint (and Idle false) init readies itself for a checkpoint
// that saves its sockets (CRIU): it also waits until every other control
// connection has closed (a connection init accepted is a socket of the
// daemon's network namespace, which such a checkpoint cannot save) or a
// short wait has passed, closing the keep-alive connections that await a
// request meanwhile, and those whose operation ends while it waits, answers a ShimsAnswer, and closes this connection
// right after its answer.
type ShimsRequest struct {
	Idle       bool `json:"idle"`
	Checkpoint bool `json:"checkpoint,omitempty"`
}

// ShimsAnswer is init's answer to a ShimsRequest with Idle false.
type ShimsAnswer struct {
	// OpenConnections counts the other control connections still open
	// when init gave up waiting for them (an attached terminal, a running
	// command's stream, a file watch): a checkpoint would fail on them.
	OpenConnections int `json:"open_connections,omitempty"`
	// Terminals counts the terminal sessions running in the jail.
	Terminals int `json:"terminals,omitempty"`
}

// ProcessInfo describes a running command (MsgList).
type ProcessInfo struct {
	Pid       int       `json:"pid"`
	Argv      []string  `json:"argv"`
	Cwd       string    `json:"cwd"`
	User      string    `json:"user"`
	StartedAt time.Time `json:"started_at"`
	TimeoutMs int64     `json:"timeout_ms,omitempty"`
}

// PathRequest names one jail path (MsgStat, MsgReadDir, MsgReadFile).
type PathRequest struct {
	Path string `json:"path"`
}

// ListDirRequest lists directory Path (MsgListDir): at most Limit entries
// (1..MaxListDir), sorted by name. A directory with more gives Limit of
// them, those it read first, and says so (ListDirAnswer.Truncated).
type ListDirRequest struct {
	Path  string `json:"path"`
	Limit int    `json:"limit"`
}

// MaxListDir bounds ListDirRequest.Limit: what init holds of one listing.
const MaxListDir = 1 << 20

// ListDirAnswer starts the answer to MsgListDir; the entries follow.
type ListDirAnswer struct {
	// Truncated: the directory has more entries than the request's Limit.
	Truncated bool `json:"truncated,omitempty"`
}

// WriteOptions controls WriteFile and Mkdir.
type WriteOptions struct {
	// Mode is the permission bits of a created file or directory (default
	// 0644 for files, 0755 for directories). When a write replaces an
	// existing file, a zero Mode keeps the file's mode.
	Mode uint32 `json:"mode,omitempty"`
	// User owns created files and directories (default: the jail's default
	// user). When a write replaces an existing file, an empty User keeps the
	// file's owner.
	User string `json:"user,omitempty"`
	// MkdirParents creates missing parent directories (mkdir -p).
	MkdirParents bool `json:"mkdir_parents,omitempty"`
}

// WriteRequest writes a file (MsgWriteFile). The file is replaced
// atomically: init writes a temporary file in the target's directory and
// renames it over the target. A final symlink is refused, never followed;
// a file with several hard links is replaced, never written through.
type WriteRequest struct {
	Path string `json:"path"`
	WriteOptions
}

// MkdirRequest creates a directory (MsgMkdir). With MkdirParents, an
// existing directory at Path is not an error.
type MkdirRequest struct {
	Path string `json:"path"`
	WriteOptions
}

// SymlinkRequest creates a symbolic link at Path to Target (MsgSymlink),
// owned by User (default: the jail's user). Target is kept as given: it
// is resolved, like any link, by whoever follows it. An existing Path is
// an error.
type SymlinkRequest struct {
	Path   string `json:"path"`
	Target string `json:"target"`
	User   string `json:"user,omitempty"`
}

// MaxLinkTarget bounds a symbolic link's target (the kernel's PATH_MAX,
// less its terminating NUL).
const MaxLinkTarget = 4095

// ValidLinkTarget reports whether t may be a symbolic link's target: 1 to
// MaxLinkTarget bytes without NUL.
func ValidLinkTarget(t string) bool {
	return t != "" && len(t) <= MaxLinkTarget && strings.IndexByte(t, 0) < 0
}

// RemoveRequest removes a path (MsgRemove).
type RemoveRequest struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive,omitempty"`
}

// RenameRequest renames a path (MsgRename); an existing file at To is
// replaced.
type RenameRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// DialRequest names a TCP port of the jail's loopback (MsgDial).
type DialRequest struct {
	Port int `json:"port"`
}

// DialAnswer answers a DialRequest: the address init connected to.
type DialAnswer struct {
	Addr string `json:"addr"`
}

// AccessRequest asks whether a user can read or write a path (MsgAccess).
type AccessRequest struct {
	Path  string `json:"path"`
	Write bool   `json:"write,omitempty"`
	// User is a name or numeric uid (default: the jail's default user).
	User string `json:"user,omitempty"`
}

// AccessResult answers an AccessRequest.
type AccessResult struct {
	OK bool `json:"ok"`
	// Reason says why access is denied (empty when OK).
	Reason string `json:"reason,omitempty"`
}

// File types reported in FileInfo.Type.
const (
	TypeFile    = "file"
	TypeDir     = "dir"
	TypeSymlink = "symlink"
	TypeOther   = "other"
)

// FileInfo describes a jail path with lstat semantics.
type FileInfo struct {
	// Name is the last element of Path.
	Name string `json:"name"`
	// Path is the jail path as requested (cleaned).
	Path string `json:"path"`
	// Type is TypeFile, TypeDir, TypeSymlink or TypeOther.
	Type string `json:"type"`
	Size int64  `json:"size"`
	// Mode holds the permission bits including setuid, setgid and sticky
	// (07777).
	Mode       uint32    `json:"mode"`
	ModTime    time.Time `json:"mtime"`
	UID        int       `json:"uid"`
	GID        int       `json:"gid"`
	LinkTarget string    `json:"link_target,omitempty"`
}

// Error kinds carried by Error.Kind.
const (
	KindInvalid        = "invalid"         // malformed request: bad path, unknown user
	KindUnprocessable  = "unprocessable"   // well-formed but not applicable: is a directory, bad cwd
	KindNotFound       = "not_found"       // ENOENT, unknown pid
	KindForbidden      = "forbidden"       // EACCES, EPERM, EROFS, peer rejected
	KindBlocked        = "blocked"         // the path is blocked by the jail's policy
	KindConflict       = "conflict"        // EEXIST, input to a closed stdin
	KindNoSpace        = "no_space"        // ENOSPC, EDQUOT
	KindNotImplemented = "not_implemented" // reserved operation
	KindInternal       = "internal"        // anything else
)

// Error is the payload of MsgError.
type Error struct {
	Kind string `json:"kind"`
	// Errno is the errno name when the error came from a system call
	// ("ENOENT"), else empty.
	Errno string `json:"errno,omitempty"`
	// Path is the jail path the error concerns, when there is one.
	Path    string `json:"path,omitempty"`
	Message string `json:"message"`
}

// Error returns the message.
func (e *Error) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("init error (%s)", e.Kind)
	}
	return e.Message
}
