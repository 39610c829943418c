package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/agentjail/agentjail/kube/internal/kubetest"
)

// testServeKubeNode: `agentjail serve --kube-node NAME --kubeconfig F`
// makes the daemon a node (aj-node-1 of TestCluster runs so, and takes
// Pods and Sandboxes in the other subtests): its node agent is the
// daemon's child, started again when it dies, so the node's lease goes on
// being renewed; without agentjail-kube beside agentjail or on PATH, serve
// refuses to start and says what is missing.
func (e *env) testServeKubeNode(t *testing.T) {
	ctx := context.Background()
	nd := e.node(t, "aj-node-1")
	old := nd.AgentPid()
	if old == 0 {
		t.Fatal("aj-node-1's daemon runs no agentjail-kube child")
	}
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var now int
	kubetest.Eventually(t, time.Minute, "the node agent started again", func(context.Context) (bool, string, error) {
		now = nd.AgentPid()
		return now != 0 && now != old, fmt.Sprintf("child pid %d", now), nil
	})
	leases := e.c.Client.CoordinationV1().Leases("kube-node-lease")
	l, err := leases.Get(ctx, nd.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	before := l.Spec.RenewTime.Time
	kubetest.Eventually(t, time.Minute, "the lease renewed by the new agent", func(ctx context.Context) (bool, string, error) {
		l, err := leases.Get(ctx, nd.Name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		return l.Spec.RenewTime.After(before), "renewed at " + l.Spec.RenewTime.String(), nil
	})
	e.c.WaitNodeReady(t, nd.Name, time.Minute)

	// Without the agent: a clear error, before anything starts.
	dir := t.TempDir()
	alone := filepath.Join(dir, "agentjail")
	b, err := os.ReadFile(bins.Agentjail)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(alone, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, alone, "serve", "--kube-node", "x", "--kubeconfig", e.c.Kubeconfig, "--data-dir", filepath.Join(dir, "data"))
	cmd.Env = []string{"PATH=" + dir + ":/usr/sbin:/usr/bin:/sbin:/bin"}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--kube-node needs agentjail-kube, the node agent, beside agentjail or on PATH") {
		t.Fatalf("serve --kube-node without agentjail-kube: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); !os.IsNotExist(err) {
		t.Fatalf("serve --kube-node without its agent made its data dir: %v", err)
	}
}
