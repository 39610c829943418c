package envd

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentjail/agentjail/internal/testenv"
)

// TestGeneratedCodeIsCurrent regenerates the Go code from the .proto files
// into a temporary directory and compares it with the committed code.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	testenv.RequireTool(t, "protoc")
	out := t.TempDir()
	cmd := exec.Command("../../../scripts/gen-envd.sh", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/gen-envd.sh: %v\n%s", err, b)
	}
	n := 0
	err := filepath.WalkDir(out, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(out, p)
		want, _ := os.ReadFile(p)
		got, err := os.ReadFile(rel)
		if err != nil {
			t.Errorf("%s is generated but not committed: run scripts/gen-envd.sh", rel)
			return nil
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run scripts/gen-envd.sh", rel)
		}
		n++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != 4 {
		t.Fatalf("the generator wrote %d files, want 4", n)
	}
	// Every committed Go file of a generated package is either generated
	// (and checked above) or a hand-written doc.go.
	for _, dir := range []string{"process", "process/processconnect", "filesystem", "filesystem/filesystemconnect"} {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			name := filepath.Join(dir, e.Name())
			if strings.HasSuffix(name, ".go") && e.Name() != "doc.go" {
				if _, err := os.Stat(filepath.Join(out, name)); err != nil {
					t.Errorf("%s is not produced by the generator: remove it", name)
				}
			}
		}
	}
}
