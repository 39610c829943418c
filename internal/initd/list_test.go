package initd

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/agentjail/agentjail/internal/initproto"
)

// TestFitList: the list of running commands fits one frame however long
// their command lines (each argument as long as the kernel takes, or a
// great many short ones) and however many run; a list that fits is left
// whole, and the commands' own argv are not changed.
func TestFitList(t *testing.T) {
	small := []initproto.ProcessInfo{{Pid: 1, Argv: []string{"sleep", "100"}, Cwd: "/workspace", User: "agent"}}
	if got := fitList(slices.Clone(small)); !slices.Equal(got[0].Argv, small[0].Argv) || got[0].Cwd != small[0].Cwd {
		t.Fatalf("a small list was changed: %+v", got)
	}
	script := strings.Repeat("print('é')\n", 12_000) // 132 KiB, as long as one argument may be
	many := make([]string, 100_000)
	for i := range many {
		many[i] = "x"
	}
	var list []initproto.ProcessInfo
	for pid := range 4096 {
		argv := []string{"python3", "-c", script, script, script}
		if pid%512 == 1 {
			argv = append([]string{"echo"}, many...)
		}
		list = append(list, initproto.ProcessInfo{Pid: pid + 1, Argv: argv, Cwd: "/" + strings.Repeat("d/", 2000), User: "agent"})
	}
	orig := list[0].Argv
	fitted := fitList(slices.Clone(list))
	b, err := json.Marshal(fitted)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > initproto.MaxPayload {
		t.Fatalf("the list takes %d bytes, more than a frame (%d)", len(b), initproto.MaxPayload)
	}
	if len(orig[2]) != len(script) {
		t.Error("a command's own argv was cut")
	}
	if f := fitted[0].Argv; f[0] != "python3" || f[1] != "-c" || !strings.HasPrefix(script, strings.TrimSuffix(f[2], "…")) {
		t.Errorf("the start of a cut command line is not kept: %q", f[:3])
	}
	if f := fitted[1].Argv; f[0] != "echo" || !strings.HasPrefix(f[len(f)-1], "…") || !strings.HasSuffix(f[len(f)-1], " more") {
		t.Errorf("arguments left out are not counted: %q", f[max(0, len(f)-3):])
	}
	for _, p := range fitted {
		for _, a := range p.Argv {
			if !utf8.ValidString(a) {
				t.Fatalf("an argument cut inside a character: %q", a)
			}
		}
	}
}
