package kubetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Eventually polls cond every 100 ms until it reports done, fails, or
// timeout passes; what it reported last is in the failure.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func(ctx context.Context) (done bool, state string, err error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last string
	for {
		done, state, err := cond(ctx)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if done {
			return
		}
		last = state
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not after %v (last: %s)", what, timeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// WaitNodeReady waits until the Node name is Ready.
func (c *Cluster) WaitNodeReady(t testing.TB, name string, timeout time.Duration) {
	t.Helper()
	Eventually(t, timeout, "node "+name+" Ready", func(ctx context.Context) (bool, string, error) {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue, fmt.Sprintf("Ready=%s %s", cond.Status, cond.Message), nil
			}
		}
		return false, "no Ready condition", nil
	})
}

// WaitPod waits until cond holds of the Pod and returns it.
func (c *Cluster) WaitPod(t testing.TB, namespace, name string, timeout time.Duration, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	Eventually(t, timeout, "pod "+name+": "+what, func(ctx context.Context) (bool, string, error) {
		p, err := c.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		pod = p
		return cond(p), fmt.Sprintf("phase %s on %q, %s", p.Status.Phase, p.Spec.NodeName, p.Status.Message), nil
	})
	return pod
}
