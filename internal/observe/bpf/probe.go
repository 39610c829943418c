package bpf

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"

	"github.com/agentjail/agentjail/internal/errdefs"
)

// ErrNotSupported is wrapped by the errors of Probe and Open when the kernel
// (or the daemon's privileges) cannot run the observation programs; the
// message names what was refused. It is of kind errdefs.ErrNotImplemented.
var ErrNotSupported = errdefs.New(errdefs.ErrNotImplemented, "kernel observation not supported")

// Probe checks that the kernel offers the maps the programs need: BTF of
// the running kernel, ring buffers (Linux 5.8) and task storage (5.11). Each
// failure wraps ErrNotSupported with the missing feature. BTF-typed
// tracepoint programs (tp_btf) are checked by loading them in Open: the
// generic probe for tracing programs uses fentry, which some kernels refuse
// while they accept tp_btf.
func Probe() error {
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		return fmt.Errorf("%w: kernel BTF (/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF): %w", ErrNotSupported, err)
	}
	checks := []struct {
		what string
		err  error
	}{
		{"ring buffer maps (Linux 5.8)", features.HaveMapType(ebpf.RingBuf)},
		{"task storage maps (Linux 5.11)", features.HaveMapType(ebpf.TaskStorage)},
	}
	for _, c := range checks {
		if c.err == nil {
			continue
		}
		if errors.Is(c.err, ebpf.ErrNotSupported) {
			return fmt.Errorf("%w: %s: %w", ErrNotSupported, c.what, c.err)
		}
		return fmt.Errorf("%w: probing %s: %w", ErrNotSupported, c.what, c.err)
	}
	return nil
}
