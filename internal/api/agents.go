package api

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/lazyre"
	"github.com/agentjail/agentjail/internal/model"
)

// AgentService serves the agent routes: installing agent CLIs, running a
// jail's agent headless or in a terminal session, and syncing a jail's
// work back to its host repository. Jails with an agent or a workspace
// section are made by Service.Create, which the daemon routes through the
// agent service.
type AgentService interface {
	// Agents lists the agents the daemon knows and their installed versions.
	Agents(ctx context.Context) ([]model.AgentInfo, error)
	// InstallAgent installs an agent CLI at version (default: the pinned
	// one), calling progress with each line of progress; installed is false
	// when that version was there already. ErrNotFound for an unknown agent.
	InstallAgent(ctx context.Context, name, version string, progress func(string)) (tool *model.AgentTool, installed bool, err error)
	// Run runs the jail's agent headless on req.Prompt, streaming to out
	// as Service.Exec does (ErrConflict when the jail has no agent).
	Run(ctx context.Context, ref string, req model.AgentRunRequest, out model.ExecOutput) (*model.ExecResult, error)
	// Session starts the jail's agent in a terminal session and returns
	// it (detached; attach with WS /jails/{id}/terminal?session=).
	Session(ctx context.Context, ref string, req model.AgentSessionRequest) (*model.TerminalSession, error)
	// Sync takes the jail's work back into its host repository as branch
	// agentjail/<jail>: ErrConflict when that branch moved on the host or
	// nothing changed, ErrUnprocessable when the jail has no host
	// repository or its workspace is no repository.
	Sync(ctx context.Context, ref string) (*model.SyncResult, error)
}

// WithAgents serves the agent routes from a (without it they answer 501).
func WithAgents(a AgentService) Option { return func(s *server) { s.agents = a } }

func (s *server) agentService() (AgentService, error) {
	if s.agents == nil {
		return nil, errdefs.NotImplementedf("this daemon does not run agents")
	}
	return s.agents, nil
}

func (s *server) listAgents(w http.ResponseWriter, r *http.Request) error {
	a, err := s.agentService()
	if err != nil {
		return err
	}
	list, err := a.Agents(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, list)
	return nil
}

var agentNameRE = lazyre.New(`^[a-z][a-z0-9-]{0,31}$`)

// installAgent streams the install as NDJSON: {"progress": line}... then
// {"tool": {...}, "installed": bool} or {"type":"error","error":{...}}.
func (s *server) installAgent(w http.ResponseWriter, r *http.Request) error {
	a, err := s.agentService()
	if err != nil {
		return err
	}
	name := r.PathValue("name")
	if !agentNameRE().MatchString(name) {
		return errdefs.NotFoundf("unknown agent %q", name)
	}
	var req model.AgentInstallRequest
	if err := decodeBody(w, r, &req, false, true); err != nil {
		return err
	}
	nw := &ndjsonLines{w: w, rc: http.NewResponseController(w)}
	tool, installed, err := a.InstallAgent(r.Context(), name, req.Version, func(line string) {
		nw.write(model.AgentInstallEvent{Progress: line})
	})
	if err != nil {
		if !nw.started {
			return err
		}
		d := s.errorDetail(r, err)
		return nw.write(StreamEvent{Type: EventError, Error: &d})
	}
	return nw.write(model.AgentInstallEvent{Tool: tool, Installed: installed})
}

// ndjsonLines writes any JSON values as flushed lines.
type ndjsonLines struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
}

func (n *ndjsonLines) write(v any) error {
	if !n.started {
		n.w.Header().Set("Content-Type", "application/x-ndjson")
		n.w.Header().Set("Cache-Control", "no-store")
		n.w.WriteHeader(http.StatusOK)
		n.started = true
	}
	writeJSONLine(n.w, v)
	return n.rc.Flush()
}

func writeJSONLine(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	_, _ = w.Write(append(b, '\n'))
}

// runAgent streams a headless run in the format of exec/stream.
func (s *server) runAgent(w http.ResponseWriter, r *http.Request) error {
	a, err := s.agentService()
	if err != nil {
		return err
	}
	var req model.AgentRunRequest
	if err := decodeBody(w, r, &req, false, false); err != nil {
		return err
	}
	switch req.Encoding {
	case "", EncodingUTF8, EncodingBase64:
	default:
		return errdefs.Unprocessablef("encoding: %q (expected %q or %q)", req.Encoding, EncodingUTF8, EncodingBase64)
	}
	nw := &ndjsonWriter{w: w, rc: http.NewResponseController(w)}
	out := nw.output(req.Encoding, "agent run")
	res, err := a.Run(r.Context(), r.PathValue("id"), req, out)
	if err != nil {
		if r.Context().Err() != nil {
			return nil
		}
		if !nw.hasStarted() {
			return err
		}
		d := s.errorDetail(r, err)
		return nw.write(StreamEvent{Type: EventError, Error: &d})
	}
	return nw.write(StreamEvent{Type: EventExit, ExecResult: res})
}

func (s *server) agentSession(w http.ResponseWriter, r *http.Request) error {
	a, err := s.agentService()
	if err != nil {
		return err
	}
	var req model.AgentSessionRequest
	if err := decodeBody(w, r, &req, false, true); err != nil {
		return err
	}
	sess, err := a.Session(r.Context(), r.PathValue("id"), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, sess)
	return nil
}

func (s *server) syncJail(w http.ResponseWriter, r *http.Request) error {
	a, err := s.agentService()
	if err != nil {
		return err
	}
	if err := decodeBody(w, r, &struct{}{}, false, true); err != nil {
		return err
	}
	res, err := a.Sync(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// PreviewService makes signed preview links (internal/preview).
type PreviewService interface {
	// Link returns a URL of the jail's port valid for ttl (0: an hour);
	// base is the daemon's host:port as the client reached it.
	Link(ctx context.Context, ref string, port int, ttl time.Duration, base string) (*model.PreviewLink, error)
}

// WithPreviews serves POST /jails/{id}/previews from p.
func WithPreviews(p PreviewService) Option { return func(s *server) { s.previews = p } }

func (s *server) createPreview(w http.ResponseWriter, r *http.Request) error {
	if s.previews == nil {
		return errdefs.NotImplementedf("this daemon does not serve previews")
	}
	var req model.PreviewRequest
	if err := decodeBody(w, r, &req, false, false); err != nil {
		return err
	}
	link, err := s.previews.Link(r.Context(), r.PathValue("id"), req.Port, time.Duration(req.TTLS)*time.Second, r.Host)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, link)
	return nil
}
