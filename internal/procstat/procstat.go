// Package procstat reads the fields of /proc/PID/stat that agentjail uses:
// a process's state and its parent.
package procstat

import (
	"bytes"
	"fmt"
	"strconv"

	"github.com/agentjail/agentjail/internal/pseudofs"
)

// Stat is part of a process's /proc/PID/stat line.
type Stat struct {
	// State is the state letter: R, S, D, Z, T (stopped by a signal),
	// t (stopped by a tracer), X...
	State byte
	// PPID is the parent's pid (0 for a process whose parent is outside
	// the reader's pid namespace).
	PPID int
}

// Read reads process pid's stat line; an error when the process is gone
// or the line does not parse.
func Read(pid int) (Stat, error) {
	// A stat line is a few hundred bytes: 52 numbers and a command name
	// of at most 64.
	var buf [2048]byte
	b, err := pseudofs.Read("/proc/"+strconv.Itoa(pid)+"/stat", buf[:])
	if err != nil {
		return Stat{}, err
	}
	return parse(b)
}

// parse reads "pid (comm) state ppid ...". The command name is in
// parentheses and may itself hold any character, so the fields are
// counted from the last ')'.
func parse(b []byte) (Stat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return Stat{}, fmt.Errorf("procstat: %q: no command name", b)
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 2 || len(f[0]) != 1 {
		return Stat{}, fmt.Errorf("procstat: %q: no state and parent", b)
	}
	ppid, err := strconv.Atoi(string(f[1]))
	if err != nil {
		return Stat{}, fmt.Errorf("procstat: %q: parent: %w", b, err)
	}
	return Stat{State: f[0][0], PPID: ppid}, nil
}

// Stopped reports whether the state is stopped by a signal or a tracer.
func (s Stat) Stopped() bool { return s.State == 'T' || s.State == 't' }
