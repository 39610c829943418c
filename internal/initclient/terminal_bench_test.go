package initclient_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"runtime"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/barepty"
	"github.com/agentjail/agentjail/internal/initclient"
	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/testenv"
)

// termOutputBytes is what the throughput benchmarks' command writes.
const termOutputBytes = 100_000_000

var termOutputCmd = []string{"sh", "-c", "head -c 100000000 /dev/zero | tr '\\0' x"}

// barePTY runs the benchmark's command on a terminal of its own, read by
// nothing but a loop (package barepty): the floor any session stands on.
func barePTY(tb testing.TB) time.Duration {
	tb.Helper()
	n, d, err := barepty.Run(termOutputCmd)
	if err != nil || n != termOutputBytes {
		tb.Fatalf("bare terminal: %d bytes, %v", n, err)
	}
	return d
}

// BenchmarkTerminalOutput measures terminal output through init (the
// terminal, the recording, the attachment) to one client, beside the bare
// terminal reader (barePTY) run in the same iteration: x-bare is the
// session's throughput over the bare reader's (target ≥ 0.8 with the
// recording on). slow-viewer adds a second attachment that reads nothing
// while the output runs: the session and its recording must not wait
// for it (it skips ahead and is told so).
func BenchmarkTerminalOutput(b *testing.B) {
	for _, tc := range []struct {
		name       string
		record     bool
		slowViewer bool
	}{
		{"bare-pty", false, false},
		{"session", false, false},
		{"recorded", true, false},
		{"recorded-slow-viewer", true, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(termOutputBytes)
			if tc.name == "bare-pty" {
				testenv.RequireRoot(b)
				for range b.N {
					barePTY(b)
				}
				return
			}
			e := newEnvRecording(b, tc.record)
			var ratios []float64
			chunks, received := 0, 0
			b.ResetTimer()
			for range b.N {
				// Each side starts without the other's garbage to collect
				// or dirty pages (a recording) to write back.
				b.StopTimer()
				settle()
				bare := barePTY(b)
				settle()
				b.StartTimer()
				start := time.Now()
				term, err := e.c.StartTerminal(context.Background(), initproto.ExecRequest{Argv: termOutputCmd, PTY: &initproto.PTYOptions{}})
				if err != nil {
					b.Fatal(err)
				}
				var slow *initclient.Terminal
				if tc.slowViewer {
					if slow, err = e.c.AttachTerminal(context.Background(), initproto.AttachRequest{Session: term.Session().ID}); err != nil {
						b.Fatal(err)
					}
				}
				n, c := drainTerminal(b, term)
				elapsed := time.Since(start)
				term.Close()
				chunks += c
				received += n
				if n != termOutputBytes {
					b.Fatalf("the client received %d of %d bytes", n, termOutputBytes)
				}
				ratios = append(ratios, bare.Seconds()/elapsed.Seconds())
				if slow != nil {
					b.StopTimer()
					got := readTerminal(b, slow)
					slow.Close()
					if !bytes.Contains(got, []byte("this viewer skipped")) || len(got) >= termOutputBytes {
						b.Fatalf("the slow viewer got %d bytes and no notice that it skipped output", len(got))
					}
					b.StartTimer()
				}
			}
			b.StopTimer()
			slices.Sort(ratios)
			b.ReportMetric(ratios[len(ratios)/2], "x-bare")
			b.ReportMetric(float64(received)/float64(chunks), "bytes/frame")
		})
	}
}

// settle collects garbage and writes dirty pages back, so that what one
// measurement left behind does not weigh on the next.
func settle() {
	runtime.GC()
	unix.Sync()
}

// drainTerminal reads a terminal's output until it ends; it returns the
// bytes and frames read.
func drainTerminal(tb testing.TB, term *initclient.Terminal) (int, int) {
	n, frames := 0, 0
	for {
		p, err := term.Next()
		if errors.Is(err, io.EOF) {
			return n, frames
		}
		if err != nil {
			tb.Fatal(err)
		}
		n += len(p)
		frames++
	}
}

func readTerminal(tb testing.TB, term *initclient.Terminal) []byte {
	var out []byte
	for {
		p, err := term.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, p...)
	}
}
