package api

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/jsonstr"
	"github.com/agentjail/agentjail/internal/model"
)

// Exec encodings of ExecRequest.Encoding.
const (
	EncodingUTF8   = "utf8"
	EncodingBase64 = "base64"
)

// StreamEvent is one line of POST /jails/{id}/exec/stream (NDJSON):
// {"type":"stdout"|"stderr","data":"..."} for each output chunk as it
// happens, then either {"type":"exit", ...ExecResult fields} or, when the
// exec failed after output began, {"type":"error","error":{...}}.
type StreamEvent struct {
	// Type is stdout, stderr, exit or error.
	Type string `json:"type"`
	// Data is an output chunk, base64 when the request's encoding is base64.
	Data string `json:"data,omitempty"`
	// ExecResult is set on the exit event (its stdout and stderr are empty).
	*model.ExecResult
	// Error is set on the error event.
	Error *ErrorDetail `json:"error,omitempty"`
}

// Stream event types.
const (
	EventStdout = "stdout"
	EventStderr = "stderr"
	EventExit   = "exit"
	EventError  = "error"
)

// decodeExec decodes an exec request and converts its stdin to raw bytes.
func decodeExec(w http.ResponseWriter, r *http.Request) (model.ExecRequest, error) {
	var req model.ExecRequest
	if err := decodeBody(w, r, &req, false, false); err != nil {
		return req, err
	}
	switch req.Encoding {
	case "", EncodingUTF8:
	case EncodingBase64:
		raw, err := base64.StdEncoding.DecodeString(req.Stdin)
		if err != nil {
			return req, errdefs.Invalidf("stdin: not valid base64 (encoding is base64): %v", err)
		}
		req.Stdin = string(raw)
	default:
		return req, errdefs.Unprocessablef("encoding: %q (expected %q or %q)", req.Encoding, EncodingUTF8, EncodingBase64)
	}
	return req, nil
}

// encodeOutput converts raw output bytes for the JSON answer. With utf8,
// bytes that are not UTF-8 become U+FFFD when marshalled.
func encodeOutput(enc string, data string) string {
	if enc == EncodingBase64 {
		return base64.StdEncoding.EncodeToString([]byte(data))
	}
	return data
}

func (s *server) exec(w http.ResponseWriter, r *http.Request) error {
	req, err := decodeExec(w, r)
	if err != nil {
		return err
	}
	res, err := s.svc.Exec(r.Context(), r.PathValue("id"), req, nil)
	if err != nil {
		return err
	}
	out := *res
	out.Stdout = encodeOutput(req.Encoding, res.Stdout)
	out.Stderr = encodeOutput(req.Encoding, res.Stderr)
	writeJSON(w, http.StatusOK, &out)
	return nil
}

// ndjsonWriter writes stream events, one flushed line each. The response
// header goes out with the first event, so an exec that fails before any
// output is answered with an ordinary error status.
type ndjsonWriter struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
}

func (n *ndjsonWriter) write(ev any) error {
	line, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	return n.writeLine(append(line, '\n'))
}

// output returns the ExecOutput that writes each chunk as a stdout or
// stderr event with its data in encoding enc; what names the stream in
// errors. The lines are built by hand: output is most of a stream, and
// encoding/json escapes a large string at about a seventh of the speed.
func (n *ndjsonWriter) output(enc, what string) model.ExecOutput {
	return func(stream string, data []byte) error {
		if stream != EventStdout && stream != EventStderr {
			return fmt.Errorf("%s: output on unknown stream %q", what, stream)
		}
		line := make([]byte, 0, len(data)*4/3+64)
		line = append(line, `{"type":"`...)
		line = append(line, stream...)
		line = append(line, `","data":`...)
		if enc == EncodingBase64 {
			line = append(line, '"')
			line = base64.StdEncoding.AppendEncode(line, data)
			line = append(line, '"')
		} else {
			line = jsonstr.Append(line, data)
		}
		return n.writeLine(append(line, "}\n"...))
	}
}

// writeLine writes one line, the response header first if it is not out
// yet, and flushes it.
func (n *ndjsonWriter) writeLine(line []byte) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.started {
		h := n.w.Header()
		h.Set("Content-Type", "application/x-ndjson")
		h.Set("Cache-Control", "no-store")
		h.Set("X-Content-Type-Options", "nosniff")
		n.w.WriteHeader(http.StatusOK)
		n.started = true
	}
	if _, err := n.w.Write(line); err != nil {
		return err
	}
	return n.rc.Flush()
}

func (n *ndjsonWriter) hasStarted() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.started
}

func (s *server) execStream(w http.ResponseWriter, r *http.Request) error {
	req, err := decodeExec(w, r)
	if err != nil {
		return err
	}
	nw := &ndjsonWriter{w: w, rc: http.NewResponseController(w)}
	res, err := s.svc.Exec(r.Context(), r.PathValue("id"), req, nw.output(req.Encoding, "exec stream"))
	if err != nil {
		if r.Context().Err() != nil {
			// The client went away; the command was cancelled with it.
			s.log.Info("exec stream ended by the client", "path", r.URL.EscapedPath(), "err", err)
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
