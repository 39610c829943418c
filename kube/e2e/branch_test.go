package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentjail/agentjail/kube/api/v1alpha1"
	"github.com/agentjail/agentjail/kube/internal/kubetest"
)

// testBranch: a running Sandbox annotated with a branch of 3 is
// snapshotted and the snapshot pushed to the operator's registry; three
// new Sandboxes become Ready, placed by the scheduler (spread over the
// hosts as their template asks) on both nodes, each pulling the snapshot
// and running on with its files and its process while the source runs
// on; deleting them all leaves no jail, snapshot, mount or cgroup on
// either node.
func (e *env) testBranch(t *testing.T) {
	ctx := context.Background()
	src := newSandbox("src")
	src.Spec.PodTemplate.ObjectMeta.Labels = map[string]string{"app": "branchy"}
	src.Spec.PodTemplate.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{
		MaxSkew: 1, TopologyKey: corev1.LabelHostname, WhenUnsatisfiable: corev1.DoNotSchedule,
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "branchy"}},
	}}
	e.createSandbox(t, src)
	e.waitSandbox(t, "src", "DependenciesReady")
	out, stderr, err := e.c.Kubectl(ctx, t, "", "exec", "src", "--", "sh", "-c", "echo branched > /workspace/note; head -c 2000000 /dev/urandom > /workspace/blob; sha256sum < /workspace/blob; pgrep -x sleep")
	if err != nil {
		t.Fatalf("exec: %v %s", err, stderr)
	}
	lines := strings.Fields(out)
	if len(lines) != 3 {
		t.Fatalf("exec: %q", out)
	}
	sum, mainPid := lines[0], lines[2]

	// An invalid request is refused with a reason, nothing made.
	e.annotate(t, "src", v1alpha1.AnnotationBranch, "100")
	if c := e.waitBranched(t, "src", "BranchFailed"); !strings.Contains(c.Message, "from 1 to 32") {
		t.Fatalf("a branch of 100: %s", c.Message)
	}

	start := time.Now()
	e.annotate(t, "src", v1alpha1.AnnotationBranch, "3")
	c := e.waitBranched(t, "src", "Branched")
	names := []string{"src-b1-1", "src-b1-2", "src-b1-3"}
	if !strings.HasPrefix(c.Message, strings.Join(names, " ")+" from snapshot ") {
		t.Fatalf("Branched: %s", c.Message)
	}
	jails := map[string][]string{}
	for _, name := range names {
		e.waitSandbox(t, name, "DependenciesReady")
		pod, err := e.c.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		j, err := e.node(t, pod.Spec.NodeName).Daemon.Get(ctx, "pod-"+string(pod.UID))
		if err != nil {
			t.Fatalf("the jail of branch %s on %s: %v", name, pod.Spec.NodeName, err)
		}
		jails[pod.Spec.NodeName] = append(jails[pod.Spec.NodeName], j.ID)
		out, stderr, err := e.c.Kubectl(ctx, t, "", "exec", name, "--", "sh", "-c", "cat /workspace/note /workspace/starts; sha256sum < /workspace/blob; pgrep -x sleep")
		if err != nil {
			t.Fatalf("exec in branch %s: %v %s", name, err, stderr)
		}
		if want := "branched\nstarted\n" + sum + "  -\n" + mainPid + "\n"; out != want {
			t.Fatalf("branch %s on %s: %q, want %q (the files, one start, the same process)", name, pod.Spec.NodeName, out, want)
		}
	}
	t.Logf("branch of 3: Ready and checked %.1f s after the request; jails by node %v", time.Since(start).Seconds(), jails)
	for _, nd := range e.nodes {
		if len(jails[nd.Name]) == 0 {
			t.Errorf("no branch landed on node %s (by node: %v)", nd.Name, jails)
		}
	}
	evs, err := e.c.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=src,reason=SnapshotPushed"})
	if err == nil && len(evs.Items) > 0 {
		t.Logf("%s", evs.Items[0].Message)
	}
	// The source runs on, unchanged.
	if out, _, err := e.c.Kubectl(ctx, t, "", "exec", "src", "--", "pgrep", "-x", "sleep"); err != nil || strings.TrimSpace(out) != mainPid {
		t.Fatalf("the source after the branch: %q %v", out, err)
	}
	// No snapshot stays on a node: the source's went to the registry, the
	// pulled copies into the jails.
	for _, nd := range e.nodes {
		if snaps, err := nd.Daemon.Snapshots(ctx, ""); err != nil || len(snaps) != 0 {
			t.Errorf("node %s holds %d snapshots after the branch (%v)", nd.Name, len(snaps), err)
		}
	}

	// Delete the source and its branches: nothing left on either node.
	var ids []string
	for _, name := range append(names, "src") {
		if pod, err := e.c.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{}); err == nil {
			if j, err := e.node(t, pod.Spec.NodeName).Daemon.Get(ctx, "pod-"+string(pod.UID)); err == nil {
				ids = append(ids, j.ID)
			}
		}
		if err := e.cl.Delete(ctx, &v1alpha1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range append(names, "src") {
		kubetest.Eventually(t, 2*time.Minute, "sandbox "+name+" gone", func(ctx context.Context) (bool, string, error) {
			err := e.cl.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &v1alpha1.Sandbox{})
			return apierrors.IsNotFound(err), "still there", nil
		})
	}
	for _, nd := range e.nodes {
		js, err := nd.Daemon.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		snaps, err := nd.Daemon.Snapshots(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(js) != 0 || len(snaps) != 0 {
			t.Errorf("node %s has %d jails and %d snapshots after the branches were deleted", nd.Name, len(js), len(snaps))
		}
	}
	if left := kubetest.Leftovers(ids...); len(left) > 0 {
		t.Fatalf("the deleted branches left: %v", left)
	}
}

// annotate sets annotation key of Sandbox name to value.
func (e *env) annotate(t *testing.T, name, key, value string) {
	t.Helper()
	ctx := context.Background()
	var sb v1alpha1.Sandbox
	if err := e.cl.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &sb); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(sb.DeepCopy())
	if sb.Annotations == nil {
		sb.Annotations = map[string]string{}
	}
	sb.Annotations[key] = value
	if err := e.cl.Patch(ctx, &sb, patch); err != nil {
		t.Fatal(err)
	}
}

// waitBranched waits until the Sandbox's Branched condition has reason
// and its branch request is taken (the annotation gone).
func (e *env) waitBranched(t *testing.T, name, reason string) *metav1.Condition {
	t.Helper()
	var c *metav1.Condition
	kubetest.Eventually(t, 3*time.Minute, "sandbox "+name+" "+reason, func(ctx context.Context) (bool, string, error) {
		var sb v1alpha1.Sandbox
		if err := e.cl.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &sb); err != nil {
			return false, err.Error(), nil
		}
		c = meta.FindStatusCondition(sb.Status.Conditions, v1alpha1.ConditionBranched)
		if c == nil {
			return false, "no Branched condition", nil
		}
		_, pending := sb.Annotations[v1alpha1.AnnotationBranch]
		return c.Reason == reason && !pending, fmt.Sprintf("%s: %s (request pending: %v)", c.Reason, c.Message, pending), nil
	})
	return c
}
