// Package conformance is the harness every isolation level passes, after
// Nomad's driver harness: one suite, run through the public API against a
// daemon that offers the level, which tests what every level must do
// (lifecycle, exec) and every capability the level declares (files and
// their containment, each enforced limit, each network mode and its
// policy, terminals, observation, snapshots, restore and branch), attempts
// the escapes for real (mount, raw sockets, /proc/sys, kernel modules,
// bpf, keyrings, ptrace of other jails and of the host, the host's files),
// and checks that what the level does not declare is refused with an
// error naming the level and the verb. A capability declared but failing
// here fails CI.
//
// A level plugs in by being offered by the daemon the tests start
// (test/integration's TestConformance runs Run for every level /health
// lists); nothing here names a level.
package conformance

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/model"
)

// EscapeProbe is a python3 program run inside a jail (on stdin, so it
// leaves no file). Each attempt runs in a forked child, so one that
// succeeded cannot change the conditions of the next; a child killed by a
// signal (a seccomp kill) counts as stopped. It prints one JSON list of
// {"name", "escaped", "detail"}.
//
// argv[1] is a JSON object: host_pids (pids of host processes),
// other_pids (host pids of another jail's processes), host_files (host
// paths that must stay unreachable, with their sha256), disk (major,
// minor of a host disk).
//
//go:embed escape_probe.py
var EscapeProbe string

// Target is a running daemon offering the level under test, and what of
// the host the harness may use.
type Target struct {
	// Client is the daemon's API.
	Client *client.Client
	// Level is the isolation level under test.
	Level string
	// DaemonPid is the daemon's host pid (no jail may reach it).
	DaemonPid int
	// DaemonFiles are host files of the daemon's (its API token) that no
	// jail may read, by path, with their content.
	DaemonFiles map[string]string
	// Internet is a server outside the host that the daemon's jail
	// network reaches, for the network tests.
	Internet Internet
}

// Internet is a server outside the host: HTTP on port 80 and a TCP echo
// service on port 7 at Addr, which the daemon's DNS resolves both names
// to.
type Internet struct {
	Addr string
	// Allowed is a name the harness allows in policies; Other one it
	// does not (then grants by a policy update).
	Allowed, Other string
}

// callTimeout bounds each API call of the harness.
const callTimeout = 2 * time.Minute

// harness is one run of the suite.
type harness struct {
	Target
	caps model.Capabilities
}

// Run runs the suite against tg. The level must be available on the
// daemon (else the test fails, naming why it is not).
func Run(t *testing.T, tg Target) {
	h := &harness{Target: tg}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	health, err := tg.Client.Health(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, l := range health.Levels {
		if l.Name != tg.Level {
			continue
		}
		if !l.Available {
			t.Fatalf("level %s is not available on the daemon: %s", tg.Level, l.Reason)
		}
		h.caps, found = *l.Capabilities, true
	}
	if !found {
		t.Fatalf("the daemon does not know level %s (its levels: %+v)", tg.Level, health.Levels)
	}
	t.Logf("%s: %+v", tg.Level, h.caps)
	t.Run("lifecycle", h.lifecycle)
	t.Run("exec", h.exec)
	if h.caps.Unsafe {
		// A level that isolates nothing promises only to run commands.
		return
	}
	t.Run("files", h.files)
	t.Run("limits", h.limits)
	t.Run("network", h.network)
	t.Run("preview", h.preview)
	t.Run("terminal", h.terminal)
	t.Run("escape", h.escape)
	t.Run("observation", h.observation)
	t.Run("snapshots", h.snapshots)
}

// has reports whether the level declares v in list.
func has(list []string, v string) bool { return slices.Contains(list, v) }

// ctx returns a context bounded by callTimeout, cancelled when t ends.
func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	t.Cleanup(cancel)
	return ctx
}

// jail creates a started jail of the level (config changed by mod, when
// set), destroyed when the test ends.
func (h *harness) jail(t *testing.T, mod func(c *client.Config)) *client.Jail {
	t.Helper()
	cfg := client.Config{Isolation: client.Isolation{Level: h.Level}}
	if mod != nil {
		mod(&cfg)
	}
	return h.create(t, client.CreateRequest{Config: cfg})
}

// create creates a jail from req (its level set to the harness's),
// destroyed when the test ends.
func (h *harness) create(t *testing.T, req client.CreateRequest) *client.Jail {
	t.Helper()
	req.Isolation.Level = h.Level
	if n := &req.Isolation.Network; n.Mode == "" && !has(h.caps.NetworkModes, config.NetIsolated) {
		// The default mode is not the level's: take its first.
		n.Mode = h.caps.NetworkModes[0]
	}
	if req.Name == "" {
		req.Name = uniqueName(t)
	}
	j, err := h.Client.Create(callCtx(t), req)
	if err != nil {
		t.Fatalf("create a %s jail: %v", h.Level, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		if err := h.Client.Destroy(ctx, j.ID); err != nil && !client.IsNotFound(err) {
			t.Errorf("destroy jail %s: %v", j.Name, err)
		}
	})
	return j
}

var nameSeq atomic.Int64

// uniqueName names a jail after the test, unique within the daemon.
func uniqueName(t *testing.T) string {
	n := strings.NewReplacer("/", "-", "_", "-", " ", "-").Replace(t.Name())
	if len(n) > 40 {
		n = n[len(n)-40:]
	}
	return fmt.Sprintf("cf-%s-%d-%d", strings.Trim(n, "-."), time.Now().UnixNano()%100000, nameSeq.Add(1))
}

// run runs req in jail id and returns its result (the call must succeed).
func (h *harness) run(t *testing.T, id string, req client.ExecRequest) *client.ExecResult {
	t.Helper()
	if req.TimeoutMs == 0 {
		req.TimeoutMs = 60_000
	}
	res, err := h.Client.Exec(callCtx(t), id, req)
	if err != nil {
		t.Fatalf("exec %q: %v", req.Cmd, err)
	}
	return res
}

// sh runs a shell script in jail id and returns its stdout; it fails the
// test when the script fails.
func (h *harness) sh(t *testing.T, id, script string) string {
	t.Helper()
	res := h.run(t, id, client.ExecRequest{Cmd: []string{"sh", "-c", script}})
	if res.ExitCode != 0 {
		t.Fatalf("%q exited %d: %s%s", script, res.ExitCode, res.Stdout, res.Stderr)
	}
	return res.Stdout
}

// refused checks that err is the daemon's refusal of verb at this level:
// 501 (or 422) naming the level.
func (h *harness) refused(t *testing.T, verb string, err error) {
	t.Helper()
	var ae *client.APIError
	if !errors.As(err, &ae) || (ae.Status != 501 && ae.Status != 422) || !strings.Contains(ae.Message, h.Level) {
		t.Errorf("%s at the %s level, which does not declare it: %v, want 501 or 422 naming the level", verb, h.Level, err)
	}
}

// waitFor polls f every 100 ms until it succeeds or d passes (for what
// the daemon records asynchronously: event files, processes).
func waitFor(d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
