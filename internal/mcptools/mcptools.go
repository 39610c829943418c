// Package mcptools is agentjail's MCP server (Model Context Protocol,
// github.com/modelcontextprotocol/go-sdk): tools that let Claude Code or
// any MCP client use agentjail as its sandbox — create a jail, run a
// command in it, read and write its files, snapshot it, branch a
// snapshot, diff two of them, get the observation report, list and
// destroy jails.
//
// Every tool call is a request to the daemon's REST API made with the
// caller's own credential (through the Go client), so what a tool may
// reach is exactly what that key may reach: its tenant's resources, read
// only for a viewer key, written to the audit log like any request.
// `agentjail mcp` serves the tools over stdio to a daemon it calls over
// HTTP; the daemon serves them itself at POST /mcp (the streamable HTTP
// transport), calling its own API in process.
package mcptools

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/internal/api"
)

// MaxFileBytes bounds what read_file returns and write_file takes.
const MaxFileBytes = 1 << 20

// maxResultBytes bounds a tool's JSON answer (a report can be large).
const maxResultBytes = 256 << 10

// NewServer returns an MCP server whose tools act through c.
func NewServer(c *client.Client, version string) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "agentjail", Title: "agentjail sandboxes", Version: version}, &mcp.ServerOptions{
		Instructions: "agentjail runs commands in isolated, observed jails (Linux containers). Create a jail, run commands and move files in it, snapshot it, branch a snapshot into copies, diff them, and read the report of everything the jail did. Jails are referred to by id or name.",
	})
	t := tools{c: c}
	mcp.AddTool(s, &mcp.Tool{Name: "create_jail", Description: "Create and start a jail. Returns its id, name and status."}, t.createJail)
	mcp.AddTool(s, &mcp.Tool{Name: "list_jails", Description: "List the jails this key may see."}, t.listJails)
	mcp.AddTool(s, &mcp.Tool{Name: "run_command", Description: "Run a command in a running jail and wait for it: its exit code, stdout and stderr (each capped at 1 MiB). Give either command (run by sh -c) or argv."}, t.runCommand)
	mcp.AddTool(s, &mcp.Tool{Name: "read_file", Description: "Read a text file of a jail (at most 1 MiB)."}, t.readFile)
	mcp.AddTool(s, &mcp.Tool{Name: "write_file", Description: "Create or replace a file in a jail (at most 1 MiB)."}, t.writeFile)
	mcp.AddTool(s, &mcp.Tool{Name: "snapshot", Description: "Snapshot a running jail: mode full (processes and files; the default) or fs (files only). Returns the snapshot's id."}, t.snapshot)
	mcp.AddTool(s, &mcp.Tool{Name: "branch", Description: "Make count (default 1) new running jails from a snapshot, each an independent copy."}, t.branch)
	mcp.AddTool(s, &mcp.Tool{Name: "diff", Description: "Compare the files of two jails or snapshots (from, to), or, with jail alone, what the jail changed; with text, unified diffs of changed text files."}, t.diff)
	mcp.AddTool(s, &mcp.Tool{Name: "report", Description: "The observation report of a jail: its processes, files, network flows and syscalls, summarised."}, t.report)
	mcp.AddTool(s, &mcp.Tool{Name: "destroy_jail", Description: "Destroy a jail and everything it holds (its snapshots stay)."}, t.destroyJail)
	return s
}

// tools are the handlers, over one API client.
type tools struct {
	c *client.Client
}

// CreateJailInput is create_jail's input.
type CreateJailInput struct {
	Name     string `json:"name,omitempty" jsonschema:"the jail's name (default: generated)"`
	Image    string `json:"image,omitempty" jsonschema:"an image of the daemon's store to run (default: the host's root filesystem, read only)"`
	Network  string `json:"network,omitempty" jsonschema:"network mode: none or bridge (default: the daemon's default)"`
	MemoryMB int64  `json:"memory_mb,omitempty" jsonschema:"memory limit in MiB (default 512)"`
}

// JailOutput describes a jail.
type JailOutput struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	Status string `json:"status"`
	Tenant string `json:"tenant,omitempty"`
}

func jailOut(j *client.Jail) JailOutput {
	return JailOutput{ID: j.ID, Name: j.Name, Status: string(j.Status), Tenant: j.Tenant}
}

func (t tools) createJail(ctx context.Context, _ *mcp.CallToolRequest, in CreateJailInput) (*mcp.CallToolResult, JailOutput, error) {
	req := client.CreateRequest{Name: in.Name}
	if in.Image != "" {
		req.Config.Isolation.Filesystem.Rootfs = "image:" + in.Image
	}
	if in.Network != "" {
		req.Config.Isolation.Network.Mode = in.Network
	}
	if in.MemoryMB > 0 {
		req.Config.Isolation.Resources.MemoryBytes = in.MemoryMB << 20
	}
	j, err := t.c.Create(ctx, req)
	if err != nil {
		return nil, JailOutput{}, err
	}
	return nil, jailOut(j), nil
}

// ListJailsOutput is list_jails's answer.
type ListJailsOutput struct {
	Jails []JailOutput `json:"jails"`
}

func (t tools) listJails(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, ListJailsOutput, error) {
	list, err := t.c.List(ctx)
	return jailsOut(list, err)
}

// jailsOut answers a list of jails (or err).
func jailsOut(list []*client.Jail, err error) (*mcp.CallToolResult, ListJailsOutput, error) {
	if err != nil {
		return nil, ListJailsOutput{}, err
	}
	out := ListJailsOutput{Jails: []JailOutput{}}
	for _, j := range list {
		out.Jails = append(out.Jails, jailOut(j))
	}
	return nil, out, nil
}

// RunCommandInput is run_command's input.
type RunCommandInput struct {
	Jail      string            `json:"jail" jsonschema:"the jail's id or name"`
	Command   string            `json:"command,omitempty" jsonschema:"a shell command line, run with sh -c"`
	Argv      []string          `json:"argv,omitempty" jsonschema:"the program and its arguments (instead of command)"`
	Cwd       string            `json:"cwd,omitempty" jsonschema:"working directory (default: the jail's workspace)"`
	Env       map[string]string `json:"env,omitempty" jsonschema:"extra environment variables"`
	Stdin     string            `json:"stdin,omitempty" jsonschema:"what the command reads on its standard input"`
	TimeoutMs int64             `json:"timeout_ms,omitempty" jsonschema:"kill the command after this many milliseconds (default: the daemon's)"`
}

// RunCommandOutput is run_command's answer.
type RunCommandOutput struct {
	ExitCode   int     `json:"exit_code"`
	Signal     string  `json:"signal,omitempty"`
	Stdout     string  `json:"stdout"`
	Stderr     string  `json:"stderr"`
	Truncated  bool    `json:"truncated,omitempty"`
	TimedOut   bool    `json:"timed_out,omitempty"`
	DurationMs float64 `json:"duration_ms"`
}

func (t tools) runCommand(ctx context.Context, _ *mcp.CallToolRequest, in RunCommandInput) (*mcp.CallToolResult, RunCommandOutput, error) {
	argv := in.Argv
	switch {
	case in.Command != "" && len(argv) > 0:
		return nil, RunCommandOutput{}, fmt.Errorf("give command or argv, not both")
	case in.Command != "":
		argv = []string{"sh", "-c", in.Command}
	case len(argv) == 0:
		return nil, RunCommandOutput{}, fmt.Errorf("command or argv: required")
	}
	res, err := t.c.Exec(ctx, in.Jail, client.ExecRequest{Cmd: argv, Cwd: in.Cwd, Env: in.Env, Stdin: in.Stdin, TimeoutMs: in.TimeoutMs})
	if err != nil {
		return nil, RunCommandOutput{}, err
	}
	return nil, RunCommandOutput{ExitCode: res.ExitCode, Signal: res.Signal, Stdout: res.Stdout, Stderr: res.Stderr,
		Truncated: res.Truncated, TimedOut: res.TimedOut, DurationMs: res.DurationMs}, nil
}

// FileInput names a jail's file.
type FileInput struct {
	Jail string `json:"jail" jsonschema:"the jail's id or name"`
	Path string `json:"path" jsonschema:"the file's absolute path in the jail"`
}

// ReadFileOutput is read_file's answer.
type ReadFileOutput struct {
	Path    string `json:"path"`
	Size    int64  `json:"size"`
	Content string `json:"content"`
}

func (t tools) readFile(ctx context.Context, _ *mcp.CallToolRequest, in FileInput) (*mcp.CallToolResult, ReadFileOutput, error) {
	fi, rc, err := t.c.ReadFile(ctx, in.Jail, in.Path)
	if err != nil {
		return nil, ReadFileOutput{}, err
	}
	defer rc.Close()
	if fi.Size > MaxFileBytes {
		return nil, ReadFileOutput{}, fmt.Errorf("%s is %d bytes, over the %d bytes read_file returns (use run_command with head or grep)", in.Path, fi.Size, MaxFileBytes)
	}
	b, err := io.ReadAll(io.LimitReader(rc, MaxFileBytes+1))
	if err != nil {
		return nil, ReadFileOutput{}, err
	}
	if len(b) > MaxFileBytes {
		return nil, ReadFileOutput{}, fmt.Errorf("%s grew over %d bytes while being read", in.Path, MaxFileBytes)
	}
	if !utf8.Valid(b) {
		return nil, ReadFileOutput{}, fmt.Errorf("%s is not UTF-8 text (use run_command with base64 or xxd)", in.Path)
	}
	return nil, ReadFileOutput{Path: in.Path, Size: int64(len(b)), Content: string(b)}, nil
}

// WriteFileInput is write_file's input.
type WriteFileInput struct {
	Jail    string `json:"jail" jsonschema:"the jail's id or name"`
	Path    string `json:"path" jsonschema:"the file's absolute path in the jail"`
	Content string `json:"content" jsonschema:"the file's new content"`
}

// WriteFileOutput is write_file's answer.
type WriteFileOutput struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

func (t tools) writeFile(ctx context.Context, _ *mcp.CallToolRequest, in WriteFileInput) (*mcp.CallToolResult, WriteFileOutput, error) {
	if len(in.Content) > MaxFileBytes {
		return nil, WriteFileOutput{}, fmt.Errorf("content: %d bytes is over the %d bytes write_file takes", len(in.Content), MaxFileBytes)
	}
	fi, err := t.c.WriteFile(ctx, in.Jail, in.Path, strings.NewReader(in.Content), client.WriteOptions{})
	if err != nil {
		return nil, WriteFileOutput{}, err
	}
	return nil, WriteFileOutput{Path: fi.Path, Size: fi.Size}, nil
}

// SnapshotInput is snapshot's input.
type SnapshotInput struct {
	Jail string `json:"jail" jsonschema:"the jail's id or name"`
	Name string `json:"name,omitempty" jsonschema:"the snapshot's name (default: generated)"`
	Mode string `json:"mode,omitempty" jsonschema:"full (processes and files, the default) or fs (files only)"`
}

// SnapshotOutput describes a snapshot.
type SnapshotOutput struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	Mode   string `json:"mode"`
	JailID string `json:"jail_id"`
}

func (t tools) snapshot(ctx context.Context, _ *mcp.CallToolRequest, in SnapshotInput) (*mcp.CallToolResult, SnapshotOutput, error) {
	s, err := t.c.Snapshot(ctx, in.Jail, client.SnapshotRequest{Name: in.Name, Mode: in.Mode})
	if err != nil {
		return nil, SnapshotOutput{}, err
	}
	return nil, SnapshotOutput{ID: s.ID, Name: s.Name, Mode: s.Mode, JailID: s.JailID}, nil
}

// BranchInput is branch's input.
type BranchInput struct {
	Snapshot string   `json:"snapshot" jsonschema:"the snapshot's id"`
	Count    int      `json:"count,omitempty" jsonschema:"how many jails (default 1)"`
	Names    []string `json:"names,omitempty" jsonschema:"their names (instead of count)"`
}

func (t tools) branch(ctx context.Context, _ *mcp.CallToolRequest, in BranchInput) (*mcp.CallToolResult, ListJailsOutput, error) {
	return jailsOut(t.c.Branch(ctx, in.Snapshot, client.BranchRequest{Count: in.Count, Names: in.Names}))
}

// DiffInput is diff's input.
type DiffInput struct {
	From string `json:"from,omitempty" jsonschema:"a jail (id or name) or a snapshot id"`
	To   string `json:"to,omitempty" jsonschema:"a jail (id or name) or a snapshot id"`
	Jail string `json:"jail,omitempty" jsonschema:"instead of from and to: what this jail changed in its root filesystem"`
	Text bool   `json:"text,omitempty" jsonschema:"add unified diffs of changed text files"`
}

func (t tools) diff(ctx context.Context, _ *mcp.CallToolRequest, in DiffInput) (*mcp.CallToolResult, any, error) {
	var d *client.FsDiff
	var err error
	switch {
	case in.Jail != "" && (in.From != "" || in.To != ""):
		return nil, nil, fmt.Errorf("give jail, or from and to")
	case in.Jail != "":
		d, err = t.c.FsDiff(ctx, in.Jail)
	default:
		d, err = t.c.Diff(ctx, in.From, in.To, in.Text)
	}
	if err != nil {
		return nil, nil, err
	}
	return jsonResult(d)
}

// JailInput names a jail.
type JailInput struct {
	Jail string `json:"jail" jsonschema:"the jail's id or name"`
}

func (t tools) report(ctx context.Context, _ *mcp.CallToolRequest, in JailInput) (*mcp.CallToolResult, any, error) {
	r, err := t.c.Report(ctx, in.Jail)
	if err != nil {
		return nil, nil, err
	}
	return jsonResult(r)
}

// DestroyOutput is destroy_jail's answer.
type DestroyOutput struct {
	Destroyed string `json:"destroyed"`
}

func (t tools) destroyJail(ctx context.Context, _ *mcp.CallToolRequest, in JailInput) (*mcp.CallToolResult, DestroyOutput, error) {
	if err := t.c.Destroy(ctx, in.Jail); err != nil {
		return nil, DestroyOutput{}, err
	}
	return nil, DestroyOutput{Destroyed: in.Jail}, nil
}

// jsonResult answers v as JSON text, cut at maxResultBytes (saying so).
func jsonResult(v any) (*mcp.CallToolResult, any, error) {
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return nil, nil, err
	}
	text := string(b)
	if len(text) > maxResultBytes {
		text = text[:maxResultBytes] + fmt.Sprintf("\n… (cut: the whole answer is %d bytes; use the REST API for all of it)", len(b))
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil, nil
}

// Handler serves the tools over MCP's streamable HTTP transport, for the
// daemon's POST /mcp. Each request is answered by a server whose tools
// call api — the daemon's own API handler, in process — with the
// request's bearer credential, which api has already accepted. The
// transport is stateless: every request stands alone, so a session cannot
// outlive or change its credential.
func Handler(api http.Handler, version string) http.Handler {
	return mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		_, cred, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		c := &client.Client{BaseURL: "http://agentjail", Token: strings.TrimSpace(cred),
			HTTP: &http.Client{Transport: inProcess{api: api, remote: r.RemoteAddr}}}
		return NewServer(c, version)
	}, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true, MaxRequestBodyBytes: 2 * MaxFileBytes})
}

// inProcess is an http.RoundTripper that hands requests to a handler.
type inProcess struct {
	api    http.Handler
	remote string
}

func (t inProcess) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(api.WithSurface(r.Context(), "mcp"))
	r.RemoteAddr = t.remote
	r.RequestURI = r.URL.RequestURI()
	rec := httptest.NewRecorder()
	t.api.ServeHTTP(rec, r)
	return rec.Result(), nil
}
