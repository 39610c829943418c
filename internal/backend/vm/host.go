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

	ocgroups "github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/manager"
	"github.com/vishvananda/netlink"

	"github.com/agentjail/agentjail/internal/backend/hostjail"
	"github.com/agentjail/agentjail/internal/config"
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

func netipPrefix32(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

func netlinkByName(name string) (netlink.Link, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return l, nil
}

// hostCgroupSlack is the memory a machine's QEMU may use beyond the
// guest's RAM (its own code, device buffers, translated code under TCG).
const hostCgroupSlack = 512 << 20

// confine places the machine's QEMU (pid) in the jail's cgroup on the
// host, with the jail's CPU share and quota and a memory bound of the
// machine's RAM and QEMU's own needs: the jail's root, who rules the
// guest's own cgroups, cannot take more of the host than that.
func confine(id string, r config.Resources, memMiB, pid int) error {
	path := string(hostjail.CgroupOf(id))
	res := &ocgroups.Resources{
		Memory:    int64(memMiB)<<20 + hostCgroupSlack,
		CpuShares: r.CPUShares, CpuPeriod: r.CPUPeriod, CpuQuota: r.CPUQuota,
		SkipDevices: true,
	}
	m, err := manager.New(&ocgroups.Cgroup{Path: path, Resources: res})
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", path, err)
	}
	if err := m.Apply(pid); err != nil {
		return fmt.Errorf("cgroup %s: place the machine (pid %d): %w", path, pid, err)
	}
	if err := m.Set(res); err != nil {
		return fmt.Errorf("cgroup %s: limits: %w", path, err)
	}
	return nil
}
