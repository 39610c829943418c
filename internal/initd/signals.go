package initd

import (
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/initproto"
)

// parseSignal parses a signal name ("SIGTERM", "TERM") or number.
func parseSignal(s string) (unix.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n <= 0 || n > 64 {
			return 0, newError(initproto.KindInvalid, "", "signal %d is out of range", n)
		}
		return unix.Signal(n), nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig := unix.SignalNum(name); sig != 0 {
		return sig, nil
	}
	return 0, newError(initproto.KindInvalid, "", "unknown signal %q", s)
}
