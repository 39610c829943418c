// Command agentjail is the agentjail daemon (serve), its command-line
// client (create, ls, exec, cp, run, ...) and the in-jail init (init),
// in one binary.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/agentjail/agentjail/internal/backend/vm/guest"
	"github.com/agentjail/agentjail/internal/confine"
)

func main() {
	// The in-jail init is dispatched before anything else runs: it is PID 1
	// of a jail and must not pay for (or be affected by) the CLI's setup.
	if len(os.Args) > 1 && os.Args[1] == "init" {
		os.Exit(runInit(os.Args[2:]))
	}
	// And PID 1 of a vm-level jail's machine (the kernel starts it from
	// the initramfs as `/agentjail vminit`).
	if len(os.Args) > 1 && os.Args[1] == "vminit" && os.Getpid() == 1 {
		guest.Main()
	}
	// So is the first step of a process-level jail, which becomes its init.
	if len(os.Args) > 1 && os.Args[1] == "confine" {
		os.Exit(confine.Main(os.Args[2:]))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd().ExecuteContext(ctx)
	stop()
	os.Exit(exitStatus(err, os.Stderr))
}

// exitStatus prints err (unless it only carries an exit code) and returns
// the process's exit status: 0 without error, 2 for usage errors, the
// command's own status for exec and run, 1 otherwise.
func exitStatus(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	var ec exitCode
	if errors.As(err, &ec) {
		return int(ec)
	}
	var op *net.OpError
	if errors.Is(err, syscall.ECONNREFUSED) && errors.As(err, &op) && op.Addr != nil {
		fmt.Fprintf(stderr, "agentjail: no daemon answers at %s (connection refused): start one with `agentjail serve`, or give its address with --addr or $AGENTJAIL_ADDR\n", op.Addr)
		return 1
	}
	fmt.Fprintf(stderr, "agentjail: %v\n", err)
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

// exitCode is an error that only sets the exit status (the status of a
// command run in a jail).
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// usageError marks an error in the command line itself.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }
