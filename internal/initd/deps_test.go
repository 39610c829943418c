package initd

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependencies keeps the init small: no HTTP stack, no CLI framework,
// no YAML, no eBPF library.
func TestDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	forbidden := []string{"net/http", "github.com/spf13/cobra", "sigs.k8s.io/yaml", "github.com/cilium/"}
	for _, dep := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if dep == f || strings.HasPrefix(dep, f) {
				t.Errorf("internal/initd depends on %s", dep)
			}
		}
	}
	if !strings.Contains(string(out), "golang.org/x/sys/unix") {
		t.Fatalf("go list output looks wrong:\n%s", out)
	}
}
