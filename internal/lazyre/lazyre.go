// Package lazyre gives regular expressions that compile on first use, so
// that a package's patterns cost nothing when its process never matches
// them (every agentjail process — the in-jail init and each command's
// shim among them — links them all).
package lazyre

import (
	"regexp"
	"sync"
)

// New returns a function that compiles expr on its first call (panicking
// on an invalid expr, like regexp.MustCompile) and returns the same
// *regexp.Regexp on every call. It is safe for concurrent use.
func New(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}
