// Package nodelease notices agentjail nodes that stopped renewing their
// lease (their host, daemon or node agent died) and does for them what
// Kubernetes' node lifecycle controller does for kubelets: the node is
// marked NotReady and tainted unreachable, so nothing more is placed there,
// and its Pods are marked Failed (reason NodeLost), so that what owns them
// (a Sandbox) replaces them on another node. When the lease is renewed
// again the taints go.
//
// It acts only on nodes labelled agentjail.dev/node=true, and works with
// or without a kube-controller-manager in the cluster.
package nodelease

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ReasonNodeLost is the reason of a Pod failed because its node was lost.
const ReasonNodeLost = "NodeLost"

// taints put on a lost node.
var taints = []corev1.Taint{
	{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute},
}

// Watchdog checks agentjail nodes' leases.
type Watchdog struct {
	Client kubernetes.Interface
	// Grace is how long a lease may go unrenewed (nodes renew every 10 s).
	Grace time.Duration
	// Selector selects the nodes to watch (default agentjail.dev/node=true).
	Selector string
	Log      *slog.Logger
}

// Run checks the nodes every Grace/4 until ctx is done.
func (w *Watchdog) Run(ctx context.Context) error {
	if w.Selector == "" {
		w.Selector = "agentjail.dev/node=true"
	}
	t := time.NewTicker(w.Grace / 4)
	defer t.Stop()
	for {
		if err := w.check(ctx); err != nil && ctx.Err() == nil {
			w.Log.Warn("checking agentjail nodes", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (w *Watchdog) check(ctx context.Context) error {
	nodes, err := w.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: w.Selector})
	if err != nil {
		return err
	}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		lease, err := w.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			continue // not registered yet
		}
		if lease.Spec.RenewTime == nil {
			continue
		}
		lost := time.Since(lease.Spec.RenewTime.Time) > w.Grace
		if err := w.reconcile(ctx, n, lost); err != nil {
			w.Log.Warn("agentjail node", "node", n.Name, "lost", lost, "err", err)
		}
	}
	return nil
}

func hasTaint(n *corev1.Node, t corev1.Taint) bool {
	for _, x := range n.Spec.Taints {
		if x.Key == t.Key && x.Effect == t.Effect {
			return true
		}
	}
	return false
}

// reconcile taints and fails a lost node's Pods, or lifts the taints of a
// node that is back.
func (w *Watchdog) reconcile(ctx context.Context, n *corev1.Node, lost bool) error {
	changed := false
	if lost {
		for _, t := range taints {
			if !hasTaint(n, t) {
				t.TimeAdded = &metav1.Time{Time: time.Now()}
				n.Spec.Taints = append(n.Spec.Taints, t)
				changed = true
			}
		}
	} else {
		kept := n.Spec.Taints[:0]
		for _, x := range n.Spec.Taints {
			if x.Key == corev1.TaintNodeUnreachable {
				changed = true
				continue
			}
			kept = append(kept, x)
		}
		n.Spec.Taints = kept
	}
	if changed {
		if _, err := w.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			return err
		}
		w.Log.Info("agentjail node", "node", n.Name, "lost", lost)
	}
	if !lost {
		return nil
	}
	if err := w.markNotReady(ctx, n.Name); err != nil {
		return err
	}
	pods, err := w.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
	if err != nil {
		return err
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		p.Status.Phase = corev1.PodFailed
		p.Status.Reason = ReasonNodeLost
		p.Status.Message = fmt.Sprintf("node %s stopped renewing its lease", n.Name)
		for j := range p.Status.Conditions {
			if p.Status.Conditions[j].Type == corev1.PodReady || p.Status.Conditions[j].Type == corev1.ContainersReady {
				p.Status.Conditions[j].Status = corev1.ConditionFalse
				p.Status.Conditions[j].Reason = ReasonNodeLost
			}
		}
		if _, err := w.Client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err)
		}
		w.Log.Info("pod failed: node lost", "pod", p.Namespace+"/"+p.Name, "node", n.Name)
	}
	return nil
}

// markNotReady sets the node's Ready condition Unknown, as the node
// lifecycle controller does.
func (w *Watchdog) markNotReady(ctx context.Context, name string) error {
	n, err := w.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for i := range n.Status.Conditions {
		c := &n.Status.Conditions[i]
		if c.Type == corev1.NodeReady && c.Status != corev1.ConditionUnknown {
			c.Status, c.Reason, c.Message = corev1.ConditionUnknown, "NodeStatusUnknown", "the node stopped renewing its lease"
			c.LastTransitionTime = metav1.Now()
			_, err := w.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
			return err
		}
	}
	return nil
}
