package integration

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// relayEnv makes the test binary a relay of TestNoisyNeighbour's chain
// instead of running tests: its value is the relay's depth.
const relayEnv = "AGENTJAIL_IT_RELAY"

// relayDepth is the chain's depth: relays standing for the daemon, init
// and the shim, the last spawning /bin/true, as on a jail's exec path.
const relayDepth = 2

// runRelay serves a relay of depth n on stdin and stdout: for every byte
// read, relay 0 spawns /bin/true and waits for it, a deeper relay passes
// the byte to the relay below it (its child) and waits for the answer;
// then it writes the byte back. It returns at the end of its input.
func runRelay(n int) error {
	var next *exec.Cmd
	var down io.WriteCloser
	var up io.ReadCloser
	if n > 0 {
		next = exec.Command(os.Args[0])
		next.Env = append(os.Environ(), relayEnv+"="+strconv.Itoa(n-1))
		next.Stderr = os.Stderr
		var err error
		if down, err = next.StdinPipe(); err != nil {
			return err
		}
		if up, err = next.StdoutPipe(); err != nil {
			return err
		}
		if err := next.Start(); err != nil {
			return err
		}
	}
	b := make([]byte, 1)
	for {
		if _, err := os.Stdin.Read(b); err != nil {
			if next != nil {
				down.Close()
				return next.Wait()
			}
			return nil
		}
		if next == nil {
			if err := exec.Command("/bin/true").Run(); err != nil {
				return err
			}
		} else if _, err := down.Write(b); err != nil {
			return err
		} else if _, err := io.ReadFull(up, b); err != nil {
			return fmt.Errorf("relay %d: %w", n-1, err)
		}
		if _, err := os.Stdout.Write(b); err != nil {
			return err
		}
	}
}

// relayChain is a running chain of host processes that hand one byte down
// to a spawn of /bin/true and back, with as many wake-ups as a jail's exec.
type relayChain struct {
	cmd  *exec.Cmd
	down io.WriteCloser
	up   io.ReadCloser
}

// startRelayChain starts the chain's top relay; it ends with the test.
func startRelayChain(t *testing.T) *relayChain {
	t.Helper()
	c := &relayChain{cmd: exec.Command(os.Args[0])}
	c.cmd.Env = append(os.Environ(), relayEnv+"="+strconv.Itoa(relayDepth))
	c.cmd.Stderr = os.Stderr
	var err error
	if c.down, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if c.up, err = c.cmd.StdoutPipe(); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.down.Close()
		if err := c.cmd.Wait(); err != nil {
			t.Errorf("relay chain: %v", err)
		}
	})
	return c
}

// roundTrip passes one byte down the chain and back.
func (c *relayChain) roundTrip(t *testing.T) time.Duration {
	t.Helper()
	b := []byte{1}
	start := time.Now()
	if _, err := c.down.Write(b); err != nil {
		t.Fatalf("relay chain: %v", err)
	}
	if _, err := io.ReadFull(c.up, b); err != nil {
		t.Fatalf("relay chain: %v", err)
	}
	return time.Since(start)
}
