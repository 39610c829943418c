// Package sandbox is the controller of the agent-sandbox `Sandbox`
// resource (agents.x-k8s.io/v1alpha1) on agentjail nodes: each Sandbox is
// one Pod named as the Sandbox, with a stable hostname and an optional
// headless Service; replicas 0 pauses it into a snapshot of its jail (its
// processes and files) and 1 resumes it from that snapshot; a shutdown
// time expires it.
//
// A branch request (v1alpha1.AnnotationBranch) makes new Sandboxes from a
// snapshot pushed to a registry, placed by the scheduler (branch.go).
//
// Pause and resume travel through the Pod: the controller asks the Pod's
// node for a snapshot with v1alpha1.AnnotationSnapshotRequest, the node answers
// with the v1alpha1.ConditionSnapshot Pod condition, the controller records the
// snapshot on the Sandbox (v1alpha1.AnnotationSnapshot) and deletes the Pod. On
// resume the new Pod carries the snapshot (v1alpha1.AnnotationRestore) and is bound
// to the node that holds it.
package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/agentjail/agentjail/kube/api/v1alpha1"
)

// finalizer keeps a Sandbox until its Pod and Service are gone.
const finalizer = "agentjail.dev/sandbox"

// Reconciler reconciles Sandboxes.
type Reconciler struct {
	Client client.Client
	Scheme *runtime.Scheme
	// ClusterDomain is the DNS domain of Services (default cluster.local).
	ClusterDomain string
	// SnapshotRegistry is the OCI repository (registry/repository) that
	// branches' snapshots travel through; "" refuses branch requests.
	SnapshotRegistry string
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// SetupWithManager registers the controller: it watches Sandboxes and the
// Pods and Services they own.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.Sandbox{}).
		Owns(&corev1.Pod{}).
		Owns(&corev1.Service{}).
		Complete(r)
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// NameHash is the v1alpha1.LabelNameHash value of a Sandbox name.
func NameHash(name string) string {
	h := fnv.New32a()
	h.Write([]byte(name))
	return strconv.FormatUint(uint64(h.Sum32()), 16)
}

// Reconcile brings one Sandbox's Pod and Service to its spec.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var sb v1alpha1.Sandbox
	if err := r.Client.Get(ctx, req.NamespacedName, &sb); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !sb.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, r.finalize(ctx, &sb)
	}
	if controllerutil.AddFinalizer(&sb, finalizer) {
		if err := r.Client.Update(ctx, &sb); err != nil {
			return reconcile.Result{}, err
		}
	}
	orig := sb.Status.DeepCopy()
	res, err := r.reconcile(ctx, &sb)
	if err != nil {
		return res, err
	}
	if !equalStatus(orig, &sb.Status) {
		if err := r.Client.Status().Update(ctx, &sb); err != nil {
			return reconcile.Result{}, err
		}
	}
	return res, nil
}

func equalStatus(a, b *v1alpha1.SandboxStatus) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

func (r *Reconciler) reconcile(ctx context.Context, sb *v1alpha1.Sandbox) (reconcile.Result, error) {
	sb.Status.Selector = v1alpha1.LabelNameHash + "=" + NameHash(sb.Name)
	if len(sb.Spec.VolumeClaimTemplates) > 0 {
		r.setReady(sb, metav1.ConditionFalse, "Unsupported", "volumeClaimTemplates: agentjail nodes mount no volumes into jails")
		return reconcile.Result{}, nil
	}
	if err := r.reconcileService(ctx, sb); err != nil {
		return reconcile.Result{}, err
	}
	if sb.Spec.ShutdownTime == nil {
		return r.reconcilePod(ctx, sb)
	}
	left := sb.Spec.ShutdownTime.Time.Sub(r.now())
	if left <= 0 {
		return reconcile.Result{}, r.expire(ctx, sb)
	}
	res, err := r.reconcilePod(ctx, sb)
	if res.RequeueAfter == 0 || res.RequeueAfter > left {
		res.RequeueAfter = left
	}
	return res, err
}

// expire removes an expired Sandbox's Pod and Service, and with the
// Delete policy the Sandbox.
func (r *Reconciler) expire(ctx context.Context, sb *v1alpha1.Sandbox) error {
	if sb.Spec.ShutdownPolicy != nil && *sb.Spec.ShutdownPolicy == v1alpha1.ShutdownPolicyDelete {
		return client.IgnoreNotFound(r.Client.Delete(ctx, sb))
	}
	if err := r.deleteOwned(ctx, sb); err != nil {
		return err
	}
	sb.Status.Replicas, sb.Status.PodIPs = 0, nil
	r.setReady(sb, metav1.ConditionFalse, "Expired", "the Sandbox's shutdown time passed")
	return nil
}

// finalize deletes what the Sandbox owns, then lets it go.
func (r *Reconciler) finalize(ctx context.Context, sb *v1alpha1.Sandbox) error {
	if !controllerutil.ContainsFinalizer(sb, finalizer) {
		return nil
	}
	if err := r.deleteOwned(ctx, sb); err != nil {
		return err
	}
	// Wait for the Pod to be gone: its node destroys the jail first.
	var pod corev1.Pod
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: sb.Namespace, Name: sb.Name}, &pod); err == nil {
		return fmt.Errorf("waiting for pod %s/%s to go", pod.Namespace, pod.Name)
	} else if !apierrors.IsNotFound(err) {
		return err
	}
	controllerutil.RemoveFinalizer(sb, finalizer)
	return r.Client.Update(ctx, sb)
}

// deleteOwned deletes the Sandbox's Pod and Service.
func (r *Reconciler) deleteOwned(ctx context.Context, sb *v1alpha1.Sandbox) error {
	for _, obj := range []client.Object{
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: sb.Namespace, Name: sb.Name}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: sb.Namespace, Name: sb.Name}},
	} {
		if err := r.Client.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	return nil
}

func (r *Reconciler) setReady(sb *v1alpha1.Sandbox, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&sb.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionReady, Status: status, Reason: reason, Message: msg, ObservedGeneration: sb.Generation})
}

// reconcileService keeps the headless Service as spec.service asks.
func (r *Reconciler) reconcileService(ctx context.Context, sb *v1alpha1.Sandbox) error {
	key := client.ObjectKey{Namespace: sb.Namespace, Name: sb.Name}
	var svc corev1.Service
	err := r.Client.Get(ctx, key, &svc)
	exists := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	switch {
	case sb.Spec.Service != nil && !*sb.Spec.Service:
		if exists {
			if err := r.Client.Delete(ctx, &svc); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
		sb.Status.Service, sb.Status.ServiceFQDN = "", ""
		return nil
	case sb.Spec.Service != nil && !exists:
		svc = corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: sb.Namespace, Name: sb.Name, Labels: map[string]string{v1alpha1.LabelNameHash: NameHash(sb.Name)}},
			Spec: corev1.ServiceSpec{
				ClusterIP: corev1.ClusterIPNone,
				Selector:  map[string]string{v1alpha1.LabelNameHash: NameHash(sb.Name)},
				// A headless Service needs no port; its DNS names the Pod.
				PublishNotReadyAddresses: false,
			},
		}
		if err := controllerutil.SetControllerReference(sb, &svc, r.Scheme); err != nil {
			return err
		}
		if err := r.Client.Create(ctx, &svc); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		exists = true
	}
	if exists {
		domain := r.ClusterDomain
		if domain == "" {
			domain = "cluster.local"
		}
		sb.Status.Service = sb.Name
		sb.Status.ServiceFQDN = fmt.Sprintf("%s.%s.svc.%s", sb.Name, sb.Namespace, domain)
	}
	return nil
}

// reconcilePod runs, pauses or resumes the Sandbox's Pod.
func (r *Reconciler) reconcilePod(ctx context.Context, sb *v1alpha1.Sandbox) (reconcile.Result, error) {
	want := int32(1)
	if sb.Spec.Replicas != nil {
		want = *sb.Spec.Replicas
	}
	var pod corev1.Pod
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: sb.Namespace, Name: sb.Name}, &pod)
	havePod := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	if havePod && !metav1.IsControlledBy(&pod, sb) {
		r.setReady(sb, metav1.ConditionFalse, "DependenciesNotReady", "a Pod named "+sb.Name+" exists that this Sandbox does not own")
		return reconcile.Result{}, nil
	}
	if havePod && pod.DeletionTimestamp != nil {
		// Going: look again when it is gone.
		sb.Status.Replicas, sb.Status.PodIPs = 0, nil
		r.setReady(sb, metav1.ConditionFalse, "DependenciesNotReady", "the Pod is being deleted")
		return reconcile.Result{}, nil
	}
	if want == 0 {
		if !havePod {
			sb.Status.Replicas, sb.Status.PodIPs = 0, nil
			r.setReady(sb, metav1.ConditionFalse, "Paused", "replicas is 0")
			return reconcile.Result{}, nil
		}
		return r.pause(ctx, sb, &pod)
	}
	if havePod && (pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded) {
		// A Sandbox's Pod runs until the Sandbox says otherwise: a Pod
		// that ended (its node was lost, its command exited) is replaced,
		// wherever the scheduler places the new one.
		zero := int64(0)
		if err := r.Client.Delete(ctx, &pod, &client.DeleteOptions{GracePeriodSeconds: &zero}); client.IgnoreNotFound(err) != nil {
			return reconcile.Result{}, err
		}
		r.setReady(sb, metav1.ConditionFalse, "DependenciesNotReady", fmt.Sprintf("the Pod ended (%s: %s); replacing it", pod.Status.Reason, pod.Status.Message))
		sb.Status.Replicas, sb.Status.PodIPs = 0, nil
		return reconcile.Result{}, nil
	}
	if !havePod {
		p, err := r.newPod(sb)
		if err != nil {
			return reconcile.Result{}, err
		}
		if err := r.Client.Create(ctx, p); err != nil && !apierrors.IsAlreadyExists(err) {
			return reconcile.Result{}, err
		}
		sb.Status.Replicas = 0
		r.setReady(sb, metav1.ConditionFalse, "DependenciesNotReady", "the Pod is starting")
		return reconcile.Result{}, nil
	}
	ready := pod.Status.Phase == corev1.PodRunning && podReady(&pod)
	sb.Status.PodIPs = podIPs(&pod)
	if ready {
		// Resumed: the snapshot is consumed.
		if _, ok := sb.Annotations[v1alpha1.AnnotationSnapshot]; ok && pod.Annotations[v1alpha1.AnnotationRestore] != "" {
			delete(sb.Annotations, v1alpha1.AnnotationSnapshot)
			if err := r.Client.Update(ctx, sb); err != nil {
				return reconcile.Result{}, err
			}
		}
		if _, ok := sb.Annotations[v1alpha1.AnnotationBranch]; ok {
			if err := r.branch(ctx, sb, &pod); err != nil {
				return reconcile.Result{}, err
			}
		}
		// After the updates above, which read the Sandbox back.
		sb.Status.PodIPs = podIPs(&pod)
		sb.Status.Replicas = 1
		r.setReady(sb, metav1.ConditionTrue, "DependenciesReady", "the Pod runs on "+pod.Spec.NodeName)
	} else {
		sb.Status.Replicas = 0
		r.setReady(sb, metav1.ConditionFalse, "DependenciesNotReady", fmt.Sprintf("the Pod is %s", pod.Status.Phase))
	}
	return reconcile.Result{}, nil
}

func podIPs(p *corev1.Pod) []string {
	var ips []string
	for _, ip := range p.Status.PodIPs {
		ips = append(ips, ip.IP)
	}
	return ips
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// pause asks the Pod's node for a snapshot, records it on the Sandbox,
// then deletes the Pod (its node destroys the jail: no process is left).
// A Pod that is not running has nothing to keep and is deleted at once.
func (r *Reconciler) pause(ctx context.Context, sb *v1alpha1.Sandbox, pod *corev1.Pod) (reconcile.Result, error) {
	if pod.Status.Phase == corev1.PodRunning {
		token := strconv.FormatInt(sb.Generation, 10)
		if pod.Annotations[v1alpha1.AnnotationSnapshotRequest] != token {
			if pod.Annotations == nil {
				pod.Annotations = map[string]string{}
			}
			pod.Annotations[v1alpha1.AnnotationSnapshotRequest] = token
			// A pause keeps its snapshot on the node (a branch's push
			// annotation stays behind on the Pod).
			delete(pod.Annotations, v1alpha1.AnnotationSnapshotPush)
			if err := r.Client.Update(ctx, pod); err != nil {
				return reconcile.Result{}, err
			}
			r.setReady(sb, metav1.ConditionFalse, "Pausing", "taking a snapshot of the jail")
			return reconcile.Result{}, nil
		}
		snap, failed, ok := snapshotAnswer(pod, token)
		if !ok {
			r.setReady(sb, metav1.ConditionFalse, "Pausing", "taking a snapshot of the jail")
			return reconcile.Result{}, nil
		}
		if failed != "" {
			r.setReady(sb, metav1.ConditionFalse, "PauseFailed", failed)
			return reconcile.Result{}, nil
		}
		b, err := json.Marshal(snap)
		if err != nil {
			return reconcile.Result{}, err
		}
		if sb.Annotations == nil {
			sb.Annotations = map[string]string{}
		}
		sb.Annotations[v1alpha1.AnnotationSnapshot] = string(b)
		if err := r.Client.Update(ctx, sb); err != nil {
			return reconcile.Result{}, err
		}
	}
	if err := r.Client.Delete(ctx, pod); client.IgnoreNotFound(err) != nil {
		return reconcile.Result{}, err
	}
	sb.Status.Replicas, sb.Status.PodIPs = 0, nil
	r.setReady(sb, metav1.ConditionFalse, "Pausing", "the Pod is being deleted")
	return reconcile.Result{}, nil
}

// snapshotAnswer reads the node's answer to the snapshot request token:
// the snapshot, or why it failed; ok is false while there is none.
func snapshotAnswer(pod *corev1.Pod, token string) (snap v1alpha1.Snapshot, failed string, ok bool) {
	for _, c := range pod.Status.Conditions {
		if c.Type != v1alpha1.ConditionSnapshot {
			continue
		}
		if c.Status == corev1.ConditionFalse {
			if strings.HasPrefix(c.Message, token+": ") {
				return snap, strings.TrimPrefix(c.Message, token+": "), true
			}
			return snap, "", false
		}
		if err := json.Unmarshal([]byte(c.Message), &snap); err != nil || snap.Token != token {
			return v1alpha1.Snapshot{}, "", false
		}
		return snap, "", true
	}
	return snap, "", false
}

// newPod is the Sandbox's Pod: its template, named and labelled for the
// Sandbox, its hostname the Sandbox's name; after a pause, restored from
// the snapshot on the node that holds it.
func (r *Reconciler) newPod(sb *v1alpha1.Sandbox) (*corev1.Pod, error) {
	tmpl := sb.Spec.PodTemplate
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: sb.Namespace, Name: sb.Name,
			Labels: map[string]string{}, Annotations: map[string]string{},
		},
	}
	tmpl.Spec.DeepCopyInto(&pod.Spec)
	for k, v := range tmpl.ObjectMeta.Labels {
		pod.Labels[k] = v
	}
	for k, v := range tmpl.ObjectMeta.Annotations {
		pod.Annotations[k] = v
	}
	pod.Labels[v1alpha1.LabelNameHash] = NameHash(sb.Name)
	if pod.Spec.Hostname == "" && len(sb.Name) <= 63 {
		pod.Spec.Hostname = sb.Name
	}
	if sb.Spec.Service != nil && *sb.Spec.Service {
		pod.Spec.Subdomain = sb.Name
	}
	if s := sb.Annotations[v1alpha1.AnnotationSnapshot]; s != "" {
		var snap v1alpha1.Snapshot
		if err := json.Unmarshal([]byte(s), &snap); err != nil {
			return nil, fmt.Errorf("sandbox %s: annotation %s: %w", sb.Name, v1alpha1.AnnotationSnapshot, err)
		}
		pod.Annotations[v1alpha1.AnnotationRestore] = s
		if snap.Ref == "" {
			// The snapshot is on that node's disk. One in a registry
			// (a branch's) is pulled by whichever node the scheduler
			// picks.
			pod.Spec.NodeName = snap.Node
		}
	}
	if err := controllerutil.SetControllerReference(sb, pod, r.Scheme); err != nil {
		return nil, err
	}
	return pod, nil
}
