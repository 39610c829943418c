package bpf

// The network programs are a separate object so that they load, attach and
// fail independently of the syscall tracer.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -cflags "-O2 -mcpu=v3 -g -Wall -Werror -D__TARGET_ARCH_x86 -I/usr/include/x86_64-linux-gnu" -target amd64 -type flow_key -type flow_val -type net_watch -type dns_ev netobs csrc/net.bpf.c
