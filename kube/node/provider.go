// Package node makes an agentjail daemon a Kubernetes node with
// virtual-kubelet: every Pod bound to the node becomes a jail of the
// daemon, its one container the jail's main command. The node registers
// itself with the host's capacity and a taint that only Pods tolerating it
// pass, keeps its lease fresh while the daemon answers, reports each Pod's
// status from its jail, and serves `kubectl logs`, `exec` and `attach`
// through the kubelet API.
//
// It speaks to the daemon through the daemon's REST API (package client),
// so it runs beside `agentjail serve`, as a child process of it
// (`serve --kube-node`) or on its own.
package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	vkerrdefs "github.com/virtual-kubelet/virtual-kubelet/errdefs"
	vknode "github.com/virtual-kubelet/virtual-kubelet/node"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	agentjail "github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/kube/api/v1alpha1"
)

// Provider runs the Pods bound to one node as jails of one daemon. It
// implements virtual-kubelet's PodLifecycleHandler and PodNotifier.
type Provider struct {
	daemon   *agentjail.Client
	nodeName string
	dir      string
	log      *slog.Logger
	events   record.EventRecorder

	mu     sync.Mutex
	pods   map[string]*podRun // by namespace/name
	notify func(*corev1.Pod)
	// ctx ends the Pods' goroutines when the provider stops.
	ctx context.Context
}

var (
	_ vknode.PodLifecycleHandler = (*Provider)(nil)
	_ vknode.PodNotifier         = (*Provider)(nil)
)

// podRun is one Pod on this node and its jail.
type podRun struct {
	key string
	log *containerLog
	// cancel stops the goroutine that runs the Pod.
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	pod    *corev1.Pod // spec as received, status as this node sees it
	jailID string
	// pid is the main command's pid in the jail while it runs.
	pid int
	// snapToken is the last snapshot request taken up.
	snapToken string
	// cm is the node's attachment to the main command.
	cm *agentjail.Command
	// gate is held by a snapshot: the attachment stays closed meanwhile
	// (CRIU cannot dump init with a connection from outside the jail).
	gate sync.RWMutex
}

// NewProvider returns a provider over daemon; dir keeps the containers'
// logs; events records the Pods' events.
func NewProvider(ctx context.Context, daemon *agentjail.Client, nodeName, dir string, log *slog.Logger, events record.EventRecorder) (*Provider, error) {
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o750); err != nil {
		return nil, err
	}
	return &Provider{daemon: daemon, nodeName: nodeName, dir: dir, log: log, events: events, pods: map[string]*podRun{}, ctx: ctx}, nil
}

func podKey(namespace, name string) string { return namespace + "/" + name }

// jailName is the name of a Pod's jail: one per Pod object (its uid).
func jailName(pod *corev1.Pod) string { return "pod-" + string(pod.UID) }

// NotifyPods registers the callback that publishes a Pod's status.
func (p *Provider) NotifyPods(_ context.Context, f func(*corev1.Pod)) {
	p.mu.Lock()
	p.notify = f
	p.mu.Unlock()
}

// publish sends r's current Pod to the pod controller.
func (p *Provider) publish(r *podRun) {
	r.mu.Lock()
	pod := r.pod.DeepCopy()
	r.mu.Unlock()
	p.mu.Lock()
	f := p.notify
	p.mu.Unlock()
	if f != nil {
		f(pod)
	}
}

// CreatePod starts running pod as a jail. A Pod that asks for something a
// jail cannot do fails at once with an event saying what.
func (p *Provider) CreatePod(_ context.Context, pod *corev1.Pod) error {
	key := podKey(pod.Namespace, pod.Name)
	p.mu.Lock()
	if old, ok := p.pods[key]; ok && old.pod.UID == pod.UID {
		p.mu.Unlock()
		return nil
	}
	p.mu.Unlock()

	pod = pod.DeepCopy()
	now := metav1.Now()
	pod.Status = corev1.PodStatus{Phase: corev1.PodPending, StartTime: &now, HostIP: "", QOSClass: corev1.PodQOSBestEffort}
	c := pod.Spec.Containers[0]
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name: c.Name, Image: c.Image, ImageID: "",
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}},
	}}
	setCondition(pod, corev1.PodScheduled, corev1.ConditionTrue, "", "")
	setCondition(pod, corev1.PodReady, corev1.ConditionFalse, "ContainersNotReady", "")

	lg, err := openLog(filepath.Join(p.dir, "logs", fmt.Sprintf("%s_%s_%s.log", pod.Namespace, pod.Name, pod.UID)))
	if err != nil {
		return fmt.Errorf("the container's log: %w", err)
	}
	ctx, cancel := context.WithCancel(p.ctx)
	r := &podRun{key: key, pod: pod, log: lg, cancel: cancel, done: make(chan struct{})}
	p.mu.Lock()
	p.pods[key] = r
	p.mu.Unlock()

	js, err := translate(pod)
	if err != nil {
		var u *unsupportedError
		if !errors.As(err, &u) {
			return err
		}
		p.events.Event(pod, corev1.EventTypeWarning, "Unsupported", u.msg)
		p.fail(r, "Unsupported", u.msg)
		close(r.done)
		return nil
	}
	for _, v := range pod.Spec.Volumes {
		if serviceAccountVolume(&v) {
			p.events.Event(pod, corev1.EventTypeWarning, "NotMounted", "volume "+v.Name+": agentjail nodes do not mount service account tokens into jails")
		}
	}
	js.create.Name = jailName(pod)
	p.publish(r)
	go func() {
		defer close(r.done)
		p.run(ctx, r, js)
	}()
	return nil
}

// fail makes the Pod Failed with reason and message (its container
// terminated without having run).
func (p *Provider) fail(r *podRun, reason, msg string) {
	r.mu.Lock()
	now := metav1.Now()
	r.pod.Status.Phase = corev1.PodFailed
	r.pod.Status.Reason, r.pod.Status.Message = reason, msg
	for i := range r.pod.Status.ContainerStatuses {
		cs := &r.pod.Status.ContainerStatuses[i]
		if cs.State.Terminated == nil {
			cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 128, Reason: reason, Message: msg, FinishedAt: now}}
		}
		cs.Ready = false
	}
	setCondition(r.pod, corev1.PodReady, corev1.ConditionFalse, "PodFailed", msg)
	r.mu.Unlock()
	p.publish(r)
}

// UpdatePod takes a new spec of a running Pod: only metadata changes
// reach a running jail (its labels and annotations are republished).
func (p *Provider) UpdatePod(_ context.Context, pod *corev1.Pod) error {
	r := p.get(podKey(pod.Namespace, pod.Name))
	if r == nil {
		return vkerrdefs.NotFoundf("pod %s/%s is not on this node", pod.Namespace, pod.Name)
	}
	r.mu.Lock()
	status := r.pod.Status
	r.pod = pod.DeepCopy()
	r.pod.Status = status
	token := pod.Annotations[v1alpha1.AnnotationSnapshotRequest]
	push := pod.Annotations[v1alpha1.AnnotationSnapshotPush]
	snap := token != "" && token != r.snapToken
	if snap {
		r.snapToken = token
	}
	r.mu.Unlock()
	p.publish(r)
	if snap {
		go p.snapshot(r, token, push)
	}
	return nil
}

// pauseSnapshotPrefix starts the names of the snapshots a node takes for
// Sandboxes' pauses.
const pauseSnapshotPrefix = "k8s-pause-"

// snapshot takes a full snapshot of the Pod's jail (its processes and
// files; the jail keeps running) and answers the request token with the
// v1alpha1.ConditionSnapshot Pod condition. With push (a registry
// reference) the snapshot is pushed there and the node keeps no copy.
func (p *Provider) snapshot(r *podRun, token, push string) {
	// Detach from the main command for the snapshot: its output meanwhile
	// is not in the log.
	r.gate.Lock()
	defer r.gate.Unlock()
	r.mu.Lock()
	id, pid, pod, cm := r.jailID, r.pid, r.pod.DeepCopy(), r.cm
	r.mu.Unlock()
	if cm != nil {
		cm.Close()
	}
	ctx, cancel := context.WithTimeout(p.ctx, 5*time.Minute)
	defer cancel()
	status, msg := corev1.ConditionFalse, token+": the Pod's container is not running"
	if id != "" && pid != 0 {
		var s *agentjail.Snapshot
		var err error
		// The daemon closes its side of the attachment a moment after
		// ours: until then the checkpoint fails (and changes nothing).
		for attempt := 1; ; attempt++ {
			s, err = p.daemon.Snapshot(ctx, id, agentjail.SnapshotRequest{Name: fmt.Sprintf("%s%s-%s-%d", pauseSnapshotPrefix, pod.UID, token, attempt)})
			if err == nil || attempt == 5 || !strings.Contains(err.Error(), "socket") {
				break
			}
			t := time.NewTimer(time.Duration(attempt) * 100 * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
			case <-t.C:
			}
		}
		ref := ""
		if err == nil && push != "" {
			ref, err = p.push(ctx, pod, s.ID, push)
		}
		if err != nil {
			msg = token + ": " + err.Error()
			p.events.Event(pod, corev1.EventTypeWarning, "SnapshotFailed", err.Error())
		} else {
			b, _ := json.Marshal(v1alpha1.Snapshot{Node: p.nodeName, ID: s.ID, Pid: pid, Token: token, Ref: ref})
			status, msg = corev1.ConditionTrue, string(b)
			p.events.Eventf(pod, corev1.EventTypeNormal, "Snapshot", "snapshot %s of jail %s", s.ID, id)
		}
	}
	r.mu.Lock()
	setCondition(r.pod, v1alpha1.ConditionSnapshot, status, "", msg)
	r.mu.Unlock()
	p.publish(r)
}

// push pushes snapshot sid to the registry reference ref and deletes it
// here, whether the push worked or not (a Pod restoring it pulls it from
// the registry); it returns the artifact's digest reference.
func (p *Provider) push(ctx context.Context, pod *corev1.Pod, sid, ref string) (string, error) {
	res, err := p.daemon.PushSnapshot(ctx, sid, ref)
	if derr := p.daemon.DeleteSnapshot(context.WithoutCancel(ctx), sid); derr != nil && !isNotFound(derr) {
		p.log.Warn("deleting a pushed snapshot", "snapshot", sid, "err", derr)
	}
	if err != nil {
		return "", fmt.Errorf("pushing snapshot %s to %s: %w", sid, ref, err)
	}
	p.events.Eventf(pod, corev1.EventTypeNormal, "SnapshotPushed", "snapshot %s pushed to %s (%d bytes in %.0f ms)", sid, res.Ref, res.Bytes, res.DurationMs)
	return res.Ref, nil
}

// DeletePod stops the Pod's command, destroys its jail and reports every
// container terminated. It may be called more than once.
func (p *Provider) DeletePod(ctx context.Context, pod *corev1.Pod) error {
	key := podKey(pod.Namespace, pod.Name)
	r := p.get(key)
	if r == nil {
		return vkerrdefs.NotFoundf("pod %s is not on this node", key)
	}
	r.cancel()
	<-r.done
	if err := p.destroyJail(ctx, r); err != nil {
		return err
	}
	r.log.close()
	r.mu.Lock()
	now := metav1.Now()
	if r.pod.Status.Phase != corev1.PodSucceeded && r.pod.Status.Phase != corev1.PodFailed {
		r.pod.Status.Phase = corev1.PodFailed
		r.pod.Status.Reason = "Deleted"
	}
	for i := range r.pod.Status.ContainerStatuses {
		cs := &r.pod.Status.ContainerStatuses[i]
		if cs.State.Terminated == nil {
			cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Killed", Message: "the Pod was deleted", FinishedAt: now}}
		}
		cs.Ready = false
	}
	r.pod.DeletionTimestamp = pod.DeletionTimestamp
	r.pod.DeletionGracePeriodSeconds = pod.DeletionGracePeriodSeconds
	r.mu.Unlock()
	p.publish(r)
	p.mu.Lock()
	if p.pods[key] == r {
		delete(p.pods, key)
	}
	p.mu.Unlock()
	os.Remove(r.log.path)
	os.Remove(r.log.path + ".1")
	return nil
}

// destroyJail destroys the Pod's jail, if it has one; a jail already gone
// is fine.
func (p *Provider) destroyJail(ctx context.Context, r *podRun) error {
	r.mu.Lock()
	id := r.jailID
	r.mu.Unlock()
	if id == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := p.daemon.Destroy(ctx, id); err != nil && !isNotFound(err) {
		return fmt.Errorf("destroying jail %s: %w", id, err)
	}
	r.mu.Lock()
	r.jailID = ""
	r.mu.Unlock()
	return nil
}

func isNotFound(err error) bool {
	var ae *agentjail.APIError
	return errors.As(err, &ae) && ae.Status == 404
}

func (p *Provider) get(key string) *podRun {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pods[key]
}

// GetPod returns the Pod as this node runs it.
func (p *Provider) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	r := p.get(podKey(namespace, name))
	if r == nil {
		return nil, vkerrdefs.NotFoundf("pod %s/%s is not on this node", namespace, name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pod.DeepCopy(), nil
}

// GetPodStatus returns the Pod's status as this node sees it.
func (p *Provider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

// GetPods returns every Pod this node runs.
func (p *Provider) GetPods(context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	runs := make([]*podRun, 0, len(p.pods))
	for _, r := range p.pods {
		runs = append(runs, r)
	}
	p.mu.Unlock()
	out := make([]*corev1.Pod, 0, len(runs))
	for _, r := range runs {
		r.mu.Lock()
		out = append(out, r.pod.DeepCopy())
		r.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Namespace+"/"+out[i].Name < out[j].Namespace+"/"+out[j].Name })
	return out, nil
}

// setCondition sets a Pod condition, keeping its transition time when the
// status does not change.
func setCondition(pod *corev1.Pod, t corev1.PodConditionType, s corev1.ConditionStatus, reason, msg string) {
	now := metav1.Now()
	for i := range pod.Status.Conditions {
		c := &pod.Status.Conditions[i]
		if c.Type == t {
			if c.Status != s {
				c.LastTransitionTime = now
			}
			c.Status, c.Reason, c.Message = s, reason, msg
			return
		}
	}
	pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: t, Status: s, Reason: reason, Message: msg, LastTransitionTime: now})
}
