package vm

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
)

// kvmProbeTimeout bounds the test boot that decides whether KVM works.
const kvmProbeTimeout = 20 * time.Second

// detectAccel returns the accelerator machines use and why: KVM only
// where a hardware KVM module (kvm_intel or kvm_amd) is loaded and a test
// machine boots the guest kernel under it within kvmProbeTimeout; TCG
// otherwise (nested or paravirtual KVM, such as kvm_pvm, runs stock guest
// kernels too slowly or not at all).
func (b *Backend) detectAccel() (accel, why string) {
	var hw string
	for _, m := range []string{"kvm_intel", "kvm_amd"} {
		if _, err := os.Stat("/sys/module/" + m); err == nil {
			hw = m
		}
	}
	if hw == "" {
		why = "no kvm_intel or kvm_amd module"
		if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil {
			why += "; /dev/kvm is kvm_pvm (nested, paravirtual)"
		}
		return "tcg", why
	}
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return "tcg", hw + " is loaded but /dev/kvm is missing"
	}
	if nested, err := os.ReadFile("/sys/module/" + hw + "/parameters/nested"); err == nil {
		why = hw + ", nested=" + strings.TrimSpace(string(nested))
	} else {
		why = hw
	}
	if err := b.probeKVM(); err != nil {
		return "tcg", why + "; a test machine failed under kvm: " + err.Error()
	}
	return "kvm", why
}

// probeKVM boots the guest kernel under KVM with no initramfs: it panics
// for want of a root, and with panic=-1 and -no-reboot QEMU then exits.
// Reaching that point within the deadline shows KVM runs the kernel.
func (b *Backend) probeKVM() error {
	ctx, cancel := context.WithTimeout(context.Background(), kvmProbeTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, b.opts.QEMU,
		"-M", "microvm,x-option-roms=off,pit=off,pic=off,rtc=off,isa-serial=on", "-accel", "kvm", "-cpu", "host",
		"-m", "128M", "-nodefaults", "-no-user-config", "-nographic", "-no-reboot", "-serial", "stdio",
		"-kernel", filepath.Join(b.opts.KernelDir, "vmlinux"),
		"-append", "console=ttyS0 panic=-1 reboot=t").CombinedOutput()
	if ctx.Err() != nil {
		return fmt.Errorf("no panic within %v", kvmProbeTimeout)
	}
	if !bytes.Contains(out, []byte("Kernel panic")) {
		return fmt.Errorf("%v: %s", err, lastLine(out))
	}
	return nil
}

// tscKHz is the host's TSC frequency in kHz, given to the guest kernel
// so that it does not calibrate (which hangs at random under TCG); 0 when
// unknown.
func tscKHz() int {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "cpu MHz" {
			mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return int(mhz * 1000)
			}
		}
	}
	return 0
}

// cpuTimeNs is the CPU time process pid used (user and system).
func cpuTimeNs(pid int) uint64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// Fields after the command (which may hold spaces): state is [0],
	// utime [11], stime [12].
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseUint(f[11], 10, 64)
	s, _ := strconv.ParseUint(f[12], 10, 64)
	// Clock ticks are 100 Hz on Linux.
	return (u + s) * 10_000_000
}

func netipPrefix32(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

func netlinkByName(name string) (netlink.Link, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return l, nil
}
