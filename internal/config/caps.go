package config

import "strings"

// AllCapabilities lists the Linux capabilities by their CAP_ names.
var AllCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
	"CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW",
	"CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT",
	"CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
	"CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
	"CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE",
	"CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ",
	"CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
}

// DefaultCapabilities is the minimal set a jail's root keeps: enough to
// own and manage its own files and processes, nothing that reaches the
// kernel, the network stack or devices.
var DefaultCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_SETGID", "CAP_SETUID", "CAP_NET_BIND_SERVICE",
}

// CapabilityName normalises a capability name ("net_raw", "CAP_NET_RAW")
// to its CAP_ form and reports whether it exists.
func CapabilityName(s string) (string, bool) {
	n := strings.ToUpper(s)
	if !strings.HasPrefix(n, "CAP_") {
		n = "CAP_" + n
	}
	for _, c := range AllCapabilities {
		if c == n {
			return n, true
		}
	}
	return "", false
}

// EffectiveCapabilities applies the process config's drop and add lists to
// the default set.
func (p *Process) EffectiveCapabilities() []string {
	set := map[string]bool{}
	for _, c := range DefaultCapabilities {
		set[c] = true
	}
	for _, c := range p.DropCapabilities {
		if strings.EqualFold(c, "ALL") {
			set = map[string]bool{}
			continue
		}
		if n, ok := CapabilityName(c); ok {
			delete(set, n)
		}
	}
	for _, c := range p.Capabilities {
		if n, ok := CapabilityName(c); ok {
			set[n] = true
		}
	}
	var out []string
	for _, c := range AllCapabilities {
		if set[c] {
			out = append(out, c)
		}
	}
	return out
}
