package conformance

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/timerslack"
)

// lifecycle: created → running → stopped → running → destroyed, with
// commands refused while stopped and the workspace kept across a stop.
func (h *harness) lifecycle(t *testing.T) {
	start := false
	j := h.create(t, client.CreateRequest{Start: &start})
	ctx := callCtx(t)
	if j.Status != client.State("created") {
		t.Fatalf("create with start false: status %s", j.Status)
	}
	if _, err := h.Client.Exec(ctx, j.ID, client.ExecRequest{Cmd: []string{"true"}}); !client.IsConflict(err) {
		t.Errorf("exec in a created jail: %v, want a conflict", err)
	}
	j, err := h.Client.Start(ctx, j.ID)
	if err != nil || j.Status != "running" {
		t.Fatalf("start: %+v %v", j, err)
	}
	ws := j.Config.Isolation.Filesystem.WorkspaceRoot
	h.sh(t, j.ID, "echo kept > "+ws+"/lifecycle")
	if j, err = h.Client.Stop(ctx, j.ID, 5*time.Second); err != nil || j.Status != "stopped" {
		t.Fatalf("stop: %+v %v", j, err)
	}
	if _, err := h.Client.Exec(ctx, j.ID, client.ExecRequest{Cmd: []string{"true"}}); !client.IsConflict(err) {
		t.Errorf("exec in a stopped jail: %v, want a conflict", err)
	}
	if _, err := h.Client.Stop(ctx, j.ID, 0); !client.IsConflict(err) {
		t.Errorf("stop of a stopped jail: %v, want a conflict", err)
	}
	if j, err = h.Client.Start(ctx, j.ID); err != nil || j.Status != "running" {
		t.Fatalf("start again: %+v %v", j, err)
	}
	if got := h.sh(t, j.ID, "cat "+ws+"/lifecycle"); got != "kept\n" {
		t.Errorf("the workspace after a stop and start holds %q", got)
	}
	if err := h.Client.Destroy(ctx, j.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Client.Get(ctx, j.ID); !client.IsNotFound(err) {
		t.Errorf("get after destroy: %v, want not found", err)
	}
}

// exec: environment, working directory, user, stdin, timeout, signals,
// exit codes and large output.
func (h *harness) exec(t *testing.T) {
	j := h.jail(t, func(c *client.Config) { c.Env = map[string]string{"FROM_CONFIG": "config-value"} })
	ws := j.Config.Isolation.Filesystem.WorkspaceRoot
	run := func(req client.ExecRequest) *client.ExecResult { return h.run(t, j.ID, req) }

	t.Run("env", func(t *testing.T) {
		res := run(client.ExecRequest{Cmd: []string{"sh", "-c", `echo "$FROM_CONFIG|$FROM_REQUEST|$HOME|$PATH"`}, Env: map[string]string{"FROM_REQUEST": "request value"}})
		f := strings.Split(strings.TrimSpace(res.Stdout), "|")
		if len(f) != 4 || f[0] != "config-value" || f[1] != "request value" || f[2] == "" || !strings.Contains(f[3], "/usr/bin") {
			t.Errorf("environment: %q", res.Stdout)
		}
	})
	t.Run("cwd", func(t *testing.T) {
		if got := strings.TrimSpace(run(client.ExecRequest{Cmd: []string{"pwd"}}).Stdout); got != ws {
			t.Errorf("default working directory %q, want the workspace %q", got, ws)
		}
		if got := strings.TrimSpace(run(client.ExecRequest{Cmd: []string{"pwd"}, Cwd: "/tmp"}).Stdout); got != "/tmp" {
			t.Errorf("cwd /tmp: %q", got)
		}
		if res, err := h.Client.Exec(callCtx(t), j.ID, client.ExecRequest{Cmd: []string{"pwd"}, Cwd: ws + "/missing"}); err == nil && res.ExitCode == 0 {
			t.Errorf("cwd of a missing directory ran: %+v", res)
		}
	})
	t.Run("timer slack", func(t *testing.T) {
		// Commands have the kernel's ordinary timer slack, not the coarse
		// one of agentjail's own processes (internal/timerslack). gVisor
		// shows none.
		got := strings.TrimSpace(run(client.ExecRequest{Cmd: []string{"sh", "-c", "cat /proc/self/timerslack_ns 2>/dev/null || echo none"}}).Stdout)
		want := strconv.FormatInt(timerslack.Ordinary.Nanoseconds(), 10)
		if h.Level == config.LevelGVisor {
			want = "none"
		}
		if got != want {
			t.Errorf("a command's timer slack: %q, want %q", got, want)
		}
	})
	t.Run("user", func(t *testing.T) {
		uid := strings.TrimSpace(run(client.ExecRequest{Cmd: []string{"id", "-u"}}).Stdout)
		if uid == "0" && !h.caps.Unsafe {
			t.Errorf("the default user is root")
		}
		// Root in the jail: granted as the jail's root, or refused naming
		// the level.
		res, err := h.Client.Exec(callCtx(t), j.ID, client.ExecRequest{Cmd: []string{"id", "-u"}, User: "root"})
		if err != nil {
			h.refused(t, "exec as root", err)
		} else if strings.TrimSpace(res.Stdout) != "0" {
			t.Errorf("exec as root: uid %q", res.Stdout)
		}
		if _, err := h.Client.Exec(callCtx(t), j.ID, client.ExecRequest{Cmd: []string{"true"}, User: "no-such-user"}); err == nil {
			t.Errorf("exec as an unknown user ran")
		}
	})
	t.Run("stdin", func(t *testing.T) {
		in := "line one\nbinary \x00\xff\x01 end"
		if got := run(client.ExecRequest{Cmd: []string{"cat"}, Stdin: in}).Stdout; got != in {
			t.Errorf("stdin round trip: %q", got)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		begin := time.Now()
		res := run(client.ExecRequest{Cmd: []string{"sleep", "60"}, TimeoutMs: 500})
		if !res.TimedOut || res.ExitCode == 0 || time.Since(begin) > 20*time.Second {
			t.Errorf("timeout: %+v after %v", res, time.Since(begin))
		}
		// Its descendants go with it.
		res = run(client.ExecRequest{Cmd: []string{"sh", "-c", "sleep 6017 & sleep 6017"}, TimeoutMs: 500})
		if !res.TimedOut {
			t.Errorf("timeout with a child: %+v", res)
		}
		if got := h.sh(t, j.ID, "pgrep -fx 'sleep 6017' || true"); got != "" {
			t.Errorf("sleeps still running after their command timed out: %s", got)
		}
	})
	t.Run("exit codes and signals", func(t *testing.T) {
		for _, c := range []struct {
			script string
			code   int
			signal string
		}{{"exit 0", 0, ""}, {"exit 3", 3, ""}, {"exit 255", 255, ""}, {"kill -TERM $$", 143, "SIGTERM"}, {"kill -KILL $$", 137, "SIGKILL"}} {
			res := run(client.ExecRequest{Cmd: []string{"sh", "-c", c.script}})
			if res.ExitCode != c.code || res.Signal != c.signal {
				t.Errorf("%q: exit %d signal %q, want %d %q", c.script, res.ExitCode, res.Signal, c.code, c.signal)
			}
		}
		if res, err := h.Client.Exec(callCtx(t), j.ID, client.ExecRequest{Cmd: []string{"/no/such/program"}}); err == nil && res.ExitCode == 0 {
			t.Errorf("a missing program ran: %+v", res)
		}
	})
	t.Run("large output", func(t *testing.T) {
		const streamed = 8 << 20
		var out bytes.Buffer
		var errBytes int
		res, err := h.Client.ExecStream(callCtx(t), j.ID, client.ExecRequest{
			Cmd: []string{"sh", "-c", "head -c " + strconv.Itoa(streamed) + " /dev/zero | tr '\\0' a; echo done >&2"},
		}, func(stream string, data []byte) error {
			if stream == "stdout" {
				out.Write(data)
			} else {
				errBytes += len(data)
			}
			return nil
		})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("streamed exec: %+v %v", res, err)
		}
		if out.Len() != streamed || bytes.Count(out.Bytes(), []byte("a")) != streamed || errBytes != 5 {
			t.Errorf("streamed %d bytes of stdout (%d 'a'), %d of stderr; want %d and 5", out.Len(), bytes.Count(out.Bytes(), []byte("a")), errBytes, streamed)
		}
		buffered := run(client.ExecRequest{Cmd: []string{"head", "-c", "3000000", "/dev/zero"}})
		if !buffered.Truncated || len(buffered.Stdout) != model.MaxExecOutput || buffered.ExitCode != 0 {
			t.Errorf("buffered exec of 3 MB: %d bytes, truncated %v, exit %d", len(buffered.Stdout), buffered.Truncated, buffered.ExitCode)
		}
	})
}
