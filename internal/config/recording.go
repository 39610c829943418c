package config

// Recording selects what the recordings of a jail's terminal sessions
// hold. Output and window resizes are always recorded; typed input only
// when Input is set, and never while the terminal is at a password prompt
// (not echoing, line by line).
type Recording struct {
	// Input records what is typed into terminal sessions.
	Input bool `json:"input,omitempty"`
}
