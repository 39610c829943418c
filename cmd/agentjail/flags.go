package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/internal/config"
)

// parseSize parses a byte size: a number with an optional binary suffix
// k, m, g or t (also kb/kib, ...; case-insensitive), e.g. 512m, 1G, 4096.
func parseSize(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "ib"), "b")
	shift := 0
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'k':
			shift = 10
		case 'm':
			shift = 20
		case 'g':
			shift = 30
		case 't':
			shift = 40
		}
		if shift != 0 {
			t = t[:n-1]
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, fmt.Errorf("%q is not a size (e.g. 512m, 1g, 4096)", s)
	}
	b := v * float64(int64(1)<<shift)
	if b > math.MaxInt64/2 {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return int64(b), nil
}

// parseEnv parses K=V pairs into a map.
func parseEnv(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	env := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%s %q: expected KEY=VALUE", flag, kv)
		}
		env[k] = v
	}
	return env, nil
}

// createFlags are the flags of create and run that shape a jail.
type createFlags struct {
	fs        *pflag.FlagSet
	name      string
	file      string
	memory    string
	disk      string
	cpuShares uint64
	pids      int64
	noStart   bool
	env       []string
	rootfs    string
}

func (f *createFlags) register(fs *pflag.FlagSet, withNoStart bool) {
	f.fs = fs
	fs.StringVar(&f.name, "name", "", "the jail's name (default: its id)")
	fs.StringVarP(&f.file, "file", "f", "", "a CreateRequest in YAML or JSON (\"-\": stdin); flags override it")
	fs.StringVar(&f.memory, "memory", "", "memory limit, e.g. 512m")
	fs.Uint64Var(&f.cpuShares, "cpus-shares", 0, "relative CPU weight (2-1024)")
	fs.StringVar(&f.disk, "disk", "", "size of the writable layer, e.g. 1g")
	fs.Int64Var(&f.pids, "pids", 0, "maximum number of tasks")
	fs.StringArrayVar(&f.env, "env", nil, "KEY=VALUE added to every command's environment (repeatable)")
	fs.StringVar(&f.rootfs, "rootfs", "", `root filesystem: "host", "dir:/path" or "image:REF"`)
	if withNoStart {
		fs.BoolVar(&f.noStart, "no-start", false, "create the jail without starting it")
	}
}

// request builds the CreateRequest: the -f file, then the flags set on
// the command line over it.
func (f *createFlags) request(stdin io.Reader) (client.CreateRequest, error) {
	var req client.CreateRequest
	if f.file != "" {
		var data []byte
		var err error
		if f.file == "-" {
			data, err = io.ReadAll(stdin)
		} else {
			data, err = os.ReadFile(f.file)
		}
		if err != nil {
			return req, fmt.Errorf("-f: %w", err)
		}
		if strings.EqualFold(filepath.Ext(f.file), ".json") {
			err = config.DecodeJSON(data, &req)
		} else {
			err = config.DecodeYAML(data, &req)
		}
		if err != nil {
			return req, fmt.Errorf("%s: %w", f.file, err)
		}
	}
	res := &req.Isolation.Resources
	changed := f.fs.Changed
	if changed("name") {
		req.Name = f.name
	}
	if changed("memory") {
		n, err := parseSize(f.memory)
		if err != nil {
			return req, usageError{fmt.Errorf("--memory: %w", err)}
		}
		res.MemoryBytes = n
	}
	if changed("disk") {
		n, err := parseSize(f.disk)
		if err != nil {
			return req, usageError{fmt.Errorf("--disk: %w", err)}
		}
		res.DiskBytes = n
	}
	if changed("cpus-shares") {
		res.CPUShares = f.cpuShares
	}
	if changed("pids") {
		res.PidsLimit = f.pids
	}
	if changed("rootfs") {
		req.Isolation.Filesystem.Rootfs = f.rootfs
	}
	env, err := parseEnv("--env", f.env)
	if err != nil {
		return req, usageError{err}
	}
	for k, v := range env {
		if req.Env == nil {
			req.Env = map[string]string{}
		}
		req.Env[k] = v
	}
	if f.noStart {
		start := false
		req.Start = &start
	}
	return req, nil
}

// execFlags are the flags of exec and run that shape a command.
type execFlags struct {
	user    string
	cwd     string
	timeout time.Duration
	stdin   bool
}

func (f *execFlags) register(fs *pflag.FlagSet) {
	fs.StringVarP(&f.user, "user", "u", "", "user (name or uid) to run as (default: the jail's user)")
	fs.StringVar(&f.cwd, "cwd", "", "working directory (default: the workspace)")
	fs.DurationVar(&f.timeout, "timeout", 0, "kill the command after this long, e.g. 30s (exit status 124)")
	fs.BoolVarP(&f.stdin, "interactive", "i", false, "pass this process's stdin to the command")
}

// request builds the ExecRequest of argv; with -i, runExec feeds it this
// process's stdin.
func (f *execFlags) request(argv []string, env map[string]string) (client.ExecRequest, error) {
	req := client.ExecRequest{Cmd: argv, Env: env, Cwd: f.cwd, User: f.user, TimeoutMs: f.timeout.Milliseconds()}
	if f.timeout < 0 {
		return req, usageError{fmt.Errorf("--timeout: %s is negative", f.timeout)}
	}
	if f.timeout > 0 && req.TimeoutMs == 0 {
		req.TimeoutMs = 1
	}
	return req, nil
}
