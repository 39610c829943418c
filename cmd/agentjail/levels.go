package main

import (
	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/backend/container"
	"github.com/agentjail/agentjail/internal/backend/gvisor"
	"github.com/agentjail/agentjail/internal/backend/process"
	"github.com/agentjail/agentjail/internal/backend/vm"
)

// levelFlags are serve's options of the isolation levels.
type levelFlags struct {
	runtime string
	criu    string
	// runsc is the gvisor level's runtime (empty: gvisor.DefaultRunsc).
	runsc string
	// unsafeNone offers the none level (no isolation; development only).
	unsafeNone bool
	// shareBranchMemory opens restored jails' memory to the kernel's
	// same-page merging.
	shareBranchMemory bool
}

// factories returns the backends of every isolation level this binary
// has, in the order the daemon reports them.
func (f levelFlags) factories() []backend.Factory {
	return []backend.Factory{
		container.Factory(f.runtime, f.criu, f.shareBranchMemory),
		process.Factory(),
		gvisor.Factory(f.runsc),
		process.NoneFactory(f.unsafeNone),
		vm.Factory(),
	}
}
