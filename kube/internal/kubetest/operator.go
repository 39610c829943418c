package kubetest

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/go-logr/logr"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/agentjail/agentjail/kube/api/v1alpha1"
)

// ChartDir is the Helm chart's directory (its crds/ hold the CRDs).
func ChartDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "deploy", "chart", "agentjail")
}

// StartOperator installs the chart's CRDs with kubectl, waits until they
// are established, and runs `agentjail-kube operator` until the test
// ends, with grace as its node lease grace and flags added to its command
// line. It returns a client that knows the Sandbox types.
func StartOperator(t testing.TB, c *Cluster, bins *Binaries, grace time.Duration, flags ...string) client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, stderr, err := c.Kubectl(ctx, t, "", "apply", "-f", filepath.Join(ChartDir(), "crds")); err != nil {
		t.Fatalf("kubectl apply the CRDs: %v: %s", err, stderr)
	}
	ext, err := apiextclient.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	Eventually(t, time.Minute, "the Sandbox CRD established", func(ctx context.Context) (bool, string, error) {
		crd, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, "sandboxes.agents.x-k8s.io", metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		for _, cond := range crd.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return true, "", nil
			}
		}
		return false, "not established", nil
	})
	startProcess(t, filepath.Join(c.Dir, "operator.log"), bins.AgentjailKube, append([]string{"operator",
		"--kubeconfig", c.Kubeconfig, fmt.Sprintf("--node-grace=%s", grace)}, flags...)...)
	scheme := kruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	ctrllog.SetLogger(logr.Discard())
	cl, err := client.New(c.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}
