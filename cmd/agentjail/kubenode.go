package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"time"
)

// kubeAgentName is the node agent's program: the Kubernetes parts are a
// binary of their own (module kube/), so the daemon does not link them.
const kubeAgentName = "agentjail-kube"

// Bounds of the node agent's restarts: the wait after an exit doubles from
// the first to the last.
const (
	kubeAgentFirstWait = time.Second
	kubeAgentLastWait  = 30 * time.Second
	// kubeAgentStopGrace is how long a stopping daemon waits for its node
	// agent after SIGTERM before it kills it.
	kubeAgentStopGrace = 10 * time.Second
)

// kubeNodeFlags are serve's --kube-node options.
type kubeNodeFlags struct {
	name       string
	kubeconfig string
	args       []string
}

// findKubeAgent returns the agentjail-kube beside the running agentjail,
// else the one on PATH.
func findKubeAgent() (string, error) {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), kubeAgentName)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	if p, err := exec.LookPath(kubeAgentName); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("--kube-node needs %s, the node agent, beside agentjail or on PATH: none found (build it with `make kube`, which puts it at bin/%s)", kubeAgentName, kubeAgentName)
}

// kubeAgent runs `agentjail-kube node` for this daemon, as its child,
// until the daemon stops, starting it again when it exits.
type kubeAgent struct {
	bin  string
	args []string
	log  *slog.Logger
	done chan struct{}
}

// startKubeAgent starts the node agent of the daemon that listens on
// bound with data dir dataDir; it stops when ctx ends (wait for it with
// wait).
func startKubeAgent(ctx context.Context, f kubeNodeFlags, bin, dataDir, bound string, log *slog.Logger) *kubeAgent {
	args := []string{"node", "--name", f.name, "--data-dir", dataDir, "--agentjail-url", "http://" + reachable(bound)}
	if f.kubeconfig != "" {
		args = append(args, "--kubeconfig", f.kubeconfig)
	}
	args = append(args, f.args...)
	a := &kubeAgent{bin: bin, args: args, log: log.With("node", f.name), done: make(chan struct{})}
	go a.supervise(ctx)
	return a
}

// reachable is the address a local client dials for a listener bound to
// addr: the loopback address when it is bound to every address.
func reachable(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		return net.JoinHostPort("127.0.0.1", port)
	}
	return addr
}

// wait returns once the node agent has stopped.
func (a *kubeAgent) wait() { <-a.done }

// supervise runs the node agent until ctx ends.
func (a *kubeAgent) supervise(ctx context.Context) {
	defer close(a.done)
	wait := kubeAgentFirstWait
	for {
		start := time.Now()
		err := a.run(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > 2*kubeAgentLastWait {
			wait = kubeAgentFirstWait
		}
		a.log.Error("the Kubernetes node agent exited; starting it again", "err", err, "in", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, kubeAgentLastWait)
	}
}

// run runs the node agent once, until it exits or ctx ends (then SIGTERM,
// and SIGKILL after kubeAgentStopGrace).
func (a *kubeAgent) run(ctx context.Context) error {
	// The agent dies with the daemon (Pdeathsig, which follows the thread
	// that started it: this goroutine keeps that thread until the agent
	// is gone). A daemon killed outright leaves its node's lease to go
	// stale, as a lost host would.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd := exec.Command(a.bin, a.args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	a.log.Info("Kubernetes node agent started", "pid", cmd.Process.Pid, "cmd", a.bin)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err == nil {
			err = errors.New("exit status 0")
		}
		return err
	case <-ctx.Done():
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(kubeAgentStopGrace)
	defer t.Stop()
	select {
	case err := <-exited:
		return err
	case <-t.C:
		_ = cmd.Process.Kill()
		return <-exited
	}
}
