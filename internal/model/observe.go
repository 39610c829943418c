package model

import "time"

// Process is one process of a jail's process tree (pids as seen inside
// the jail).
type Process struct {
	Pid       int        `json:"pid"`
	Ppid      int        `json:"ppid"`
	HostPid   int        `json:"host_pid"`
	Comm      string     `json:"comm,omitempty"`
	Exe       string     `json:"exe,omitempty"`
	Argv      []string   `json:"argv,omitempty"`
	Cwd       string     `json:"cwd,omitempty"`
	UID       uint32     `json:"uid"`
	StartedAt time.Time  `json:"started_at"`
	ExitedAt  *time.Time `json:"exited_at,omitempty"`
	// ExitCode is set once the process exited normally; Signal once a
	// signal ended it.
	ExitCode *int       `json:"exit_code,omitempty"`
	Signal   string     `json:"signal,omitempty"`
	Children []*Process `json:"children,omitempty"`
}

// ProcessTree is the answer of GET /jails/{id}/processes.
type ProcessTree struct {
	// Roots are processes whose parent is not in the jail's record (init's
	// children and orphans re-parented to it).
	Roots []*Process `json:"roots"`
	// Running counts processes that have not exited.
	Running int `json:"running"`
	// Total counts every process recorded.
	Total int `json:"total"`
}

// Change is one difference between two file trees.
type Change struct {
	Path string `json:"path"`
	// Kind is added, modified or deleted.
	Kind string `json:"kind"`
	// Type is file, dir, symlink or other (of the newer side; of the older
	// one for deleted).
	Type string `json:"type"`
	Size int64  `json:"size"`
	// Mode is the octal permission bits, e.g. "0644".
	Mode string `json:"mode"`
	// SHA256 of a regular file's content (newer side).
	SHA256 string `json:"sha256,omitempty"`
	// OldSize, OldMode and OldSHA256 describe the older side of a modified entry.
	OldSize   int64  `json:"old_size,omitempty"`
	OldMode   string `json:"old_mode,omitempty"`
	OldSHA256 string `json:"old_sha256,omitempty"`
	// Diff is a unified diff of a text file, when asked for.
	Diff string `json:"diff,omitempty"`
}

// FsDiff is the answer of GET /jails/{id}/fs/diff.
type FsDiff struct {
	Changes []Change `json:"changes"`
	Added   int      `json:"added"`
	Changed int      `json:"modified"`
	Deleted int      `json:"deleted"`
	// Truncated is set when more paths changed than one diff examines
	// (100 000), or when directories are nested past the kernel's path
	// limit (4 096 bytes; what is below them is not read): the changes and
	// counts are those among the paths it read.
	Truncated bool `json:"truncated,omitempty"`
}

// SyscallStat is one syscall's total in a report.
type SyscallStat struct {
	Name    string `json:"name"`
	Nr      int    `json:"nr"`
	Count   uint64 `json:"count"`
	Errors  uint64 `json:"errors"`
	TotalNs uint64 `json:"total_ns"`
}

// FileStat is one path's totals in a report.
type FileStat struct {
	Path         string `json:"path"`
	BytesRead    int64  `json:"bytes_read"`
	BytesWritten int64  `json:"bytes_written"`
	Opens        uint64 `json:"opens"`
	// Ops counts the other operations (unlink, rename, mkdir, chmod, ...).
	Ops map[string]uint64 `json:"ops,omitempty"`
}

// NetStat is one destination's totals in a report.
type NetStat struct {
	Destination string `json:"destination"`
	BytesOut    int64  `json:"bytes_out"`
	BytesIn     int64  `json:"bytes_in"`
	Connections uint64 `json:"connections"`
	Allowed     uint64 `json:"allowed"`
	Blocked     uint64 `json:"blocked"`
}

// Report is the whole observation of a jail as one document
// (GET /jails/{id}/report).
type Report struct {
	JailID      string    `json:"jail_id"`
	Name        string    `json:"name"`
	Status      State     `json:"status"`
	GeneratedAt time.Time `json:"generated_at"`
	// Since is when the current record began (the daemon's watch of the
	// jail); events before a daemon restart are in the JSONL files only.
	Since    *time.Time        `json:"since,omitempty"`
	Tracing  string            `json:"tracing"`
	Events   map[string]uint64 `json:"events"`
	Syscalls []SyscallStat     `json:"syscalls"`
	Files    []FileStat        `json:"files"`
	Network  []NetStat         `json:"network"`
	Process  ProcessTree       `json:"processes"`
	FsDiff   *FsDiff           `json:"fs_diff,omitempty"`
	// Lost counts dropped events by source: the kernel ring buffer
	// ("kernel"), the JSONL writer falling behind ("writer"), a full data
	// dir ("disk"), event files at their bound ("limit"), the network
	// tracer ("network"), and packets past the capture file's bound
	// ("pcap").
	Lost map[string]uint64 `json:"lost"`
	// DNS counts the jail's queries to the daemon's DNS: answered, and
	// dropped (absent when the jail has no network attached).
	DNS *DNSStats `json:"dns,omitempty"`
	// Observation says whether the jail is watched, and why not.
	Observation Check `json:"observation"`
	// FileCheck cross-checks the syscall-derived file record with fanotify.
	FileCheck *FileCheck `json:"file_check,omitempty"`
}

// DNSStats counts a jail's DNS queries: answered, dropped over its
// network.limits.dns_queries_per_second, and dropped because it already
// had the most queries in flight a jail may have (or the daemon's queue was
// full).
type DNSStats struct {
	Answered         uint64 `json:"answered"`
	DroppedRateLimit uint64 `json:"dropped_rate_limit"`
	DroppedBusy      uint64 `json:"dropped_busy"`
}

// FileCheck compares the files fanotify saw closed after writing with the
// file record derived from the syscall stream.
type FileCheck struct {
	// Written counts the distinct files fanotify saw written.
	Written int `json:"written"`
	// Missing lists files fanotify saw written that the syscall-derived
	// record does not have (empty when the two agree).
	Missing []string `json:"missing"`
}
