package conformance

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/agentjail/agentjail/client"
)

// terminal: with PTY declared, a terminal runs a shell on a real
// terminal (a tty of the given size) and reports its exit; without, it
// is refused naming the level.
func (h *harness) terminal(t *testing.T) {
	j := h.jail(t, nil)
	term, err := h.Client.Terminal(callCtx(t), j.ID, client.TerminalOptions{Cmd: []string{"sh"}, Rows: 33, Cols: 111})
	if !h.caps.PTY {
		if err == nil {
			term.Close()
		}
		h.refused(t, "open a terminal", err)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	defer term.Close()
	if _, err := term.Write([]byte("tty; stty size; echo marker-$((6*7)); exit 7\n")); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := term.Read(buf)
			out.Write(buf[:n])
			if err != nil {
				done <- err
				return
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the terminal did not end; it showed %q", out.String())
	}
	s := out.String()
	if !strings.Contains(s, "/dev/pts/") || !strings.Contains(s, "33 111") || !strings.Contains(s, "marker-42") {
		t.Errorf("terminal output %q: want a /dev/pts tty of 33x111 and the marker", s)
	}
	if ex, ok := term.Exit(); !ok || ex.Code != 7 {
		t.Errorf("terminal exit: %+v %v, want code 7", ex, ok)
	}
}
