package e2e

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	agentjail "github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/kube/api/v1alpha1"
	"github.com/agentjail/agentjail/kube/internal/kubetest"
)

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkSandbox: a Sandbox from create to Ready, and to its first
// command through the gateway, beside the floor: create → exec of a jail
// on one host, against a node's daemon directly.
func BenchmarkSandbox(b *testing.B) {
	c := kubetest.Start(b)
	nd := kubetest.StartNode(b, c, bins, "aj-bench", 0, kubetest.SeparateAgent)
	cl := kubetest.StartOperator(b, c, bins, 40*time.Second)
	gw := agentjail.New(kubetest.StartGateway(b, c, bins), c.AgentjailToken)
	ctx := context.Background()
	var ready, first, floor []time.Duration
	for i := 0; b.Loop(); i++ {
		name := fmt.Sprintf("bench-%d", i)
		start := time.Now()
		if err := cl.Create(ctx, newSandbox(name)); err != nil {
			b.Fatal(err)
		}
		var sb v1alpha1.Sandbox
		for {
			if err := cl.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &sb); err != nil {
				b.Fatal(err)
			}
			if meta.IsStatusConditionTrue(sb.Status.Conditions, v1alpha1.ConditionReady) {
				break
			}
			if time.Since(start) > 3*time.Minute {
				b.Fatalf("sandbox %s not Ready after 3 minutes", name)
			}
			time.Sleep(10 * time.Millisecond)
		}
		ready = append(ready, time.Since(start))
		if _, err := gw.Exec(ctx, "default."+name, agentjail.ExecRequest{Cmd: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		first = append(first, time.Since(start))

		start = time.Now()
		j, err := nd.Daemon.Create(ctx, agentjail.CreateRequest{})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := nd.Daemon.Exec(ctx, j.ID, agentjail.ExecRequest{Cmd: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		floor = append(floor, time.Since(start))

		b.StopTimer()
		if err := nd.Daemon.Destroy(ctx, j.ID); err != nil {
			b.Fatal(err)
		}
		if err := cl.Delete(ctx, &sb); err != nil {
			b.Fatal(err)
		}
		// The next one starts on a node without it.
		kubetest.Eventually(b, 2*time.Minute, "sandbox "+name+" gone", func(ctx context.Context) (bool, string, error) {
			err := cl.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &v1alpha1.Sandbox{})
			return apierrors.IsNotFound(err), "still there", nil
		})
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(ms(median(first)), "ms")
	b.ReportMetric(ms(median(floor)), "ref-ms")
	b.ReportMetric(float64(median(first))/float64(median(floor)), "x-ref")
	b.ReportMetric(ms(median(ready)), "ready-ms")
}
