package gateway

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
)

// maxLocations bounds the remembered locations; when full they are
// forgotten at once and found again on demand.
const maxLocations = 1 << 16

// locations remembers which node holds what: "jail/ID", "snapshot/ID",
// "recording/ID", "e2b/SANDBOX" → node name. What is remembered is only a
// hint: ids are unique, so a node that no longer holds one answers 404 as
// the daemon would on one host.
type locations struct {
	mu  sync.Mutex
	m   map[string]string
	max int
}

func newLocations(max int) *locations {
	return &locations{m: map[string]string{}, max: max}
}

func (l *locations) get(key string) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, ok := l.m[key]
	return n, ok
}

func (l *locations) put(key, node string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.m[key]; !ok && len(l.m) >= l.max {
		clear(l.m)
	}
	l.m[key] = node
}

func (l *locations) forget(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m, key)
}

// credentialHeaders are what a probe carries of the caller's request, so
// a node answers it as it would answer the caller.
var credentialHeaders = []string{"Authorization", "X-Api-Key", "X-Access-Token", "E2b-Sandbox-Id"}

// located forwards r (path unchanged) to the node that holds key: the
// remembered one, else the node whose daemon answers HEAD probePath (with
// the caller's credentials; extra headers added) with 2xx. When no node
// holds it, the first node answers, so the caller gets the daemon's own
// 404 (or 401 for a wrong credential).
func (g *Gateway) located(w http.ResponseWriter, r *http.Request, key, probePath string, extra http.Header) {
	ctx := r.Context()
	ns, err := g.nodes(ctx)
	if err != nil {
		g.fail(w, err)
		return
	}
	if len(ns) == 0 {
		g.fail(w, errNoNode)
		return
	}
	if name, ok := g.where.get(key); ok {
		for _, n := range ns {
			if n.name == name {
				g.forward(w, r, n, r.URL.Path, key)
				return
			}
		}
		g.where.forget(key)
	}
	if i := g.probe(ctx, r, ns, probePath, extra); i >= 0 {
		g.where.put(key, ns[i].name)
		g.forward(w, r, ns[i], r.URL.Path, key)
		return
	}
	n, err := g.first(ctx)
	if err != nil {
		g.fail(w, err)
		return
	}
	g.forward(w, r, n, r.URL.Path, "")
}

// probe asks every node at once HEAD path with r's credentials and returns
// the index of the first that answers 2xx, or -1.
func (g *Gateway) probe(ctx context.Context, r *http.Request, ns []agentNode, path string, extra http.Header) int {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	found := make(chan int, len(ns))
	for i, n := range ns {
		go func() {
			if g.answers(ctx, r, n, path, extra) {
				found <- i
				return
			}
			found <- -1
		}()
	}
	for range ns {
		if i := <-found; i >= 0 {
			return i
		}
	}
	return -1
}

// answers reports whether node n answers HEAD path (with r's credentials,
// extra headers added) with 2xx.
func (g *Gateway) answers(ctx context.Context, r *http.Request, n agentNode, path string, extra http.Header) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, strings.TrimSuffix(n.api.String(), "/")+path, nil)
	if err != nil {
		return false
	}
	copyCredentials(req.Header, r.Header)
	for k, v := range extra {
		req.Header[k] = v
	}
	res, err := g.http.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 4096))
	res.Body.Close()
	return res.StatusCode/100 == 2
}

func copyCredentials(dst, src http.Header) {
	for _, h := range credentialHeaders {
		if v := src.Values(h); len(v) > 0 {
			dst[h] = v
		}
	}
}
