package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/model"
)

// The agent API's types.
type (
	// Agent is a jail's agent section.
	Agent = config.Agent
	// Workspace is a jail's workspace section.
	Workspace = config.Workspace
	// Sync configures a workspace's sync back.
	Sync = config.Sync
	// AgentInfo is an agent the daemon knows.
	AgentInfo = model.AgentInfo
	// AgentTool is an installed agent CLI.
	AgentTool = model.AgentTool
	// AgentRunRequest is a headless run.
	AgentRunRequest = model.AgentRunRequest
	// AgentSessionRequest starts the agent's TUI.
	AgentSessionRequest = model.AgentSessionRequest
	// SyncResult is what a sync wrote.
	SyncResult = model.SyncResult
)

// Agents lists the agents the daemon knows and their installed versions.
func (c *Client) Agents(ctx context.Context) ([]AgentInfo, error) {
	var out []AgentInfo
	return out, c.call(ctx, http.MethodGet, "/agents", nil, &out)
}

// InstallAgent installs an agent CLI on the daemon's host (version ""
// for agentjail's pinned one), passing each progress line to progress (may
// be nil). installed is false when that version was there already.
func (c *Client) InstallAgent(ctx context.Context, name, version string, progress func(line string)) (tool *AgentTool, installed bool, err error) {
	b, err := json.Marshal(model.AgentInstallRequest{Version: version})
	if err != nil {
		return nil, false, err
	}
	resp, err := c.do(ctx, request{method: http.MethodPost, path: "/agents/" + url.PathEscape(name) + "/install",
		body: bytes.NewReader(b), ctype: "application/json"})
	if err != nil {
		return nil, false, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), maxStreamLine)
	for sc.Scan() {
		var ev struct {
			model.AgentInstallEvent
			Type  string `json:"type"`
			Error *struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, false, fmt.Errorf("install stream: bad event: %w", err)
		}
		switch {
		case ev.Error != nil:
			return nil, false, &APIError{Status: statusOfCode(ev.Error.Code), Code: ev.Error.Code, Message: ev.Error.Message}
		case ev.Tool != nil:
			return ev.Tool, ev.Installed, nil
		case progress != nil:
			progress(ev.Progress)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, false, fmt.Errorf("install stream: %w", err)
	}
	return nil, false, errors.New("install stream: the daemon ended the stream without a result")
}

// RunAgent runs the jail's agent headless on req.Prompt, passing its
// output to fn as it comes, and returns its exit.
func (c *Client) RunAgent(ctx context.Context, ref string, req AgentRunRequest, fn func(stream string, data []byte) error) (*ExecResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req.Encoding = "base64"
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(ctx, request{method: http.MethodPost, path: jailURL(ref) + "/agent/run", body: bytes.NewReader(b), ctype: "application/json"})
	if err != nil {
		return nil, err
	}
	return readExecStream(resp, fn)
}

// AgentSession starts the jail's agent in a terminal session; attach to
// it with Terminal and TerminalOptions.Session.
func (c *Client) AgentSession(ctx context.Context, ref string, req AgentSessionRequest) (*TerminalSession, error) {
	var out TerminalSession
	return &out, c.call(ctx, http.MethodPost, jailURL(ref)+"/agent/session", req, &out)
}

// Sync takes the jail's work back into its host repository as branch
// agentjail/<jail>.
func (c *Client) Sync(ctx context.Context, ref string) (*SyncResult, error) {
	var out SyncResult
	return &out, c.call(ctx, http.MethodPost, jailURL(ref)+"/sync", struct{}{}, &out)
}

// PreviewLink is a signed preview URL.
type PreviewLink = model.PreviewLink

// Preview returns a signed link to a port of the jail, served by the
// daemon at http://<port>-<jail>.localhost:<daemon port>/, valid for ttl
// (0: an hour).
func (c *Client) Preview(ctx context.Context, ref string, port int, ttl time.Duration) (*PreviewLink, error) {
	var out PreviewLink
	return &out, c.call(ctx, http.MethodPost, jailURL(ref)+"/previews", model.PreviewRequest{Port: port, TTLS: int64(ttl / time.Second)}, &out)
}
