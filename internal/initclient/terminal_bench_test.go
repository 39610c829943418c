package initclient_test

import (
	"context"
	"errors"
	"io"
	"testing"

	"github.com/agentjail/agentjail/internal/initproto"
)

// BenchmarkTerminalOutput measures terminal output through init (pty,
// recording, attachment) to one client.
func BenchmarkTerminalOutput(b *testing.B) {
	e := newEnv(b)
	const size = 100_000_000
	b.SetBytes(size)
	for i := 0; i < b.N; i++ {
		term, err := e.c.StartTerminal(context.Background(), initproto.ExecRequest{
			Argv: []string{"sh", "-c", "head -c 100000000 /dev/zero | tr '\\0' x"}, PTY: &initproto.PTYOptions{},
		})
		if err != nil {
			b.Fatal(err)
		}
		n, chunks := 0, 0
		for {
			p, err := term.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			n += len(p)
			chunks++
		}
		term.Close()
		if n != size {
			b.Fatalf("received %d bytes", n)
		}
		b.ReportMetric(float64(n)/float64(chunks), "bytes/chunk")
	}
}
