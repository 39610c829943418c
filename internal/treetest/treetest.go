// Package treetest runs, over init's protocol, a command tree that leaves
// its shell in every usual way, and checks that the tree ends: the
// helpers behind the tests of init's "a departed client's commands are
// killed" promise, over a unix socket and over the vm level's streams.
package treetest

import (
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/initproto"
)

// Script starts a tree that escapes in every usual way: a setsid() child,
// a double-forked orphan and a plain background child; each prints its
// pid, then the command itself prints its pid and waits.
const Script = `setsid sh -c 'echo $$; exec sleep 1000' &
(sh -c 'echo $$; exec sleep 1000' &) 
sleep 1000 & echo $!
echo $$
wait`

// Start asks init, on conn, to run Script with its stdin open.
func Start(t testing.TB, conn net.Conn) {
	t.Helper()
	if err := initproto.WriteJSON(conn, initproto.MsgExec, initproto.ExecRequest{Argv: []string{"sh", "-c", Script}, Stdin: true}); err != nil {
		t.Fatal(err)
	}
}

// Pids reads the four pids Script prints on conn.
func Pids(t testing.TB, conn net.Conn) []int {
	t.Helper()
	var out strings.Builder
	for len(strings.Fields(out.String())) < 4 {
		typ, p, err := initproto.ReadFrame(conn, nil)
		if err != nil {
			t.Fatal(err)
		}
		if typ == initproto.MsgStdout {
			out.Write(p)
		}
	}
	return ParsePids(t, strings.Fields(out.String()))
}

// ParsePids parses one pid per line.
func ParsePids(t testing.TB, lines []string) []int {
	t.Helper()
	var pids []int
	for _, l := range lines {
		p, err := strconv.Atoi(strings.TrimSpace(l))
		if err != nil {
			t.Fatalf("not a pid: %q", l)
		}
		pids = append(pids, p)
	}
	return pids
}

// Alive reports whether pid exists (a zombie counts as existing).
func Alive(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return err == nil
}

// Gone waits until every pid is gone (dead and reaped), failing after
// five seconds.
func Gone(t testing.TB, pids []int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		alive := 0
		for _, p := range pids {
			if Alive(p) {
				alive++
			}
		}
		if alive == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the command tree's %d processes still exist after 5s", alive, len(pids))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Flood sends input frames on conn until a write fails: a command that
// never reads its input fills its pipe and then the connection.
type Flood struct {
	written atomic.Int64
	done    chan struct{}
}

// NewFlood starts sending input on conn.
func NewFlood(conn net.Conn) *Flood {
	f := &Flood{done: make(chan struct{})}
	go func() {
		defer close(f.done)
		chunk := make([]byte, initproto.ChunkSize)
		for {
			if err := initproto.WriteFrame(conn, initproto.MsgStdin, chunk); err != nil {
				return
			}
			f.written.Add(int64(len(chunk)))
		}
	}()
	return f
}

// Written is how many input bytes were sent so far.
func (f *Flood) Written() int64 { return f.written.Load() }

// Done is closed when a write has failed and the flood ended.
func (f *Flood) Done() <-chan struct{} { return f.done }
