package main

import (
	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/backend/container"
)

// levelFlags are serve's options of the isolation levels.
type levelFlags struct {
	runtime string
	criu    string
}

// factories returns the backends of every isolation level this binary
// has, in the order the daemon reports them.
func (f levelFlags) factories() []backend.Factory {
	return []backend.Factory{
		container.Factory(f.runtime, f.criu),
	}
}
