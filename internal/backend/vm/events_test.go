package vm

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/agentjail/agentjail/internal/backend/vm/vmproto"
	"github.com/agentjail/agentjail/internal/observe"
)

// TestEventsAcrossIdle: the jail's process events keep coming on one
// stream across quiet spells, the sink hears of each quiet spell, and a
// passed deadline on a control stream reads as os.ErrDeadlineExceeded
// (as on every other connection), not as a broken stream.
func TestEventsAcrossIdle(t *testing.T) {
	dir := t.TempDir()
	ln, err := net.Listen("unix", filepath.Join(dir, controlSock))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	idle := make(chan struct{})
	guestErr := make(chan error, 1)
	stop := make(chan struct{})
	defer close(stop)
	// The guest: hello, then on its first stream one event, a quiet
	// spell, another event; it answers nothing on the streams after.
	go func() {
		guestErr <- func() error {
			c, err := ln.Accept()
			if err != nil {
				return err
			}
			r := bufio.NewReader(c)
			for {
				l, err := r.ReadString('\n')
				if err != nil {
					return err
				}
				if l == strings.TrimPrefix(vmproto.WakeLine, "\n") {
					break
				}
			}
			if _, err := c.Write([]byte("\n" + vmproto.HelloLine + "\n")); err != nil {
				return err
			}
			cfg := yamux.DefaultConfig()
			cfg.EnableKeepAlive = false
			s, err := yamux.Server(c, cfg)
			if err != nil {
				return err
			}
			go func() { <-stop; s.Close() }()
			st, err := s.Accept()
			if err != nil {
				return err
			}
			defer st.Close()
			if _, err := st.Read(make([]byte, 1)); err != nil {
				return err
			}
			if _, err := st.Write([]byte(`{"op":"exec","pid":10}` + "\n")); err != nil {
				return err
			}
			<-idle
			_, err = st.Write([]byte(`{"op":"exit","pid":10}` + "\n"))
			return err
		}()
	}()

	s := newSession(dir)
	defer s.close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := s.stream(ctx, vmproto.KindEvents)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sink := &idleSink{idle: idle}
	done := make(chan struct{})
	go func() {
		defer close(done)
		(&Backend{}).readEvents(c, sink)
	}()
	select {
	case err := <-guestErr:
		if err != nil {
			t.Fatal(err)
		}
	case <-done:
		// The reading ended: at the stream's end after the second event,
		// or too early, at the quiet spell (then the guest still waits).
		sink.Idle()
		if err := <-guestErr; err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	<-done
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if got := strings.Join(sink.ops, " "); got != "exec exit" {
		t.Errorf("one reading of the stream handed %q to the sink, want both events (exec exit)", got)
	}

	// A passed deadline is a timeout, not a broken stream.
	c2, err := s.stream(ctx, vmproto.KindStats)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	if _, err := c2.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a read past its deadline failed with %v, want os.ErrDeadlineExceeded", err)
	}
}

// idleSink records the events' operations and closes idle at the first
// quiet spell it hears of.
type idleSink struct {
	mu   sync.Mutex
	ops  []string
	idle chan struct{}
	once sync.Once
}

func (s *idleSink) Handle(ev *observe.Event) {
	s.mu.Lock()
	s.ops = append(s.ops, ev.Op)
	s.mu.Unlock()
}

func (s *idleSink) Idle() { s.once.Do(func() { close(s.idle) }) }
