package bpf

import (
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

func loopGetppid() float64 {
	const n = 2000000
	best := time.Duration(1<<63 - 1)
	for range 5 {
		start := time.Now()
		for range n {
			syscall.Getppid()
		}
		if d := time.Since(start); d < best {
			best = d
		}
	}
	return float64(best) / n
}

func TestExpOverhead(t *testing.T) {
	base := loopGetppid()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.RawTracepoint, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	if err != nil { t.Fatal(err) }
	l1, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: "sys_enter", Program: prog})
	if err != nil { t.Fatal(err) }
	l2, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: "sys_exit", Program: prog})
	if err != nil { t.Fatal(err) }
	raw := loopGetppid()
	l1.Close(); l2.Close()
	base2 := loopGetppid()
	spec, _ := loadObserve()
	var objs observeObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil { t.Fatal(err) }
	defer objs.Close()
	a, _ := link.AttachTracing(link.TracingOptions{Program: objs.SysEnter, AttachType: ebpf.AttachTraceRawTp})
	b, _ := link.AttachTracing(link.TracingOptions{Program: objs.SysExit, AttachType: ebpf.AttachTraceRawTp})
	ours := loopGetppid()
	a.Close(); b.Close()
	t.Logf("base %.1f, empty raw_tp %.1f, base again %.1f, ours (tp_btf) %.1f ns", base, raw, base2, ours)
}
