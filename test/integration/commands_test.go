package integration

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	agentjail "github.com/agentjail/agentjail/client"
)

// commandOutput reads cm until the command exits and returns what each
// stream carried.
func commandOutput(t *testing.T, cm *agentjail.Command) (stdout, stderr string, exit agentjail.CommandExit) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	var out, errb strings.Builder
	for {
		stream, data, err := cm.Next(ctx)
		if errors.Is(err, io.EOF) {
			ex, ok := cm.Exit()
			if !ok {
				t.Fatal("EOF without an exit status")
			}
			return out.String(), errb.String(), ex
		}
		if err != nil {
			t.Fatalf("reading the command: %v", err)
		}
		switch stream {
		case agentjail.Stdout:
			out.Write(data)
		case agentjail.Stderr:
			errb.Write(data)
		default:
			t.Fatalf("output on stream %d", stream)
		}
	}
}

// TestCommandSocket: a background command over WS /jails/{id}/commands/ws
// keeps stdout and stderr apart, takes stdin, reports its exit; a detached
// one outlives its connection and is attached again by pid; one that is
// not detached dies with its connection; bad requests are 400/404.
func TestCommandSocket(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, nil)
	c := agentjail.New(d.addr, d.token)
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()

	cm, err := c.Command(ctx, j.ID, agentjail.CommandOptions{Cmd: []string{"sh", "-c", "read x; echo out:$x; echo err >&2; exit 3"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if cm.Pid() <= 1 {
		t.Fatalf("pid %d", cm.Pid())
	}
	if _, err := cm.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	if err := cm.CloseStdin(ctx); err != nil {
		t.Fatal(err)
	}
	out, errOut, ex := commandOutput(t, cm)
	if out != "out:hello\n" || errOut != "err\n" || ex.Code != 3 {
		t.Fatalf("stdout %q stderr %q exit %+v", out, errOut, ex)
	}

	// Detached: the command keeps running without a connection, and an
	// attachment by pid gets its later output and its exit.
	cm, err = c.Command(ctx, j.ID, agentjail.CommandOptions{Cmd: []string{"sh", "-c", "while [ ! -e /tmp/go ]; do sleep 0.05; done; echo after; exit 7"}, Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	pid := cm.Pid()
	cm.Close()
	jailHas(t, d, j.ID, "sh")
	cm, err = c.AttachCommand(ctx, j.ID, pid)
	if err != nil {
		t.Fatal(err)
	}
	d.mustSh(t, j.ID, "touch /tmp/go")
	if out, _, ex := commandOutput(t, cm); out != "after\n" || ex.Code != 7 {
		t.Fatalf("attached: stdout %q exit %+v", out, ex)
	}

	// Not detached: closing the connection kills the command.
	cm, err = c.Command(ctx, j.ID, agentjail.CommandOptions{Cmd: []string{"sleep", "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	jailHas(t, d, j.ID, "sleep")
	cm.Close()
	d.waitSh(t, j.ID, "! pgrep -x sleep", 10*time.Second, "the sleep killed with its connection")

	// Errors before the upgrade.
	for _, tc := range []struct {
		query string
		want  int
	}{
		{"", http.StatusBadRequest},
		{"?cmd=true&bogus=1", http.StatusBadRequest},
		{"?pid=0", http.StatusBadRequest},
		{"?pid=5&cmd=true", http.StatusBadRequest},
		{"?pid=99999", http.StatusNotFound},
	} {
		r := d.api.do(t, "GET", "/jails/"+j.ID+"/commands/ws"+tc.query, nil, "Upgrade", "websocket", "Connection", "Upgrade")
		if r.status != tc.want {
			t.Errorf("%q: %s, want %d", tc.query, r, tc.want)
		}
	}
	if r := d.api.do(t, "GET", "/jails/"+j.ID+"/commands/ws?cmd=true", nil); r.status != http.StatusBadRequest {
		t.Errorf("without an upgrade: %s", r)
	}
	if _, err := c.Command(ctx, "no-such-jail", agentjail.CommandOptions{Cmd: []string{"true"}}); err == nil {
		t.Error("a command in a jail that does not exist started")
	}
}
