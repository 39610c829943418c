package model

import "time"

// TerminalRequest opens a terminal (WS /jails/{id}/terminal): a new
// session running Cmd, or, with Session set, an attachment to a running
// one (the other fields are then ignored, except ReadOnly).
type TerminalRequest struct {
	// Cmd is the command line (default: the user's login shell, as a login
	// shell).
	Cmd []string
	// Session attaches to this running session instead.
	Session string
	// ReadOnly attachments see the output but cannot type, resize or
	// signal.
	ReadOnly bool
	// Rows and Cols are the window size (default 24x80).
	Rows, Cols int
	// User runs the command (default: the jail's user).
	User string
	// Cwd is the working directory (default: the workspace).
	Cwd string
	// Term is the command's TERM (default xterm-256color).
	Term string
	// Env is added to the command's environment.
	Env map[string]string
}

// TerminalSession describes a terminal session of a jail.
type TerminalSession struct {
	ID        string    `json:"id"`
	JailID    string    `json:"jail_id"`
	Pid       int       `json:"pid"`
	Cmd       []string  `json:"cmd"`
	User      string    `json:"user"`
	Cwd       string    `json:"cwd"`
	Term      string    `json:"term"`
	Rows      int       `json:"rows"`
	Cols      int       `json:"cols"`
	StartedAt time.Time `json:"started_at"`
	// Attached counts the clients attached now.
	Attached int `json:"attached"`
	// RecordingID names the session's recording (GET /recordings/{rid});
	// empty when it is not recorded.
	RecordingID string `json:"recording_id,omitempty"`
}

// TerminalExit is how a terminal session's command ended.
type TerminalExit struct {
	// Code is the exit code, or 128+N when signal N killed the command.
	Code int `json:"code"`
	// Signal names the signal that killed the command, if one did.
	Signal string `json:"signal,omitempty"`
}

// Terminal is a client's attachment to a terminal session. Read is for
// one goroutine; the other methods may be called from any goroutine.
type Terminal interface {
	// Session describes the session as it was when the client attached.
	Session() TerminalSession
	// Read returns terminal output: an attachment first gets the
	// session's recent output, then the live stream. After the command
	// exits, Read returns io.EOF and Exit has the status.
	Read(p []byte) (int, error)
	// Write types p into the terminal (a no-op on a read-only
	// attachment).
	Write(p []byte) (int, error)
	// Resize sets the window size (both positive).
	Resize(rows, cols int) error
	// Signal sends a signal (name or number) to the terminal's foreground
	// process group.
	Signal(sig string) error
	// Exit returns the exit status once Read returned io.EOF.
	Exit() (TerminalExit, bool)
	// Close detaches; the session keeps running.
	Close() error
}

// Recording states.
const (
	// RecordingActive: the session runs and is being recorded.
	RecordingActive = "recording"
	// RecordingComplete: the session ended; the recording is compressed
	// and checksummed.
	RecordingComplete = "complete"
)

// Recording describes the asciicast v2 recording of a terminal session.
type Recording struct {
	// ID is "{jail id}-{session id}".
	ID        string    `json:"id"`
	JailID    string    `json:"jail_id"`
	SessionID string    `json:"session_id"`
	Command   string    `json:"command"`
	Width     int       `json:"width"`
	Height    int       `json:"height"`
	StartedAt time.Time `json:"started_at"`
	// Status is RecordingActive or RecordingComplete.
	Status string `json:"status"`
	// Size is the size of the .cast (uncompressed) in bytes.
	Size int64 `json:"size"`
	// CompressedSize is the size of the stored zstd file.
	CompressedSize int64 `json:"compressed_size,omitempty"`
	// SHA256 is the hex digest of the stored zstd file, checked on every
	// read.
	SHA256 string `json:"sha256,omitempty"`
}
