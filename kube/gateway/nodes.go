package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/agentjail/agentjail/kube/api/v1alpha1"
)

// agentNode is an agentjail node: a Kubernetes Node with its daemon's URL.
type agentNode struct {
	name string
	api  *url.URL
	// ready: the node is Ready, schedulable and not tainted unreachable,
	// so new jails may go there.
	ready bool
}

var (
	// errNotAgentjail is a node that is not an agentjail node.
	errNotAgentjail = errors.New("not an agentjail node")
	// errNoNode: no agentjail node can take the request.
	errNoNode = errors.New("no ready agentjail node")
)

// nodes lists the agentjail nodes, by name.
func (g *Gateway) nodes(ctx context.Context) ([]agentNode, error) {
	list, err := g.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	var out []agentNode
	for i := range list.Items {
		if n, err := toAgentNode(&list.Items[i]); err == nil {
			out = append(out, n)
		}
	}
	slices.SortFunc(out, func(a, b agentNode) int { return strings.Compare(a.name, b.name) })
	return out, nil
}

// node is the agentjail node name.
func (g *Gateway) node(ctx context.Context, name string) (agentNode, error) {
	n, err := g.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return agentNode{}, fmt.Errorf("node %s: %w", name, err)
	}
	return toAgentNode(n)
}

func toAgentNode(n *corev1.Node) (agentNode, error) {
	a := n.Annotations[v1alpha1.AnnotationAPI]
	if a == "" {
		return agentNode{}, fmt.Errorf("node %s: %w (no %s annotation)", n.Name, errNotAgentjail, v1alpha1.AnnotationAPI)
	}
	u, err := url.Parse(a)
	if err != nil {
		return agentNode{}, fmt.Errorf("node %s: %s %q: %w", n.Name, v1alpha1.AnnotationAPI, a, err)
	}
	ready := !n.Spec.Unschedulable
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
			ready = false
		}
	}
	for _, t := range n.Spec.Taints {
		if t.Key == corev1.TaintNodeUnreachable || t.Key == corev1.TaintNodeNotReady {
			ready = false
		}
	}
	return agentNode{name: n.Name, api: u, ready: ready}, nil
}

// place picks the node of a new jail: the ready nodes in turn, among
// those that accept the caller's credentials (an API key is known to the
// daemon that issued it only; the cluster's token to all). acceptPath is
// a read the caller may make on a node that knows its credentials.
func (g *Gateway) place(r *http.Request, acceptPath string) (agentNode, error) {
	ns, err := g.nodes(r.Context())
	if err != nil {
		return agentNode{}, err
	}
	ns = slices.DeleteFunc(ns, func(n agentNode) bool { return !n.ready })
	if len(ns) == 0 {
		return agentNode{}, errNoNode
	}
	if len(ns) > 1 {
		if ok := g.accepting(r, ns, acceptPath); len(ok) > 0 {
			ns = ok
		}
	}
	return ns[(g.turn.Add(1)-1)%uint64(len(ns))], nil
}

// accepting returns the nodes of ns whose daemon answers HEAD path with
// r's credentials with 2xx.
func (g *Gateway) accepting(r *http.Request, ns []agentNode, path string) []agentNode {
	ok := make([]bool, len(ns))
	var wg sync.WaitGroup
	for i, n := range ns {
		wg.Go(func() { ok[i] = g.answers(r.Context(), r, n, path, nil) })
	}
	wg.Wait()
	var out []agentNode
	for i, n := range ns {
		if ok[i] {
			out = append(out, n)
		}
	}
	return out
}

// first is the first ready node (by name): the one that answers for what
// is not any one node's.
func (g *Gateway) first(ctx context.Context) (agentNode, error) {
	ns, err := g.nodes(ctx)
	if err != nil {
		return agentNode{}, err
	}
	for _, n := range ns {
		if n.ready {
			return n, nil
		}
	}
	if len(ns) > 0 {
		return ns[0], nil
	}
	return agentNode{}, errNoNode
}

// create places a new jail (POST /jails).
func (g *Gateway) create(w http.ResponseWriter, r *http.Request) {
	n, err := g.place(r, "/whoami")
	if err != nil {
		g.fail(w, err)
		return
	}
	g.forward(w, r, n, r.URL.Path, "")
}

// podJail forwards a request for the jail of Pod NAMESPACE.NAME to its
// node, with the jail named as that node knows it. It reports false, having
// written nothing, when there is no such Pod.
func (g *Gateway) podJail(w http.ResponseWriter, r *http.Request, ref, rest string) bool {
	ns, name, _ := strings.Cut(ref, ".")
	if ns == "" || name == "" {
		return false
	}
	pod, err := g.client.CoreV1().Pods(ns).Get(r.Context(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		g.fail(w, fmt.Errorf("pod %s/%s: %w", ns, name, err))
		return true
	}
	if pod.Spec.NodeName == "" || pod.Status.Phase != corev1.PodRunning {
		g.error(w, http.StatusConflict, "conflict", fmt.Sprintf("pod %s/%s is %s: its jail does not run", ns, name, pod.Status.Phase))
		return true
	}
	n, err := g.node(r.Context(), pod.Spec.NodeName)
	if err != nil {
		g.fail(w, err)
		return true
	}
	g.forward(w, r, n, "/jails/pod-"+string(pod.UID)+rest, "")
	return true
}

// forward proxies r to node n with path p (the query kept). When the node
// does not answer, the location key (if any) is forgotten.
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, n agentNode, p, key string) {
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(n.api)
			pr.Out.URL.Path = strings.TrimSuffix(n.api.Path, "/") + p
			pr.Out.URL.RawPath = ""
			pr.Out.Host = n.api.Host
			// The daemon names itself in URLs it returns (template
			// uploads) by the host the client reached: the gateway's.
			pr.SetXForwarded()
		},
		// Streams (SSE, exec output) are flushed as they come.
		FlushInterval: -1,
		ErrorLog:      slog.NewLogLogger(g.log.Handler(), slog.LevelWarn),
		ModifyResponse: func(res *http.Response) error {
			res.Header.Set(NodeHeader, n.name)
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			if key != "" {
				g.where.forget(key)
			}
			w.Header().Set(NodeHeader, n.name)
			g.error(w, http.StatusBadGateway, "unavailable", "node "+n.name+": its daemon does not answer: "+err.Error())
		},
	}
	// The transport sends the request body on while the answer streams
	// back: the server must not drain and close that body when the answer's
	// head is written (HTTP/1 does unless told), or the transport's last
	// read of it fails and tears down the connection to the node.
	_ = http.NewResponseController(w).EnableFullDuplex()
	rp.ServeHTTP(w, r)
}

// fail answers err in the daemon's error shape.
func (g *Gateway) fail(w http.ResponseWriter, err error) {
	status, code := g.classify(err)
	g.error(w, status, code, err.Error())
}

// classify maps err to an HTTP status and error code: a missing Pod or
// node is 404, a node that is not an agentjail node 422, no ready node
// 503, anything else 502.
func (g *Gateway) classify(err error) (int, string) {
	switch {
	case apierrors.IsNotFound(err):
		return http.StatusNotFound, "not_found"
	case errors.Is(err, errNotAgentjail):
		return http.StatusUnprocessableEntity, "unprocessable"
	case errors.Is(err, errNoNode):
		return http.StatusServiceUnavailable, "unavailable"
	default:
		g.log.Warn("gateway", "err", err)
		return http.StatusBadGateway, "unavailable"
	}
}
