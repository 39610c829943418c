package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	dto "github.com/prometheus/client_model/go"
	vkerrdefs "github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	corev1 "k8s.io/api/core/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	utilexec "k8s.io/utils/exec"

	agentjail "github.com/agentjail/agentjail/client"
)

var _ nodeutil.Provider = (*Provider)(nil)

// running returns the jail of a Pod whose container runs, and the main
// command's pid.
func (p *Provider) running(namespace, name, container string) (*podRun, string, int, error) {
	r := p.get(podKey(namespace, name))
	if r == nil {
		return nil, "", 0, vkerrdefs.NotFoundf("pod %s/%s is not on this node", namespace, name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if container != "" && container != r.pod.Spec.Containers[0].Name {
		return nil, "", 0, vkerrdefs.NotFoundf("pod %s/%s has no container %q", namespace, name, container)
	}
	if r.jailID == "" || r.pod.Status.Phase != corev1.PodRunning {
		return nil, "", 0, vkerrdefs.InvalidInputf("pod %s/%s: the container is not running", namespace, name)
	}
	return r, r.jailID, r.pid, nil
}

// exitError is how the kubelet API reports a command's exit code.
func exitError(code int) error {
	if code == 0 {
		return nil
	}
	return utilexec.CodeExitError{Err: fmt.Errorf("command terminated with exit code %d", code), Code: code}
}

// RunInContainer runs cmd in the Pod's jail (`kubectl exec`): with a
// terminal when asked (-t), else with stdout and stderr apart and stdin
// when given (-i).
func (p *Provider) RunInContainer(ctx context.Context, namespace, name, container string, cmd []string, attach api.AttachIO) error {
	_, id, _, err := p.running(namespace, name, container)
	if err != nil {
		return err
	}
	if attach.TTY() {
		return p.execTerminal(ctx, id, cmd, attach)
	}
	cm, err := p.daemon.Command(ctx, id, agentjail.CommandOptions{Cmd: cmd, Stdin: attach.Stdin() != nil})
	if err != nil {
		return err
	}
	defer cm.Close()
	if in := attach.Stdin(); in != nil {
		go func() {
			if _, err := io.Copy(cm, in); err == nil {
				_ = cm.CloseStdin(ctx)
			}
		}()
	}
	code, err := copyCommand(ctx, cm, attach)
	if err != nil {
		return err
	}
	return exitError(code)
}

// copyCommand copies a command's output to attach's stdout and stderr
// until it exits, and returns its exit code.
func copyCommand(ctx context.Context, cm *agentjail.Command, attach api.AttachIO) (int, error) {
	out, errw := attach.Stdout(), attach.Stderr()
	for {
		stream, data, err := cm.Next(ctx)
		if errors.Is(err, io.EOF) {
			exit, _ := cm.Exit()
			return exit.Code, nil
		}
		if err != nil {
			return 0, err
		}
		w := out
		if stream == agentjail.Stderr && errw != nil {
			w = errw
		}
		if w != nil {
			if _, err := w.Write(data); err != nil {
				return 0, err
			}
		}
	}
}

// execTerminal runs cmd on a terminal of the jail, following the client's
// window size.
func (p *Provider) execTerminal(ctx context.Context, id string, cmd []string, attach api.AttachIO) error {
	opts := agentjail.TerminalOptions{Cmd: cmd}
	resize := attach.Resize()
	// The first size arrives right after the stream opens.
	select {
	case sz, ok := <-resize:
		if ok {
			opts.Rows, opts.Cols = int(sz.Height), int(sz.Width)
		}
	default:
	}
	t, err := p.daemon.Terminal(ctx, id, opts)
	if err != nil {
		return err
	}
	defer t.Close()
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		wg.Wait()
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case sz, ok := <-resize:
				if !ok {
					return
				}
				_ = t.Resize(ctx, int(sz.Height), int(sz.Width))
			}
		}
	}()
	if in := attach.Stdin(); in != nil {
		go func() { _, _ = io.Copy(t, in) }()
	}
	if out := attach.Stdout(); out != nil {
		_, err = io.Copy(out, t)
	} else {
		_, err = io.Copy(io.Discard, t)
	}
	if exit, ok := t.Exit(); ok {
		return exitError(exit.Code)
	}
	return err
}

// AttachToContainer attaches to the container's running command
// (`kubectl attach`): its output from now on, until it exits. The command
// has no stdin and no terminal.
func (p *Provider) AttachToContainer(ctx context.Context, namespace, name, container string, attach api.AttachIO) error {
	_, id, pid, err := p.running(namespace, name, container)
	if err != nil {
		return err
	}
	if attach.TTY() {
		return vkerrdefs.InvalidInput("the container's command has no terminal: attach without -t")
	}
	cm, err := p.daemon.AttachCommand(ctx, id, pid)
	if err != nil {
		return err
	}
	defer cm.Close()
	code, err := copyCommand(ctx, cm, attach)
	if err != nil {
		return err
	}
	return exitError(code)
}

// GetContainerLogs reads the container's log (`kubectl logs`).
func (p *Provider) GetContainerLogs(ctx context.Context, namespace, name, container string, opts api.ContainerLogOpts) (io.ReadCloser, error) {
	r := p.get(podKey(namespace, name))
	if r == nil {
		return nil, vkerrdefs.NotFoundf("pod %s/%s is not on this node", namespace, name)
	}
	if container != "" && container != r.pod.Spec.Containers[0].Name {
		return nil, vkerrdefs.NotFoundf("pod %s/%s has no container %q", namespace, name, container)
	}
	if opts.Previous {
		return nil, vkerrdefs.InvalidInput("--previous: the node keeps one log per container, across its restarts")
	}
	return r.log.read(ctx, opts), nil
}

// GetStatsSummary is not served: agentjail reports a jail's usage in its
// own API (GET /jails/{id}).
func (p *Provider) GetStatsSummary(context.Context) (*statsv1alpha1.Summary, error) {
	return nil, vkerrdefs.InvalidInput("agentjail nodes do not serve the kubelet stats summary; see GET /jails/{id} of the node's daemon")
}

// GetMetricsResource is not served either (see GetStatsSummary).
func (p *Provider) GetMetricsResource(context.Context) ([]*dto.MetricFamily, error) {
	return nil, vkerrdefs.InvalidInput("agentjail nodes do not serve kubelet resource metrics")
}

// PortForward is not served: reach a jail's ports through its previews.
func (p *Provider) PortForward(_ context.Context, namespace, name string, port int32, _ io.ReadWriteCloser) error {
	return vkerrdefs.InvalidInputf("pod %s/%s port %d: agentjail nodes do not forward ports; use the daemon's previews", namespace, name, port)
}
