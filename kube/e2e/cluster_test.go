package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentjail/agentjail/internal/image/imagetest"
	"github.com/agentjail/agentjail/kube/internal/kubetest"
	"github.com/agentjail/agentjail/kube/node"
)

// env is the cluster the subtests of TestCluster share.
type env struct {
	c     *kubetest.Cluster
	nodes []*kubetest.Node
	// cl knows the Sandbox types.
	cl client.Client
	// gateway is the gateway's URL.
	gateway string
	// reg is the registry the nodes pull from and push snapshots to.
	reg *imagetest.Registry
}

// TestCluster starts a control plane and two agentjail nodes once and
// runs every acceptance test against them. Node aj-node-0 runs its agent
// beside the daemon, as the chart's DaemonSet does; aj-node-1 is
// `agentjail serve --kube-node aj-node-1 --kubeconfig F`.
func TestCluster(t *testing.T) {
	c := kubetest.Start(t)
	e := &env{c: c}
	// The registry branches travel through, on loopback.
	reg := imagetest.NewRegistry(t)
	e.reg = reg
	for i, a := range []kubetest.Agent{kubetest.SeparateAgent, kubetest.ServeKubeNode} {
		e.nodes = append(e.nodes, kubetest.StartNode(t, c, bins, fmt.Sprintf("aj-node-%d", i), i, a, "--insecure-registry", reg.Host))
	}
	e.cl = kubetest.StartOperator(t, c, bins, 20*time.Second, "--snapshot-registry", reg.Host+"/agentjail/snapshots")
	e.gateway = kubetest.StartGateway(t, c, bins)
	t.Run("Manifests", e.testManifests)
	t.Run("Pods", e.testPods)
	t.Run("Sandbox", e.testSandbox)
	t.Run("Branch", e.testBranch)
	t.Run("E2B", e.testE2B)
	t.Run("E2BTemplate", e.testE2BTemplate)
	t.Run("E2BVolume", e.testE2BVolume)
	t.Run("Console", e.testConsole)
	t.Run("ServeKubeNode", e.testServeKubeNode)
	t.Run("NodeLost", e.testNodeLost)
}

// pod is a Pod for agentjail nodes: it tolerates their taint and runs
// command on the host image.
func pod(name string, restart corev1.RestartPolicy, command ...string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy: restart,
			Tolerations:   []corev1.Toleration{node.Toleration()},
			Containers:    []corev1.Container{{Name: "main", Image: node.HostImage, Command: command}},
		},
	}
}

func terminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// testPods: a Pod that tolerates the nodes' taint runs as a jail and ends
// Succeeded or Failed with its command's exit code; kubectl logs shows its
// output; kubectl exec runs commands in a running Pod's jail, with stdin
// and exit codes; a Pod asking for what a jail cannot do fails with an
// event saying so; one without the toleration is never placed; deleting a
// Pod destroys its jail.
func (e *env) testPods(t *testing.T) {
	ctx := context.Background()
	pods := e.c.Client.CoreV1().Pods("default")
	for _, p := range []*corev1.Pod{
		pod("ok", corev1.RestartPolicyNever, "sh", "-c", "echo hello from $(hostname); echo to stderr >&2"),
		pod("three", corev1.RestartPolicyNever, "sh", "-c", "exit 3"),
	} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ok := e.c.WaitPod(t, "default", "ok", 2*time.Minute, "Succeeded", terminal)
	if ok.Status.Phase != corev1.PodSucceeded || ok.Status.ContainerStatuses[0].State.Terminated.ExitCode != 0 {
		t.Fatalf("pod ok: phase %s, container %+v", ok.Status.Phase, ok.Status.ContainerStatuses)
	}
	if !strings.HasPrefix(ok.Spec.NodeName, "aj-node-") {
		t.Fatalf("pod ok ran on %q", ok.Spec.NodeName)
	}
	three := e.c.WaitPod(t, "default", "three", 2*time.Minute, "Failed", terminal)
	if three.Status.Phase != corev1.PodFailed || three.Status.ContainerStatuses[0].State.Terminated.ExitCode != 3 {
		t.Fatalf("pod three: phase %s, container %+v", three.Status.Phase, three.Status.ContainerStatuses)
	}
	// Both streams, each line whole (their order is the pipes').
	out, stderr, err := e.c.Kubectl(ctx, t, "", "logs", "ok")
	if lines := strings.Split(out, "\n"); err != nil || len(lines) != 3 || !slices.Contains(lines, "hello from ok") || !slices.Contains(lines, "to stderr") {
		t.Fatalf("kubectl logs ok: %q %q %v", out, stderr, err)
	}

	// A running Pod: exec with exit codes and stdin.
	if _, err := pods.Create(ctx, pod("sleeper", corev1.RestartPolicyAlways, "sleep", "3600"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.c.WaitPod(t, "default", "sleeper", 2*time.Minute, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	out, stderr, err = e.c.Kubectl(ctx, t, "", "exec", "sleeper", "--", "sh", "-c", "echo out; echo err >&2; exit 5")
	if out != "out\n" || !strings.Contains(stderr, "err\n") || !strings.Contains(stderr, "exit code 5") {
		t.Fatalf("kubectl exec: stdout %q stderr %q err %v", out, stderr, err)
	}
	out, stderr, err = e.c.Kubectl(ctx, t, "typed in\n", "exec", "-i", "sleeper", "--", "sh", "-c", "read x; echo got:$x; pgrep -x sleep >/dev/null && echo main-runs")
	if err != nil || out != "got:typed in\nmain-runs\n" {
		t.Fatalf("kubectl exec -i: stdout %q stderr %q err %v", out, stderr, err)
	}

	// What a jail cannot do: a clear failure and an event.
	two := pod("two", corev1.RestartPolicyNever, "true")
	two.Spec.Containers = append(two.Spec.Containers, corev1.Container{Name: "side", Image: node.HostImage, Command: []string{"true"}})
	if _, err := pods.Create(ctx, two, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := e.c.WaitPod(t, "default", "two", 2*time.Minute, "Failed", terminal)
	if p.Status.Phase != corev1.PodFailed || p.Status.Reason != "Unsupported" || !strings.Contains(p.Status.Message, "one container") {
		t.Fatalf("pod two: %s %s %q", p.Status.Phase, p.Status.Reason, p.Status.Message)
	}
	kubetest.Eventually(t, time.Minute, "the Unsupported event of pod two", func(ctx context.Context) (bool, string, error) {
		evs, err := e.c.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=two,reason=Unsupported"})
		if err != nil {
			return false, err.Error(), nil
		}
		return len(evs.Items) > 0, "no event", nil
	})

	// Without the toleration nothing places it.
	untolerated := pod("untolerated", corev1.RestartPolicyNever, "true")
	untolerated.Spec.Tolerations = nil
	if _, err := pods.Create(ctx, untolerated, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.c.WaitPod(t, "default", "untolerated", time.Minute, "Unschedulable", func(p *corev1.Pod) bool {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return true
			}
		}
		return false
	})

	// Deleting a running Pod destroys its jail.
	sleeper, err := pods.Get(ctx, "sleeper", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nd := e.node(t, sleeper.Spec.NodeName)
	if _, err := nd.Daemon.Get(ctx, "pod-"+string(sleeper.UID)); err != nil {
		t.Fatalf("the jail of pod sleeper: %v", err)
	}
	if _, stderr, err := e.c.Kubectl(ctx, t, "", "delete", "pod", "sleeper", "ok", "three", "two", "untolerated", "--wait=true", "--timeout=2m"); err != nil {
		t.Fatalf("kubectl delete: %v: %s", err, stderr)
	}
	for _, nd := range e.nodes {
		js, err := nd.Daemon.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(js) != 0 {
			t.Errorf("node %s still has %d jails after the Pods were deleted (%s...)", nd.Name, len(js), js[0].Name)
		}
	}
}

// node returns the test node called name.
func (e *env) node(t *testing.T, name string) *kubetest.Node {
	t.Helper()
	for _, nd := range e.nodes {
		if nd.Name == name {
			return nd
		}
	}
	t.Fatalf("no node %q", name)
	return nil
}

// testManifests: the plain manifests (what the Helm chart renders) are
// accepted by the real apiserver (a server-side dry run validates every
// object against its schema).
func (e *env) testManifests(t *testing.T) {
	ctx := context.Background()
	if _, stderr, err := e.c.Kubectl(ctx, t, "", "create", "namespace", "agentjail"); err != nil {
		t.Fatalf("kubectl create namespace: %v: %s", err, stderr)
	}
	out, stderr, err := e.c.Kubectl(ctx, t, "", "apply", "--dry-run=server", "-f", filepath.Join(kubetest.ChartDir(), "..", "..", "manifests", "agentjail.yaml"))
	if err != nil {
		t.Fatalf("kubectl apply --dry-run=server: %v: %s", err, stderr)
	}
	for _, want := range []string{"daemonset.apps/agentjail-node", "deployment.apps/agentjail-operator", "deployment.apps/agentjail-gateway", "clusterrole.rbac.authorization.k8s.io/agentjail-node"} {
		if !strings.Contains(out, want) {
			t.Errorf("the dry run did not take %s:\n%s", want, out)
		}
	}
}
