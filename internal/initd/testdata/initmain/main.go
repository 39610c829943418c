// Command initmain is a minimal binary around initd.Main, built by the
// PID-1 test: `initmain init [flags]` behaves as `agentjail init`.
package main

import (
	"fmt"
	"os"

	"github.com/agentjail/agentjail/internal/initd"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != "init" {
		fmt.Fprintln(os.Stderr, "usage: initmain init [flags]")
		os.Exit(2)
	}
	os.Exit(initd.Main(os.Args[2:]))
}
