package kubetest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	agentjail "github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/internal/testenv"
)

// Binaries are the programs the nodes run, built by Build.
type Binaries struct {
	// Agentjail is cmd/agentjail, AgentjailKube kube/cmd/agentjail-kube.
	Agentjail, AgentjailKube string
}

// Build builds agentjail and agentjail-kube into dir. kubeDir is the kube
// module's root.
func Build(kubeDir, dir string) (*Binaries, error) {
	b := &Binaries{Agentjail: filepath.Join(dir, "agentjail"), AgentjailKube: filepath.Join(dir, "agentjail-kube")}
	for _, s := range []struct{ dir, pkg, out string }{
		{filepath.Join(kubeDir, ".."), "./cmd/agentjail", b.Agentjail},
		{kubeDir, "./cmd/agentjail-kube", b.AgentjailKube},
	} {
		cmd := exec.Command("go", "build", "-o", s.out, s.pkg)
		cmd.Dir = s.dir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("building %s: %w\n%s", s.pkg, err, out)
		}
	}
	return b, nil
}

// Node is one agentjail node: a daemon on its own data dir and jail
// network, and `agentjail-kube node` registering it with the cluster.
type Node struct {
	Name    string
	DataDir string
	// Daemon is a client of the node's daemon.
	Daemon *agentjail.Client
	// DaemonURL and Token reach the daemon's API.
	DaemonURL, Token string

	bins   *Binaries
	daemon *Process
	agent  *Process
}

var listeningRE = regexp.MustCompile(`agentjail: listening on http://(\S+)`)

// Agent says how a node's agent runs.
type Agent int

const (
	// SeparateAgent: `agentjail-kube node` beside the daemon, as the
	// chart's DaemonSet runs it.
	SeparateAgent Agent = iota
	// ServeKubeNode: `agentjail serve --kube-node NAME --kubeconfig F`,
	// whose daemon runs the agent as its child.
	ServeKubeNode
)

// StartNode starts node n (0-9) of the test: its daemon (interfaces kN*,
// jail network 10.(230+N).0.0/16, serveFlags added to its command line)
// and its node agent as agent says, and waits until the Node is Ready.
// Everything is stopped and the data dir torn down when the test ends.
func StartNode(t testing.TB, c *Cluster, bins *Binaries, name string, n int, agent Agent, serveFlags ...string) *Node {
	t.Helper()
	testenv.RequireRoot(t)
	dir, err := os.MkdirTemp("", "agentjail-kube-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	nd := &Node{Name: name, DataDir: dir, bins: bins}
	// The nodes share one API token, as a cluster install gives them from
	// a Secret: the gateway passes the caller's token through.
	if err := os.WriteFile(filepath.Join(dir, "api-token"), []byte(c.AgentjailToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := nd.shutdown(); err != nil {
			t.Errorf("node %s: %v", name, err)
		}
		if t.Failed() {
			t.Logf("node %s logs: %s.log, %s.node.log", name, dir, dir)
		}
	})
	nodeArgs := []string{"--listen", "127.0.0.1:0", "--address", "127.0.0.1", "--client-ca", c.KubeletClientCA,
		"--snapshot-gc-interval", "1s", "--snapshot-gc-grace", "20s"}
	var serveArgs []string
	if agent == ServeKubeNode {
		serveArgs = []string{"--kube-node", name, "--kubeconfig", c.Kubeconfig}
		for _, a := range nodeArgs {
			serveArgs = append(serveArgs, "--kube-node-arg="+a)
		}
	}
	if err := nd.startDaemon(n, append(serveArgs, serveFlags...)...); err != nil {
		t.Fatalf("node %s: %v", name, err)
	}
	if agent == SeparateAgent {
		nd.agent, err = spawn(dir+".node.log", nil, bins.AgentjailKube,
			append([]string{"node", "--name", name, "--data-dir", dir, "--kubeconfig", c.Kubeconfig}, nodeArgs...)...)
		if err != nil {
			t.Fatal(err)
		}
	}
	c.WaitNodeReady(t, name, 2*time.Minute)
	return nd
}

// AgentPid is the pid of the node agent the daemon runs as its child
// (ServeKubeNode), 0 when there is none.
func (nd *Node) AgentPid() int {
	if nd.daemon == nil {
		return 0
	}
	ppid := strconv.Itoa(nd.daemon.Cmd.Process.Pid)
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 1 && f[1] == ppid && strings.Contains(string(b[:i]), "(agentjail-kube") {
			return pid
		}
	}
	return 0
}

// startDaemon runs `agentjail serve` on the node's data dir, with extra
// arguments.
func (nd *Node) startDaemon(n int, extra ...string) error {
	ready := make(chan string, 1)
	p, err := spawn(nd.DataDir+".log", func(line string) {
		if m := listeningRE.FindStringSubmatch(line); m != nil {
			select {
			case ready <- m[1]:
			default:
			}
		}
	}, nd.bins.Agentjail, append([]string{"serve", "--data-dir", nd.DataDir, "--addr", "127.0.0.1:0",
		"--net-prefix", fmt.Sprintf("k%d", n), "--subnet", fmt.Sprintf("10.%d.0.0/16", 230+n), "--warm-jails", "0"},
		extra...)...)
	if err != nil {
		return err
	}
	nd.daemon = p
	select {
	case addr := <-ready:
		nd.DaemonURL = "http://" + addr
	case <-p.Exited():
		b, _ := os.ReadFile(p.Log)
		return fmt.Errorf("the daemon exited before listening; log:\n%s", tail(string(b), 40))
	case <-time.After(2 * time.Minute):
		return fmt.Errorf("the daemon did not listen within 2 minutes")
	}
	tok, err := os.ReadFile(filepath.Join(nd.DataDir, "api-token"))
	if err != nil {
		return err
	}
	nd.Token = strings.TrimSpace(string(tok))
	nd.Daemon = agentjail.New(nd.DaemonURL, nd.Token)
	return nil
}

// KillDaemon SIGKILLs the node's daemon and its node agent, as a host
// that dies would lose both.
func (nd *Node) KillDaemon() {
	if nd.agent != nil {
		nd.agent.Kill()
	}
	if nd.daemon != nil {
		nd.daemon.Kill()
	}
}

// shutdown stops the node agent and the daemon, tears the data dir down
// (`agentjail teardown`, which removes every jail, mount, cgroup and
// interface of it) and removes it.
func (nd *Node) shutdown() error {
	if nd.agent != nil {
		nd.agent.Stop()
	}
	if nd.daemon != nil {
		nd.daemon.Stop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, nd.bins.Agentjail, "teardown", "--data-dir", nd.DataDir).CombinedOutput(); err != nil {
		return fmt.Errorf("agentjail teardown: %w\n%s", err, out)
	}
	return os.RemoveAll(nd.DataDir)
}

// StartGateway runs `agentjail-kube gateway` until the test ends and
// returns its URL.
func StartGateway(t testing.TB, c *Cluster, bins *Binaries) string {
	t.Helper()
	ready := make(chan string, 1)
	p, err := spawn(filepath.Join(c.Dir, "gateway.log"), func(line string) {
		if m := gatewayRE.FindStringSubmatch(line); m != nil {
			select {
			case ready <- m[1]:
			default:
			}
		}
	}, bins.AgentjailKube, "gateway", "--kubeconfig", c.Kubeconfig, "--listen", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	select {
	case u := <-ready:
		return u
	case <-p.Exited():
		t.Fatalf("the gateway exited; log in %s", p.Log)
	case <-time.After(time.Minute):
		t.Fatal("the gateway did not listen within a minute")
	}
	return ""
}

var gatewayRE = regexp.MustCompile(`gateway listening" addr=(\S+)`)
