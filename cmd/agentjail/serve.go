package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentjail/agentjail/internal/agent"
	"github.com/agentjail/agentjail/internal/api"
	"github.com/agentjail/agentjail/internal/apikey"
	"github.com/agentjail/agentjail/internal/atomicfile"
	"github.com/agentjail/agentjail/internal/audit"
	"github.com/agentjail/agentjail/internal/backend/gvisor"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/console"
	"github.com/agentjail/agentjail/internal/e2b"
	"github.com/agentjail/agentjail/internal/jail"
	"github.com/agentjail/agentjail/internal/mcptools"
	"github.com/agentjail/agentjail/internal/metrics"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/preview"
	"github.com/agentjail/agentjail/internal/telemetry"
	"github.com/agentjail/agentjail/internal/tenant"
	"github.com/agentjail/agentjail/internal/timerslack"
)

// The jail manager is what the E2B-compatible surface runs on.
var (
	_ e2b.Jails  = (*jail.Manager)(nil)
	_ e2b.Images = (*jail.Manager)(nil)
)

// shutdownGrace is how long a stopping daemon waits for requests in
// flight before closing their connections (which cancels their commands).
const shutdownGrace = 10 * time.Second

// maxWarmJails bounds serve --warm-jails and --warm-max.
const maxWarmJails = 256

// defaultWarmMax is serve --warm-max's default: a burst of 64 creates
// finds its jails ready the next time.
const defaultWarmMax = 64

func newServeCmd(g *globals) *cobra.Command {
	var poolSize, toolsDir, secretsFile, mdnsIface, e2bDomain string
	var mdnsOn bool
	var lv levelFlags
	var warmJails, warmMax int
	var net netFlags
	var insecureRegistries []string
	var profileCache, debianMirror string
	var metricsAddr, otlpEndpoint string
	var kn kubeNodeFlags
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the daemon",
		Long: `Run the daemon: the jail manager, its REST API, and the web console at /
(log in with the API token).

On first start it writes a random API token to DATA_DIR/api-token (mode 0600).
Once listening it prints "agentjail: listening on http://HOST:PORT" to stderr
and writes HOST:PORT to DATA_DIR/daemon.addr (so --addr 127.0.0.1:0 works).
SIGINT or SIGTERM stop it; running jails keep running and are adopted by the
next start.

With --kube-node NAME the daemon is also a Kubernetes node (docs/kubernetes.md):
it runs the node agent, agentjail-kube node (found beside agentjail, else on
PATH), as its child once listening, starts it again if it exits, and stops it
when it stops.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var pool int64
			if poolSize != "" {
				n, err := parseSize(poolSize)
				if err != nil {
					return usageError{fmt.Errorf("--pool-size: %w", err)}
				}
				pool = n
			}
			if warmJails < 0 || warmJails > maxWarmJails {
				return usageError{fmt.Errorf("--warm-jails: %d is not between 0 and %d", warmJails, maxWarmJails)}
			}
			if !cmd.Flags().Changed("warm-max") {
				warmMax = max(warmJails, defaultWarmMax)
			}
			if warmMax < warmJails || warmMax > maxWarmJails {
				return usageError{fmt.Errorf("--warm-max: %d is not between --warm-jails (%d) and %d", warmMax, warmJails, maxWarmJails)}
			}
			// Before anything is opened: the daemon runs on as a new
			// program image (same pid), whose threads and children
			// (runc, init, the shims) have the coarse timer slack.
			if err := timerslack.Reexec(); err != nil {
				slog.Warn("timer slack", "err", err)
			}
			opts := jail.Options{DataDir: g.dataDirPath(), Backends: lv.factories(), PoolSize: pool, WarmJails: warmJails, WarmMax: warmMax,
				AllowHostNetwork: net.allowHost, Subnet: net.subnet, NetPrefix: net.prefix}
			opts.Registries.Insecure = insecureRegistries
			opts.ProfileCache, opts.DebianMirror = profileCache, debianMirror
			if net.hostsFile != "" {
				hosts, err := readHostsFile(net.hostsFile)
				if err != nil {
					return usageError{fmt.Errorf("--hosts-file: %w", err)}
				}
				opts.Hosts = hosts
			}
			if err := checkE2BDomain(e2bDomain); err != nil {
				return usageError{fmt.Errorf("--e2b-domain: %w", err)}
			}
			do := daemonOptions{toolsDir: toolsDir, e2bDomain: e2bDomain, secretsFile: secretsFile, mdns: mdnsOn, mdnsIface: mdnsIface, metricsAddr: metricsAddr, otlpEndpoint: otlpEndpoint, kubeNode: kn}
			if kn.name == "" && (kn.kubeconfig != "" || len(kn.args) > 0) {
				return usageError{errors.New("--kubeconfig and --kube-node-arg go with --kube-node NAME")}
			}
			if kn.name != "" {
				bin, err := findKubeAgent()
				if err != nil {
					return err
				}
				do.kubeAgent = bin
			}
			return serve(cmd.Context(), opts, g.listenAddr(), do)
		},
	}
	cmd.Flags().StringVar(&lv.runtime, "runtime", "runc", "OCI runtime binary")
	cmd.Flags().StringVar(&lv.runsc, "runsc", "", "runsc binary of the gvisor level (default "+gvisor.DefaultRunsc+", built by make gvisor)")
	cmd.Flags().BoolVar(&lv.unsafeNone, "unsafe-none-level", false, "UNSAFE, development only: offer isolation level none, whose jails are unconfined processes of the daemon's user on the host")
	cmd.Flags().StringSliceVar(&insecureRegistries, "insecure-registry", nil, "a registry (host:port) that image pulls may reach over plain HTTP (repeatable); credentials for others come from ~/.docker/config.json")
	cmd.Flags().StringVar(&e2bDomain, "e2b-domain", "", "answer E2B's sandbox host names PORT-ID.DOMAIN (the SDK's getHost) for this domain, e.g. localhost:8082 or sandbox.example.com behind a wildcard DNS name; as on E2B a sandbox's ports are then public unless created with allowPublicTraffic: false (default: none, the SDK reaches ports by header)")
	cmd.Flags().BoolVar(&mdnsOn, "mdns", false, "answer mDNS for JAIL.sandbox.local and PORT-JAIL.sandbox.local with this host's address, for previews from the LAN (listen with --addr 0.0.0.0:PORT)")
	cmd.Flags().StringVar(&mdnsIface, "mdns-iface", "", "the interface mDNS answers on and whose address it gives (default: every interface)")
	cmd.Flags().StringVar(&toolsDir, "tools-dir", "", "where agent CLIs are installed, one read-only tree per version shared by all jails (default DATA_DIR/tools)")
	cmd.Flags().StringVar(&secretsFile, "secrets-file", "", "KEY=VALUE file (mode 0600) of the model API keys the proxy adds for agents, e.g. ANTHROPIC_API_KEY (default DATA_DIR/secrets.env; the daemon's environment is read too)")
	cmd.Flags().StringVar(&lv.criu, "criu", "", "CRIU binary for process snapshots (default: /usr/local/sbin/criu, else criu on PATH; without a working one only fs snapshots are available)")
	cmd.Flags().BoolVar(&lv.shareBranchMemory, "share-branch-memory", false, "let jails restored from snapshots (restores, branches) share the memory pages they hold alike, copy-on-write, through the kernel's same-page merging (ksmd, started at the first restore; host-wide): it saves memory, but one restored jail can then tell by timing whether another holds a page it guesses, so use it only when every jail on this host may learn that of the others")
	cmd.Flags().StringVar(&poolSize, "pool-size", "", "size of the storage pool image, e.g. 64g (default: 64 GiB or 90% of the free space)")
	cmd.Flags().StringVar(&otlpEndpoint, "otlp-endpoint", "", "export traces of API calls and the jails' events (as logs) over OTLP/HTTP to this collector, e.g. http://127.0.0.1:4318 (default: no export)")
	cmd.Flags().StringVar(&metricsAddr, "metrics-addr", "", "also serve the Prometheus metrics without a credential at http://ADDR/metrics (e.g. 127.0.0.1:9108); GET /metrics on the API takes an admin key or the token")
	cmd.Flags().IntVar(&warmJails, "warm-jails", 2, "how many started jails of the default configuration to keep ready: a create asking for that configuration takes one (0: none)")
	cmd.Flags().IntVar(&warmMax, "warm-max", defaultWarmMax, "how many ready jails the pool grows to after bursts of creates (the most created in ten seconds over the last five minutes); --warm-jails for a pool of fixed size")
	cmd.Flags().BoolVar(&net.allowHost, "allow-host-network", false, `allow jails with network mode "host" (they share the host's network, no policy applies)`)
	cmd.Flags().StringVar(&net.hostsFile, "hosts-file", "", "static name → address entries (hosts(5) format) the jails' DNS answers before the host's resolver")
	cmd.Flags().StringVar(&net.subnet, "subnet", "", "the jail network (default 10.88.0.0/16; remembered in DATA_DIR/network.json)")
	cmd.Flags().StringVar(&kn.name, "kube-node", "", "also be the Kubernetes node NAME: run the node agent (agentjail-kube node) as the daemon's child")
	cmd.Flags().StringVar(&kn.kubeconfig, "kubeconfig", "", "with --kube-node: the cluster's kubeconfig (default: in-cluster, else KUBECONFIG)")
	cmd.Flags().StringArrayVar(&kn.args, "kube-node-arg", nil, "with --kube-node: one more flag for agentjail-kube node, e.g. --kube-node-arg=--advertise-api=http://10.0.0.5:8082 (repeatable)")
	cmd.Flags().StringVar(&net.prefix, "net-prefix", "", `prefix of the host interfaces and nftables table the daemon owns (default "aj"; remembered); a second daemon on one host needs its own prefix and subnet`)
	return cmd
}

// checkE2BDomain checks serve --e2b-domain: a host name, with an
// optional port ("" is none).
func checkE2BDomain(d string) error {
	if d == "" {
		return nil
	}
	host := d
	if h, p, err := net.SplitHostPort(d); err == nil {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("%q: the port must be a number (1-65535)", d)
		}
		host = h
	}
	_, err := config.NormalizeHost(host)
	return err
}

// netFlags are serve's network options.
type netFlags struct {
	allowHost bool
	hostsFile string
	subnet    string
	prefix    string
}

// readHostsFile parses hosts(5) lines: an address followed by names.
func readHostsFile(path string) (map[string][]netip.Addr, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	hosts := map[string][]netip.Addr{}
	for i, line := range strings.Split(string(data), "\n") {
		if j := strings.IndexByte(line, '#'); j >= 0 {
			line = line[:j]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		addr, err := netip.ParseAddr(f[0])
		if err != nil || len(f) < 2 {
			return nil, fmt.Errorf("line %d: want an address followed by names", i+1)
		}
		for _, name := range f[1:] {
			name = strings.ToLower(name)
			hosts[name] = append(hosts[name], addr)
		}
	}
	return hosts, nil
}

// daemonOptions are serve's options beyond the jail manager's.
type daemonOptions struct {
	toolsDir, secretsFile string
	// e2bDomain, when set, is the domain of the E2B sandbox host names.
	e2bDomain string
	mdns      bool
	mdnsIface string
	// metricsAddr, when set, serves /metrics there without a credential.
	metricsAddr string
	// otlpEndpoint, when set, receives traces and event logs over OTLP.
	otlpEndpoint string
	// kubeNode, when named, makes the daemon a Kubernetes node through
	// the node agent kubeAgent.
	kubeNode  kubeNodeFlags
	kubeAgent string
}

// daemon is the API's Service: the jail manager, whose creates and
// destroys go through the agent service (agent and workspace sections).
type daemon struct {
	*jail.Manager
	agents *agent.Service
}

func (d daemon) Create(ctx context.Context, req model.CreateRequest) (*model.Jail, error) {
	return d.agents.Create(ctx, req)
}

func (d daemon) Destroy(ctx context.Context, ref string) error { return d.agents.Destroy(ctx, ref) }

// serve runs the daemon until ctx is cancelled.
func serve(ctx context.Context, opts jail.Options, addr string, do daemonOptions) error {
	level := slog.LevelInfo
	if os.Getenv("AGENTJAIL_DEBUG") != "" {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	dataDir := opts.DataDir
	token, err := api.EnsureToken(dataDir)
	if err != nil {
		return err
	}
	keys, err := apikey.Open(dataDir)
	if err != nil {
		return err
	}
	opts.Logger = log
	if opts.Quotas, err = tenant.OpenQuotas(dataDir); err != nil {
		return err
	}
	auditLog, err := audit.Open(filepath.Join(dataDir, audit.FileName), 0)
	if err != nil {
		return err
	}
	defer auditLog.Close()
	if do.secretsFile == "" {
		do.secretsFile = filepath.Join(dataDir, "secrets.env")
	}
	secrets := agent.NewKeys(do.secretsFile, os.LookupEnv)
	if err := secrets.Check(); err != nil {
		log.Warn("model API keys", "err", err)
	}
	opts.Secrets = secrets.Lookup
	mets := metrics.New()
	opts.NetObserver = mets.Net
	if do.otlpEndpoint != "" {
		exp, err := telemetry.Setup(ctx, do.otlpEndpoint, jail.Version)
		if err != nil {
			return usageError{err}
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := exp.Shutdown(sctx); err != nil {
				log.Warn("flushing the OTLP export", "err", err)
			}
		}()
		opts.EventLogs = exp.JailEvents
		log.Info("exporting traces and jail events", "otlp", do.otlpEndpoint)
	}
	// The addresses first: one in use fails the start at once, before
	// the manager takes the data dir and starts its jails.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	defer ln.Close()
	if do.metricsAddr != "" {
		stop, err := serveMetrics(do.metricsAddr, mets, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	mgr, err := jail.NewManager(ctx, opts)
	if err != nil {
		return err
	}
	defer func() {
		if err := mgr.Close(); err != nil {
			log.Error("closing the jail manager", "err", err)
		}
	}()
	mets.Watch(mgr)
	absData, err := filepath.Abs(dataDir)
	if err != nil {
		return err
	}
	agents, err := agent.NewService(ctx, mgr, agent.Options{DataDir: absData, ToolsDir: do.toolsDir, Keys: secrets, Log: log})
	if err != nil {
		return err
	}
	defer agents.Close()
	svc := daemon{Manager: mgr, agents: agents}
	previews, err := preview.New(mgr, token, absData)
	if err != nil {
		return err
	}
	e2bSvc, err := e2b.New(ctx, mgr, e2b.Options{DataDir: dataDir, Keys: keys, AdminToken: token, Log: log, Audit: auditLog, Ports: previews, Domain: do.e2bDomain, Images: mgr,
		OtherHosts: func(h string) bool { _, ok := preview.ParseHost(h); return ok }})
	if err != nil {
		return err
	}
	defer e2bSvc.Close()
	if do.mdns {
		var o preview.MDNSOptions
		if do.mdnsIface != "" {
			if o.Iface, err = net.InterfaceByName(do.mdnsIface); err != nil {
				return fmt.Errorf("--mdns-iface: %w", err)
			}
		}
		responder, err := preview.StartMDNS(mgr, o)
		if err != nil {
			return err
		}
		defer responder.Close()
		log.Info("answering mDNS", "names", "JAIL."+preview.MDNSDomain+", PORT-JAIL."+preview.MDNSDomain)
	}
	h := api.NewServer(svc, token, log, api.WithKeys(keys), api.WithAgents(agents), api.WithImages(mgr), api.WithPreviews(previews),
		api.WithQuotas(mgr), api.WithAudit(auditLog), api.WithMetrics(mets),
		api.WithMCP(func(h http.Handler) http.Handler { return mcptools.Handler(h, jail.Version) }),
		api.WithMount(e2bSvc.Prefix()+"/", e2bSvc), api.WithMount("/files", e2bSvc), api.WithCommands(mgr))
	// The console serves its pages and sessions and hands every API route
	// to the API's handler; previews of jails' dev servers are answered
	// by their host name before either.
	root := console.New(console.Options{API: h, Log: log})
	// The node agent runs while the daemon serves.
	actx, stopAgent := context.WithCancel(ctx)
	var agent *kubeAgent
	started := func(bound string) {
		if do.kubeNode.name != "" {
			agent = startKubeAgent(actx, do.kubeNode, do.kubeAgent, absData, bound, log)
		}
	}
	err = listenAndServe(ctx, e2bSvc.WrapHosts(previews.Wrap(root)), ln, dataDir, log, os.Stderr, started)
	stopAgent()
	if agent != nil {
		agent.wait()
	}
	return err
}

// serveMetrics serves the metrics at http://addr/metrics until stop is
// called.
func serveMetrics(addr string, m *metrics.Metrics, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("serving the metrics", "err", err)
		}
	}()
	log.Info("serving metrics", "addr", "http://"+ln.Addr().String()+"/metrics")
	return func() { srv.Close() }, nil
}

// listenAndServe serves h on ln until ctx is cancelled. It first writes
// the bound HOST:PORT to DATA_DIR/daemon.addr (removed again on return)
// and announces it on stderr in one line; then it calls started (if set)
// with that address.
func listenAndServe(ctx context.Context, h http.Handler, ln net.Listener, dataDir string, log *slog.Logger, stderr io.Writer, started func(bound string)) error {
	bound := ln.Addr().String()
	addrPath := filepath.Join(dataDir, addrFile)
	if err := atomicfile.WriteFile(addrPath, []byte(bound+"\n"), 0o644); err != nil {
		return err
	}
	defer os.Remove(addrPath)

	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	fmt.Fprintf(stderr, "agentjail: listening on http://%s\n", bound)
	if started != nil {
		started(bound)
	}

	select {
	case err := <-done:
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("requests still running at shutdown; closing their connections", "err", err)
		srv.Close()
	}
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving: %w", err)
	}
	return nil
}
