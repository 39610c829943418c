package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/agentjail/agentjail/kube/api/v1alpha1"
)

// Branches: a running Sandbox annotated v1alpha1.AnnotationBranch=N is
// snapshotted through its Pod as a pause is, but its node also pushes the
// snapshot to the operator's snapshot registry (and keeps no copy). The
// operator then makes N Sandboxes of the same spec, each recording the
// pushed snapshot; their Pods are not bound to a node: the scheduler
// places them, and each node pulls the snapshot before restoring it.

// branch serves the branch request of sb, whose Pod runs and is ready.
func (r *Reconciler) branch(ctx context.Context, sb *v1alpha1.Sandbox, pod *corev1.Pod) error {
	n, err := strconv.Atoi(sb.Annotations[v1alpha1.AnnotationBranch])
	if err != nil || n < 1 || n > v1alpha1.MaxBranches {
		return r.branchDone(ctx, sb, metav1.ConditionFalse, "BranchFailed",
			fmt.Sprintf("annotation %s: %q must be a number from 1 to %d", v1alpha1.AnnotationBranch, sb.Annotations[v1alpha1.AnnotationBranch], v1alpha1.MaxBranches))
	}
	if r.SnapshotRegistry == "" {
		return r.branchDone(ctx, sb, metav1.ConditionFalse, "BranchFailed",
			"the operator has no snapshot registry (agentjail-kube operator --snapshot-registry, Helm value snapshotRegistry.repository) through which a branch reaches other nodes")
	}
	k := branchCount(sb) + 1
	token := "b" + strconv.Itoa(k)
	if pod.Annotations[v1alpha1.AnnotationSnapshotRequest] != token {
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[v1alpha1.AnnotationSnapshotRequest] = token
		pod.Annotations[v1alpha1.AnnotationSnapshotPush] = r.SnapshotRegistry + ":" + artifactTag(sb, token)
		if err := r.Client.Update(ctx, pod); err != nil {
			return err
		}
		r.setBranched(sb, metav1.ConditionFalse, "Branching", "taking a snapshot and pushing it to "+r.SnapshotRegistry)
		return nil
	}
	snap, failed, ok := snapshotAnswer(pod, token)
	switch {
	case !ok:
		r.setBranched(sb, metav1.ConditionFalse, "Branching", "taking a snapshot and pushing it to "+r.SnapshotRegistry)
		return nil
	case failed != "":
		return r.branchDone(ctx, sb, metav1.ConditionFalse, "BranchFailed", failed)
	case snap.Ref == "":
		return r.branchDone(ctx, sb, metav1.ConditionFalse, "BranchFailed", "the node answered with a snapshot it did not push")
	}
	rec, err := json.Marshal(snap)
	if err != nil {
		return err
	}
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%s-%d", sb.Name, token, i+1)
		one := int32(1)
		b := &v1alpha1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: sb.Namespace, Name: names[i],
				Labels:      map[string]string{v1alpha1.LabelBranchOf: sb.Name},
				Annotations: map[string]string{v1alpha1.AnnotationSnapshot: string(rec)},
			},
			Spec: sb.DeepCopy().Spec,
		}
		b.Spec.Replicas = &one
		if err := r.Client.Create(ctx, b); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("branch %s of sandbox %s: %w", names[i], sb.Name, err)
		}
	}
	if sb.Annotations == nil {
		sb.Annotations = map[string]string{}
	}
	sb.Annotations[v1alpha1.AnnotationBranchCount] = strconv.Itoa(k)
	return r.branchDone(ctx, sb, metav1.ConditionTrue, "Branched",
		fmt.Sprintf("%s from snapshot %s", strings.Join(names, " "), snap.Ref))
}

// branchDone ends sb's branch request (its annotation removed) and
// reports it.
func (r *Reconciler) branchDone(ctx context.Context, sb *v1alpha1.Sandbox, status metav1.ConditionStatus, reason, msg string) error {
	delete(sb.Annotations, v1alpha1.AnnotationBranch)
	if err := r.Client.Update(ctx, sb); err != nil {
		return err
	}
	// After the update, which reads the Sandbox back (status included).
	r.setBranched(sb, status, reason, msg)
	return nil
}

func (r *Reconciler) setBranched(sb *v1alpha1.Sandbox, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&sb.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionBranched, Status: status, Reason: reason, Message: msg, ObservedGeneration: sb.Generation})
}

// branchCount is how many branch requests sb has had taken.
func branchCount(sb *v1alpha1.Sandbox) int {
	n, _ := strconv.Atoi(sb.Annotations[v1alpha1.AnnotationBranchCount])
	return max(n, 0)
}

// artifactTag is the registry tag of sb's snapshot for request token:
// NAMESPACE.NAME.TOKEN, cut to a tag's 128 characters.
func artifactTag(sb *v1alpha1.Sandbox, token string) string {
	tag := sb.Namespace + "." + sb.Name
	if room := 128 - len(token) - 1; len(tag) > room {
		tag = tag[:room]
	}
	return tag + "." + token
}

// CheckRepository checks that repo names an OCI repository
// (registry/repository, without a tag or digest); "" is fine (no
// registry).
func CheckRepository(repo string) error {
	if repo == "" {
		return nil
	}
	host, path, ok := strings.Cut(repo, "/")
	last := path[strings.LastIndex(path, "/")+1:]
	if !ok || host == "" || path == "" || strings.ContainsAny(repo, "@ ") || strings.Contains(last, ":") || strings.ToLower(path) != path {
		return fmt.Errorf("%q is not registry/repository (a lower-case repository, no tag or digest)", repo)
	}
	return nil
}
