package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	agentjail "github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/kube/api/v1alpha1"
)

// Restart back-off of a container whose Pod restarts it: doubling from
// restartBackoffMin to restartBackoffMax, back to the minimum after it ran
// restartBackoffReset without exiting.
const (
	restartBackoffMin   = time.Second
	restartBackoffMax   = time.Minute
	restartBackoffReset = 10 * time.Minute
)

// run brings a Pod's jail up and runs its container's command, restarting
// it as the Pod's restartPolicy says, until the Pod ends or ctx is done.
func (p *Provider) run(ctx context.Context, r *podRun, js *jailSpec) {
	r.mu.Lock()
	pod := r.pod.DeepCopy()
	r.mu.Unlock()
	argv, err := p.prepare(ctx, pod, js)
	if err != nil {
		if ctx.Err() == nil {
			p.fail(r, "ErrImagePull", err.Error())
		}
		return
	}
	var restore *v1alpha1.Snapshot
	if a := pod.Annotations[v1alpha1.AnnotationRestore]; a != "" {
		restore = new(v1alpha1.Snapshot)
		if err := json.Unmarshal([]byte(a), restore); err != nil {
			p.fail(r, "Unsupported", fmt.Sprintf("annotation %s: %v", v1alpha1.AnnotationRestore, err))
			return
		}
	}
	j, err := p.createJail(ctx, js, restore)
	if err != nil {
		if ctx.Err() == nil {
			p.events.Event(pod, corev1.EventTypeWarning, "FailedCreate", err.Error())
			p.fail(r, "CreateJailError", err.Error())
		}
		return
	}
	r.mu.Lock()
	r.jailID = j.ID
	r.mu.Unlock()
	p.events.Eventf(pod, corev1.EventTypeNormal, "Created", "jail %s (level %s)", j.ID, j.Config.Isolation.Level)

	// A restored jail's command runs on: attach to it.
	attach := 0
	if restore != nil {
		attach = restore.Pid
	}
	backoff := restartBackoffMin
	for {
		started := time.Now()
		exit, err := p.runOnce(ctx, r, pod, js, argv, attach)
		attach = 0
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			p.events.Event(pod, corev1.EventTypeWarning, "Failed", err.Error())
			p.fail(r, "Error", err.Error())
			_ = p.destroyJail(context.Background(), r)
			return
		}
		restart := pod.Spec.RestartPolicy == corev1.RestartPolicyAlways ||
			(pod.Spec.RestartPolicy == corev1.RestartPolicyOnFailure && exit.Code != 0)
		if !restart {
			p.finish(r, exit)
			// The jail's work is done; its output stays in the log.
			if err := p.destroyJail(context.Background(), r); err != nil {
				p.log.Warn("destroying a finished pod's jail", "pod", r.key, "err", err)
			}
			return
		}
		if time.Since(started) > restartBackoffReset {
			backoff = restartBackoffMin
		}
		p.restarting(r, exit, backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(backoff*2, restartBackoffMax)
		r.log.resume()
	}
}

// prepare pulls the Pod's image when the daemon does not have it and
// returns the command line: the container's command and args, with the
// image's entrypoint and command where the Pod gives none.
func (p *Provider) prepare(ctx context.Context, pod *corev1.Pod, js *jailSpec) ([]string, error) {
	command, args := js.command, js.args
	if js.image != "" {
		img, err := p.daemon.GetImage(ctx, js.image)
		if isNotFound(err) {
			p.events.Eventf(pod, corev1.EventTypeNormal, "Pulling", "pulling image %q", js.image)
			img, err = p.daemon.Pull(ctx, js.image, nil)
			if err == nil {
				p.events.Eventf(pod, corev1.EventTypeNormal, "Pulled", "pulled image %q (%s)", js.image, img.ID)
			}
		}
		if err != nil {
			err = fmt.Errorf("image %q: %w", js.image, err)
			p.events.Event(pod, corev1.EventTypeWarning, "Failed", err.Error())
			return nil, err
		}
		if len(command) == 0 {
			command = img.Config.Entrypoint
			if len(args) == 0 {
				args = img.Config.Cmd
			}
		}
	}
	argv := append(append([]string(nil), command...), args...)
	if len(argv) == 0 {
		err := fmt.Errorf("image %q has no entrypoint or command and the Pod gives none", js.image)
		p.events.Event(pod, corev1.EventTypeWarning, "Failed", err.Error())
		return nil, err
	}
	return argv, nil
}

// createJail creates the Pod's jail (restored from snapshot when not
// nil), or takes the one an earlier run of this node made for the Pod.
func (p *Provider) createJail(ctx context.Context, js *jailSpec, snapshot *v1alpha1.Snapshot) (*agentjail.Jail, error) {
	if j, err := p.daemon.Get(ctx, js.create.Name); err == nil {
		if j.Status == agentjail.State("running") {
			return j, nil
		}
		if err := p.daemon.Destroy(ctx, j.ID); err != nil && !isNotFound(err) {
			return nil, fmt.Errorf("removing the stale jail %s: %w", j.ID, err)
		}
	}
	if snapshot == nil {
		return p.daemon.Create(ctx, js.create)
	}
	sid := snapshot.ID
	switch {
	case snapshot.Ref != "":
		// A branch: its snapshot is in a registry, pulled into a copy of
		// this node's own (the original may serve other branches).
		s, err := p.daemon.PullSnapshot(ctx, snapshot.Ref, "")
		if err != nil {
			return nil, fmt.Errorf("pulling snapshot %s: %w", snapshot.Ref, err)
		}
		sid = s.ID
	case snapshot.Node != p.nodeName:
		return nil, fmt.Errorf("snapshot %s is on node %s, not on %s", snapshot.ID, snapshot.Node, p.nodeName)
	}
	j, err := p.daemon.Restore(ctx, sid, js.create.Name)
	// The snapshot is consumed (or, when the restore failed, a pulled
	// copy is no use): the jail carries its state on.
	if (err == nil || sid != snapshot.ID) && sid != "" {
		if derr := p.daemon.DeleteSnapshot(context.WithoutCancel(ctx), sid); derr != nil && !isNotFound(derr) {
			p.log.Warn("deleting a restored snapshot", "snapshot", sid, "err", derr)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("restoring snapshot %s: %w", sid, err)
	}
	return j, nil
}

// runOnce runs the container's command once (or, with attach, follows
// the restored one of that pid) and returns how it exited.
func (p *Provider) runOnce(ctx context.Context, r *podRun, pod *corev1.Pod, js *jailSpec, argv []string, attach int) (agentjail.CommandExit, error) {
	r.mu.Lock()
	id := r.jailID
	r.mu.Unlock()
	var cm *agentjail.Command
	var err error
	if attach != 0 {
		cm, err = p.daemon.AttachCommand(ctx, id, attach)
		if err != nil {
			p.events.Eventf(pod, corev1.EventTypeWarning, "Restarting", "the restored command (pid %d) is gone (%v): starting it again", attach, err)
		}
	}
	if cm == nil {
		cm, err = p.daemon.Command(ctx, id, agentjail.CommandOptions{Cmd: argv, Cwd: js.cwd, Detach: true})
	}
	if err != nil {
		return agentjail.CommandExit{}, fmt.Errorf("starting the container's command: %w", err)
	}
	defer func() {
		r.mu.Lock()
		r.cm = nil
		r.mu.Unlock()
		cm.Close()
	}()
	now := metav1.Now()
	r.mu.Lock()
	r.cm = cm
	r.pid = cm.Pid()
	cs := &r.pod.Status.ContainerStatuses[0]
	cs.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}
	cs.Ready, cs.Started = true, ptr(true)
	cs.ContainerID = "agentjail://" + id
	r.pod.Status.Phase = corev1.PodRunning
	r.pod.Status.Reason, r.pod.Status.Message = "", ""
	setCondition(r.pod, corev1.PodInitialized, corev1.ConditionTrue, "", "")
	setCondition(r.pod, corev1.ContainersReady, corev1.ConditionTrue, "", "")
	setCondition(r.pod, corev1.PodReady, corev1.ConditionTrue, "", "")
	r.mu.Unlock()
	p.publish(r)
	p.events.Eventf(pod, corev1.EventTypeNormal, "Started", "started %q in jail %s (pid %d)", argv[0], id, cm.Pid())

	for attempt := 0; ; {
		stream, data, err := cm.Next(ctx)
		if errors.Is(err, io.EOF) {
			exit, _ := cm.Exit()
			r.log.end()
			return exit, nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return agentjail.CommandExit{}, ctx.Err()
			}
			// The connection to the daemon broke: attach again by pid
			// (output meanwhile is lost), a few times.
			if attempt++; attempt > 5 {
				return agentjail.CommandExit{}, fmt.Errorf("lost the container's command: %w", err)
			}
			t := time.NewTimer(time.Duration(attempt) * 200 * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				return agentjail.CommandExit{}, ctx.Err()
			case <-t.C:
			}
			cm.Close()
			// A snapshot in progress keeps us detached until it is done.
			r.gate.RLock()
			r.mu.Lock()
			pid := r.pid
			r.mu.Unlock()
			next, aerr := p.daemon.AttachCommand(ctx, id, pid)
			if aerr == nil {
				cm, attempt = next, 0
				r.mu.Lock()
				r.cm = cm
				r.mu.Unlock()
			}
			r.gate.RUnlock()
			continue
		}
		name := "stdout"
		if stream == agentjail.Stderr {
			name = "stderr"
		}
		if err := r.log.write(name, data); err != nil {
			p.log.Warn("writing a container's log", "pod", r.key, "err", err)
		}
	}
}

// terminated is the container state of an exit.
func terminated(exit agentjail.CommandExit, startedAt metav1.Time) *corev1.ContainerStateTerminated {
	t := &corev1.ContainerStateTerminated{ExitCode: int32(exit.Code), StartedAt: startedAt, FinishedAt: metav1.Now(), Reason: "Completed"}
	switch {
	case exit.TimedOut:
		t.Reason = "DeadlineExceeded"
	case exit.Signal != "":
		t.Reason, t.Message = "Error", "killed by "+exit.Signal
	case exit.Code != 0:
		t.Reason = "Error"
	}
	return t
}

// finish records the container's last exit and ends the Pod: Succeeded
// on 0, else Failed.
func (p *Provider) finish(r *podRun, exit agentjail.CommandExit) {
	r.mu.Lock()
	cs := &r.pod.Status.ContainerStatuses[0]
	var started metav1.Time
	if cs.State.Running != nil {
		started = cs.State.Running.StartedAt
	}
	cs.State = corev1.ContainerState{Terminated: terminated(exit, started)}
	cs.Ready, cs.Started = false, ptr(false)
	r.pid = 0
	r.pod.Status.Phase = corev1.PodSucceeded
	if exit.Code != 0 || exit.Signal != "" {
		r.pod.Status.Phase = corev1.PodFailed
	}
	setCondition(r.pod, corev1.ContainersReady, corev1.ConditionFalse, "PodCompleted", "")
	setCondition(r.pod, corev1.PodReady, corev1.ConditionFalse, "PodCompleted", "")
	r.mu.Unlock()
	p.publish(r)
}

// restarting records an exit the Pod restarts after backoff.
func (p *Provider) restarting(r *podRun, exit agentjail.CommandExit, backoff time.Duration) {
	r.mu.Lock()
	cs := &r.pod.Status.ContainerStatuses[0]
	var started metav1.Time
	if cs.State.Running != nil {
		started = cs.State.Running.StartedAt
	}
	cs.LastTerminationState = corev1.ContainerState{Terminated: terminated(exit, started)}
	cs.RestartCount++
	cs.Ready, cs.Started = false, ptr(false)
	reason := "Completed"
	if exit.Code != 0 {
		reason = "CrashLoopBackOff"
	}
	cs.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason,
		Message: fmt.Sprintf("back-off %v restarting the container", backoff)}}
	r.pid = 0
	setCondition(r.pod, corev1.ContainersReady, corev1.ConditionFalse, "ContainersNotReady", "")
	setCondition(r.pod, corev1.PodReady, corev1.ConditionFalse, "ContainersNotReady", "")
	r.mu.Unlock()
	p.publish(r)
}

func ptr[T any](v T) *T { return &v }
