package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// maxListBody bounds one node's answer to a gathered list.
const maxListBody = 64 << 20

// answer is one node's answer to a gathered request.
type answer struct {
	node   agentNode
	status int
	header http.Header
	body   []byte
	err    error
}

// learner remembers where the items of a node's list are.
type learner func(g *Gateway, node string, body []byte)

// gather sends r (a GET without a body) to every node's daemon at path and
// answers the union of their lists: JSON arrays are joined, and so are the
// array fields of JSON objects ({"jails": [...]}). A node that refuses
// the caller's credential (401, 403) is left out when another accepts it;
// otherwise a refusal (400...) is passed on as it is. A node that does not
// answer is left out (and logged). learn, if set, records where the
// items are.
func (g *Gateway) gather(w http.ResponseWriter, r *http.Request, path string, learn learner) {
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
	answers := g.ask(ctx, r, ns, path)
	// A node that does not know the caller's credential (an API key is
	// its issuer's) has nothing of the caller's: left out, unless no node
	// knows it.
	known := slices.ContainsFunc(answers, func(a answer) bool { return a.err == nil && a.status == http.StatusOK })
	var bodies [][]byte
	var names []string
	for _, a := range answers {
		switch {
		case a.err != nil:
			g.log.Warn("gateway: a node did not answer a list", "node", a.node.name, "path", path, "err", a.err)
		case known && (a.status == http.StatusUnauthorized || a.status == http.StatusForbidden):
		case a.status != http.StatusOK:
			for k, v := range a.header {
				w.Header()[k] = v
			}
			w.Header().Set(NodeHeader, a.node.name)
			w.WriteHeader(a.status)
			_, _ = w.Write(a.body)
			return
		default:
			bodies = append(bodies, a.body)
			names = append(names, a.node.name)
			if learn != nil {
				learn(g, a.node.name, a.body)
			}
		}
	}
	if len(bodies) == 0 {
		g.error(w, http.StatusBadGateway, "unavailable", "no agentjail node answered "+path)
		return
	}
	merged, err := mergeLists(bodies)
	if err != nil {
		g.error(w, http.StatusBadGateway, "unavailable", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(NodeHeader, strings.Join(names, ","))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(merged)
}

// ask sends GET path (r's query and credentials) to every node at once.
func (g *Gateway) ask(ctx context.Context, r *http.Request, ns []agentNode, path string) []answer {
	out := make([]answer, len(ns))
	var wg sync.WaitGroup
	for i, n := range ns {
		wg.Go(func() {
			out[i] = g.get(ctx, r, n, path)
		})
	}
	wg.Wait()
	return out
}

// get asks node n GET path with r's query and credentials.
func (g *Gateway) get(ctx context.Context, r *http.Request, n agentNode, path string) answer {
	a := answer{node: n}
	u := *n.api
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawQuery = r.URL.RawQuery
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		a.err = err
		return a
	}
	copyCredentials(req.Header, r.Header)
	res, err := g.http.Do(req)
	if err != nil {
		a.err = err
		return a
	}
	defer res.Body.Close()
	a.status, a.header = res.StatusCode, res.Header
	a.body, a.err = io.ReadAll(io.LimitReader(res.Body, maxListBody+1))
	if a.err == nil && len(a.body) > maxListBody {
		a.err = fmt.Errorf("the answer is larger than %d bytes", maxListBody)
	}
	return a
}

// mergeLists joins JSON lists: arrays, or objects whose array fields are
// joined (other fields are the first body's).
func mergeLists(bodies [][]byte) ([]byte, error) {
	if t := bytes.TrimSpace(bodies[0]); len(t) > 0 && t[0] == '[' {
		all := []json.RawMessage{}
		for _, b := range bodies {
			var items []json.RawMessage
			if err := json.Unmarshal(b, &items); err != nil {
				return nil, fmt.Errorf("a node's list: %w", err)
			}
			all = append(all, items...)
		}
		return json.Marshal(all)
	}
	var out map[string]json.RawMessage
	for _, b := range bodies {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(b, &obj); err != nil {
			return nil, fmt.Errorf("a node's list: %w", err)
		}
		if out == nil {
			out = obj
			continue
		}
		for k, v := range obj {
			var have, more []json.RawMessage
			if json.Unmarshal(out[k], &have) != nil || json.Unmarshal(v, &more) != nil {
				continue
			}
			joined, err := json.Marshal(append(have, more...))
			if err != nil {
				return nil, err
			}
			out[k] = joined
		}
	}
	return json.Marshal(out)
}

// learnItems records "prefix/ITEM[field]" → node for each item of the
// array field list (or of the top-level array when list is "").
func learnItems(g *Gateway, node string, body []byte, list, prefix string, fields ...string) {
	raw := json.RawMessage(body)
	if list != "" {
		var obj map[string]json.RawMessage
		if json.Unmarshal(body, &obj) != nil {
			return
		}
		raw = obj[list]
	}
	var items []map[string]any
	if json.Unmarshal(raw, &items) != nil {
		return
	}
	for _, it := range items {
		for _, f := range fields {
			if s, ok := it[f].(string); ok && s != "" {
				g.where.put(prefix+"/"+s, node)
			}
		}
	}
}

func learnJails(g *Gateway, node string, body []byte) {
	learnItems(g, node, body, "jails", "jail", "id", "name")
}

func learnSnapshots(g *Gateway, node string, body []byte) {
	learnItems(g, node, body, "snapshots", "snapshot", "id")
}

func learnSandboxes(g *Gateway, node string, body []byte) {
	learnItems(g, node, body, "", "e2b", "sandboxID")
}
