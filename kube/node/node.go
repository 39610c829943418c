package node

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	vknode "github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	agentjail "github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/kube/api/v1alpha1"
)

// Taint is on every agentjail node: only Pods that tolerate it are placed
// there (key TaintKey, value TaintValue, effect NoSchedule).
const (
	TaintKey   = "virtual-kubelet.io/provider"
	TaintValue = "agentjail"
	// LabelNode marks agentjail nodes ("true").
	LabelNode = "agentjail.dev/node"
)

// Toleration is what a Pod carries to be placed on agentjail nodes.
func Toleration() corev1.Toleration {
	return corev1.Toleration{Key: TaintKey, Operator: corev1.TolerationOpEqual, Value: TaintValue, Effect: corev1.TaintEffectNoSchedule}
}

// Options configure a node.
type Options struct {
	// Name is the Node's name.
	Name string
	// Client reaches the cluster's apiserver.
	Client kubernetes.Interface
	// Daemon is the agentjail daemon whose jails run the node's Pods.
	Daemon *agentjail.Client
	// Dir keeps the node's files (container logs, its serving key).
	Dir string
	// Listen is the kubelet API's address (logs, exec, attach), e.g.
	// ":10250"; Address the node's InternalIP the apiserver dials.
	Listen, Address string
	// ClientCA is the PEM file of the CA that signs the apiserver's client
	// certificate for kubelets (--kubelet-client-certificate); the kubelet
	// API accepts no other client.
	ClientCA string
	// API is the daemon's URL as the cluster's gateway reaches it
	// (published as the Node's v1alpha1.AnnotationAPI).
	API string
	// Dynamic, when set, lets the node collect the pause snapshots no
	// Sandbox records any more, every SnapshotGC (default 30 s) once
	// older than SnapshotGrace (default 1 min).
	Dynamic                   dynamic.Interface
	SnapshotGC, SnapshotGrace time.Duration
	// MaxPods is the node's pod capacity (default 110).
	MaxPods int
	Log     *slog.Logger
}

// Run registers the node and runs it until ctx is done.
func Run(ctx context.Context, o Options) error {
	if o.Name == "" || o.Client == nil || o.Daemon == nil || o.Dir == "" || o.ClientCA == "" {
		return errors.New("node: Name, Client, Daemon, Dir and ClientCA are required")
	}
	if o.MaxPods == 0 {
		o.MaxPods = 110
	}
	if o.SnapshotGC == 0 {
		o.SnapshotGC = 30 * time.Second
	}
	if o.SnapshotGrace == 0 {
		o.SnapshotGrace = time.Minute
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	tlsConf, err := serverTLS(o)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("node: the kubelet API: %w", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()

	eb := record.NewBroadcaster()
	eb.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: o.Client.CoreV1().Events("")})
	defer eb.Shutdown()
	recorder := eb.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "agentjail-node", Host: o.Name})

	mux := http.NewServeMux()
	var prov *Provider
	n, err := nodeutil.NewNode(o.Name, func(cfg nodeutil.ProviderConfig) (nodeutil.Provider, vknode.NodeProvider, error) {
		if err := describeNode(ctx, cfg.Node, o, port); err != nil {
			return nil, nil, err
		}
		prov, err = NewProvider(ctx, o.Daemon, o.Name, o.Dir, o.Log, recorder)
		return prov, &daemonHealth{daemon: o.Daemon, node: cfg.Node}, err
	},
		nodeutil.WithClient(o.Client),
		nodeutil.AttachProviderRoutes(mux),
		func(c *nodeutil.NodeConfig) error {
			c.HTTPListenAddr = net.JoinHostPort(hostOf(o.Listen), strconv.Itoa(port))
			c.TLSConfig = tlsConf
			c.Handler = mux
			c.EventRecorder = recorder
			c.NumWorkers = 4
			c.InformerResyncPeriod = time.Minute
			return nil
		},
	)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	o.Log.Info("kubernetes node starting", "node", o.Name, "kubelet_api", net.JoinHostPort(o.Address, strconv.Itoa(port)))
	go func() {
		if err := n.WaitReady(ctx, 0); err == nil {
			o.Log.Info("kubernetes node ready", "node", o.Name)
		}
	}()
	if o.Dynamic != nil {
		go prov.collectSnapshots(ctx, o.Dynamic, o.SnapshotGC, o.SnapshotGrace)
	}
	return n.Run(ctx)
}

func hostOf(addr string) string {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	return h
}

// describeNode fills the Node object: capacity from the host, the taint,
// labels, addresses and the kubelet endpoint.
func describeNode(ctx context.Context, n *corev1.Node, o Options, port int) error {
	mem, err := memTotal()
	if err != nil {
		return err
	}
	h, err := o.Daemon.Health(ctx)
	if err != nil {
		return fmt.Errorf("node: the agentjail daemon does not answer: %w", err)
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(mem, resource.BinarySI),
		corev1.ResourcePods:   *resource.NewQuantity(int64(o.MaxPods), resource.DecimalSI),
	}
	n.Labels[LabelNode] = "true"
	if n.Annotations == nil {
		n.Annotations = map[string]string{}
	}
	n.Annotations[v1alpha1.AnnotationAPI] = o.API
	// As a kubelet labels its node: topology spread and affinity by
	// host work across agentjail nodes too.
	n.Labels[corev1.LabelHostname] = o.Name
	n.Labels[corev1.LabelOSStable] = "linux"
	n.Labels[corev1.LabelArchStable] = runtime.GOARCH
	n.Spec.Taints = []corev1.Taint{{Key: TaintKey, Value: TaintValue, Effect: corev1.TaintEffectNoSchedule}}
	n.Status.Capacity = capacity
	n.Status.Allocatable = capacity.DeepCopy()
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: o.Address}, {Type: corev1.NodeHostName, Address: o.Name}}
	n.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(port)
	n.Status.NodeInfo = corev1.NodeSystemInfo{
		OperatingSystem: "linux", Architecture: runtime.GOARCH,
		KubeletVersion:          "agentjail-" + h.Version,
		ContainerRuntimeVersion: "agentjail://" + h.Version,
	}
	return nil
}

// memTotal reads the host's memory from /proc/meminfo.
func memTotal() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("node: no MemTotal in /proc/meminfo")
}

// daemonHealth is the node's heartbeat: the node stays Ready, and its
// lease fresh, only while the daemon answers.
type daemonHealth struct {
	daemon *agentjail.Client
	node   *corev1.Node
}

var _ vknode.NodeProvider = (*daemonHealth)(nil)

// Ping asks the daemon for its health.
func (d *daemonHealth) Ping(ctx context.Context) error {
	_, err := d.daemon.Health(ctx)
	return err
}

// NotifyNodeStatus marks the node Ready once; the pings keep it so.
func (d *daemonHealth) NotifyNodeStatus(_ context.Context, cb func(*corev1.Node)) {
	n := d.node.DeepCopy()
	n.Status.Phase = corev1.NodeRunning
	for i := range n.Status.Conditions {
		c := &n.Status.Conditions[i]
		c.Status = corev1.ConditionFalse
		if c.Type == corev1.NodeReady {
			c.Status, c.Reason, c.Message = corev1.ConditionTrue, "KubeletReady", "the agentjail daemon answers"
		}
	}
	go cb(n)
}

// serverTLS is the kubelet API's TLS: a self-signed serving certificate
// made at start, and client certificates required, signed by o.ClientCA.
func serverTLS(o Options) (*tls.Config, error) {
	caPEM, err := os.ReadFile(o.ClientCA)
	if err != nil {
		return nil, fmt.Errorf("node: client CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("node: %s holds no PEM certificate", o.ClientCA)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: o.Name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{o.Name},
	}
	if ip := net.ParseIP(o.Address); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}, nil
}
