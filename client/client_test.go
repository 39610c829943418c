package client

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentjail/agentjail/internal/api"
	"github.com/agentjail/agentjail/internal/api/apitest"
	"github.com/agentjail/agentjail/internal/model"
)

const token = "test-token-0123456789"

func newTest(t *testing.T) (*Client, *apitest.Service) {
	t.Helper()
	svc := apitest.New()
	srv := httptest.NewServer(api.NewServer(svc, token, nil))
	t.Cleanup(srv.Close)
	return New(strings.TrimPrefix(srv.URL, "http://"), token), svc
}

func wantAPIError(t *testing.T, err error, status int, code string) {
	t.Helper()
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != status || ae.Code != code || ae.Message == "" {
		t.Fatalf("err %#v, want APIError %d %s", err, status, code)
	}
}

func TestLifecycle(t *testing.T) {
	c, svc := newTest(t)
	ctx := context.Background()
	h, err := c.Health(ctx)
	if err != nil || h.Status != "ok" {
		t.Fatalf("health %+v %v", h, err)
	}
	f := false
	j, err := c.Create(ctx, CreateRequest{Name: "one", Start: &f})
	if err != nil || j.Status != model.StateCreated || j.Config.Isolation.Resources.MemoryBytes == 0 {
		t.Fatalf("create %+v %v", j, err)
	}
	_, err = c.Create(ctx, CreateRequest{Name: "one"})
	wantAPIError(t, err, 409, "conflict")
	if !IsConflict(err) {
		t.Error("IsConflict false")
	}
	if j, err = c.Start(ctx, "one"); err != nil || j.Status != model.StateRunning {
		t.Fatalf("start %+v %v", j, err)
	}
	if j, err = c.Get(ctx, j.ID); err != nil || j.Stats == nil {
		t.Fatalf("get %+v %v", j, err)
	}
	l, err := c.List(ctx)
	if err != nil || len(l) != 1 {
		t.Fatalf("list %v %v", l, err)
	}
	if _, err = c.Stop(ctx, "one", 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if got := svc.Stops; len(got) != 1 || got[0] != 2*time.Second {
		t.Errorf("stop grace %v, want 2s (rounded up)", got)
	}
	if err := c.Destroy(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	_, err = c.Get(ctx, "one")
	wantAPIError(t, err, 404, "not_found")
	if !IsNotFound(err) {
		t.Error("IsNotFound false")
	}

	bad := New(c.BaseURL, "wrong")
	_, err = bad.List(ctx)
	wantAPIError(t, err, 401, "unauthorized")
}

func TestExec(t *testing.T) {
	c, _ := newTest(t)
	ctx := context.Background()
	if _, err := c.Create(ctx, CreateRequest{Name: "ex"}); err != nil {
		t.Fatal(err)
	}
	raw := "\x00\xff binary \xfe"
	res, err := c.Exec(ctx, "ex", ExecRequest{Cmd: []string{"cat"}, Stdin: raw})
	if err != nil || res.Stdout != raw {
		t.Fatalf("exec %+v %v", res, err)
	}
	var got bytes.Buffer
	res, err = c.ExecStream(ctx, "ex", ExecRequest{Cmd: []string{"cat"}, Stdin: raw}, func(stream string, data []byte) error {
		got.WriteString(stream + ":")
		got.Write(data)
		return nil
	})
	if err != nil || res.ExitCode != 0 || got.String() != "stdout:"+raw {
		t.Fatalf("stream %+v %v %q", res, err, got.String())
	}
	res, err = c.ExecStream(ctx, "ex", ExecRequest{Cmd: []string{"fail", "4", "oops"}}, func(string, []byte) error { return nil })
	if err != nil || res.ExitCode != 4 {
		t.Fatalf("fail: %+v %v", res, err)
	}
	_, err = c.ExecStream(ctx, "nope", ExecRequest{Cmd: []string{"echo"}}, func(string, []byte) error { return nil })
	wantAPIError(t, err, 404, "not_found")
	stop := errors.New("stop here")
	_, err = c.ExecStream(ctx, "ex", ExecRequest{Cmd: []string{"echo", "x"}}, func(string, []byte) error { return stop })
	if !errors.Is(err, stop) {
		t.Fatalf("callback error: %v", err)
	}
}

func TestFiles(t *testing.T) {
	c, svc := newTest(t)
	ctx := context.Background()
	if _, err := c.Create(ctx, CreateRequest{Name: "fs"}); err != nil {
		t.Fatal(err)
	}
	fi, err := c.WriteFile(ctx, "fs", "/workspace/dir/with space?.txt", strings.NewReader("data"), WriteOptions{Mode: 0o640})
	if err != nil || fi.Path != "/workspace/dir/with space?.txt" || fi.Mode != "0640" {
		t.Fatalf("write %+v %v", fi, err)
	}
	fi, rc, err := c.ReadFile(ctx, "fs", "/workspace/dir/with space?.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "data" || fi.Size != 4 || fi.Mode != "0640" || fi.ModTime.IsZero() {
		t.Fatalf("read %q %+v", b, fi)
	}
	_, _, err = c.ReadFile(ctx, "fs", "/workspace/dir")
	wantAPIError(t, err, 400, "invalid_argument")
	if fi, err = c.Mkdir(ctx, "fs", "/workspace/d2", WriteOptions{Mode: 0o700}); err != nil || fi.Type != "dir" || fi.Mode != "0700" {
		t.Fatalf("mkdir %+v %v", fi, err)
	}
	entries, err := c.ReadDir(ctx, "fs", "/workspace")
	if err != nil || len(entries) != 2 || entries[0].Name != "d2" || entries[1].Name != "dir" {
		t.Fatalf("readdir %+v %v", entries, err)
	}
	if fi, err = c.Stat(ctx, "fs", "workspace/dir/"); err != nil || fi.Type != "dir" || fi.Path != "/workspace/dir" {
		t.Fatalf("stat %+v %v", fi, err)
	}
	if err := svc.AddSymlink("fs", "/workspace/ln", "dir"); err != nil {
		t.Fatal(err)
	}
	if fi, err = c.Stat(ctx, "fs", "/workspace/ln"); err != nil || fi.Type != "symlink" || fi.LinkTarget != "dir" {
		t.Fatalf("stat symlink %+v %v", fi, err)
	}
	ar, err := c.Access(ctx, "fs", "/workspace/dir", "read", "")
	if err != nil || !ar.Accessible || ar.User != "agent" {
		t.Fatalf("access %+v %v", ar, err)
	}
	err = c.Remove(ctx, "fs", "/workspace/dir", false)
	wantAPIError(t, err, 409, "conflict")
	if err := c.Remove(ctx, "fs", "/workspace/dir", true); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stat(ctx, "fs", "/"); err == nil {
		t.Fatal("stat of / accepted; the files API cannot name the root")
	}
	if _, err := c.Stat(ctx, "fs", "/a\x00b"); err == nil {
		t.Fatal("NUL byte accepted")
	}
}

func TestNonJSONError(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "upstream broke", http.StatusBadGateway)
	}))
	defer srv.Close()
	_, err := New(srv.URL, "t").List(context.Background())
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 502 || !strings.Contains(ae.Message, "upstream broke") {
		t.Fatalf("err %#v", err)
	}
}

// TestExecStreamLines: the output events a daemon writes are read without
// a JSON decoder, and any other spelling of the same event (escapes, keys
// in another order, as another encoder may write them) the same through
// one.
func TestExecStreamLines(t *testing.T) {
	raw := []byte("\x00\xff?>~ binary \xfe")
	b64 := base64.StdEncoding.EncodeToString(raw) // holds '/' and '+'
	lines := strings.Join([]string{
		`{"type":"stdout","data":"` + b64 + `"}`,
		`{"type":"stderr","data":"` + strings.ReplaceAll(b64, "/", `\/`) + `"}`,
		`{"data":"` + b64 + `","type":"stdout"}`,
		`{"type":"stdout","data":""}`,
		`{"type":"exit","exit_code":3}`,
	}, "\n") + "\n"
	if !strings.Contains(b64, "/") {
		t.Fatalf("%q holds no '/': the escaped line tests nothing", b64)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, lines)
	}))
	defer srv.Close()
	var got []string
	res, err := New(strings.TrimPrefix(srv.URL, "http://"), "t").ExecStream(context.Background(), "j", ExecRequest{Cmd: []string{"x"}}, func(stream string, data []byte) error {
		got = append(got, stream+":"+string(data))
		return nil
	})
	want := []string{"stdout:" + string(raw), "stderr:" + string(raw), "stdout:" + string(raw), "stdout:"}
	if err != nil || res.ExitCode != 3 || !slices.Equal(got, want) {
		t.Fatalf("events %q, result %+v, %v; want %q", got, res, err, want)
	}
}
