package initclient_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/errdefs"
)

// echoServer answers each line it reads on a connection with the line in
// upper case, on a listener of network at addr.
func echoServer(t *testing.T, network, addr string) int {
	t.Helper()
	l, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadBytes('\n')
					if err != nil {
						return
					}
					for i, b := range line {
						if 'a' <= b && b <= 'z' {
							line[i] = b - 32
						}
					}
					if _, err := c.Write(line); err != nil {
						return
					}
				}
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// roundTrip sends line on c and reads the answer's line.
func roundTrip(t *testing.T, c net.Conn, br *bufio.Reader, line string) string {
	t.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		t.Fatal(err)
	}
	got, err := br.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return got[:len(got)-1]
}

// TestDialPort: init connects to a port of its loopback for the client,
// on 127.0.0.1 or else ::1 (where a server listening on "localhost" may
// be), and relays both ways; a port nothing listens on, and one that is
// not a port, are precise errors; readying for a checkpoint closes the
// relayed connections, which counts none of them as open.
func TestDialPort(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, tc := range []struct{ network, addr string }{{"tcp4", "127.0.0.1:0"}, {"tcp6", "[::1]:0"}} {
		port := echoServer(t, tc.network, tc.addr)
		c, err := e.c.DialPort(ctx, port)
		if err != nil {
			t.Fatalf("%s: %v", tc.addr, err)
		}
		if want := strings.Replace(tc.addr, ":0", ":"+strconv.Itoa(port), 1); c.RemoteAddr().String() != want {
			t.Errorf("connected to %s, want %s", c.RemoteAddr(), want)
		}
		br := bufio.NewReader(c)
		for _, s := range []string{"hello", "again"} {
			if got := roundTrip(t, c, br, s); got != map[string]string{"hello": "HELLO", "again": "AGAIN"}[s] {
				t.Errorf("%s: %q came back as %q", tc.addr, s, got)
			}
		}
		c.Close()
	}

	free, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := free.Addr().(*net.TCPAddr).Port
	free.Close()
	if _, err := e.c.DialPort(ctx, closedPort); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a port nothing listens on: %v", err)
	}
	for _, p := range []int{0, -1, 65536} {
		if _, err := e.c.DialPort(ctx, p); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("port %d: %v", p, err)
		}
	}

	port := echoServer(t, "tcp4", "127.0.0.1:0")
	c, err := e.c.DialPort(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	if got := roundTrip(t, c, br, "before"); got != "BEFORE" {
		t.Fatalf("%q", got)
	}
	ans, err := e.c.ReadyForCheckpoint(ctx)
	if err != nil || ans.OpenConnections != 0 {
		t.Fatalf("readying for a checkpoint with a relayed port open: %+v %v", ans, err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("the relayed connection still works after the checkpoint's preparation")
	}
	if err := e.c.SetIdleShims(ctx, true); err != nil {
		t.Fatal(err)
	}
	// After the checkpoint, a new connection works.
	c2, err := e.c.DialPort(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if got := roundTrip(t, c2, bufio.NewReader(c2), "after"); got != "AFTER" {
		t.Fatalf("%q", got)
	}
}
