package initclient_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/initproto"
)

// silentInit is a socket whose owner accepts connections and never reads
// or answers: an init stopped by a signal or a tracer, as the daemon sees
// it (the kernel queues connections and buffers requests).
func silentInit(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "init.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return sock
}

// TestUnresponsiveInit checks that every kind of call to an init that
// does not answer fails with ErrUnresponsive within the liveness bound,
// and that the hook is told.
func TestUnresponsiveInit(t *testing.T) {
	sock := silentInit(t)
	bound := initclient.LivenessAfter + initclient.PingTimeout + time.Second
	calls := map[string]func(c *initclient.Client) error{
		"ping": func(c *initclient.Client) error { return c.Ping(context.Background()) },
		"stat": func(c *initclient.Client) error {
			_, err := c.Stat(context.Background(), "/etc")
			return err
		},
		"exec": func(c *initclient.Client) error {
			_, err := c.Exec(context.Background(), initproto.ExecRequest{Argv: []string{"true"}}, nil, nil, nil)
			return err
		},
		"read file": func(c *initclient.Client) error {
			_, _, err := c.ReadFile(context.Background(), "/etc/hostname")
			return err
		},
		"terminal": func(c *initclient.Client) error {
			_, err := c.StartTerminal(context.Background(), initproto.ExecRequest{PTY: &initproto.PTYOptions{Rows: 24, Cols: 80}})
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var told atomic.Int32
			c := initclient.New(initclient.UnixSocket(sock))
			c.OnUnresponsive = func(error) { told.Add(1) }
			start := time.Now()
			err := call(c)
			took := time.Since(start)
			if !errors.Is(err, errdefs.ErrUnresponsive) {
				t.Fatalf("want ErrUnresponsive, got %v", err)
			}
			if took > bound {
				t.Errorf("failed after %v, more than %v", took, bound)
			}
			if err := waitTold(&told); err != nil {
				t.Error(err)
			}
		})
	}
}

func waitTold(told *atomic.Int32) error {
	deadline := time.Now().Add(time.Second)
	for told.Load() == 0 {
		if time.Now().After(deadline) {
			return errors.New("OnUnresponsive was not called")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// TestLivenessKeepsLongCalls runs a command that is silent for longer than
// the liveness bound against a live init: the checks are answered and the
// command's exit is reported as usual.
func TestLivenessKeepsLongCalls(t *testing.T) {
	e := newEnv(t)
	e.c.OnUnresponsive = func(err error) { t.Errorf("told unresponsive: %v", err) }
	d := initclient.LivenessAfter + initclient.PingTimeout + time.Second
	st, err := e.c.Exec(context.Background(), initproto.ExecRequest{
		Argv: []string{"sleep", strconv.Itoa(int(d.Seconds()))},
	}, nil, nil, nil)
	if err != nil || st.Signal != "" || st.Code != 0 {
		t.Fatalf("exec: %+v, %v", st, err)
	}
}
