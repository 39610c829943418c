package e2e

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/agentjail/agentjail/kube/nodelease"
)

// testNodeLost: when a node's daemon is killed (SIGKILL, with its node
// agent, as a host that dies), its Pods are marked Failed (NodeLost) once
// its lease runs out, and a Sandbox's Pod is replaced on the other node.
// It leaves one node dead: it runs last.
func (e *env) testNodeLost(t *testing.T) {
	ctx := context.Background()
	e.createSandbox(t, newSandbox("survivor"))
	e.waitSandbox(t, "survivor", "DependenciesReady")
	sp, err := e.c.Client.CoreV1().Pods("default").Get(ctx, "survivor", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lost := e.node(t, sp.Spec.NodeName)
	// A plain Pod on the same node, which nothing replaces.
	plain := pod("plain", corev1.RestartPolicyAlways, "sleep", "4343434")
	plain.Spec.NodeName = lost.Name
	if _, err := e.c.Client.CoreV1().Pods("default").Create(ctx, plain, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.c.WaitPod(t, "default", "plain", 2*time.Minute, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })

	lost.KillDaemon()
	failed := e.c.WaitPod(t, "default", "plain", 2*time.Minute, "Failed (NodeLost)", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	if failed.Status.Reason != nodelease.ReasonNodeLost {
		t.Fatalf("pod plain: reason %q %q", failed.Status.Reason, failed.Status.Message)
	}
	e.c.WaitPod(t, "default", "survivor", 3*time.Minute, "running on the other node", func(p *corev1.Pod) bool {
		return p.UID != sp.UID && p.Status.Phase == corev1.PodRunning && p.Spec.NodeName != lost.Name
	})
	e.waitSandbox(t, "survivor", "DependenciesReady")
	n, err := e.c.Client.CoreV1().Nodes().Get(ctx, lost.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tainted := false
	for _, tn := range n.Spec.Taints {
		tainted = tainted || tn.Key == corev1.TaintNodeUnreachable
	}
	if !tainted {
		t.Errorf("the lost node is not tainted unreachable: %+v", n.Spec.Taints)
	}
}
