package bpf

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agentjail/agentjail/internal/initproto"
	"github.com/agentjail/agentjail/internal/testenv"
)

// generators are the files whose //go:generate lines run bpf2go.
var generators = []string{"gen.go", "netgen.go"}

// TestGeneratedObjectsAreCurrent runs every //go:generate line of the
// package with bpf2go (the version go.mod pins) and clang into a temporary
// directory, and fails when an output differs from the committed one: a
// .bpf.c or header changed without `go generate`. clang 14 and the same
// flags produce the same bytes on every machine.
func TestGeneratedObjectsAreCurrent(t *testing.T) {
	testenv.RequireTool(t, "clang")
	testenv.RequireTool(t, "llvm-strip")
	if _, err := os.Stat("/usr/include/bpf/bpf_helpers.h"); err != nil {
		testenv.Need(t, "libbpf-dev (/usr/include/bpf)")
	}
	out := t.TempDir()
	n := 0
	for _, gen := range generators {
		for _, args := range generateLines(t, gen) {
			if len(args) < 3 || args[0] != "go" || args[1] != "run" || !strings.HasSuffix(args[2], "/cmd/bpf2go") {
				t.Fatalf("%s: not a bpf2go line: %q", gen, args)
			}
			cmd := exec.Command("go", append(args[1:3:3], append([]string{"-output-dir", out, "-go-package", "bpf"}, args[3:]...)...)...)
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, b)
			}
			n++
		}
	}
	if n != len(generators) {
		t.Fatalf("ran %d bpf2go lines, want %d", n, len(generators))
	}
	made, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(made) != 2*n {
		t.Fatalf("bpf2go wrote %d files, want %d", len(made), 2*n)
	}
	for _, e := range made {
		want, err := os.ReadFile(filepath.Join(out, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(e.Name())
		if err != nil {
			t.Errorf("%s is generated but not committed: run go generate ./internal/observe/bpf", e.Name())
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale against its sources: run go generate ./internal/observe/bpf (needs clang, llvm and libbpf-dev) and commit the outputs", e.Name())
		}
	}
}

// generateLines returns the commands of file's //go:generate lines, split
// into words as go generate splits them (double-quoted strings are one
// word).
func generateLines(t *testing.T, file string) [][]string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]string
	for _, line := range strings.Split(string(data), "\n") {
		rest, ok := strings.CutPrefix(line, "//go:generate ")
		if !ok {
			continue
		}
		var words []string
		var cur strings.Builder
		inWord, quoted := false, false
		for _, r := range rest {
			switch {
			case r == '"':
				quoted, inWord = !quoted, true
			case (r == ' ' || r == '\t') && !quoted:
				if inWord {
					words = append(words, cur.String())
					cur.Reset()
					inWord = false
				}
			default:
				cur.WriteRune(r)
				inWord = true
			}
		}
		if quoted {
			t.Fatalf("%s: unterminated quote in %q", file, line)
		}
		if inWord {
			words = append(words, cur.String())
		}
		out = append(out, words)
	}
	return out
}

// TestInitRecordOptionMatches checks that the prctl option init marks its
// recorded threads with is the one the kernel program looks for.
func TestInitRecordOptionMatches(t *testing.T) {
	h, err := os.ReadFile(filepath.Join("csrc", "observe.h"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(h), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "#define" && f[1] == "INIT_RECORD_OPTION" {
			v, err := strconv.ParseUint(strings.TrimSuffix(f[2], "UL"), 0, 64)
			if err != nil {
				t.Fatalf("INIT_RECORD_OPTION %q: %v", f[2], err)
			}
			if v != initproto.RecordOption {
				t.Fatalf("observe.h's INIT_RECORD_OPTION is %#x, initproto.RecordOption %#x", v, initproto.RecordOption)
			}
			return
		}
	}
	t.Fatal("observe.h defines no INIT_RECORD_OPTION")
}
