package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// e2bPrefix is where the daemons serve the E2B-compatible API: the SDK's
// E2B_API_URL is GATEWAY/e2b and E2B_SANDBOX_URL GATEWAY/e2b/envd.
const e2bPrefix = "/e2b"

// maxE2BBody bounds a create's body, which the gateway reads to find a
// snapshot template's node (the daemon's own bound is 1 MiB).
const maxE2BBody = 1 << 20

// maxPresignedUpload bounds the body of a presigned upload: it is kept to
// be offered to each node in turn.
const maxPresignedUpload = 256 << 20

// e2b routes the E2B-compatible API: the sandbox plane by the
// E2b-Sandbox-Id header, the control plane by the sandbox id in the path;
// creates are placed, lists gathered.
func (g *Gateway) e2b(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.Path, e2bPrefix)
	seg := strings.Split(strings.TrimPrefix(rest, "/"), "/")
	switch {
	case seg[0] == "envd":
		// A sandbox answers its health only while it runs: the daemon
		// that holds a running sandbox says 204.
		id := r.Header.Get("E2b-Sandbox-Id")
		g.located(w, r, "e2b/"+id, e2bPrefix+"/envd/health", http.Header{"E2b-Sandbox-Id": {id}})
	case r.Method == http.MethodPost && (rest == "/v2/sandboxes" || rest == "/sandboxes"):
		g.e2bCreate(w, r)
	case r.Method == http.MethodGet && (rest == "/v2/sandboxes" || rest == "/sandboxes"):
		g.gather(w, r, r.URL.Path, learnSandboxes)
	case r.Method == http.MethodGet && rest == "/snapshots":
		g.gather(w, r, r.URL.Path, nil)
	case r.Method == http.MethodPost && rest == "/volumes":
		g.e2bVolumeCreate(w, r)
	case r.Method == http.MethodGet && rest == "/volumes":
		g.gather(w, r, r.URL.Path, nil)
	case len(seg) == 2 && seg[0] == "volumes":
		g.located(w, r, volumeKey(seg[1]), e2bPrefix+"/volumes/"+url.PathEscape(seg[1]), nil)
	case len(seg) == 3 && seg[0] == "volumecontent":
		// The content API carries the volume's token, no API key: the node
		// whose daemon takes the token on the volume's root holds it.
		g.located(w, r, volumeKey(seg[1]), e2bPrefix+"/volumecontent/"+url.PathEscape(seg[1])+"/path?path=/", nil)
	case r.Method == http.MethodPost && rest == "/v3/templates":
		g.e2bTemplateRequest(w, r)
	case r.Method == http.MethodGet && rest == "/templates":
		g.gather(w, r, r.URL.Path, nil)
	case len(seg) == 2 && seg[0] == "templates" && seg[1] == "tags":
		g.e2bTemplateTags(w, r)
	case r.Method == http.MethodDelete && len(seg) == 2 && seg[0] == "templates":
		// A template (by id or name), else a snapshot.
		if i := g.templateNode(r, seg[1]); i.ok {
			g.forward(w, r, i.node, r.URL.Path, "")
			return
		}
		n, ok := g.snapshotNode(w, r, seg[1])
		if ok {
			g.forward(w, r, n, r.URL.Path, "")
		}
	case len(seg) == 3 && seg[0] == "templates" && seg[1] == "aliases":
		g.located(w, r, templateKey(seg[2]), e2bPrefix+"/templates/"+seg[2], nil)
	case len(seg) == 4 && seg[0] == "templates" && seg[2] == "files" && (r.Method == http.MethodPut || r.Method == http.MethodHead):
		// The SDK's upload carries the build's token, no API key: the node
		// that knows the token holds the template.
		g.located(w, r, templateKey(seg[1]), r.URL.Path+"?token="+url.QueryEscape(r.URL.Query().Get("token")), nil)
	case len(seg) >= 2 && seg[0] == "templates":
		g.located(w, r, templateKey(seg[1]), e2bPrefix+"/templates/"+seg[1], nil)
	case len(seg) >= 3 && seg[0] == "v2" && seg[1] == "templates":
		g.located(w, r, templateKey(seg[2]), e2bPrefix+"/templates/"+seg[2], nil)
	case len(seg) >= 2 && seg[0] == "sandboxes", len(seg) >= 3 && seg[0] == "v2" && seg[1] == "sandboxes":
		id := seg[1]
		if seg[0] == "v2" {
			id = seg[2]
		}
		g.located(w, r, "e2b/"+id, e2bPrefix+"/sandboxes/"+id, nil)
	default:
		g.anyNode(w, r)
	}
}

// e2bCreate places a new sandbox: with volumes, on the node of its first
// volume (a volume is a node's directory); from a snapshot (templateID
// names one of the caller's snapshots) on the snapshot's node; from a
// template on the template's node; else on the next ready node.
func (g *Gateway) e2bCreate(w http.ResponseWriter, r *http.Request) {
	var req struct {
		TemplateID   string `json:"templateID"`
		VolumeMounts []struct {
			Name string `json:"name"`
		} `json:"volumeMounts"`
	}
	if !readE2BBody(w, r, &req) {
		return
	}
	if len(req.VolumeMounts) > 0 {
		if i := g.volumeNode(r, req.VolumeMounts[0].Name); i.ok {
			g.forward(w, r, i.node, r.URL.Path, "")
			return
		}
	}
	if t := req.TemplateID; t != "" && t != "base" {
		if n, ok := g.snapshotNode(nil, r, t); ok {
			g.forward(w, r, n, r.URL.Path, "")
			return
		}
		// A template built on a node: NAME[:TAG] or its id.
		name, _, _ := strings.Cut(t, ":")
		if i := g.templateNode(r, name); i.ok {
			g.forward(w, r, i.node, r.URL.Path, "")
			return
		}
	}
	n, err := g.place(r, e2bPrefix+"/v2/sandboxes?limit=1")
	if err != nil {
		g.failE2B(w, err)
		return
	}
	g.forward(w, r, n, r.URL.Path, "")
}

// templateKey is the location cache's key of a template id or name.
func templateKey(ref string) string { return "e2b-template/" + ref }

// found is a node found to hold something.
type found struct {
	node agentNode
	ok   bool
}

// templateNode finds the node that holds the caller's template ref (an id
// or a name): the one whose daemon answers HEAD /e2b/templates/REF.
func (g *Gateway) templateNode(r *http.Request, ref string) found {
	return g.holder(r, ref, templateKey(ref), e2bPrefix+"/templates/"+url.PathEscape(ref))
}

// holder finds the node that holds ref (none for ""): the one cached
// under key, else the one whose daemon answers HEAD probePath with r's
// credentials (then cached).
func (g *Gateway) holder(r *http.Request, ref, key, probePath string) found {
	ns, err := g.nodes(r.Context())
	if err != nil || ref == "" {
		return found{}
	}
	if name, ok := g.where.get(key); ok {
		for _, n := range ns {
			if n.name == name {
				return found{n, true}
			}
		}
	}
	if i := g.probe(r.Context(), r, ns, probePath, nil); i >= 0 {
		g.where.put(key, ns[i].name)
		return found{ns[i], true}
	}
	return found{}
}

// volumeKey is the location cache's key of a volume id or name.
func volumeKey(ref string) string { return "e2b-volume/" + ref }

// volumeNode finds the node that holds the caller's volume ref (an id or
// a name): the one whose daemon answers HEAD /e2b/volumes/REF.
func (g *Gateway) volumeNode(r *http.Request, ref string) found {
	return g.holder(r, ref, volumeKey(ref), e2bPrefix+"/volumes/"+url.PathEscape(ref))
}

// e2bVolumeCreate places a new volume: on the node that has one of that
// name (whose daemon refuses the second), else on the next ready node.
func (g *Gateway) e2bVolumeCreate(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"name"`
	}
	if !readE2BBody(w, r, &req) {
		return
	}
	g.forwardOrPlace(w, r, g.volumeNode(r, req.Name), e2bPrefix+"/volumes")
}

// forwardOrPlace forwards r to the node f found, else to the next ready
// node that accepts r's credentials on acceptPath.
func (g *Gateway) forwardOrPlace(w http.ResponseWriter, r *http.Request, f found, acceptPath string) {
	n := f.node
	if !f.ok {
		var err error
		if n, err = g.place(r, acceptPath); err != nil {
			g.failE2B(w, err)
			return
		}
	}
	g.forward(w, r, n, r.URL.Path, "")
}

// readE2BBody reads a small request body (restoring it for the daemon)
// into v; a bad body is the daemon's to refuse. It answers and reports
// false when the body cannot be read or is too large.
func readE2BBody(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxE2BBody+1))
	if err != nil {
		writeE2BError(w, http.StatusBadRequest, "reading the body: "+err.Error())
		return false
	}
	if len(body) > maxE2BBody {
		writeE2BError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than %d bytes", maxE2BBody))
		return false
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	_ = json.Unmarshal(body, v)
	return true
}

// e2bTemplateRequest places a template build: on the node that holds the
// template of that name, else on the next ready node.
func (g *Gateway) e2bTemplateRequest(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name  string `json:"name"`
		Alias string `json:"alias"`
	}
	if !readE2BBody(w, r, &req) {
		return
	}
	name := req.Name
	if name == "" {
		name = req.Alias
	}
	name, _, _ = strings.Cut(name, ":")
	g.forwardOrPlace(w, r, g.templateNode(r, name), e2bPrefix+"/templates")
}

// e2bTemplateTags sends a tag change to the node of the template its body
// names (target NAME:TAG, or name).
func (g *Gateway) e2bTemplateTags(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Target string `json:"target"`
		Name   string `json:"name"`
	}
	if !readE2BBody(w, r, &req) {
		return
	}
	name := req.Name
	if name == "" {
		name, _, _ = strings.Cut(req.Target, ":")
	}
	if i := g.templateNode(r, name); i.ok {
		g.forward(w, r, i.node, r.URL.Path, "")
		return
	}
	g.anyNode(w, r)
}

// snapshotNode finds the node that holds the caller's E2B snapshot id (or
// name) by asking every node's list. Without one, it returns the first
// node, whose daemon answers as on one host; it writes an error to w (if
// set) and reports false when there is no node.
func (g *Gateway) snapshotNode(w http.ResponseWriter, r *http.Request, id string) (agentNode, bool) {
	ns, err := g.nodes(r.Context())
	if err == nil && len(ns) == 0 {
		err = errNoNode
	}
	if err != nil {
		if w != nil {
			g.failE2B(w, err)
		}
		return agentNode{}, false
	}
	for _, a := range g.ask(r.Context(), r, ns, e2bPrefix+"/snapshots") {
		if a.err != nil || a.status != http.StatusOK {
			continue
		}
		var snaps []struct {
			SnapshotID string   `json:"snapshotID"`
			Names      []string `json:"names"`
		}
		if json.Unmarshal(a.body, &snaps) != nil {
			continue
		}
		for _, s := range snaps {
			if s.SnapshotID == id || slices.Contains(s.Names, id) {
				return a.node, true
			}
		}
	}
	if w == nil {
		return agentNode{}, false
	}
	n, err := g.first(r.Context())
	if err != nil {
		g.failE2B(w, err)
		return agentNode{}, false
	}
	return n, true
}

// presigned serves the presigned /files URLs the SDK builds (uploadUrl,
// downloadUrl): they carry a signature but no sandbox id, so each node is
// offered the request in turn until one does not refuse the signature
// (401). An upload's body is kept for that, up to maxPresignedUpload.
func (g *Gateway) presigned(w http.ResponseWriter, r *http.Request) {
	ns, err := g.nodes(r.Context())
	if err == nil && len(ns) == 0 {
		err = errNoNode
	}
	if err != nil {
		g.failE2B(w, err)
		return
	}
	var body []byte
	if r.Body != nil && r.Body != http.NoBody {
		body, err = io.ReadAll(io.LimitReader(r.Body, maxPresignedUpload+1))
		if err != nil {
			writeE2BError(w, http.StatusBadRequest, "reading the body: "+err.Error())
			return
		}
		if len(body) > maxPresignedUpload {
			writeE2BError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("through the gateway a presigned upload is at most %d bytes (files.write streams any size)", maxPresignedUpload))
			return
		}
	}
	for i, n := range ns {
		last := i == len(ns)-1
		req, err := http.NewRequestWithContext(r.Context(), r.Method, strings.TrimSuffix(n.api.String(), "/")+"/files?"+r.URL.RawQuery, bytes.NewReader(body))
		if err != nil {
			writeE2BError(w, http.StatusBadRequest, err.Error())
			return
		}
		req.Header = r.Header.Clone()
		req.ContentLength = int64(len(body))
		// No client deadline: a download streams as long as it takes.
		res, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			if last {
				writeE2BError(w, http.StatusBadGateway, "node "+n.name+": "+err.Error())
				return
			}
			continue
		}
		if res.StatusCode == http.StatusUnauthorized && !last {
			res.Body.Close()
			continue
		}
		for k, v := range res.Header {
			w.Header()[k] = v
		}
		w.Header().Set(NodeHeader, n.name)
		w.WriteHeader(res.StatusCode)
		_, _ = io.Copy(w, res.Body)
		res.Body.Close()
		return
	}
}

// failE2B answers err in the E2B API's error shape.
func (g *Gateway) failE2B(w http.ResponseWriter, err error) {
	status, _ := g.classify(err)
	writeE2BError(w, status, err.Error())
}

// writeE2BError writes an error as the E2B SDK reads it: {"code": status,
// "message"}.
func writeE2BError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"code": status, "message": msg})
}
