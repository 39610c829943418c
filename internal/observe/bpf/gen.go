package bpf

// Regenerating the objects needs clang, llvm and libbpf-dev (for the bpf/*.h
// headers; scripts/setup.sh installs them); building the package does not,
// as the outputs are committed. TestGeneratedObjectsAreCurrent regenerates
// them and fails when a committed output is stale.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -D__TARGET_ARCH_x86 -I/usr/include/x86_64-linux-gnu" -target amd64 -type hdr -type sys_ev -type fork_ev -type exec_ev -type exit_ev -type watch observe csrc/observe.bpf.c
