// Package bpf is the kernel side of agentjail's observation layer: eBPF
// programs on the sys_enter/sys_exit and sched_process_{fork,exec,exit}
// tracepoints (BTF-typed, CO-RE), one ring buffer shared by every jail, and
// the Tracer that loads them once, watches jails by the id of their cgroup
// v2 directory, and decodes the records into observe.Event values for each
// jail's observe.Sink.
//
// The programs are compiled ahead of time with bpf2go; the object and its Go
// wrapper are committed next to observe.bpf.c, so building needs no clang.
package bpf
