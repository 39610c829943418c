package node

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/agentjail/agentjail/kube/api/v1alpha1"
)

// collectSnapshots deletes, every interval, the pause snapshots this node
// took (named k8s-pause-...) that no Sandbox records any more (their
// Sandbox was deleted while paused) and that are older than grace (the
// operator records a snapshot on its Sandbox a moment after the node took
// it). Without the Sandbox API in the cluster it does nothing.
func (p *Provider) collectSnapshots(ctx context.Context, dc dynamic.Interface, interval, grace time.Duration) {
	gvr := v1alpha1.GroupVersion.WithResource("sandboxes")
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		list, err := dc.Resource(gvr).List(ctx, metav1.ListOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			p.log.Warn("listing Sandboxes for snapshot collection", "err", err)
			continue
		}
		kept := map[string]bool{}
		for _, sb := range list.Items {
			var s v1alpha1.Snapshot
			if a := sb.GetAnnotations()[v1alpha1.AnnotationSnapshot]; a != "" && json.Unmarshal([]byte(a), &s) == nil && s.Node == p.nodeName {
				kept[s.ID] = true
			}
		}
		snaps, err := p.daemon.Snapshots(ctx, "")
		if err != nil {
			p.log.Warn("listing snapshots for collection", "err", err)
			continue
		}
		for _, s := range snaps {
			if !strings.HasPrefix(s.Name, pauseSnapshotPrefix) || kept[s.ID] || time.Since(s.CreatedAt) < grace {
				continue
			}
			if err := p.daemon.DeleteSnapshot(ctx, s.ID); err != nil && !isNotFound(err) {
				p.log.Warn("deleting an unreferenced pause snapshot", "snapshot", s.ID, "err", err)
				continue
			}
			p.log.Info("deleted a pause snapshot no Sandbox records", "snapshot", s.ID, "name", s.Name)
		}
	}
}
