package initd

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestOOMScoreAroundFork: a process started while the score is raised has
// the raised score from its first instruction, and the raiser returns to
// its own.
func TestOOMScoreAroundFork(t *testing.T) {
	read := func() string {
		b, err := os.ReadFile("/proc/self/oom_score_adj")
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	own := read()
	n, err := strconv.Atoi(own)
	if err != nil {
		t.Fatal(err)
	}
	adj := max(n+1, 500)
	o, err := openOOMScore(adj)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(o.fd)

	o.raise()
	out, err := exec.Command("cat", "/proc/self/oom_score_adj").Output()
	o.restore()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != strconv.Itoa(adj) {
		t.Errorf("a process started while raised has %s, want %d", got, adj)
	}
	if got := read(); got != own {
		t.Errorf("after restore the score is %s, want %s", got, own)
	}
}
