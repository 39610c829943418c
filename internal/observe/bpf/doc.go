// Package bpf is the kernel side of agentjail's observation layer: eBPF
// programs on the sys_enter/sys_exit and sched_process_{fork,exec,exit}
// tracepoints (BTF-typed, CO-RE), one ring buffer shared by every jail, and
// the Tracer that loads them once, watches jails by the id of their cgroup
// v2 directory, and decodes the records into observe.Event values for each
// jail's observe.Sink.
//
// The C sources live in csrc/ (a directory without Go files, so cgo-enabled
// builds do not try to compile them); bpf2go compiles them ahead of time and
// its outputs (observe_x86_bpfel.go and .o) are committed here, so building
// needs no clang. Regenerate with `go generate` (see gen.go).
//
// Records are submitted without ring wake-ups: the reader drains the ring
// whenever it holds data and otherwise sleeps on a Go timer (Config.Poll).
// Per-event wake-ups dropped 9–15 % of events on the project's machines, and
// a reader blocked in epoll_wait raised the cost of every other process's
// syscalls from +0.19 µs to +0.7 µs there, so neither is used.
package bpf
