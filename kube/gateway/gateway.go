// Package gateway is the one API of a cluster of agentjail nodes: it
// serves the daemon's REST API for every jail on every node, finding the
// node from the jail's Pod and forwarding the request (streams and
// WebSockets included) to that node's daemon.
//
// A jail is named NAMESPACE.NAME: the Pod (or the Sandbox, whose Pod has
// its name) NAME in NAMESPACE; `/jails/default.sb/exec` reaches the jail
// of Sandbox sb. `/nodes/NODE/...` reaches one node's daemon as it is
// (its health, images, snapshots). The gateway holds no credentials: the
// caller's Authorization header (or a route's ticket) passes through and
// the node's daemon decides, so auth is as on one host.
package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/agentjail/agentjail/kube/api/v1alpha1"
)

// Gateway is the cluster's API handler.
type Gateway struct {
	Client kubernetes.Interface
	Log    *slog.Logger
}

var _ http.Handler = (*Gateway)(nil)

// ServeHTTP routes /jails/NAMESPACE.NAME/... and /nodes/NODE/....
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	parts := strings.SplitN(strings.TrimPrefix(r.URL.Path, "/"), "/", 3)
	if len(parts) < 2 || parts[1] == "" {
		g.error(w, http.StatusNotFound, "not_found", "the gateway serves /jails/NAMESPACE.NAME/... and /nodes/NODE/...")
		return
	}
	rest := ""
	if len(parts) == 3 {
		rest = "/" + parts[2]
	}
	switch parts[0] {
	case "jails":
		g.jail(w, r, parts[1], rest)
	case "nodes":
		target, err := g.nodeAPI(r.Context(), parts[1])
		if err != nil {
			g.fail(w, err)
			return
		}
		g.forward(w, r, target, rest)
	default:
		g.error(w, http.StatusNotFound, "not_found", "the gateway serves /jails/NAMESPACE.NAME/... and /nodes/NODE/...")
	}
}

// jail forwards a request for the jail of Pod NAMESPACE.NAME to its node,
// with the jail named as that node knows it.
func (g *Gateway) jail(w http.ResponseWriter, r *http.Request, ref, rest string) {
	ns, name, ok := strings.Cut(ref, ".")
	if !ok || ns == "" || name == "" {
		g.error(w, http.StatusBadRequest, "invalid", fmt.Sprintf("jail %q: name a jail NAMESPACE.NAME (its Pod or Sandbox)", ref))
		return
	}
	pod, err := g.Client.CoreV1().Pods(ns).Get(r.Context(), name, metav1.GetOptions{})
	if err != nil {
		g.fail(w, fmt.Errorf("pod %s/%s: %w", ns, name, err))
		return
	}
	if pod.Spec.NodeName == "" || pod.Status.Phase != corev1.PodRunning {
		g.error(w, http.StatusConflict, "conflict", fmt.Sprintf("pod %s/%s is %s: its jail does not run", ns, name, pod.Status.Phase))
		return
	}
	target, err := g.nodeAPI(r.Context(), pod.Spec.NodeName)
	if err != nil {
		g.fail(w, err)
		return
	}
	g.forward(w, r, target, "/jails/pod-"+string(pod.UID)+rest)
}

// errNotAgentjail is a node that is not an agentjail node.
var errNotAgentjail = errors.New("not an agentjail node")

// nodeAPI is the daemon URL of node name.
func (g *Gateway) nodeAPI(ctx context.Context, name string) (*url.URL, error) {
	n, err := g.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", name, err)
	}
	a := n.Annotations[v1alpha1.AnnotationAPI]
	if a == "" {
		return nil, fmt.Errorf("node %s: %w (no %s annotation)", name, errNotAgentjail, v1alpha1.AnnotationAPI)
	}
	return url.Parse(a)
}

// forward proxies r to target with path p (the query kept).
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, target *url.URL, p string) {
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.URL.Path = strings.TrimSuffix(target.Path, "/") + p
			pr.Out.URL.RawPath = ""
			pr.Out.Host = target.Host
		},
		// Streams (SSE, exec output) are flushed as they come.
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			g.error(w, http.StatusBadGateway, "unavailable", "the node's daemon does not answer: "+err.Error())
		},
	}
	rp.ServeHTTP(w, r)
}

// fail answers err: a missing Pod or node is 404, a node that is not an
// agentjail node 422, anything else 502.
func (g *Gateway) fail(w http.ResponseWriter, err error) {
	switch {
	case apierrors.IsNotFound(err):
		g.error(w, http.StatusNotFound, "not_found", err.Error())
	case errors.Is(err, errNotAgentjail):
		g.error(w, http.StatusUnprocessableEntity, "unprocessable", err.Error())
	default:
		g.Log.Warn("gateway", "err", err)
		g.error(w, http.StatusBadGateway, "unavailable", err.Error())
	}
}

// error writes an error in the daemon's body shape.
func (g *Gateway) error(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	body.Error.Code, body.Error.Message = code, msg
	_ = json.NewEncoder(w).Encode(body)
}
