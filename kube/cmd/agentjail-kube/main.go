// Command agentjail-kube connects agentjail to Kubernetes:
//
//	agentjail-kube node      run an agentjail daemon's jails as a Kubernetes node
//	agentjail-kube operator  serve the Sandbox API and watch agentjail nodes' leases
//	agentjail-kube gateway   the daemons' API for every jail of the cluster
//
// `agentjail serve --kube-node NAME` starts `agentjail-kube node` beside the
// daemon; run it yourself to keep the two apart.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	agentjail "github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/kube/api/v1alpha1"
	"github.com/agentjail/agentjail/kube/gateway"
	"github.com/agentjail/agentjail/kube/node"
	"github.com/agentjail/agentjail/kube/nodelease"
	"github.com/agentjail/agentjail/kube/sandbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := &cobra.Command{Use: "agentjail-kube", Short: "agentjail in a Kubernetes cluster", SilenceUsage: true}
	root.AddCommand(nodeCmd(), operatorCmd(), gatewayCmd())
	if err := root.ExecuteContext(ctx); err != nil {
		os.Exit(1)
	}
}

// daemonFlags locate the agentjail daemon: its URL and token, or its data
// dir (daemon.addr and api-token in it).
type daemonFlags struct {
	url, token, dataDir string
}

func (d *daemonFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&d.dataDir, "data-dir", "/var/lib/agentjail", "the daemon's data dir: its address and API token are read from it")
	cmd.Flags().StringVar(&d.url, "agentjail-url", "", "the daemon's API (default: from DATA_DIR/daemon.addr)")
	cmd.Flags().StringVar(&d.token, "agentjail-token", "", "the daemon's API token (default: AGENTJAIL_TOKEN, else DATA_DIR/api-token)")
}

func (d *daemonFlags) client() (*agentjail.Client, error) {
	u, tok := d.url, d.token
	if u == "" {
		b, err := os.ReadFile(filepath.Join(d.dataDir, "daemon.addr"))
		if err != nil {
			return nil, fmt.Errorf("--agentjail-url not given and the daemon's address is unknown: %w", err)
		}
		u = "http://" + strings.TrimSpace(string(b))
	}
	if tok == "" {
		tok = os.Getenv("AGENTJAIL_TOKEN")
	}
	if tok == "" {
		b, err := os.ReadFile(filepath.Join(d.dataDir, "api-token"))
		if err != nil {
			return nil, fmt.Errorf("--agentjail-token not given: %w", err)
		}
		tok = strings.TrimSpace(string(b))
	}
	return agentjail.New(u, tok), nil
}

// restConfig loads kubeconfig (default: in-cluster, else KUBECONFIG).
func restConfig(kubeconfig string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	return cfg, nil
}

func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := restConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

func operatorCmd() *cobra.Command {
	var (
		kubeconfig, metricsAddr, probeAddr, clusterDomain, snapshotRegistry string
		leaderElect                                                         bool
		grace                                                               time.Duration
	)
	cmd := &cobra.Command{
		Use:   "operator",
		Short: "serve the agent-sandbox Sandbox API on agentjail nodes and watch the nodes' leases",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := slog.New(slog.NewTextHandler(os.Stderr, nil))
			ctrl.SetLogger(logr.FromSlogHandler(log.Handler()))
			cfg, err := restConfig(kubeconfig)
			if err != nil {
				return err
			}
			scheme := runtime.NewScheme()
			if err := clientgoscheme.AddToScheme(scheme); err != nil {
				return err
			}
			if err := v1alpha1.AddToScheme(scheme); err != nil {
				return err
			}
			mgr, err := ctrl.NewManager(cfg, ctrl.Options{
				Scheme:                 scheme,
				Metrics:                metricsserver.Options{BindAddress: metricsAddr},
				HealthProbeBindAddress: probeAddr,
				LeaderElection:         leaderElect,
				LeaderElectionID:       "agentjail-operator",
			})
			if err != nil {
				return err
			}
			if err := sandbox.CheckRepository(snapshotRegistry); err != nil {
				return fmt.Errorf("--snapshot-registry: %w", err)
			}
			if err := (&sandbox.Reconciler{Client: mgr.GetClient(), Scheme: scheme, ClusterDomain: clusterDomain, SnapshotRegistry: snapshotRegistry}).SetupWithManager(mgr); err != nil {
				return err
			}
			cs, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return err
			}
			wd := &nodelease.Watchdog{Client: cs, Grace: grace, Log: log}
			if err := mgr.Add(manager.RunnableFunc(wd.Run)); err != nil {
				return err
			}
			if probeAddr != "0" {
				if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
					return err
				}
				if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
					return err
				}
			}
			log.Info("operator starting")
			return mgr.Start(cmd.Context())
		},
	}
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the cluster (default: in-cluster, else KUBECONFIG)")
	cmd.Flags().StringVar(&metricsAddr, "metrics-addr", "0", `address of the Prometheus metrics ("0": none)`)
	cmd.Flags().StringVar(&probeAddr, "health-addr", "0", `address of /healthz and /readyz ("0": none)`)
	cmd.Flags().StringVar(&clusterDomain, "cluster-domain", "cluster.local", "the cluster's DNS domain (for status.serviceFQDN)")
	cmd.Flags().BoolVar(&leaderElect, "leader-elect", false, "elect one active operator among replicas")
	cmd.Flags().DurationVar(&grace, "node-grace", 40*time.Second, "how long an agentjail node's lease may go unrenewed before its Pods are failed")
	cmd.Flags().StringVar(&snapshotRegistry, "snapshot-registry", "", "the OCI repository (registry/repository) every node's daemon reaches, through which branches of Sandboxes move between nodes (none: branch requests are refused)")
	return cmd
}

func nodeCmd() *cobra.Command {
	var (
		d               daemonFlags
		o               node.Options
		kubeconfig, dir string
	)
	cmd := &cobra.Command{
		Use:   "node",
		Short: "register the daemon as a Kubernetes node whose Pods are jails",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Name == "" {
				return errors.New("--name is required")
			}
			var err error
			if o.Daemon, err = d.client(); err != nil {
				return err
			}
			cfg, err := restConfig(kubeconfig)
			if err != nil {
				return err
			}
			if o.Client, err = kubernetes.NewForConfig(cfg); err != nil {
				return err
			}
			if o.Dynamic, err = dynamic.NewForConfig(cfg); err != nil {
				return err
			}
			if o.API == "" {
				o.API = o.Daemon.BaseURL
			}
			o.Dir = dir
			if o.Dir == "" {
				o.Dir = filepath.Join(d.dataDir, "kube-node")
			}
			o.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
			return node.Run(cmd.Context(), o)
		},
	}
	d.add(cmd)
	cmd.Flags().StringVar(&o.Name, "name", "", "the Node's name")
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the cluster (default: in-cluster, else KUBECONFIG)")
	cmd.Flags().StringVar(&dir, "dir", "", "where the node keeps container logs (default DATA_DIR/kube-node)")
	cmd.Flags().StringVar(&o.Listen, "listen", ":10250", "address of the kubelet API (logs, exec, attach)")
	cmd.Flags().StringVar(&o.Address, "address", "", "the node's InternalIP, which the apiserver dials for the kubelet API")
	cmd.Flags().StringVar(&o.ClientCA, "client-ca", "", "CA file of the apiserver's kubelet client certificate (--kubelet-client-certificate)")
	cmd.Flags().IntVar(&o.MaxPods, "max-pods", 110, "how many Pods the node takes")
	cmd.Flags().DurationVar(&o.SnapshotGC, "snapshot-gc-interval", 30*time.Second, "how often the node deletes pause snapshots no Sandbox records any more")
	cmd.Flags().DurationVar(&o.SnapshotGrace, "snapshot-gc-grace", time.Minute, "how old such a snapshot must be to be deleted")
	cmd.Flags().StringVar(&o.API, "advertise-api", "", "the daemon's API URL as the cluster's gateway reaches it (default --agentjail-url)")
	return cmd
}

func gatewayCmd() *cobra.Command {
	var kubeconfig, listen string
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "serve the agentjail API, the E2B-compatible API and the web console for every jail of the cluster, forwarding to the jail's node",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := slog.New(slog.NewTextHandler(os.Stderr, nil))
			cs, err := kubeClient(kubeconfig)
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			srv := &http.Server{Handler: gateway.New(cs, log), ReadHeaderTimeout: 30 * time.Second}
			go func() {
				<-cmd.Context().Done()
				_ = srv.Close()
			}()
			log.Info("gateway listening", "addr", "http://"+ln.Addr().String())
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the cluster (default: in-cluster, else KUBECONFIG)")
	cmd.Flags().StringVar(&listen, "listen", ":8080", "address of the gateway's API")
	return cmd
}
