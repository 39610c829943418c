// Package fakemodel is a model API for tests: one plain-HTTP server that
// speaks the Anthropic Messages API, the OpenAI Responses API and the
// Gemini API (streamed and not) well enough to drive the real agent CLIs
// (Claude Code, Codex CLI, Gemini CLI, opencode) through one tool round
// trip. Every answer is decided from the request alone: a tool result in
// the newest turn gets the final answer (the marker and the tool's
// output), a structured-output side query gets the smallest JSON object
// its schema allows, a request that offers the shell tool gets one call
// of it, anything else a plain answer. Every request is logged.
package fakemodel

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Config is the scenario.
type Config struct {
	// Command is the shell command of the one tool call.
	Command string
	// Marker starts the final answer (default FAKE-DONE).
	Marker string
	// Tool, when set, is the tool the Anthropic API calls instead of the
	// shell, with ToolInput as its input, if the request offers it (e.g.
	// an MCP tool: "mcp__agentjail__run_command").
	Tool      string
	ToolInput map[string]any
}

// Request is one logged request.
type Request struct {
	Time    time.Time   `json:"ts"`
	Method  string      `json:"method"`
	Path    string      `json:"path"`
	Query   string      `json:"query,omitempty"`
	Header  http.Header `json:"headers"`
	Body    string      `json:"body,omitempty"`
	Planned string      `json:"planned"`
}

// Server is the fake model API; use it as an http.Handler.
type Server struct {
	cfg Config
	seq atomic.Int64

	mu  sync.Mutex
	log []Request
	// first is closed at the first model request.
	first     chan struct{}
	firstOnce sync.Once
	firstAt   time.Time
}

// New returns a server for cfg.
func New(cfg Config) *Server {
	if cfg.Marker == "" {
		cfg.Marker = "FAKE-DONE"
	}
	if cfg.Command == "" {
		cfg.Command = "ls /workspace"
	}
	return &Server{cfg: cfg, first: make(chan struct{})}
}

// Requests returns the log so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.log...)
}

// Reset empties the log and re-arms First.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = nil
	s.first = make(chan struct{})
	s.firstOnce = sync.Once{}
	s.firstAt = time.Time{}
}

// First returns a channel closed at the first model request since the
// last Reset, and a function returning when it came.
func (s *Server) First() (<-chan struct{}, func() time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := s.first
	return ch, func() time.Time { s.mu.Lock(); defer s.mu.Unlock(); return s.firstAt }
}

// ModelRequests are the logged requests that asked a model for an answer.
func (s *Server) ModelRequests() []Request {
	var out []Request
	for _, r := range s.Requests() {
		if r.Method == http.MethodPost && (strings.HasPrefix(r.Path, "/v1/messages") && !strings.HasSuffix(r.Path, "count_tokens") ||
			r.Path == "/v1/responses" || strings.Contains(r.Path, "enerateContent")) {
			out = append(out, r)
		}
	}
	return out
}

func (s *Server) record(r *http.Request, body []byte, planned string) {
	h := r.Header.Clone()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.log = append(s.log, Request{Time: time.Now(), Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Header: h, Body: string(body), Planned: planned})
	if planned != "" && planned != "not-found" && planned != "count" && planned != "models" {
		s.firstOnce.Do(func() { s.firstAt = time.Now(); close(s.first) })
	}
}

// ServeHTTP answers one request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if r.Method == http.MethodHead {
		s.record(r, nil, "head")
		return
	}
	p := r.URL.Path
	switch {
	case r.Method == http.MethodConnect:
		s.record(r, nil, "refused")
		http.Error(w, "no tunnels here", http.StatusForbidden)
	case r.Method == http.MethodPost && p == "/v1/messages/count_tokens":
		s.record(r, body, "count")
		writeJSON(w, map[string]any{"input_tokens": 100})
	case r.Method == http.MethodGet && p == "/v1/models":
		s.record(r, nil, "models")
		writeJSON(w, map[string]any{"data": []any{map[string]any{"type": "model", "id": "fake-model", "display_name": "Fake",
			"created_at": "2025-01-01T00:00:00Z"}}, "has_more": false, "first_id": "fake-model", "last_id": "fake-model"})
	case r.Method == http.MethodPost && p == "/v1/messages":
		s.anthropic(w, r, body)
	case r.Method == http.MethodPost && p == "/v1/responses":
		s.responses(w, r, body)
	case r.Method == http.MethodPost && strings.HasPrefix(p, "/v1beta/models/") && strings.HasSuffix(p, ":countTokens"):
		s.record(r, body, "count")
		writeJSON(w, map[string]any{"totalTokens": 100})
	case r.Method == http.MethodPost && strings.HasPrefix(p, "/v1beta/models/") && strings.Contains(p, "enerateContent"):
		s.gemini(w, r, body, strings.HasSuffix(p, ":streamGenerateContent"))
	default:
		s.record(r, body, "not-found")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"type":"error","error":{"type":"not_found_error","message":"fake model: no %s %s"}}`, r.Method, p)
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("request-id", "req_fake")
	w.Header().Set("Content-Length", fmt.Sprint(len(b)))
	w.Write(b)
}

// sse writes server-sent events, each flushed.
type sse struct {
	w http.ResponseWriter
}

func newSSE(w http.ResponseWriter) *sse {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	return &sse{w: w}
}

func (e *sse) event(name string, v any) {
	b, _ := json.Marshal(v)
	if name != "" {
		fmt.Fprintf(e.w, "event: %s\n", name)
	}
	fmt.Fprintf(e.w, "data: %s\n\n", b)
	http.NewResponseController(e.w).Flush()
}

func (s *Server) final(output string) string {
	return s.cfg.Marker + ": the tool returned:\n" + strings.TrimSpace(output)
}

func halves(s string) [2]string {
	n := len(s) / 2
	return [2]string{s[:n], s[n:]}
}

// ---- Anthropic Messages ----

type anthropicReq struct {
	Stream   bool `json:"stream"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Tools []struct {
		Name string `json:"name"`
	} `json:"tools"`
	OutputConfig *struct {
		Format *struct {
			Type   string         `json:"type"`
			Schema map[string]any `json:"schema"`
		} `json:"format"`
	} `json:"output_config"`
}

type block struct {
	Type    string          `json:"type"`
	Text    string          `json:"text"`
	Content json.RawMessage `json:"content"`
}

// anthropicToolResult returns the text of a tool_result in the last user
// message.
func anthropicToolResult(req *anthropicReq) (string, bool) {
	if len(req.Messages) == 0 {
		return "", false
	}
	last := req.Messages[len(req.Messages)-1]
	if last.Role != "user" {
		return "", false
	}
	var blocks []block
	if json.Unmarshal(last.Content, &blocks) != nil {
		return "", false
	}
	for _, b := range blocks {
		if b.Type != "tool_result" {
			continue
		}
		var str string
		if json.Unmarshal(b.Content, &str) == nil {
			return str, true
		}
		var parts []block
		json.Unmarshal(b.Content, &parts)
		var sb strings.Builder
		for _, p := range parts {
			sb.WriteString(p.Text)
		}
		return sb.String(), true
	}
	return "", false
}

func (s *Server) anthropic(w http.ResponseWriter, r *http.Request, body []byte) {
	var req anthropicReq
	if err := json.Unmarshal(body, &req); err != nil {
		s.record(r, body, "bad-request")
		http.Error(w, `{"type":"error","error":{"type":"invalid_request_error","message":"bad json"}}`, http.StatusBadRequest)
		return
	}
	var text, tool string
	var input map[string]any
	planned := "text"
	if out, ok := anthropicToolResult(&req); ok {
		text, planned = s.final(out), "end_turn"
	} else if name := offered(req.Tools, s.cfg.Tool); s.cfg.Tool != "" && name != "" {
		tool, planned = name, "tool_use"
		text = "I will use the " + name + " tool."
		input = s.cfg.ToolInput
	} else if name := offered(req.Tools, "Bash", "bash"); name != "" {
		tool, planned = name, "tool_use"
		text = "I will use the " + name + " tool."
		input = map[string]any{"command": s.cfg.Command, "description": "Write a file and list the workspace"}
	} else if req.OutputConfig != nil && req.OutputConfig.Format != nil && req.OutputConfig.Format.Type == "json_schema" {
		b, _ := json.Marshal(minimal(req.OutputConfig.Format.Schema))
		text, planned = string(b), "json"
	} else {
		text = s.cfg.Marker + ": plain answer"
	}
	s.record(r, body, planned)
	id := fmt.Sprintf("msg_fake%d", s.seq.Add(1))
	stop := "end_turn"
	if tool != "" {
		stop = "tool_use"
	}
	usage := map[string]any{"input_tokens": 12, "output_tokens": 20, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
	if !req.Stream {
		content := []any{map[string]any{"type": "text", "text": text}}
		if tool != "" {
			content = append(content, map[string]any{"type": "tool_use", "id": "toolu_" + id, "name": tool, "input": input})
		}
		writeJSON(w, map[string]any{"id": id, "type": "message", "role": "assistant", "model": "fake-model", "content": content,
			"stop_reason": stop, "stop_sequence": nil, "usage": usage})
		return
	}
	e := newSSE(w)
	e.event("message_start", map[string]any{"type": "message_start", "message": map[string]any{"id": id, "type": "message", "role": "assistant",
		"model": "fake-model", "content": []any{}, "stop_reason": nil, "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": 12, "output_tokens": 1, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}})
	e.event("ping", map[string]any{"type": "ping"})
	e.event("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]any{"type": "text", "text": ""}})
	for _, part := range halves(text) {
		e.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "text_delta", "text": part}})
	}
	e.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	if tool != "" {
		e.event("content_block_start", map[string]any{"type": "content_block_start", "index": 1,
			"content_block": map[string]any{"type": "tool_use", "id": "toolu_" + id, "name": tool, "input": map[string]any{}}})
		args, _ := json.Marshal(input)
		h := halves(string(args))
		for _, part := range []string{"", h[0], h[1]} {
			e.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": 1, "delta": map[string]any{"type": "input_json_delta", "partial_json": part}})
		}
		e.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": 1})
	}
	e.event("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop, "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": 20}})
	e.event("message_stop", map[string]any{"type": "message_stop"})
}

func offered(tools []struct {
	Name string `json:"name"`
}, names ...string) string {
	for _, t := range tools {
		for _, n := range names {
			if t.Name == n {
				return n
			}
		}
	}
	return ""
}

// ---- OpenAI Responses ----

type responsesReq struct {
	Stream bool              `json:"stream"`
	Input  []json.RawMessage `json:"input"`
	Tools  []struct {
		Type string `json:"type"`
		Name string `json:"name"`
	} `json:"tools"`
	Text *struct {
		Format *struct {
			Type   string         `json:"type"`
			Schema map[string]any `json:"schema"`
		} `json:"format"`
	} `json:"text"`
}

func (s *Server) responses(w http.ResponseWriter, r *http.Request, body []byte) {
	var req responsesReq
	if err := json.Unmarshal(body, &req); err != nil {
		s.record(r, body, "bad-request")
		http.Error(w, `{"error":{"message":"bad json"}}`, http.StatusBadRequest)
		return
	}
	// The newest items after the last user message.
	var output string
	hasResult := false
	for _, raw := range req.Input {
		var it struct {
			Type   string          `json:"type"`
			Role   string          `json:"role"`
			Output json.RawMessage `json:"output"`
		}
		json.Unmarshal(raw, &it)
		switch {
		case it.Role == "user" || (it.Type == "message" && it.Role == "user"):
			hasResult, output = false, ""
		case it.Type == "function_call_output" || it.Type == "custom_tool_call_output" || it.Type == "local_shell_call_output":
			hasResult = true
			var str string
			if json.Unmarshal(it.Output, &str) != nil {
				str = string(it.Output)
			}
			output = str
		}
	}
	var text, tool, args string
	planned := "text"
	switch {
	case req.Text != nil && req.Text.Format != nil && req.Text.Format.Type == "json_schema":
		b, _ := json.Marshal(minimal(req.Text.Format.Schema))
		text, planned = string(b), "json"
	case hasResult:
		text, planned = s.final(output), "end_turn"
	default:
		names := map[string]bool{}
		for _, t := range req.Tools {
			names[t.Name] = true
		}
		switch {
		case names["exec_command"]:
			tool = "exec_command"
			b, _ := json.Marshal(map[string]any{"cmd": s.cfg.Command})
			args = string(b)
		case names["shell_command"]:
			tool = "shell_command"
			b, _ := json.Marshal(map[string]any{"command": s.cfg.Command})
			args = string(b)
		case names["shell"]:
			tool = "shell"
			b, _ := json.Marshal(map[string]any{"command": []string{"bash", "-lc", s.cfg.Command}})
			args = string(b)
		default:
			text = s.cfg.Marker + ": plain answer"
		}
		if tool != "" {
			planned = "tool_use"
		}
	}
	s.record(r, body, planned)
	n := s.seq.Add(1)
	rid := fmt.Sprintf("resp_fake%d", n)
	var item map[string]any
	if tool != "" {
		item = map[string]any{"type": "function_call", "id": fmt.Sprintf("fc_%d", n), "call_id": fmt.Sprintf("call_%d", n),
			"name": tool, "arguments": args, "status": "completed"}
	} else {
		item = map[string]any{"type": "message", "id": fmt.Sprintf("msg_%d", n), "role": "assistant", "status": "completed",
			"content": []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}}}
	}
	usage := map[string]any{"input_tokens": 12, "input_tokens_details": map[string]any{"cached_tokens": 0}, "output_tokens": 20,
		"output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": 32}
	done := map[string]any{"id": rid, "object": "response", "status": "completed", "model": "fake-model", "output": []any{item}, "usage": usage}
	if !req.Stream {
		writeJSON(w, done)
		return
	}
	e := newSSE(w)
	seq := 0
	ev := func(name string, v map[string]any) {
		v["type"] = name
		v["sequence_number"] = seq
		seq++
		e.event(name, v)
	}
	ev("response.created", map[string]any{"response": map[string]any{"id": rid, "object": "response", "status": "in_progress", "model": "fake-model", "output": []any{}}})
	if tool != "" {
		added := map[string]any{}
		for k, v := range item {
			added[k] = v
		}
		added["arguments"], added["status"] = "", "in_progress"
		ev("response.output_item.added", map[string]any{"output_index": 0, "item": added})
		for _, part := range halves(args) {
			ev("response.function_call_arguments.delta", map[string]any{"output_index": 0, "item_id": item["id"], "delta": part})
		}
		ev("response.function_call_arguments.done", map[string]any{"output_index": 0, "item_id": item["id"], "arguments": args})
	} else {
		ev("response.output_item.added", map[string]any{"output_index": 0, "item": map[string]any{"type": "message", "id": item["id"], "role": "assistant",
			"status": "in_progress", "content": []any{}}})
		ev("response.content_part.added", map[string]any{"output_index": 0, "item_id": item["id"], "content_index": 0,
			"part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}})
		for _, part := range halves(text) {
			ev("response.output_text.delta", map[string]any{"output_index": 0, "item_id": item["id"], "content_index": 0, "delta": part})
		}
		ev("response.output_text.done", map[string]any{"output_index": 0, "item_id": item["id"], "content_index": 0, "text": text})
		ev("response.content_part.done", map[string]any{"output_index": 0, "item_id": item["id"], "content_index": 0,
			"part": map[string]any{"type": "output_text", "text": text, "annotations": []any{}}})
	}
	ev("response.output_item.done", map[string]any{"output_index": 0, "item": item})
	ev("response.completed", map[string]any{"response": done})
}

// ---- Gemini ----

type geminiReq struct {
	Contents []struct {
		Role  string `json:"role"`
		Parts []struct {
			Text             string `json:"text"`
			FunctionResponse *struct {
				Name     string         `json:"name"`
				Response map[string]any `json:"response"`
			} `json:"functionResponse"`
		} `json:"parts"`
	} `json:"contents"`
	Tools []struct {
		FunctionDeclarations []struct {
			Name string `json:"name"`
		} `json:"functionDeclarations"`
	} `json:"tools"`
	GenerationConfig *struct {
		ResponseMimeType   string         `json:"responseMimeType"`
		ResponseJSONSchema map[string]any `json:"responseJsonSchema"`
		ResponseSchema     map[string]any `json:"responseSchema"`
	} `json:"generationConfig"`
}

func (s *Server) gemini(w http.ResponseWriter, r *http.Request, body []byte, stream bool) {
	var req geminiReq
	if err := json.Unmarshal(body, &req); err != nil {
		s.record(r, body, "bad-request")
		http.Error(w, `{"error":{"code":400,"message":"bad json"}}`, http.StatusBadRequest)
		return
	}
	var part map[string]any
	planned := "text"
	gc := req.GenerationConfig
	switch {
	case gc != nil && gc.ResponseMimeType == "application/json":
		schema := gc.ResponseJSONSchema
		if schema == nil {
			schema = gc.ResponseSchema
		}
		b, _ := json.Marshal(minimal(schema))
		part, planned = map[string]any{"text": string(b)}, "json"
	default:
		if out, ok := geminiToolResult(&req); ok {
			part, planned = map[string]any{"text": s.final(out)}, "end_turn"
			break
		}
		offered := false
		for _, t := range req.Tools {
			for _, f := range t.FunctionDeclarations {
				offered = offered || f.Name == "run_shell_command"
			}
		}
		if offered {
			part, planned = map[string]any{"functionCall": map[string]any{"name": "run_shell_command",
				"args": map[string]any{"command": s.cfg.Command, "description": "Write a file and list the workspace"}}}, "tool_use"
		} else {
			part = map[string]any{"text": s.cfg.Marker + ": plain answer"}
		}
	}
	s.record(r, body, planned)
	resp := map[string]any{
		"candidates":    []any{map[string]any{"content": map[string]any{"role": "model", "parts": []any{part}}, "finishReason": "STOP", "index": 0}},
		"usageMetadata": map[string]any{"promptTokenCount": 12, "candidatesTokenCount": 20, "totalTokenCount": 32},
		"modelVersion":  "gemini-fake", "responseId": fmt.Sprintf("fake-%d", s.seq.Add(1)),
	}
	if !stream {
		writeJSON(w, resp)
		return
	}
	newSSE(w).event("", resp)
}

func geminiToolResult(req *geminiReq) (string, bool) {
	if len(req.Contents) == 0 {
		return "", false
	}
	last := req.Contents[len(req.Contents)-1]
	for _, p := range last.Parts {
		if p.FunctionResponse != nil {
			if out, ok := p.FunctionResponse.Response["output"].(string); ok {
				return out, true
			}
			b, _ := json.Marshal(p.FunctionResponse.Response)
			return string(b), true
		}
	}
	return "", false
}

// minimal returns the smallest value a JSON schema allows: objects with
// every property, empty arrays, minimum numbers (or 1), false, the first
// enum value, a short string. Type names may be upper case (Gemini).
func minimal(schema map[string]any) any {
	if schema == nil {
		return map[string]any{}
	}
	if enum, ok := schema["enum"].([]any); ok && len(enum) > 0 {
		return enum[0]
	}
	t, _ := schema["type"].(string)
	if ts, ok := schema["type"].([]any); ok && len(ts) > 0 {
		t, _ = ts[0].(string)
	}
	switch strings.ToLower(t) {
	case "object", "":
		out := map[string]any{}
		props, _ := schema["properties"].(map[string]any)
		for k, v := range props {
			sub, _ := v.(map[string]any)
			out[k] = minimal(sub)
		}
		return out
	case "array":
		return []any{}
	case "integer", "number":
		if m, ok := schema["minimum"].(float64); ok {
			return m
		}
		return 1
	case "boolean":
		return false
	default:
		if min, ok := schema["minLength"].(float64); ok && min > 12 {
			return strings.Repeat("x", int(min))
		}
		return "Fake session"
	}
}

// LogJSON renders the log as JSON lines with the key headers cut short
// (for failure messages).
func (s *Server) LogJSON() string {
	var buf bytes.Buffer
	for _, r := range s.Requests() {
		h := r.Header.Clone()
		for _, k := range []string{"X-Api-Key", "Authorization", "X-Goog-Api-Key"} {
			if v := h.Get(k); len(v) > 12 {
				h.Set(k, v[:12]+"…")
			}
		}
		r.Header = h
		if len(r.Body) > 300 {
			r.Body = r.Body[:300] + "…"
		}
		b, _ := json.Marshal(r)
		buf.Write(b)
		buf.WriteByte('\n')
	}
	return buf.String()
}
