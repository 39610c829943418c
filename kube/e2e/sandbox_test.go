package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	agentjail "github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/kube/api/v1alpha1"
	"github.com/agentjail/agentjail/kube/internal/kubetest"
	"github.com/agentjail/agentjail/kube/node"
)

// sandboxMain is a Sandbox's main command: it records that it started
// and then waits, a process that a pause must keep.
const sandboxMain = "echo started >> /workspace/starts; exec sleep 4242424"

func newSandbox(name string) *v1alpha1.Sandbox {
	yes := true
	return &v1alpha1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1alpha1.SandboxSpec{
			Service: &yes,
			PodTemplate: v1alpha1.PodTemplate{Spec: corev1.PodSpec{
				Tolerations: []corev1.Toleration{node.Toleration()},
				Containers:  []corev1.Container{{Name: "main", Image: node.HostImage, Command: []string{"sh", "-c", sandboxMain}}},
			}},
		},
	}
}

// createSandbox creates sb. When the test fails before deleting it, its
// cleanup deletes it and waits until it is gone, so that the next test
// starts on empty nodes.
func (e *env) createSandbox(t *testing.T, sb *v1alpha1.Sandbox) {
	t.Helper()
	if err := e.cl.Create(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(sb)
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := e.cl.Delete(ctx, &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}); err != nil && !apierrors.IsNotFound(err) {
			t.Logf("deleting sandbox %s after the failure: %v", key.Name, err)
			return
		}
		kubetest.Eventually(t, 2*time.Minute, "sandbox "+key.Name+" gone after the failure", func(ctx context.Context) (bool, string, error) {
			err := e.cl.Get(ctx, key, &v1alpha1.Sandbox{})
			return apierrors.IsNotFound(err), "still there", nil
		})
	})
}

// waitSandbox waits until the Sandbox's Ready condition has reason.
func (e *env) waitSandbox(t *testing.T, name, reason string) *v1alpha1.Sandbox {
	t.Helper()
	var sb v1alpha1.Sandbox
	kubetest.Eventually(t, 3*time.Minute, "sandbox "+name+" "+reason, func(ctx context.Context) (bool, string, error) {
		if err := e.cl.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &sb); err != nil {
			return false, err.Error(), nil
		}
		c := meta.FindStatusCondition(sb.Status.Conditions, v1alpha1.ConditionReady)
		if c == nil {
			return false, "no Ready condition", nil
		}
		return c.Reason == reason, c.Reason + ": " + c.Message, nil
	})
	return &sb
}

// setReplicas scales the Sandbox.
func (e *env) setReplicas(t *testing.T, name string, n int32) {
	t.Helper()
	ctx := context.Background()
	var sb v1alpha1.Sandbox
	if err := e.cl.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &sb); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(sb.DeepCopy())
	sb.Spec.Replicas = &n
	if err := e.cl.Patch(ctx, &sb, patch); err != nil {
		t.Fatal(err)
	}
}

// testSandbox: a Sandbox becomes Ready with a Pod on an agentjail node and
// a headless Service; paused (replicas 0) its jail is snapshotted and
// destroyed, no process left; resumed (replicas 1) the same process runs
// on and the files are there; deleted, nothing of it is left on any node.
func (e *env) testSandbox(t *testing.T) {
	ctx := context.Background()
	e.createSandbox(t, newSandbox("sb"))
	sb := e.waitSandbox(t, "sb", "DependenciesReady")
	if sb.Status.Replicas != 1 || sb.Status.ServiceFQDN != "sb.default.svc.cluster.local" || sb.Status.Selector == "" {
		t.Fatalf("status %+v", sb.Status)
	}
	var svc corev1.Service
	if err := e.cl.Get(ctx, client.ObjectKey{Namespace: "default", Name: "sb"}, &svc); err != nil || svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Fatalf("headless service: %v %+v", err, svc.Spec)
	}
	pod, err := e.c.Client.CoreV1().Pods("default").Get(ctx, "sb", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nd := e.node(t, pod.Spec.NodeName)
	j, err := nd.Daemon.Get(ctx, "pod-"+string(pod.UID))
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{j.ID}

	// Through the gateway: a command, a streamed command, errors.
	gw := agentjail.New(e.gateway, e.c.AgentjailToken)
	res, err := gw.Exec(ctx, "default.sb", agentjail.ExecRequest{Cmd: []string{"sh", "-c", "echo via gateway on $(hostname); exit 4"}})
	if err != nil || res.Stdout != "via gateway on sb\n" || res.ExitCode != 4 {
		t.Fatalf("exec through the gateway: %+v %v", res, err)
	}
	cm, err := gw.Command(ctx, "default.sb", agentjail.CommandOptions{Cmd: []string{"sh", "-c", "read x; echo got $x; echo e >&2"}, Stdin: true})
	if err != nil {
		t.Fatalf("command stream through the gateway: %v", err)
	}
	if _, err := cm.Write([]byte("streamed\n")); err != nil {
		t.Fatal(err)
	}
	if err := cm.CloseStdin(ctx); err != nil {
		t.Fatal(err)
	}
	var streamed strings.Builder
	for {
		stream, data, err := cm.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("command stream through the gateway: %v", err)
		}
		fmt.Fprintf(&streamed, "%d:%s", stream, data)
	}
	cm.Close()
	if got := streamed.String(); !strings.Contains(got, "1:got streamed\n") || !strings.Contains(got, "2:e\n") {
		t.Fatalf("streamed through the gateway: %q", got)
	}
	var ae *agentjail.APIError
	if _, err := agentjail.New(e.gateway, "wrong").Exec(ctx, "default.sb", agentjail.ExecRequest{Cmd: []string{"true"}}); !errors.As(err, &ae) || ae.Status != http.StatusUnauthorized {
		t.Fatalf("a wrong token through the gateway: %v", err)
	}
	if _, err := gw.Exec(ctx, "default.nosuch", agentjail.ExecRequest{Cmd: []string{"true"}}); !errors.As(err, &ae) || ae.Status != http.StatusNotFound {
		t.Fatalf("an unknown sandbox through the gateway: %v", err)
	}
	out, stderr, err := e.c.Kubectl(ctx, t, "", "exec", "sb", "--", "sh", "-c", "echo kept > /workspace/note; pgrep -x sleep")
	if err != nil {
		t.Fatalf("exec: %v %s", err, stderr)
	}
	mainPid := strings.TrimSpace(out)
	if mainPid == "" {
		t.Fatal("the main command does not run")
	}

	// Pause: a snapshot, then no jail and no process.
	e.setReplicas(t, "sb", 0)
	sb = e.waitSandbox(t, "sb", "Paused")
	if sb.Annotations[v1alpha1.AnnotationSnapshot] == "" || sb.Status.Replicas != 0 {
		t.Fatalf("paused sandbox: annotations %v status %+v", sb.Annotations, sb.Status)
	}
	if _, err := e.c.Client.CoreV1().Pods("default").Get(ctx, "sb", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the paused sandbox's pod: %v", err)
	}
	if _, err := nd.Daemon.Get(ctx, j.ID); err == nil {
		t.Fatal("the paused sandbox's jail is still there")
	}
	if left := kubetest.Leftovers(j.ID); len(left) > 0 {
		t.Fatalf("the paused sandbox left: %v", left)
	}

	// Resume: the same process, the same files, on the node with the
	// snapshot.
	e.setReplicas(t, "sb", 1)
	e.waitSandbox(t, "sb", "DependenciesReady")
	pod, err = e.c.Client.CoreV1().Pods("default").Get(ctx, "sb", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.NodeName != nd.Name {
		t.Fatalf("resumed on %s, the snapshot is on %s", pod.Spec.NodeName, nd.Name)
	}
	out, stderr, err = e.c.Kubectl(ctx, t, "", "exec", "sb", "--", "sh", "-c", "cat /workspace/note /workspace/starts; pgrep -x sleep")
	if err != nil {
		t.Fatalf("exec after resume: %v %s", err, stderr)
	}
	if want := "kept\nstarted\n" + mainPid + "\n"; out != want {
		t.Fatalf("after resume: %q, want %q (files, one start, the same process)", out, want)
	}
	j2, err := nd.Daemon.Get(ctx, "pod-"+string(pod.UID))
	if err != nil {
		t.Fatal(err)
	}
	ids = append(ids, j2.ID)

	// Delete: nothing left on any node.
	if err := e.cl.Delete(ctx, sb); err != nil {
		t.Fatal(err)
	}
	kubetest.Eventually(t, 2*time.Minute, "sandbox sb gone", func(ctx context.Context) (bool, string, error) {
		err := e.cl.Get(ctx, client.ObjectKey{Namespace: "default", Name: "sb"}, &v1alpha1.Sandbox{})
		return apierrors.IsNotFound(err), "still there", nil
	})
	for _, nd := range e.nodes {
		js, err := nd.Daemon.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(js) != 0 {
			t.Errorf("node %s has %d jails after the Sandbox was deleted", nd.Name, len(js))
		}
	}
	if left := kubetest.Leftovers(ids...); len(left) > 0 {
		t.Fatalf("the deleted sandbox left: %v", left)
	}

	// Deleted while paused: its snapshot goes too.
	e.createSandbox(t, newSandbox("napping"))
	e.waitSandbox(t, "napping", "DependenciesReady")
	e.setReplicas(t, "napping", 0)
	paused := e.waitSandbox(t, "napping", "Paused")
	var snap v1alpha1.Snapshot
	if err := json.Unmarshal([]byte(paused.Annotations[v1alpha1.AnnotationSnapshot]), &snap); err != nil {
		t.Fatal(err)
	}
	holder := e.node(t, snap.Node)
	if _, err := holder.Daemon.GetSnapshot(ctx, snap.ID); err != nil {
		t.Fatalf("the pause snapshot: %v", err)
	}
	if err := e.cl.Delete(ctx, paused); err != nil {
		t.Fatal(err)
	}
	kubetest.Eventually(t, 2*time.Minute, "the pause snapshot of a deleted Sandbox collected", func(ctx context.Context) (bool, string, error) {
		snaps, err := holder.Daemon.Snapshots(ctx, "")
		if err != nil {
			return false, err.Error(), nil
		}
		return len(snaps) == 0, fmt.Sprintf("%d snapshots", len(snaps)), nil
	})
}
