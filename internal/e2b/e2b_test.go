package e2b

import (
	"errors"
	"log/slog"
	"net/url"
	"regexp"
	"testing"

	"connectrpc.com/connect"

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
