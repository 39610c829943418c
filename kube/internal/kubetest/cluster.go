// Package kubetest runs a real Kubernetes control plane for tests: etcd
// (its embed package, inside the test binary) and kube-apiserver and
// kube-scheduler built from the Go modules kube/go.mod pins
// (scripts/build-kube.sh builds them once per version), on 127.0.0.1;
// and agentjail nodes beside it: `agentjail serve` daemons, each with its
// own data dir and jail network, with `agentjail-kube node` registering
// it. There is no kube-controller-manager: what agentjail nodes need of
// one, agentjail's operator does (see docs/kubernetes.md).
//
// It is imported only by tests and benchmarks.
package kubetest

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/agentjail/agentjail/internal/testenv"
)

// BinDir is where scripts/build-kube.sh installs kube-apiserver,
// kube-scheduler, kubectl and helm (KUBE_BIN_DIR overrides it).
func BinDir() string {
	if d := os.Getenv("KUBE_BIN_DIR"); d != "" {
		return d
	}
	return "/var/cache/agentjail/kube/bin"
}

// Bin returns the path of one of the programs scripts/build-kube.sh
// builds; the test fails (skips without CI=true) when it is missing.
func Bin(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(BinDir(), name)
	if _, err := os.Stat(p); err != nil {
		testenv.Need(t, fmt.Sprintf("%s is not built (run scripts/build-kube.sh): %v", p, err))
	}
	return p
}

// Cluster is a running control plane.
type Cluster struct {
	// Config reaches the apiserver as a cluster administrator.
	Config *rest.Config
	// Client is a clientset over Config.
	Client kubernetes.Interface
	// Kubeconfig is a kubeconfig file holding Config, for processes
	// (agentjail nodes, the operator, kubectl, helm).
	Kubeconfig string
	// KubeletClientCA is the CA file of the certificate the apiserver
	// presents to kubelets (for logs, exec and attach).
	KubeletClientCA string
	// Dir holds the control plane's files and logs.
	Dir string
	// AgentjailToken is the API token every agentjail node of the
	// cluster shares.
	AgentjailToken string
}

// Start runs etcd, kube-apiserver and kube-scheduler until the test ends.
// Their logs are files in the test's temporary directory, named in the
// test log when the test fails.
func Start(t testing.TB) *Cluster {
	t.Helper()
	apiserver, scheduler := Bin(t, "kube-apiserver"), Bin(t, "kube-scheduler")
	dir := t.TempDir()
	c := &Cluster{Dir: dir, AgentjailToken: randomToken(t)}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("control plane logs: %s/*.log", dir)
		}
	})
	etcdURL := startEtcd(t, filepath.Join(dir, "etcd"), filepath.Join(dir, "etcd.log"))
	pki, err := makePKI(filepath.Join(dir, "pki"))
	if err != nil {
		t.Fatal(err)
	}
	c.KubeletClientCA = pki.ca
	token := randomToken(t)
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(token+",admin,admin,system:masters\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	startProcess(t, filepath.Join(dir, "kube-apiserver.log"), apiserver,
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", port),
		"--tls-cert-file="+pki.serverCert, "--tls-private-key-file="+pki.serverKey,
		"--client-ca-file="+pki.ca,
		"--token-auth-file="+tokens,
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+pki.saKey, "--service-account-signing-key-file="+pki.saKey,
		"--service-cluster-ip-range=10.96.0.0/16",
		// No controller-manager: nothing creates the default ServiceAccount
		// or lifts the not-ready taint, and the endpoint reconciler refuses
		// a loopback advertise address.
		"--endpoint-reconciler-type=none",
		"--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
		"--kubelet-client-certificate="+pki.kubeletClientCert, "--kubelet-client-key="+pki.kubeletClientKey,
		"--kubelet-preferred-address-types=InternalIP",
		"--profiling=false",
		// As real clusters do: the node DaemonSet is privileged.
		"--allow-privileged=true",
	)
	caPEM, err := os.ReadFile(pki.ca)
	if err != nil {
		t.Fatal(err)
	}
	c.Config = &rest.Config{
		Host:            fmt.Sprintf("https://127.0.0.1:%d", port),
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: caPEM},
		QPS:             100, Burst: 200,
	}
	waitReady(t, c.Config, filepath.Join(dir, "kube-apiserver.log"))
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		t.Fatal(err)
	}
	c.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := WriteKubeconfig(c.Kubeconfig, c.Config); err != nil {
		t.Fatal(err)
	}
	startProcess(t, filepath.Join(dir, "kube-scheduler.log"), scheduler,
		"--kubeconfig="+c.Kubeconfig, "--leader-elect=false", "--secure-port=0")
	return c
}

// startEtcd runs an embedded etcd in dir on free loopback ports and
// returns its client URL.
func startEtcd(t testing.TB, dir, logFile string) string {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{logFile}
	client := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	peer := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("etcd: %v", err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		t.Fatalf("etcd: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("etcd: not ready after a minute")
	}
	return client.String()
}

// freePort is a loopback TCP port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func randomToken(t testing.TB) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", b)
}

// Process is a program a test started.
type Process struct {
	Cmd    *exec.Cmd
	Log    string
	exited chan struct{}
}

// Exited is closed when the process has been waited for.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Kill sends SIGKILL and waits for the process.
func (p *Process) Kill() {
	_ = p.Cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// Stop sends SIGTERM and waits up to a minute, then kills.
func (p *Process) Stop() {
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(time.Minute):
		p.Kill()
	}
}

// startProcess runs bin with args, its output to logFile, until the test
// ends (SIGTERM, then SIGKILL). It dies with the test binary.
func startProcess(t testing.TB, logFile, bin string, args ...string) *Process {
	t.Helper()
	p, err := spawn(logFile, nil, bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

// spawn starts bin; lines of its stderr are passed to onLine as well.
func spawn(logFile string, onLine func(string), bin string, args ...string) (*Process, error) {
	logf, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var stderr *bufio.Scanner
	if onLine != nil {
		r, err := cmd.StderrPipe()
		if err != nil {
			logf.Close()
			return nil, err
		}
		stderr = bufio.NewScanner(r)
		stderr.Buffer(make([]byte, 64<<10), 1<<20)
	} else {
		cmd.Stderr = logf
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	p := &Process{Cmd: cmd, Log: logFile, exited: make(chan struct{})}
	go func() {
		if stderr != nil {
			for stderr.Scan() {
				line := stderr.Text()
				fmt.Fprintln(logf, line)
				onLine(line)
			}
		}
		_ = cmd.Wait()
		logf.Close()
		close(p.exited)
	}()
	return p, nil
}

// waitReady polls the apiserver's /readyz until it answers ok.
func waitReady(t testing.TB, cfg *rest.Config, logFile string) {
	t.Helper()
	tc, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: tc, Timeout: 5 * time.Second}
	deadline := time.Now().Add(3 * time.Minute)
	var last string
	for time.Now().Before(deadline) {
		resp, err := hc.Get(cfg.Host + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
	b, _ := os.ReadFile(logFile)
	t.Fatalf("kube-apiserver not ready after 3 minutes (%s); log tail:\n%s", last, tail(string(b), 40))
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// WriteKubeconfig writes cfg as a kubeconfig file (mode 0600).
func WriteKubeconfig(path string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.TLSClientConfig.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "admin", Namespace: "default"}
	kc.CurrentContext = "test"
	return clientcmd.WriteToFile(*kc, path)
}

// pki is the control plane's key material.
type pki struct {
	ca, serverCert, serverKey, kubeletClientCert, kubeletClientKey, saKey string
}

// makePKI makes, in dir, a CA, the apiserver's serving certificate for
// 127.0.0.1 and the client certificate it presents to kubelets (both
// signed by the CA), and the service-account signing key.
func makePKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &pki{ca: filepath.Join(dir, "ca.crt"), serverCert: filepath.Join(dir, "apiserver.crt"), serverKey: filepath.Join(dir, "apiserver.key"),
		kubeletClientCert: filepath.Join(dir, "kubelet-client.crt"), kubeletClientKey: filepath.Join(dir, "kubelet-client.key"), saKey: filepath.Join(dir, "sa.key")}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "agentjail-test-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, IsCA: true, BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.ca, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	leaf := func(serial int64, tmpl *x509.Certificate, certFile, keyFile string) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(24*time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return err
		}
		if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
			return err
		}
		return writePEM(keyFile, "EC PRIVATE KEY", keyDER)
	}
	if err := leaf(2, &x509.Certificate{Subject: pkix.Name{CommonName: "kube-apiserver"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost", "kubernetes.default.svc"}}, p.serverCert, p.serverKey); err != nil {
		return nil, err
	}
	if err := leaf(3, &x509.Certificate{Subject: pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, p.kubeletClientCert, p.kubeletClientKey); err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	saDER, err := x509.MarshalECPrivateKey(saKey)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.saKey, "EC PRIVATE KEY", saDER); err != nil {
		return nil, err
	}
	return p, nil
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

// Kubectl runs kubectl against the cluster with args (stdin fed from
// stdin when not empty) and returns its stdout and stderr.
func (c *Cluster) Kubectl(ctx context.Context, t testing.TB, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := exec.CommandContext(ctx, Bin(t, "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}
