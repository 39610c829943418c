package config

// Sizes.
const (
	MiB = int64(1) << 20
	GiB = int64(1) << 30
)

// Defaults and maxima of seed 000 ("Resource Defaults").
const (
	DefaultCPUShares = 256
	MaxCPUShares     = 1024
	DefaultMemory    = 512 * MiB
	MaxMemory        = 8192 * MiB
	DefaultDisk      = 1024 * MiB
	MaxDisk          = 16384 * MiB
	MinDisk          = 64 * MiB
	MinMemory        = 16 * MiB
	DefaultPids      = 128
	MinPids          = 32
	MaxPids          = 4096
	DefaultCPUPeriod = 100000
	DefaultNofile    = 1024
	DefaultUser      = "agent"
	DefaultWorkspace = "/workspace"
	RootfsHost       = "host"
	RootfsDirPrefix  = "dir:"
	// RootfsImagePrefix names an image of the daemon's store
	// ("image:python:3.12-slim"); the daemon pins the image's id
	// ("image:python:3.12-slim@sha256:…").
	RootfsImagePrefix = "image:"
	// RootfsProfilePrefix names a profile the daemon builds with
	// mmdebstrap ("profile:python"); it becomes the profile's image.
	RootfsProfilePrefix = "profile:"
	// RootfsNixPrefix names a flake whose closure nix builds
	// ("nix:nixpkgs#python3"); it becomes an image too.
	RootfsNixPrefix = "nix:"
)

// ApplyDefaults fills every unset field of c with its default.
func (c *Config) ApplyDefaults() {
	if c.Tracing.Mode == "" {
		c.Tracing.Mode = TraceFull
	}
	iso := &c.Isolation
	if iso.Level == "" {
		iso.Level = LevelContainer
	}
	fs := &iso.Filesystem
	if fs.Rootfs == "" {
		fs.Rootfs = RootfsHost
	}
	if fs.WorkspaceRoot == "" {
		fs.WorkspaceRoot = DefaultWorkspace
	}
	if fs.UseOverlay == nil {
		t := true
		fs.UseOverlay = &t
	}
	if iso.Network.Mode == "" {
		iso.Network.Mode = NetIsolated
	}
	r := &iso.Resources
	if r.CPUShares == 0 {
		r.CPUShares = DefaultCPUShares
	}
	if r.CPUPeriod == 0 {
		r.CPUPeriod = DefaultCPUPeriod
	}
	if r.MemoryBytes == 0 {
		r.MemoryBytes = DefaultMemory
	}
	if r.MemorySwapBytes == 0 {
		r.MemorySwapBytes = r.MemoryBytes
	}
	if r.DiskBytes == 0 {
		r.DiskBytes = DefaultDisk
	}
	if r.PidsLimit == 0 {
		r.PidsLimit = DefaultPids
	}
	if r.NofileLimit == 0 {
		r.NofileLimit = DefaultNofile
	}
	p := &iso.Process
	if p.User == "" {
		p.User = DefaultUser
	}
	t := true
	ns := p.Namespaces
	if ns == nil {
		ns = &Namespaces{}
		p.Namespaces = ns
	}
	for _, b := range []**bool{&ns.PID, &ns.Mount, &ns.Network, &ns.UTS, &ns.IPC, &ns.Cgroup} {
		if *b == nil {
			*b = &t
		}
	}
	if ns.User == nil {
		f := false
		ns.User = &f
	}
}
