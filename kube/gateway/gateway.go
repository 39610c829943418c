// Package gateway is the one API of a cluster of agentjail nodes: the
// daemon's REST API, the E2B-compatible API and the web console for every
// jail on every node. It finds the node that holds what a request names
// and forwards the request there (streams, Server-Sent Events and
// WebSockets included).
//
// How a request finds its node:
//
//   - /jails/NAMESPACE.NAME/... is the jail of Pod NAME in NAMESPACE (or
//     of the Sandbox, whose Pod has its name): the Pod's node.
//   - /jails/ID/..., /snapshots/ID/..., /recordings/ID and the E2B
//     sandboxes (/e2b/sandboxes/ID/..., and the sandbox plane /e2b/envd by
//     its E2b-Sandbox-Id header) are found by asking every node's daemon
//     once, with the caller's own credentials, and remembered.
//   - GET /jails, /snapshots and the E2B lists gather every node's answer.
//   - POST /jails and an E2B create place the new jail on the next ready
//     node in turn (an E2B create from a snapshot goes to the snapshot's
//     node).
//   - /nodes/NODE/... reaches one node's daemon as it is; every other
//     route (images, keys, profiles, ...) answers for one ready node, named
//     in the Agentjail-Node header every forwarded answer carries.
//
// The console's pages and sessions are served by the gateway itself
// (package console) in front of this API. The gateway holds no
// credentials: the caller's Authorization, X-API-KEY or X-Access-Token
// passes through and the node's daemon decides, so auth is as on one
// host (the nodes share the API token).
package gateway

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/agentjail/agentjail/internal/console"
)

// NodeHeader names, on every forwarded answer, the node that gave it.
const NodeHeader = "Agentjail-Node"

// probeTimeout bounds a question to one node's daemon (where is X?).
const probeTimeout = 10 * time.Second

// Gateway is the cluster's API handler.
type Gateway struct {
	client kubernetes.Interface
	log    *slog.Logger
	// http asks the nodes' daemons (probes and gathered lists).
	http *http.Client
	// root is the console in front of the API.
	root http.Handler
	// where remembers which node holds a jail, snapshot or sandbox.
	where *locations
	// turn picks the node of the next new jail.
	turn atomic.Uint64
}

var _ http.Handler = (*Gateway)(nil)

// New returns the gateway of the cluster cs reaches.
func New(cs kubernetes.Interface, log *slog.Logger) *Gateway {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &Gateway{client: cs, log: log, where: newLocations(maxLocations)}
	// Probes and lists carry no streams: a bounded client. Forwarded
	// requests use the reverse proxy's transport without a deadline.
	g.http = &http.Client{Timeout: probeTimeout}
	g.root = console.New(console.Options{API: http.HandlerFunc(g.api), Log: log})
	return g
}

// ServeHTTP serves the console and the API.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.root.ServeHTTP(w, r)
}

// api serves the API: what bearer-token clients reach at the root and the
// console's pages reach under /api/.
func (g *Gateway) api(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	seg := strings.SplitN(strings.TrimPrefix(p, "/"), "/", 3)
	rest := ""
	if len(seg) == 3 {
		rest = "/" + seg[2]
	}
	switch {
	case p == "/health":
		g.health(w, r)
	case seg[0] == "nodes":
		if len(seg) < 2 || seg[1] == "" {
			g.error(w, http.StatusNotFound, "not_found", "name a node: /nodes/NODE/...")
			return
		}
		n, err := g.node(r.Context(), seg[1])
		if err != nil {
			g.fail(w, err)
			return
		}
		g.forward(w, r, n, rest, "")
	case seg[0] == "e2b":
		g.e2b(w, r)
	case p == "/files":
		g.presigned(w, r)
	case p == "/jails" && r.Method == http.MethodGet:
		g.gather(w, r, p, learnJails)
	case p == "/jails" && r.Method == http.MethodPost:
		g.create(w, r)
	case seg[0] == "jails" && len(seg) >= 2 && seg[1] != "":
		if strings.Contains(seg[1], ".") && g.podJail(w, r, seg[1], rest) {
			return
		}
		g.located(w, r, "jail/"+seg[1], "/jails/"+seg[1], nil)
	case p == "/snapshots" && r.Method == http.MethodGet:
		g.gather(w, r, p, learnSnapshots)
	case seg[0] == "snapshots" && len(seg) >= 2 && seg[1] != "":
		g.located(w, r, "snapshot/"+seg[1], "/snapshots/"+seg[1], nil)
	case seg[0] == "recordings" && len(seg) == 2 && seg[1] != "":
		g.located(w, r, "recording/"+seg[1], "/recordings/"+seg[1], nil)
	case p == "/diff":
		// Both sides of a diff are on one node: the first one's.
		from := r.URL.Query().Get("from")
		g.located(w, r, "snapshot/"+from, "/snapshots/"+from, nil)
	default:
		g.anyNode(w, r)
	}
}

// health answers for the gateway itself: how many agentjail nodes are
// ready to take new jails.
func (g *Gateway) health(w http.ResponseWriter, r *http.Request) {
	ns, err := g.nodes(r.Context())
	if err != nil {
		g.fail(w, err)
		return
	}
	ready := 0
	for _, n := range ns {
		if n.ready {
			ready++
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "nodes": len(ns), "ready": ready})
}

// anyNode forwards a route that is one node's (images, keys, profiles,
// whoami...) to the first ready node.
func (g *Gateway) anyNode(w http.ResponseWriter, r *http.Request) {
	n, err := g.first(r.Context())
	if err != nil {
		g.fail(w, err)
		return
	}
	g.forward(w, r, n, r.URL.Path, "")
}

// error writes an error in the daemon's body shape.
func (g *Gateway) error(w http.ResponseWriter, status int, code, msg string) {
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	body.Error.Code, body.Error.Message = code, msg
	writeJSON(w, status, body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // every value written here marshals
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
