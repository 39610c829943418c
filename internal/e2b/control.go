package e2b

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/agentjail/agentjail/internal/api"
	"github.com/agentjail/agentjail/internal/audit"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
	"github.com/agentjail/agentjail/internal/observe"
	"github.com/agentjail/agentjail/internal/tenant"
)

// envdVersion is the envd version the sandbox plane implements; the SDK
// switches its features by it (0.5.7: no forced user, closeStdin,
// octet-stream and gzip uploads).
const envdVersion = "0.5.7"

// maxBody bounds a control-plane request body.
const maxBody = 1 << 20

// controlHandler is a control-plane route's handler.
type controlHandler func(s *Service, c caller, w http.ResponseWriter, r *http.Request) error

// routes builds the control plane's mux and the sandbox plane's handler.
func (s *Service) routes() {
	s.mux = http.NewServeMux()
	for _, rt := range []struct {
		pattern string
		write   bool
		h       controlHandler
	}{
		{"POST /v2/sandboxes", true, (*Service).postSandbox},
		{"POST /sandboxes", true, (*Service).postSandbox},
		{"GET /v2/sandboxes", false, (*Service).listSandboxes},
		{"GET /sandboxes", false, (*Service).listSandboxes},
		{"GET /sandboxes/{id}", false, (*Service).getSandbox},
		{"DELETE /sandboxes/{id}", true, (*Service).deleteSandbox},
		{"POST /sandboxes/{id}/timeout", true, (*Service).postTimeout},
		{"PUT /sandboxes/{id}/network", true, (*Service).putNetwork},
		{"POST /sandboxes/{id}/pause", true, (*Service).postPause},
		{"POST /sandboxes/{id}/resume", true, (*Service).postConnect},
		{"POST /v2/sandboxes/{id}/connect", true, (*Service).postConnect},
		{"POST /sandboxes/{id}/fork", true, (*Service).postFork},
		{"GET /sandboxes/{id}/metrics", false, (*Service).getMetrics},
		{"POST /sandboxes/{id}/snapshots", true, (*Service).postSnapshot},
		{"GET /snapshots", false, (*Service).listSnapshots},
		{"DELETE /templates/{id}", true, (*Service).deleteSnapshotOrTemplate},
		// Templates (template.go).
		{"POST /v3/templates", true, (*Service).postTemplate},
		{"GET /templates", false, (*Service).listTemplates},
		{"GET /templates/{id}", false, (*Service).getTemplate},
		{"GET /templates/{id}/files/{hash}", true, (*Service).getFileLink},
		{"POST /v2/templates/{id}/builds/{build}", true, (*Service).postBuild},
		{"GET /templates/{id}/builds/{build}/status", false, (*Service).getBuildStatus},
		{"GET /templates/{a}/{b}", false, (*Service).getTemplateSub},
		{"POST /templates/tags", true, (*Service).postTags},
		{"DELETE /templates/tags", true, (*Service).deleteTags},
		// Volumes (volume.go).
		{"POST /volumes", true, (*Service).postVolume},
		{"GET /volumes", false, (*Service).listVolumes},
		{"GET /volumes/{id}", false, (*Service).getVolume},
		{"DELETE /volumes/{id}", true, (*Service).deleteVolume},
		// Extensions: the observation of a sandbox.
		{"GET /sandboxes/{id}/report", false, (*Service).getReport},
		{"GET /sandboxes/{id}/events", false, (*Service).getEvents},
	} {
		s.mux.Handle(rt.pattern, s.control(rt.write, rt.h))
	}
	// The SDK uploads a build's files to the URL getFileLink gave, with
	// its token and no API key.
	s.mux.HandleFunc("PUT /templates/{id}/files/{hash}", s.putFile)
	s.mux.HandleFunc("HEAD /templates/{id}/files/{hash}", s.putFile)
	// The volume content API (E2B_VOLUME_API_URL), with the volume's
	// token.
	for pattern, h := range map[string]func(http.ResponseWriter, *http.Request, *os.Root, string) error{
		"GET /volumecontent/{id}/dir":     s.volumeList,
		"POST /volumecontent/{id}/dir":    s.volumeMkdir,
		"GET /volumecontent/{id}/path":    s.volumeStat,
		"PATCH /volumecontent/{id}/path":  s.volumePatch,
		"DELETE /volumecontent/{id}/path": s.volumeRemove,
		"GET /volumecontent/{id}/file":    s.volumeRead,
		"PUT /volumecontent/{id}/file":    s.volumeWrite,
	} {
		s.mux.HandleFunc(pattern, s.volumeContent(h))
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeAPIError(w, http.StatusNotImplemented, "agentjail's E2B-compatible API does not support "+r.Method+" "+r.URL.Path+" (see docs/e2b.md)")
	})
	s.envd = s.envdHandler()
}

// control authenticates a request, checks the key's role, and writes the
// handler's error as the SDK expects it: {"code": status, "message"}.
func (s *Service) control(write bool, h controlHandler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		c, err := s.authenticate(r)
		if err == nil && write && !c.key.Role.CanWrite() {
			err = errdefs.Forbiddenf("API key %s is a viewer's: it may only read", c.key.ID)
		}
		if err == nil {
			// The jails the sandbox's operations make belong to the
			// key's tenant, and the manager's look-ups check it.
			r = r.WithContext(tenant.NewContext(r.Context(), c.principal()))
			err = h(s, c, w, r)
		}
		status := http.StatusOK
		if err != nil {
			status = s.writeError(w, r, err)
		}
		if write {
			s.auditRequest(r, c, status, err, start)
		}
	})
}

// writeError answers err with its status (api.HTTPStatus) and the body
// the SDK reads.
func (s *Service) writeError(w http.ResponseWriter, r *http.Request, err error) int {
	status := api.HTTPStatus(err)
	msg := err.Error()
	if status == http.StatusInternalServerError {
		s.log.Error("e2b: internal error", "method", r.Method, "path", r.URL.Path, "err", err)
		msg = "internal error (see the daemon's log)"
	}
	writeAPIError(w, status, msg)
	return status
}

// auditRequest writes the audit line of a control-plane request that
// changes state.
func (s *Service) auditRequest(r *http.Request, c caller, status int, err error, start time.Time) {
	if s.opts.Audit == nil {
		return
	}
	e := audit.Entry{
		Surface: "e2b", Who: "anonymous", Action: r.Method + " " + r.URL.Path, Target: r.URL.Path,
		Status: status, Result: audit.ResultOf(status), Remote: r.RemoteAddr,
		DurationMs: float64(time.Since(start).Microseconds()) / 1000,
	}
	if c.key.Role != "" {
		p := c.principal()
		e.Who, e.KeyName, e.Tenant, e.Role = p.Who(), p.KeyName, p.Tenant, string(p.Role)
	}
	if err != nil {
		e.Error = err.Error()
	}
	if werr := s.opts.Audit.Write(e); werr != nil {
		s.log.Error("e2b: writing the audit log", "err", werr)
	}
}

func writeAPIError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"code": status, "message": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// decode reads a JSON body into v (unknown fields are ignored, as the SDK
// may send newer ones); an empty body leaves v alone.
func decode(r *http.Request, v any) error {
	data, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return errdefs.Wrap(errdefs.ErrInvalid, err, "request body")
	}
	if len(data) > maxBody {
		return errdefs.New(errdefs.ErrTooLarge, "request body: over %d bytes", maxBody)
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		return nil
	}
	if err := json.Unmarshal(data, v); err != nil {
		return errdefs.Invalidf("request body: %v", err)
	}
	return nil
}

// timeoutOf converts a timeout in seconds (nil: def).
func timeoutOf(sec *int64, def time.Duration) (time.Duration, error) {
	if sec == nil {
		return def, nil
	}
	if *sec < 0 || *sec > int64(maxTimeout/time.Second) {
		return 0, errdefs.Invalidf("timeout: %d s must be between 0 and %d s", *sec, int64(maxTimeout/time.Second))
	}
	return time.Duration(*sec) * time.Second, nil
}

// sandboxJSON is the Sandbox object of create, connect and fork.
func (s *Service) sandboxJSON(sb *sandbox) map[string]any {
	r := sb.snapshot()
	return map[string]any{
		"sandboxID": r.ID, "templateID": r.TemplateID, "clientID": "agentjail",
		"envdVersion": envdVersion, "envdAccessToken": r.Token, "domain": s.domain(), "trafficAccessToken": nilIfEmpty(r.TrafficToken),
	}
}

// domain is the sandboxes' domain as the SDK reads it (null: none).
func (s *Service) domain() any { return nilIfEmpty(s.opts.Domain) }

func nilIfEmpty(v string) any {
	if v == "" {
		return nil
	}
	return v
}

// detailJSON is the SandboxDetail of GET /sandboxes/{id} and the list,
// with agentjail's extension: the jails the sandbox ran in.
func (s *Service) detailJSON(r record) map[string]any {
	meta := r.Metadata
	if meta == nil {
		meta = map[string]string{}
	}
	state := r.State
	if state != statePaused {
		state = stateRunning
	}
	out := map[string]any{
		"sandboxID": r.ID, "templateID": r.TemplateID, "clientID": "agentjail", "alias": r.TemplateID,
		"metadata": meta, "envdVersion": envdVersion, "startedAt": r.StartedAt.Format(time.RFC3339Nano),
		"endAt": r.EndAt.Format(time.RFC3339Nano), "state": state, "cpuCount": r.CPUCount, "memoryMB": r.MemoryMB,
		"diskSizeMB": 0, "allowInternetAccess": r.Network != nil && r.Network.Internet, "domain": s.domain(),
		"lifecycle": map[string]any{"onTimeout": map[bool]string{true: "pause", false: "kill"}[r.AutoPause], "autoResume": r.AutoResume},
		"agentjail": map[string]any{"jailID": r.JailID, "jails": r.Jails},
	}
	if r.Network != nil {
		out["network"] = r.Network.infoJSON()
	}
	out["volumeMounts"] = nonNil(r.Volumes)
	return out
}

// createBody is the body of POST /v2/sandboxes.
type createBody struct {
	TemplateID string            `json:"templateID"`
	Timeout    *int64            `json:"timeout"`
	Metadata   map[string]string `json:"metadata"`
	EnvVars    map[string]string `json:"envVars"`
	AutoPause  bool              `json:"autoPause"`
	// AutoPauseMemory false makes the pause at the timeout keep the
	// files only.
	AutoPauseMemory *bool `json:"autoPauseMemory"`
	AutoResume      *struct {
		Enabled bool `json:"enabled"`
	} `json:"autoResume"`
	AllowInternetAccess *bool           `json:"allow_internet_access"`
	Network             *networkBody    `json:"network"`
	MCP                 json.RawMessage `json:"mcp"`
	IAM                 json.RawMessage `json:"iam"`
	Volumes             json.RawMessage `json:"volumeMounts"`
}

func (s *Service) postSandbox(c caller, w http.ResponseWriter, r *http.Request) error {
	var b createBody
	if err := decode(r, &b); err != nil {
		return err
	}
	if given(b.MCP) {
		return errdefs.NotImplementedf("mcp: MCP gateways in sandboxes are not supported by agentjail")
	}
	if given(b.IAM) {
		return errdefs.NotImplementedf("iam: workload identity tokens are not supported by agentjail")
	}
	timeout, err := timeoutOf(b.Timeout, defaultTimeout)
	if err != nil {
		return err
	}
	vols, mounts, err := s.volumeMounts(c, b.Volumes)
	if err != nil {
		return err
	}
	spec := createSpec{template: b.TemplateID, timeout: timeout, metadata: b.Metadata, envVars: b.EnvVars, autoPause: b.AutoPause, volumes: vols, mounts: mounts,
		autoResume: b.AutoResume != nil && b.AutoResume.Enabled, pauseFilesOnly: b.AutoPauseMemory != nil && !*b.AutoPauseMemory}
	if spec.pauseFilesOnly && !spec.autoPause {
		return errdefs.Invalidf("autoPauseMemory: applies to the pause at the timeout (autoPause)")
	}
	if spec.autoResume && !spec.autoPause {
		return errdefs.Invalidf("autoResume: a sandbox resumes only when it pauses at its timeout (autoPause)")
	}
	if b.AllowInternetAccess != nil || b.Network != nil {
		if b.Network != nil && b.Network.AllowInternetAccess != nil {
			return errdefs.Invalidf("network.allow_internet_access: give allow_internet_access beside network")
		}
		if spec.network, spec.creds, err = parseNetwork(b.AllowInternetAccess, b.Network); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), opTimeout)
	defer cancel()
	sb, err := s.create(ctx, c, spec)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, s.sandboxJSON(sb))
	return nil
}

// listSandboxes serves GET /v2/sandboxes: filtered by metadata, state and
// template, oldest first, paginated by x-next-token.
func (s *Service) listSandboxes(c caller, w http.ResponseWriter, r *http.Request) error {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return errdefs.Invalidf("query: %v", err)
	}
	var want url.Values
	if m := q.Get("metadata"); m != "" {
		v, err := url.ParseQuery(m)
		if err != nil {
			return errdefs.Invalidf("metadata: %v", err)
		}
		want = v
	}
	states := map[string]bool{}
	for _, st := range q["state"] {
		for _, x := range strings.Split(st, ",") {
			if x != "" {
				states[x] = true
			}
		}
	}
	limit := 100
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			return errdefs.Invalidf("limit: %q must be between 1 and 1000", l)
		}
		limit = n
	}
	s.mu.Lock()
	var recs []record
	for _, sb := range s.sandboxes {
		if c.sees(sb) {
			recs = append(recs, sb.snapshot())
		}
	}
	s.mu.Unlock()
	sort.Slice(recs, func(i, j int) bool {
		if recs[i].StartedAt.Equal(recs[j].StartedAt) {
			return recs[i].ID < recs[j].ID
		}
		return recs[i].StartedAt.Before(recs[j].StartedAt)
	})
	out := []map[string]any{}
	var afterAt time.Time
	afterID := ""
	if tok := q.Get("nextToken"); tok != "" {
		ns, id, ok := strings.Cut(tok, "_")
		n, err := strconv.ParseInt(ns, 10, 64)
		if !ok || err != nil {
			return errdefs.Invalidf("nextToken: %q is not a token this API gave", tok)
		}
		afterAt, afterID = time.Unix(0, n).UTC(), id
	}
	more := ""
	var last record
	for _, rec := range recs {
		if afterID != "" && (rec.StartedAt.Before(afterAt) || (rec.StartedAt.Equal(afterAt) && rec.ID <= afterID)) {
			continue
		}
		if rec.State != stateRunning && rec.State != statePaused {
			continue
		}
		if len(states) > 0 && !states[rec.State] {
			continue
		}
		if t := q.Get("template"); t != "" && t != rec.TemplateID {
			continue
		}
		if !matches(rec.Metadata, want) {
			continue
		}
		if len(out) == limit {
			more = fmt.Sprintf("%d_%s", last.StartedAt.UnixNano(), last.ID)
			break
		}
		out = append(out, s.detailJSON(rec))
		last = rec
	}
	if more != "" {
		w.Header().Set("X-Next-Token", more)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func matches(meta map[string]string, want url.Values) bool {
	for k, vs := range want {
		for _, v := range vs {
			if meta[k] != v {
				return false
			}
		}
	}
	return true
}

func (s *Service) getSandbox(c caller, w http.ResponseWriter, r *http.Request) error {
	sb, err := s.lookup(c, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.detailJSON(sb.snapshot()))
	return nil
}

func (s *Service) deleteSandbox(c caller, w http.ResponseWriter, r *http.Request) error {
	sb, err := s.lookup(c, r.PathValue("id"))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), opTimeout)
	defer cancel()
	if err := s.kill(ctx, sb); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Service) postTimeout(c caller, w http.ResponseWriter, r *http.Request) error {
	var b struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := decode(r, &b); err != nil {
		return err
	}
	if b.Timeout == nil {
		return errdefs.Invalidf("timeout: required (seconds)")
	}
	d, err := timeoutOf(b.Timeout, 0)
	if err != nil {
		return err
	}
	sb, err := s.lookup(c, r.PathValue("id"))
	if err != nil {
		return err
	}
	if err := s.setTimeout(sb, d); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Service) postPause(c caller, w http.ResponseWriter, r *http.Request) error {
	var b struct {
		// Memory false pauses the files only (the SDK's keepMemory).
		Memory *bool `json:"memory"`
	}
	if err := decode(r, &b); err != nil {
		return err
	}
	sb, err := s.lookup(c, r.PathValue("id"))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), opTimeout)
	defer cancel()
	if err := s.pause(ctx, sb, b.Memory == nil || *b.Memory); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// postConnect resumes a paused sandbox (201) or extends a running one's
// timeout (200), and returns the Sandbox object.
func (s *Service) postConnect(c caller, w http.ResponseWriter, r *http.Request) error {
	var b struct {
		Timeout *int64 `json:"timeout"`
		// Memory false asks for a fresh start from the files (the SDK's
		// onResume: 'reboot').
		Memory *bool `json:"memory"`
	}
	if err := decode(r, &b); err != nil {
		return err
	}
	d, err := timeoutOf(b.Timeout, defaultTimeout)
	if err != nil {
		return err
	}
	sb, err := s.lookup(c, r.PathValue("id"))
	if err != nil {
		return err
	}
	status := http.StatusOK
	if rec := sb.snapshot(); rec.State == statePaused {
		if b.Memory != nil && !*b.Memory && !rec.PausedFilesOnly {
			return errdefs.NotImplementedf("memory: false: agentjail resumes a sandbox paused with its memory with its processes; pause it with keepMemory: false for a fresh start")
		}
		status = http.StatusCreated
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), opTimeout)
	defer cancel()
	if err := s.resume(ctx, sb, d); err != nil {
		return err
	}
	writeJSON(w, status, s.sandboxJSON(sb))
	return nil
}

func (s *Service) postFork(c caller, w http.ResponseWriter, r *http.Request) error {
	var b struct {
		Timeout *int64 `json:"timeout"`
		Count   *int   `json:"count"`
	}
	if err := decode(r, &b); err != nil {
		return err
	}
	d, err := timeoutOf(b.Timeout, 15*time.Second)
	if err != nil {
		return err
	}
	count := 1
	if b.Count != nil {
		count = *b.Count
	}
	sb, err := s.lookup(c, r.PathValue("id"))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), opTimeout)
	defer cancel()
	forks, err := s.fork(ctx, c, sb, count, d)
	if err != nil {
		return err
	}
	out := make([]map[string]any, len(forks))
	for i, f := range forks {
		out[i] = map[string]any{"sandbox": s.sandboxJSON(f)}
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// getMetrics serves the sandbox's current resource use as one sample.
func (s *Service) getMetrics(c caller, w http.ResponseWriter, r *http.Request) error {
	sb, err := s.lookup(c, r.PathValue("id"))
	if err != nil {
		return err
	}
	m, err := s.metrics(r.Context(), sb)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, []map[string]any{m})
	return nil
}

// metrics is one sample of the sandbox's resource use (zero while paused).
func (s *Service) metrics(ctx context.Context, sb *sandbox) (map[string]any, error) {
	rec := sb.snapshot()
	m := map[string]any{"timestamp": time.Now().UTC().Format(time.RFC3339Nano), "cpuCount": rec.CPUCount,
		"cpuUsedPct": 0.0, "memUsed": 0, "memTotal": rec.MemoryMB << 20, "memCache": 0, "diskUsed": 0, "diskTotal": 0}
	if rec.State != stateRunning {
		return m, nil
	}
	j, err := s.jails.Get(ctx, rec.JailID)
	if err != nil {
		return nil, err
	}
	if st := j.Stats; st != nil {
		m["memUsed"], m["memTotal"] = st.MemoryBytes, st.MemoryLimitBytes
		m["diskUsed"], m["diskTotal"] = st.DiskUsedBytes, st.DiskLimitBytes
		if j.StartedAt != nil {
			if el := time.Since(*j.StartedAt); el > 0 && rec.CPUCount > 0 {
				m["cpuUsedPct"] = 100 * float64(st.CPUTimeNs) / float64(el.Nanoseconds()) / float64(rec.CPUCount)
			}
		}
	}
	return m, nil
}

// postSnapshot records the running sandbox (files and processes) as a
// snapshot a later create can name as its template.
func (s *Service) postSnapshot(c caller, w http.ResponseWriter, r *http.Request) error {
	var b struct {
		Name string `json:"name"`
	}
	if err := decode(r, &b); err != nil {
		return err
	}
	sb, err := s.lookup(c, r.PathValue("id"))
	if err != nil {
		return err
	}
	rec, err := sb.lockRunning("be snapshotted")
	if err != nil {
		return err
	}
	defer sb.op.Unlock()
	sb.endStreams()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), opTimeout)
	defer cancel()
	snap, err := s.snapshot(ctx, rec.JailID, snapshotRequest(b.Name))
	if err != nil {
		return err
	}
	names := []string{}
	if b.Name != "" {
		names = append(names, b.Name)
	}
	writeJSON(w, http.StatusCreated, map[string]any{"snapshotID": snap.ID, "names": names})
	return nil
}

// listSnapshots lists the snapshots of the caller's sandboxes (of one
// with ?sandboxID=).
func (s *Service) listSnapshots(c caller, w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	s.mu.Lock()
	jails := map[string]string{}
	for _, sb := range s.sandboxes {
		if !c.sees(sb) {
			continue
		}
		rec := sb.snapshot()
		if id := q.Get("sandboxID"); id != "" && id != rec.ID {
			continue
		}
		for _, j := range rec.Jails {
			jails[j] = rec.ID
		}
	}
	s.mu.Unlock()
	all, err := s.jails.ListSnapshots(r.Context(), "")
	if err != nil {
		return err
	}
	out := []map[string]any{}
	for _, sn := range all {
		if _, ok := jails[sn.JailID]; !ok || strings.Contains(sn.Name, "-pause-") || strings.Contains(sn.Name, "-fork-") {
			continue
		}
		if n := q.Get("name"); n != "" && n != sn.Name {
			continue
		}
		out = append(out, map[string]any{"snapshotID": sn.ID, "names": []string{sn.Name}})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// deleteSnapshotOrTemplate deletes a template (by id or name), or a
// snapshot of one of the caller's sandboxes.
func (s *Service) deleteSnapshotOrTemplate(c caller, w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if rec, err := s.templates.lookup(c, id); err == nil {
		if err := s.deleteTemplate(r.Context(), rec); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	snaps, err := s.jails.ListSnapshots(r.Context(), "")
	if err != nil {
		return err
	}
	for _, sn := range snaps {
		if sn.ID != id {
			continue
		}
		if !s.ownsJail(c, sn.JailID) {
			break
		}
		if err := s.jails.DeleteSnapshot(r.Context(), id); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	return errdefs.NotFoundf("snapshot %q not found", id)
}

// ownsJail reports whether jail belongs to a sandbox c sees.
func (s *Service) ownsJail(c caller, jail string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sb := range s.sandboxes {
		if !c.sees(sb) {
			continue
		}
		for _, j := range sb.snapshot().Jails {
			if j == jail {
				return true
			}
		}
	}
	return false
}

// getReport serves the observation report of the sandbox's jail (of an
// earlier one with ?jail=): every syscall, file, network flow and process.
func (s *Service) getReport(c caller, w http.ResponseWriter, r *http.Request) error {
	sb, err := s.lookup(c, r.PathValue("id"))
	if err != nil {
		return err
	}
	rec := sb.snapshot()
	jail := r.URL.Query().Get("jail")
	if jail == "" || (jail == rec.JailID && rec.State == stateRunning) {
		if rec.State != stateRunning {
			jail = rec.JailID
		} else {
			rep, err := s.jails.Report(r.Context(), rec.JailID)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, rep)
			return nil
		}
	}
	known := false
	for _, j := range rec.Jails {
		known = known || j == jail
	}
	if !known {
		return errdefs.NotFoundf("jail %q is not one of sandbox %s's", jail, rec.ID)
	}
	data, err := s.readReport(rec.ID, jail)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(data)
	return nil
}

// getEvents streams the running sandbox's live events as NDJSON
// (?type=syscall,file,net,proc; ?follow=false ends at the newest).
func (s *Service) getEvents(c caller, w http.ResponseWriter, r *http.Request) error {
	sb, err := s.lookup(c, r.PathValue("id"))
	if err != nil {
		return err
	}
	rec := sb.snapshot()
	if rec.State != stateRunning {
		return errdefs.Conflictf("sandbox %s is %s; its live events resume with it", rec.ID, rec.State)
	}
	var types []string
	if t := r.URL.Query().Get("type"); t != "" {
		types = strings.Split(t, ",")
	}
	follow := r.URL.Query().Get("follow") != "false"
	sub, newest, err := s.jails.Events(r.Context(), rec.JailID, 0, types)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	buf := make([]observe.Event, 0, 256)
	var line []byte
	for {
		if !follow && sub.Position() >= newest {
			return nil
		}
		evs, err := sub.Next(r.Context(), buf[:0])
		for i := range evs {
			line = append(evs[i].AppendJSON(line[:0]), '\n')
			if _, werr := w.Write(line); werr != nil {
				return nil
			}
		}
		_ = rc.Flush()
		if err != nil {
			return nil
		}
	}
}

// snapshotRequest is a full snapshot, named when name is a valid name.
func snapshotRequest(name string) model.SnapshotRequest {
	return model.SnapshotRequest{Name: name, Mode: model.SnapshotFull}
}
