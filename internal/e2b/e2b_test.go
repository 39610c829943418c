package e2b

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/agentjail/agentjail/internal/apikey"
	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/initproto"
)

func TestSandboxIDShape(t *testing.T) {
	re := regexp.MustCompile(`^[a-z0-9]{20}$`)
	seen := map[string]bool{}
	for range 1000 {
		id := newSandboxID()
		if !re.MatchString(id) || seen[id] {
			t.Fatalf("id %q", id)
		}
		seen[id] = true
	}
}

// TestEndEvent: the end event is envd's, from Go's ProcessState.
func TestEndEvent(t *testing.T) {
	ok := endEvent(initproto.ExitStatus{Code: 0})
	if ok.ExitCode != 0 || !ok.Exited || ok.Status != "exit status 0" || ok.Error != nil {
		t.Errorf("exit 0: %v", ok)
	}
	three := endEvent(initproto.ExitStatus{Code: 3})
	if three.ExitCode != 3 || three.GetError() != "exit status 3" {
		t.Errorf("exit 3: %v", three)
	}
	killed := endEvent(initproto.ExitStatus{Code: 137, Signal: "SIGKILL"})
	if killed.ExitCode != -1 || killed.Exited || killed.Status != "signal: killed" || killed.GetError() != "signal: killed" {
		t.Errorf("killed: %v", killed)
	}
	if term := endEvent(initproto.ExitStatus{Code: 143, Signal: "SIGTERM"}); term.Status != "signal: terminated" {
		t.Errorf("terminated: %v", term)
	}
}

// TestSignature: the SDK's presigned URL formula (docs/e2b.md).
func TestSignature(t *testing.T) {
	// sha256("/a:read::tok") in unpadded standard base64.
	if got := signature("/a", "read", "", "tok", 0); got != "v1_2/gNbgFPxFSqkheS/SD0NHlzA121E/nxkOtc/ovxeoI" {
		t.Errorf("signature: %s", got)
	}
	if signature("/a", "read", "", "tok", 1) == signature("/a", "read", "", "tok", 0) {
		t.Error("the expiration is not signed")
	}
	if signature("/a", "write", "", "tok", 0) == signature("/a", "read", "", "tok", 0) {
		t.Error("the operation is not signed")
	}
}

func TestMetadataFilter(t *testing.T) {
	meta := map[string]string{"suite": "x", "run": "1"}
	q, _ := url.ParseQuery("suite=x&run=1")
	if !matches(meta, q) {
		t.Error("all keys match")
	}
	q, _ = url.ParseQuery("suite=x&run=2")
	if matches(meta, q) {
		t.Error("a differing value matched")
	}
	if !matches(meta, nil) {
		t.Error("no filter")
	}
}

func TestTemplateConfig(t *testing.T) {
	if c := templateConfig("base"); c.Isolation.Filesystem.Rootfs != "" {
		t.Errorf("base: %q", c.Isolation.Filesystem.Rootfs)
	}
	if c := templateConfig("python:3.12"); c.Isolation.Filesystem.Rootfs != "image:python:3.12" {
		t.Errorf("image: %q", c.Isolation.Filesystem.Rootfs)
	}
}

// TestRPCCodes: each error kind reaches the SDK as the Connect code it
// turns into its own error type.
func TestRPCCodes(t *testing.T) {
	s := &Service{log: discard()}
	for _, c := range []struct {
		err  error
		want connect.Code
	}{
		{errdefs.NotFoundf("x"), connect.CodeNotFound},
		{errdefs.Invalidf("x"), connect.CodeInvalidArgument},
		{errdefs.Unprocessablef("x"), connect.CodeInvalidArgument},
		{errdefs.New(errdefs.ErrUnauthorized, "x"), connect.CodeUnauthenticated},
		{errdefs.New(errdefs.ErrTooLarge, "x"), connect.CodeResourceExhausted},
		{errSandboxGone, connect.CodeUnavailable},
		{errors.New("boom"), connect.CodeInternal},
	} {
		if got := connect.CodeOf(s.rpcError(c.err)); got != c.want {
			t.Errorf("%v: %v, want %v", c.err, got, c.want)
		}
	}
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestListPages: pages follow x-next-token in start order, filters apply.
func TestListPages(t *testing.T) {
	s := &Service{log: discard(), sandboxes: map[string]*sandbox{}}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 5 {
		r := record{ID: fmt.Sprintf("sb%d", i), Tenant: "t", State: stateRunning, StartedAt: base.Add(time.Duration(i%3) * time.Second),
			Metadata: map[string]string{"odd": strconv.FormatBool(i%2 == 1)}}
		s.sandboxes[r.ID] = newSandbox(r)
	}
	s.sandboxes["other"] = newSandbox(record{ID: "other", Tenant: "u", State: stateRunning})
	c := caller{key: apikey.Key{Tenant: "t", Role: apikey.RoleUser}}
	page := func(query string) ([]string, string) {
		w := httptest.NewRecorder()
		if err := s.listSandboxes(c, w, httptest.NewRequest("GET", "/v2/sandboxes?"+query, nil)); err != nil {
			t.Fatal(err)
		}
		var out []struct {
			ID string `json:"sandboxID"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
			t.Fatal(err)
		}
		ids := []string{}
		for _, o := range out {
			ids = append(ids, o.ID)
		}
		return ids, w.Header().Get("X-Next-Token")
	}
	var all []string
	tok := ""
	for range 10 {
		ids, next := page("limit=2&nextToken=" + url.QueryEscape(tok))
		all = append(all, ids...)
		if next == "" {
			break
		}
		tok = next
	}
	if want := []string{"sb0", "sb3", "sb1", "sb4", "sb2"}; !slices.Equal(all, want) {
		t.Fatalf("pages: %v, want %v", all, want)
	}
	if ids, _ := page("metadata=" + url.QueryEscape("odd=true")); !slices.Equal(ids, []string{"sb3", "sb1"}) {
		t.Fatalf("metadata filter: %v", ids)
	}
	if ids, _ := page("state=paused"); len(ids) != 0 {
		t.Fatalf("state filter: %v", ids)
	}
}

// TestNetworkOptions: E2B's network options become the jail's policy
// (allowOut over denyOut, ALL_TRAFFIC standing for IPv6 and every name
// too), and what cannot be honoured or is malformed is refused with the
// option named.
func TestNetworkOptions(t *testing.T) {
	yes := true
	n, creds, err := parseNetwork(&yes, &networkBody{
		AllowOut: []string{"api.example.com", allTraffic}, DenyOut: []string{"10.0.0.0/8", allTraffic},
		Rules: map[string][]networkRule{"api.example.com": {{Transform: &transform{Headers: map[string]string{"Authorization": "Bearer x"}}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	dests := func(rs []config.EgressRule) (out []string) {
		for _, r := range rs {
			out = append(out, r.Destination)
		}
		return out
	}
	pol := n.policy(config.NetBridge, creds)
	for _, c := range []struct {
		list      string
		got, want []string
	}{
		{"always_allow", dests(pol.AlwaysAllow), []string{"api.example.com", allTraffic, "::/0", "*"}},
		{"blocked_egress", dests(pol.BlockedEgress), []string{"10.0.0.0/8", allTraffic, "::/0"}},
		{"allowed_egress", dests(pol.AllowedEgress), []string{"*", allTraffic, "::/0"}},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s: %q, want %q", c.list, c.got, c.want)
		}
	}
	if len(pol.Credentials) != 1 || pol.Credentials[0] != (config.Credential{Host: "api.example.com", Header: "Authorization", Value: "Bearer x"}) {
		t.Errorf("credentials: %+v", pol.Credentials)
	}
	if b, _ := json.Marshal(n.infoJSON()); strings.Contains(string(b), "Bearer") {
		t.Errorf("the info shows a header's value: %s", b)
	}

	long := make([]string, maxNetworkEntries+1)
	for i := range long {
		long[i] = fmt.Sprintf("10.0.%d.%d", i/256, i%256)
	}
	for _, c := range []struct {
		what string
		body networkBody
		kind error
		msg  string
	}{
		{"a domain in denyOut", networkBody{DenyOut: []string{"example.com"}}, errdefs.ErrInvalid, "denyOut[0]"},
		{"* in allowOut", networkBody{AllowOut: []string{"*"}}, errdefs.ErrInvalid, "allowOut[0]"},
		{"a bad CIDR", networkBody{AllowOut: []string{"10.0.0.0/40"}}, errdefs.ErrInvalid, "allowOut[0]"},
		{"too many entries", networkBody{DenyOut: long}, errdefs.ErrInvalid, "at most 256"},
		{"a rule for an address", networkBody{Rules: map[string][]networkRule{"10.0.0.1/32": nil}}, errdefs.ErrInvalid, "rules"},
		{"a mask with a path", networkBody{MaskRequestHost: ptr("a.example/x")}, errdefs.ErrInvalid, "maskRequestHost"},
		{"a bad header name", networkBody{Rules: map[string][]networkRule{"a.example": {{Transform: &transform{Headers: map[string]string{"X Bad": "v"}}}}}}, errdefs.ErrInvalid, "header name"},
		{"a header value with a line break", networkBody{Rules: map[string][]networkRule{"a.example": {{Transform: &transform{Headers: map[string]string{"X-A": "v\r\nX-B: w"}}}}}}, errdefs.ErrInvalid, "header name"},
		{"an egress proxy", networkBody{EgressProxy: json.RawMessage(`{"address":"p:1080"}`)}, errdefs.ErrNotImplemented, "egressProxy"},
		{"https ports", networkBody{HTTPSPorts: []int{443}}, errdefs.ErrNotImplemented, "httpsPorts"},
		{"an identity token", networkBody{Rules: map[string][]networkRule{"a.example": {{Transform: &transform{Headers: map[string]string{"Authorization": "Bearer ${e2b.identity.tokens.aws}"}}}}}}, errdefs.ErrNotImplemented, "iam"},
	} {
		_, _, err := parseNetwork(nil, &c.body)
		if !errors.Is(err, c.kind) || !strings.Contains(fmt.Sprint(err), c.msg) {
			t.Errorf("%s: %v, want %v naming %s", c.what, err, c.kind, c.msg)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// TestHostTarget: PORT-ID.DOMAIN names a sandbox's port, whatever the
// case, a trailing dot or the ports after the host and the domain.
func TestHostTarget(t *testing.T) {
	s := &Service{opts: Options{Domain: "Sandbox.Example:8082"}}
	for _, c := range []struct {
		host string
		port int
		id   string
		ok   bool
	}{
		{"8000-abc.sandbox.example", 8000, "abc", true},
		{"8000-abc.sandbox.example:8082", 8000, "abc", true},
		{"49983-ABC.Sandbox.Example.", 49983, "abc", true},
		{"sandbox.example", 0, "", false},
		{"8000-abc.x.sandbox.example", 0, "", false},
		{"0-abc.sandbox.example", 0, "", false},
		{"70000-abc.sandbox.example", 0, "", false},
		{"8000-.sandbox.example", 0, "", false},
		{"abc.sandbox.example", 0, "", false},
		{"8000-abc.sandbox.example.org", 0, "", false},
		{"8000-abc.localhost", 0, "", false},
	} {
		port, id, ok := s.hostTarget(c.host)
		if port != c.port || id != c.id || ok != c.ok {
			t.Errorf("%s: %d %q %v, want %d %q %v", c.host, port, id, ok, c.port, c.id, c.ok)
		}
	}
	if _, _, ok := (&Service{}).hostTarget("8000-abc.localhost"); ok {
		t.Error("a daemon without a domain claims a host")
	}
}

// TestWrapHostsLeavesOtherHosts: a host name that names no sandbox is
// left to the next handler when it claims the host (previews share
// *.localhost), and answered 502 otherwise; other hosts pass through.
func TestWrapHostsLeavesOtherHosts(t *testing.T) {
	s := &Service{opts: Options{Domain: "localhost:8082", OtherHosts: func(h string) bool { return strings.HasSuffix(h, ".localhost:8082") }},
		log: slog.New(slog.DiscardHandler), sandboxes: map[string]*sandbox{}}
	passed := 0
	h := s.WrapHosts(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { passed++ }))
	for _, c := range []struct {
		host   string
		passed bool
		status int
	}{
		{"3000-myjail.localhost:8082", true, http.StatusOK},
		{"127.0.0.1:8082", true, http.StatusOK},
		{"3000-nosuchsandbox.localhost", false, http.StatusBadGateway},
	} {
		before := passed
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "http://"+c.host+"/", nil)
		h.ServeHTTP(rec, req)
		if (passed > before) != c.passed || rec.Code != c.status {
			t.Errorf("%s: passed on %v, status %d; want %v, %d", c.host, passed > before, rec.Code, c.passed, c.status)
		}
	}
}
