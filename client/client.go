// Package client is a Go client of agentjail's REST API (api/openapi.yaml).
//
// A Client holds the daemon's base URL and bearer token; each method is one
// API call. Errors the daemon answers with are returned as *APIError, which
// carries the HTTP status and the error's code and message. Exec output and
// stdin are raw bytes held in Go strings: the client moves them as base64 on
// the wire, so binary data survives.
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/model"
)

// The API's types, named here so that programs outside this module can
// use them.
type (
	// Jail is a jail as the API reports it.
	Jail = model.Jail
	// State is a jail's lifecycle state.
	State = model.State
	// Stats is a jail's live resource usage.
	Stats = model.Stats
	// CreateRequest is the body of Create.
	CreateRequest = model.CreateRequest
	// ExecRequest is the request of Exec and ExecStream.
	ExecRequest = model.ExecRequest
	// ExecResult is the outcome of a command.
	ExecResult = model.ExecResult
	// FileInfo describes a path in a jail.
	FileInfo = model.FileInfo
	// WriteOptions controls WriteFile and Mkdir.
	WriteOptions = model.WriteOptions
	// AccessResult is the answer of Access.
	AccessResult = model.AccessResult
	// Health is the daemon's health report.
	Health = model.Health
	// BranchRequest says how many jails Branch makes and their names.
	BranchRequest = model.BranchRequest
	// Config is a jail's configuration.
	Config = config.Config
	// Isolation is the isolation part of a Config.
	Isolation = config.Isolation
	// Filesystem configures a jail's root and mounts.
	Filesystem = config.Filesystem
	// Mount is a bind mount of a host path into a jail.
	Mount = config.Mount
	// Network configures a jail's network.
	Network = config.Network
	// Resources are a jail's limits.
	Resources = config.Resources
	// Process configures the identity and privileges of a jail's processes.
	Process = config.Process
)

// APIError is an error answered by the daemon.
type APIError struct {
	// Status is the HTTP status.
	Status int
	// Code is the machine-readable kind, e.g. "not_found", "conflict".
	Code string
	// Message names the field or resource at fault.
	Message string
}

// Error returns the daemon's message.
func (e *APIError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("%d %s", e.Status, http.StatusText(e.Status))
	}
	return e.Message
}

// IsNotFound reports whether err is an APIError with status 404.
func IsNotFound(err error) bool { return statusOf(err) == http.StatusNotFound }

// IsConflict reports whether err is an APIError with status 409.
func IsConflict(err error) bool { return statusOf(err) == http.StatusConflict }

func statusOf(err error) int {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Status
	}
	return 0
}

// Client calls one daemon. Its fields may be changed before first use.
type Client struct {
	// BaseURL is the daemon's URL, e.g. http://127.0.0.1:8082.
	BaseURL string
	// Token is the bearer token (DATA_DIR/api-token on the daemon's host).
	Token string
	// HTTP makes the requests (default: http.DefaultClient). A client
	// timeout also cuts streams short; prefer contexts.
	HTTP *http.Client
}

// New returns a client of the daemon at baseURL ("http://host:port"; a
// bare "host:port" gets http://) using token.
func New(baseURL, token string) *Client {
	if !strings.Contains(baseURL, "://") {
		baseURL = "http://" + baseURL
	}
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), Token: token, HTTP: http.DefaultClient}
}

// request is one API call.
type request struct {
	method string
	path   string // already escaped
	query  url.Values
	body   io.Reader
	ctype  string
}

// send sends req and returns the response, whatever its status.
func (c *Client) send(ctx context.Context, req request) (*http.Response, error) {
	u := c.BaseURL + req.path
	if len(req.query) > 0 {
		u += "?" + req.query.Encode()
	}
	hr, err := http.NewRequestWithContext(ctx, req.method, u, req.body)
	if err != nil {
		return nil, err
	}
	if c.Token != "" {
		hr.Header.Set("Authorization", "Bearer "+c.Token)
	}
	if req.ctype != "" {
		hr.Header.Set("Content-Type", req.ctype)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	return hc.Do(hr)
}

// do sends req and returns the response when its status is 2xx; otherwise
// it closes the body and returns an *APIError.
func (c *Client) do(ctx context.Context, req request) (*http.Response, error) {
	resp, err := c.send(ctx, req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	return nil, readAPIError(resp)
}

func readAPIError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var eb struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	ae := &APIError{Status: resp.StatusCode}
	if json.Unmarshal(b, &eb) == nil && eb.Error.Code != "" {
		ae.Code, ae.Message = eb.Error.Code, eb.Error.Message
	} else {
		ae.Code = "http_" + strconv.Itoa(resp.StatusCode)
		ae.Message = strings.TrimSpace(fmt.Sprintf("%s %s", resp.Status, bytes.TrimSpace(b)))
	}
	return ae
}

// call sends a request with an optional JSON body and decodes a JSON
// answer into out (when out is not nil).
func (c *Client) call(ctx context.Context, method, p string, in, out any) error {
	req := request{method: method, path: p}
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		req.body, req.ctype = bytes.NewReader(b), "application/json"
	}
	resp, err := c.do(ctx, req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return decodeJSON(resp, out)
}

func decodeJSON(resp *http.Response, out any) error {
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode %s %s answer: %w", resp.Request.Method, resp.Request.URL.Path, err)
	}
	return nil
}

func jailURL(ref string) string { return "/jails/" + url.PathEscape(ref) }

// fileURL is the URL path of a jail path: the path, cleaned, without its
// leading slash, each element escaped.
func fileURL(ref, p string) (string, error) {
	if p == "" || strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("jail path %q: must be a non-empty path without NUL bytes", p)
	}
	clean := strings.TrimPrefix(path.Clean("/"+p), "/")
	if clean == "" {
		return "", fmt.Errorf("jail path %q: the root directory cannot be named in the files API", p)
	}
	parts := strings.Split(clean, "/")
	for i, s := range parts {
		parts[i] = url.PathEscape(s)
	}
	return jailURL(ref) + "/files/" + strings.Join(parts, "/"), nil
}

// Health returns the daemon's health report. A degraded daemon answers
// with status 503 and the report, which Health returns without error.
func (c *Client) Health(ctx context.Context) (*Health, error) {
	resp, err := c.send(ctx, request{method: http.MethodGet, path: "/health"})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusServiceUnavailable {
		return nil, readAPIError(resp)
	}
	var h Health
	if err := decodeJSON(resp, &h); err != nil {
		return nil, err
	}
	return &h, nil
}

// Create makes a jail (and starts it unless req.Start is false).
func (c *Client) Create(ctx context.Context, req CreateRequest) (*Jail, error) {
	var j Jail
	if err := c.call(ctx, http.MethodPost, "/jails", req, &j); err != nil {
		return nil, err
	}
	return &j, nil
}

// List returns every jail.
func (c *Client) List(ctx context.Context) ([]*Jail, error) {
	var l struct {
		Jails []*Jail `json:"jails"`
	}
	if err := c.call(ctx, http.MethodGet, "/jails", nil, &l); err != nil {
		return nil, err
	}
	return l.Jails, nil
}

// Get returns the jail named by ref (id or name) with its live stats.
func (c *Client) Get(ctx context.Context, ref string) (*Jail, error) {
	var j Jail
	if err := c.call(ctx, http.MethodGet, jailURL(ref), nil, &j); err != nil {
		return nil, err
	}
	return &j, nil
}

// Start starts a created or stopped jail.
func (c *Client) Start(ctx context.Context, ref string) (*Jail, error) {
	var j Jail
	if err := c.call(ctx, http.MethodPost, jailURL(ref)+"/start", nil, &j); err != nil {
		return nil, err
	}
	return &j, nil
}

// Stop stops a running jail, killing its processes after grace (rounded
// up to whole seconds).
func (c *Client) Stop(ctx context.Context, ref string, grace time.Duration) (*Jail, error) {
	secs := int64((grace + time.Second - 1) / time.Second)
	body := struct {
		TimeoutS int64 `json:"timeout_s"`
	}{max(secs, 0)}
	var j Jail
	if err := c.call(ctx, http.MethodPost, jailURL(ref)+"/stop", body, &j); err != nil {
		return nil, err
	}
	return &j, nil
}

// Destroy removes a jail and everything it owns.
func (c *Client) Destroy(ctx context.Context, ref string) error {
	return c.call(ctx, http.MethodDelete, jailURL(ref), nil, nil)
}

// wireExec is req with stdin in base64, as the client sends it.
func wireExec(req ExecRequest) ExecRequest {
	req.Encoding = "base64"
	req.Stdin = base64.StdEncoding.EncodeToString([]byte(req.Stdin))
	return req
}

func unbase64(field, s string) (string, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return "", fmt.Errorf("exec answer: %s is not base64: %w", field, err)
	}
	return string(b), nil
}

// Exec runs a command and returns its buffered result: stdout and stderr
// (raw bytes), each capped by the daemon at 1 MiB with Truncated set.
// req.Stdin is raw bytes; req.Encoding is ignored (the client uses base64).
func (c *Client) Exec(ctx context.Context, ref string, req ExecRequest) (*ExecResult, error) {
	var res ExecResult
	if err := c.call(ctx, http.MethodPost, jailURL(ref)+"/exec", wireExec(req), &res); err != nil {
		return nil, err
	}
	var err error
	if res.Stdout, err = unbase64("stdout", res.Stdout); err != nil {
		return nil, err
	}
	if res.Stderr, err = unbase64("stderr", res.Stderr); err != nil {
		return nil, err
	}
	return &res, nil
}

// streamEvent is one line of the exec stream.
type streamEvent struct {
	Type string `json:"type"`
	Data string `json:"data"`
	*ExecResult
	Error *streamError `json:"error"`
}

// streamError is the error line of an NDJSON stream that had begun.
type streamError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// apiError converts an error line (nil: none was given) to an *APIError,
// with fallback as its message when the line has none.
func (e *streamError) apiError(fallback string) *APIError {
	ae := &APIError{Status: http.StatusInternalServerError, Code: "internal", Message: fallback}
	if e != nil {
		ae.Code, ae.Message = e.Code, e.Message
		ae.Status = statusOfCode(e.Code)
	}
	return ae
}

// maxStreamLine bounds one NDJSON line of the exec stream.
const maxStreamLine = 16 << 20

// ExecStream runs a command, calling fn with each output chunk ("stdout"
// or "stderr", raw bytes) as the daemon sends it, and returns the result
// (whose Stdout and Stderr are empty). An error from fn, or cancelling ctx,
// ends the request, which kills the command. req.Stdin is raw bytes.
func (c *Client) ExecStream(ctx context.Context, ref string, req ExecRequest, fn func(stream string, data []byte) error) (*ExecResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	b, err := json.Marshal(wireExec(req))
	if err != nil {
		return nil, err
	}
	resp, err := c.do(ctx, request{method: http.MethodPost, path: jailURL(ref) + "/exec/stream", body: bytes.NewReader(b), ctype: "application/json"})
	if err != nil {
		return nil, err
	}
	return readExecStream(resp, fn)
}

// readExecStream reads an exec stream (base64 data) to its exit event.
func readExecStream(resp *http.Response, fn func(stream string, data []byte) error) (*ExecResult, error) {
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), maxStreamLine)
	for sc.Scan() {
		if stream, b64, ok := outputEvent(sc.Bytes()); ok {
			data := make([]byte, base64.StdEncoding.DecodedLen(len(b64)))
			n, err := base64.StdEncoding.Decode(data, b64)
			if err != nil {
				return nil, fmt.Errorf("exec stream: %s data is not base64: %w", stream, err)
			}
			if err := fn(stream, data[:n]); err != nil {
				return nil, err
			}
			continue
		}
		var ev streamEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("exec stream: bad event: %w", err)
		}
		switch ev.Type {
		case "stdout", "stderr":
			data, err := base64.StdEncoding.DecodeString(ev.Data)
			if err != nil {
				return nil, fmt.Errorf("exec stream: %s data is not base64: %w", ev.Type, err)
			}
			if err := fn(ev.Type, data); err != nil {
				return nil, err
			}
		case "exit":
			if ev.ExecResult == nil {
				return nil, errors.New("exec stream: exit event without a result")
			}
			return ev.ExecResult, nil
		case "error":
			return nil, ev.Error.apiError("exec failed")
		default:
			return nil, fmt.Errorf("exec stream: unknown event type %q", ev.Type)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("exec stream: %w", err)
	}
	return nil, errors.New("exec stream: the daemon ended the stream without an exit event")
}

// outputEvent recognises an output event of an exec stream in the form the
// daemon writes it, {"type":"stdout","data":"BASE64"}, and returns its
// stream and data without a JSON decoder (which reads a large string at a
// fraction of the speed); ok is false for any other line, which is then
// decoded as JSON.
func outputEvent(line []byte) (stream string, b64 []byte, ok bool) {
	for _, o := range outputPrefixes {
		rest, found := bytes.CutPrefix(line, o.prefix)
		if !found {
			continue
		}
		rest, found = bytes.CutSuffix(rest, []byte(`"}`))
		if !found || bytes.IndexByte(rest, '\\') >= 0 || bytes.IndexByte(rest, '"') >= 0 {
			return "", nil, false
		}
		return o.stream, rest, true
	}
	return "", nil, false
}

// outputPrefixes are the starts of the daemon's output events, by stream.
var outputPrefixes = []struct {
	stream string
	prefix []byte
}{
	{"stdout", []byte(`{"type":"stdout","data":"`)},
	{"stderr", []byte(`{"type":"stderr","data":"`)},
}

// codeStatus is the daemon's mapping of error codes to statuses, for
// errors that arrive inside a stream.
var codeStatus = map[string]int{
	"invalid_argument": http.StatusBadRequest,
	"unprocessable":    http.StatusUnprocessableEntity,
	"not_found":        http.StatusNotFound,
	"conflict":         http.StatusConflict,
	"forbidden":        http.StatusForbidden,
	"unauthorized":     http.StatusUnauthorized,
	"too_large":        http.StatusRequestEntityTooLarge,
	"not_implemented":  http.StatusNotImplemented,
	"unavailable":      http.StatusServiceUnavailable,
	"timeout":          http.StatusGatewayTimeout,
}

func statusOfCode(code string) int {
	if s, ok := codeStatus[code]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// Stat describes a jail path (without following a final symlink).
func (c *Client) Stat(ctx context.Context, ref, p string) (*FileInfo, error) {
	u, err := fileURL(ref, p)
	if err != nil {
		return nil, err
	}
	var fi FileInfo
	if err := c.call(ctx, http.MethodGet, u+"?stat=true", nil, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// ReadDir lists a directory in the jail, its entries sorted by name. A
// directory with more entries than one listing gives (100 000) is an
// error: a caller that walks a tree must not take part of one for all.
func (c *Client) ReadDir(ctx context.Context, ref, p string) ([]FileInfo, error) {
	u, err := fileURL(ref, p)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(ctx, request{method: http.MethodGet, path: u})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if !isJSON(resp) {
		return nil, &APIError{Status: http.StatusBadRequest, Code: "invalid_argument", Message: p + ": not a directory"}
	}
	var l model.DirListing
	if err := decodeJSON(resp, &l); err != nil {
		return nil, err
	}
	if l.Truncated {
		return nil, &APIError{Status: http.StatusRequestEntityTooLarge, Code: "too_large",
			Message: fmt.Sprintf("%s: the directory has more entries than one listing gives (%d listed)", p, len(l.Entries))}
	}
	return l.Entries, nil
}

func isJSON(resp *http.Response) bool {
	return strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json")
}

// ReadFile opens a file in the jail for reading; the caller closes the
// reader. The FileInfo holds what the response tells: name, path, type
// "file", size (-1 when unknown), mode and modification time.
func (c *Client) ReadFile(ctx context.Context, ref, p string) (*FileInfo, io.ReadCloser, error) {
	u, err := fileURL(ref, p)
	if err != nil {
		return nil, nil, err
	}
	resp, err := c.do(ctx, request{method: http.MethodGet, path: u})
	if err != nil {
		return nil, nil, err
	}
	if isJSON(resp) {
		resp.Body.Close()
		return nil, nil, &APIError{Status: http.StatusBadRequest, Code: "invalid_argument", Message: p + ": is a directory"}
	}
	clean := path.Clean("/" + p)
	fi := &FileInfo{Name: path.Base(clean), Path: clean, Type: "file", Size: resp.ContentLength, Mode: resp.Header.Get("X-Agentjail-Mode")}
	if t, err := time.Parse(time.RFC3339Nano, resp.Header.Get("X-Agentjail-Mtime")); err == nil {
		fi.ModTime = t
	}
	return fi, resp.Body, nil
}

func writeQuery(opts WriteOptions) url.Values {
	q := url.Values{}
	if opts.Mode != 0 {
		q.Set("mode", fmt.Sprintf("%04o", opts.Mode))
	}
	if opts.User != "" {
		q.Set("user", opts.User)
	}
	return q
}

// WriteFile creates or replaces a file in the jail with r's bytes (at most
// 1 GiB); opts.Mode 0 means the daemon's default 0644.
func (c *Client) WriteFile(ctx context.Context, ref, p string, r io.Reader, opts WriteOptions) (*FileInfo, error) {
	u, err := fileURL(ref, p)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(ctx, request{method: http.MethodPut, path: u, query: writeQuery(opts), body: r, ctype: "application/octet-stream"})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var fi FileInfo
	return &fi, decodeJSON(resp, &fi)
}

// Mkdir creates a directory (and missing parents) in the jail.
func (c *Client) Mkdir(ctx context.Context, ref, p string, opts WriteOptions) (*FileInfo, error) {
	q := writeQuery(opts)
	q.Set("type", "dir")
	return c.putEmpty(ctx, ref, p, q)
}

// Symlink creates the symbolic link p → target in the jail (a conflict
// when p exists); opts.Mode does not apply.
func (c *Client) Symlink(ctx context.Context, ref, p, target string, opts WriteOptions) (*FileInfo, error) {
	q := writeQuery(opts)
	q.Set("type", "symlink")
	q.Set("target", target)
	return c.putEmpty(ctx, ref, p, q)
}

// putEmpty creates what the query q describes at p, with an empty body.
func (c *Client) putEmpty(ctx context.Context, ref, p string, q url.Values) (*FileInfo, error) {
	u, err := fileURL(ref, p)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(ctx, request{method: http.MethodPut, path: u, query: q})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var fi FileInfo
	return &fi, decodeJSON(resp, &fi)
}

// Remove deletes a path in the jail; a non-empty directory needs recursive.
func (c *Client) Remove(ctx context.Context, ref, p string, recursive bool) error {
	u, err := fileURL(ref, p)
	if err != nil {
		return err
	}
	if recursive {
		u += "?recursive=true"
	}
	return c.call(ctx, http.MethodDelete, u, nil, nil)
}

// Access reports whether user (empty: the jail's user) may read or write
// (mode "read" or "write") a path in the jail.
func (c *Client) Access(ctx context.Context, ref, p, mode, user string) (*AccessResult, error) {
	u, err := fileURL(ref, p)
	if err != nil {
		return nil, err
	}
	q := url.Values{"access": {mode}}
	if user != "" {
		q.Set("user", user)
	}
	var ar AccessResult
	if err := c.call(ctx, http.MethodGet, u+"?"+q.Encode(), nil, &ar); err != nil {
		return nil, err
	}
	return &ar, nil
}
