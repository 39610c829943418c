package backend

import (
	"debug/elf"
	"fmt"
)

// StaticBinary returns an error when the executable at path is
// dynamically linked (has an ELF interpreter). The agentjail binary runs
// as the init of jails whose root holds none of the host's libraries (an
// image, a virtual machine's initramfs): it must be built without cgo.
func StaticBinary(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("reading the agentjail binary: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("the agentjail binary %s is dynamically linked (built with cgo): "+
				"jails whose root lacks this host's libraries cannot run it as their init; build it with CGO_ENABLED=0 (make build does)", path)
		}
	}
	return nil
}
