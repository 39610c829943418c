package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentjail/agentjail/kube/internal/kubetest"
)

// bins are agentjail and agentjail-kube built for this run.
var bins *kubetest.Binaries

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "agentjail-kube-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	wd, _ := os.Getwd()
	bins, err = kubetest.Build(filepath.Dir(wd), dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
