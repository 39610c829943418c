package e2b

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/agentjail/agentjail/internal/api/apitest"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
)

func TestCopyTarget(t *testing.T) {
	for _, tc := range []struct {
		src, name, dest string
		intoDir, isDir  bool
		want            string
		ok              bool
	}{
		// A directory's contents go into dest.
		{"app", "app", "/srv/app", false, true, "/srv/app", true},
		{"app", "app/main.py", "/srv/app", false, false, "/srv/app/main.py", true},
		{"app", "app/sub/x", "/srv/app/", true, false, "/srv/app/sub/x", true},
		// A file goes to dest, or into it when dest ends in "/".
		{"hello.txt", "hello.txt", "/etc/hello", false, false, "/etc/hello", true},
		{"hello.txt", "hello.txt", "/etc/", true, false, "/etc/hello.txt", true},
		{"conf/a.ini", "conf/a.ini", "/etc/a.ini", false, false, "/etc/a.ini", true},
		// The parents of a nested source are not copied.
		{"conf/a.ini", "conf", "/etc/a.ini", false, true, "", false},
		// A pattern's matches go into dest by their names.
		{"data/*.csv", "data/a.csv", "/data/", true, false, "/data/a.csv", true},
		{"data/*.csv", "data/c.txt", "/data/", true, false, "", false},
		{"data/*", "data/sub/x", "/data/", true, false, "/data/sub/x", true},
		// Nothing else matches.
		{"app", "application/x", "/srv", false, false, "", false},
	} {
		got, ok := copyTarget(tc.src, tc.name, tc.dest, tc.intoDir, tc.isDir)
		if got != tc.want || ok != tc.ok {
			t.Errorf("copyTarget(%q, %q, %q, %v, %v) = %q, %v; want %q, %v", tc.src, tc.name, tc.dest, tc.intoDir, tc.isDir, got, ok, tc.want, tc.ok)
		}
	}
}

// fakeImages is an image store that records commits.
type fakeImages struct {
	mu      sync.Mutex
	commits []model.CommitRequest
	removed []string
	pulled  []string
	// auths are the credentials of each pull ("" without).
	auths []string
}

func (f *fakeImages) GetImage(_ context.Context, ref string) (*model.Image, error) {
	f.mu.Lock()
	committed := slices.ContainsFunc(f.commits, func(c model.CommitRequest) bool { return c.Ref == ref }) && !slices.Contains(f.removed, ref)
	f.mu.Unlock()
	if committed || strings.HasPrefix(ref, "local/") {
		return &model.Image{ID: "sha256:" + strings.Repeat("c", 64), Tags: []string{ref}}, nil
	}
	return nil, errdefs.NotFoundf("image %q not found", ref)
}

func (f *fakeImages) PullImage(_ context.Context, ref string, auth *model.RegistryAuth, _ func(model.PullProgress)) (*model.Image, error) {
	f.mu.Lock()
	f.pulled = append(f.pulled, ref)
	a := ""
	if auth != nil {
		a = auth.Username + ":" + auth.Password
	}
	f.auths = append(f.auths, a)
	f.mu.Unlock()
	if strings.Contains(ref, "missing") {
		return nil, errdefs.NotFoundf("image %q not found", ref)
	}
	return &model.Image{ID: "sha256:" + strings.Repeat("a", 64), Tags: []string{ref}}, nil
}

func (f *fakeImages) Commit(_ context.Context, _ string, req model.CommitRequest) (*model.Image, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.commits = append(f.commits, req)
	return &model.Image{ID: "sha256:" + strings.Repeat("b", 64), Tags: []string{req.Ref}}, nil
}

func (f *fakeImages) RemoveImage(_ context.Context, ref string, _ bool) (model.ImageRemoval, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removed = append(f.removed, ref)
	return model.ImageRemoval{}, nil
}

var _ Images = (*fakeImages)(nil)

const testToken = "e2b-test-admin-token-0123456789"

// call sends one request to svc as the admin.
func call(t *testing.T, svc *Service, method, target string, body any) *httptest.ResponseRecorder {
	t.Helper()
	var b []byte
	if body != nil {
		b, _ = json.Marshal(body)
	}
	r := httptest.NewRequest(method, target, bytes.NewReader(b))
	r.Header.Set("X-API-KEY", testToken)
	w := httptest.NewRecorder()
	svc.ServeHTTP(w, r)
	return w
}

// TestBuildSteps runs builds over the in-memory jail service: the steps'
// commands get the env, work dir and user the steps before them set; the
// commit carries them; a failing command fails the build at its step with
// its output in the log; the build's jail is gone either way.
func TestBuildSteps(t *testing.T) {
	jails := apitest.New()
	var mu sync.Mutex
	var ran []model.ExecRequest
	jails.ExecHook = func(_ context.Context, _ string, req model.ExecRequest, out model.ExecOutput) (*model.ExecResult, error) {
		mu.Lock()
		ran = append(ran, req)
		mu.Unlock()
		script := req.Cmd[len(req.Cmd)-1]
		if strings.HasPrefix(script, "fail") {
			out("stderr", []byte("it broke\n"))
			return &model.ExecResult{ExitCode: 2}, nil
		}
		out("stdout", []byte("ran "+script+"\n"))
		return &model.ExecResult{}, nil
	}
	imgs := &fakeImages{}
	svc, err := New(context.Background(), fuzzJails{jails}, Options{DataDir: t.TempDir(), AdminToken: testToken, Images: imgs, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()

	build := func(name string, steps []buildStep) (tpl, bld string) {
		var req struct{ TemplateID, BuildID string }
		w := call(t, svc, "POST", "/e2b/v3/templates", map[string]any{"name": name})
		if w.Code != http.StatusAccepted || json.Unmarshal(w.Body.Bytes(), &req) != nil {
			t.Fatalf("request a build: %d %s", w.Code, w.Body)
		}
		w = call(t, svc, "POST", "/e2b/v2/templates/"+req.TemplateID+"/builds/"+req.BuildID, map[string]any{"fromImage": "busybox", "steps": steps})
		if w.Code != http.StatusAccepted {
			t.Fatalf("start the build: %d %s", w.Code, w.Body)
		}
		svc.templates.wg.Wait()
		return req.TemplateID, req.BuildID
	}
	status := func(tpl, bld string) (out struct {
		Status     string
		LogEntries []struct{ Message, Step string }
		Reason     *struct{ Message, Step string }
	}) {
		w := call(t, svc, "GET", "/e2b/templates/"+tpl+"/builds/"+bld+"/status", nil)
		if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &out) != nil {
			t.Fatalf("status: %d %s", w.Code, w.Body)
		}
		return out
	}

	tpl, bld := build("steps", []buildStep{
		{Type: "ENV", Args: []string{"A", "1", "B", "2"}},
		{Type: "WORKDIR", Args: []string{"/srv"}},
		{Type: "WORKDIR", Args: []string{"app"}},
		{Type: "USER", Args: []string{"app"}},
		{Type: "RUN", Args: []string{"make"}},
		{Type: "ENV", Args: []string{"A", "3"}},
		{Type: "RUN", Args: []string{"install", "root"}},
	})
	st := status(tpl, bld)
	if st.Status != buildReady {
		t.Fatalf("build: %+v", st)
	}
	if len(ran) != 2 || ran[0].Cwd != "/srv/app" || ran[0].User != "app" || ran[0].Env["A"] != "1" || ran[0].Env["B"] != "2" ||
		ran[1].User != "root" || ran[1].Env["A"] != "3" {
		t.Errorf("the steps' commands: %+v", ran)
	}
	if !slices.ContainsFunc(st.LogEntries, func(e struct{ Message, Step string }) bool { return e.Message == "ran make" && e.Step == "5" }) {
		t.Errorf("the log lacks the RUN step's output: %+v", st.LogEntries)
	}
	if len(imgs.commits) != 1 {
		t.Fatalf("commits: %+v", imgs.commits)
	}
	ch := imgs.commits[0].Changes
	if ch.WorkingDir != "/srv/app" || ch.User != "app" || !slices.Equal(ch.Env, []string{"B=2", "A=3"}) {
		t.Errorf("the commit's changes: %+v", ch)
	}

	tpl, bld = build("broken", []buildStep{{Type: "RUN", Args: []string{"true"}}, {Type: "RUN", Args: []string{"fail now"}}})
	st = status(tpl, bld)
	if st.Status != buildError || st.Reason == nil || st.Reason.Step != "2" || !strings.Contains(st.Reason.Message, "exit code 2") {
		t.Fatalf("failed build: %+v", st)
	}
	if !slices.ContainsFunc(st.LogEntries, func(e struct{ Message, Step string }) bool { return e.Message == "it broke" }) {
		t.Errorf("the log lacks the failing command's output: %+v", st.LogEntries)
	}
	// The status pages by logsOffset.
	w := call(t, svc, "GET", "/e2b/templates/"+tpl+"/builds/"+bld+"/status?logsOffset=1000", nil)
	if !strings.Contains(w.Body.String(), `"logEntries":[]`) {
		t.Errorf("status past the log's end: %s", w.Body)
	}
	if js, _ := jails.List(context.Background()); len(js) != 0 {
		t.Errorf("jails left by the builds: %+v", js)
	}
}

// TestInterruptedBuild: a build the daemon stopped in is failed when the
// service opens again, and its jail removed.
func TestInterruptedBuild(t *testing.T) {
	jails := apitest.New()
	j, err := jails.Create(context.Background(), model.CreateRequest{Name: "e2b-build-x"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rec := templateRecord{ID: "tpl", Name: "x", Builds: []*buildRecord{{ID: "b1", Status: buildBuilding, Jails: []string{j.ID}}}}
	data, _ := json.Marshal(rec)
	if err := os.MkdirAll(filepath.Join(dir, "e2b", "templates"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "e2b", "templates", "tpl.json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	svc, err := New(context.Background(), fuzzJails{jails}, Options{DataDir: dir, AdminToken: testToken, Images: &fakeImages{}, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	if _, err := jails.Get(context.Background(), j.ID); err == nil {
		t.Error("the interrupted build's jail is still there")
	}
	w := call(t, svc, "GET", "/e2b/templates/tpl/builds/b1/status", nil)
	if !strings.Contains(w.Body.String(), `"status":"error"`) || !strings.Contains(w.Body.String(), "stopped during the build") {
		t.Errorf("status of the interrupted build: %s", w.Body)
	}
}

// TestRefusedBuild: a build whose instructions are refused is a 4xx, the
// build is recorded as failed (not left waiting), and nothing runs.
func TestRefusedBuild(t *testing.T) {
	svc, err := New(context.Background(), fuzzJails{apitest.New()}, Options{DataDir: t.TempDir(), AdminToken: testToken, Images: &fakeImages{}, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	for _, tc := range []struct {
		body   map[string]any
		status int
		msg    string
	}{
		{map[string]any{"steps": []any{}}, 400, "exactly one of fromImage and fromTemplate"},
		{map[string]any{"fromImage": "x", "fromTemplate": "y"}, 400, "exactly one"},
		{map[string]any{"fromTemplate": "base"}, 400, "not an image"},
		{map[string]any{"fromImage": "x", "steps": []any{map[string]any{"type": "EXPOSE", "args": []string{"80"}}}}, 400, "is not a build step agentjail runs"},
		{map[string]any{"fromImage": "x", "steps": []any{map[string]any{"type": "COPY", "args": []string{"a", "/b"}, "filesHash": strings.Repeat("0", 64)}}}, 400, "were not uploaded"},
		{map[string]any{"fromImage": "x", "steps": []any{map[string]any{"type": "COPY", "args": []string{"a", "/b", "", "999"}, "filesHash": strings.Repeat("0", 64)}}}, 400, "not an octal file mode"},
		{map[string]any{"fromImage": "x", "steps": []any{map[string]any{"type": "ENV", "args": []string{"A"}}}}, 400, "pairs"},
		{map[string]any{"fromImage": "x", "fromImageRegistry": map[string]any{"type": "registry", "username": "u"}}, 400, "a username and a password are both required"},
		{map[string]any{"fromImage": "x", "fromImageRegistry": map[string]any{"type": "gcp", "serviceAccountJson": "{not json"}}, 400, "not a JSON service account key"},
		{map[string]any{"fromImage": "x", "fromImageRegistry": map[string]any{"type": "aws", "awsAccessKeyId": "a", "awsSecretAccessKey": "b", "awsRegion": "c"}}, 501, "AWS keys"},
		{map[string]any{"fromImage": "x", "fromImageRegistry": map[string]any{"type": "ftp"}}, 400, "unknown type"},
		{map[string]any{"fromTemplate": "y", "fromImageRegistry": map[string]any{"type": "registry", "username": "u", "password": "p"}}, 400, "credentials are for a base image"},
	} {
		var req struct{ TemplateID, BuildID string }
		w := call(t, svc, "POST", "/e2b/v3/templates", map[string]any{"name": "refused"})
		if json.Unmarshal(w.Body.Bytes(), &req) != nil {
			t.Fatalf("request: %d %s", w.Code, w.Body)
		}
		path := "/e2b/v2/templates/" + req.TemplateID + "/builds/" + req.BuildID
		w = call(t, svc, "POST", path, tc.body)
		if w.Code != tc.status || !strings.Contains(w.Body.String(), tc.msg) {
			t.Errorf("%v: %d %s; want %d %q", tc.body, w.Code, w.Body, tc.status, tc.msg)
		}
		w = call(t, svc, "GET", "/e2b/templates/"+req.TemplateID+"/builds/"+req.BuildID+"/status", nil)
		if !strings.Contains(w.Body.String(), `"status":"error"`) {
			t.Errorf("%v: the refused build is not failed: %s", tc.body, w.Body)
		}
		// A second start of the same build is a conflict.
		if w := call(t, svc, "POST", path, map[string]any{"fromImage": "x"}); w.Code != http.StatusConflict {
			t.Errorf("a second start: %d %s", w.Code, w.Body)
		}
	}
	for _, tc := range []struct {
		body any
		msg  string
	}{
		{map[string]any{"name": "Bad Name"}, "not a template name"},
		{map[string]any{"name": "base"}, "not a template name"},
		{map[string]any{"name": "ok", "tags": []string{"no spaces"}}, "not a tag"},
		{map[string]any{"name": "ok", "cpuCount": -1}, "negative"},
	} {
		if w := call(t, svc, "POST", "/e2b/v3/templates", tc.body); w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), tc.msg) {
			t.Errorf("%v: %d %s", tc.body, w.Code, w.Body)
		}
	}
	// An upload without the build's token is refused, and one over the
	// bound too.
	var req struct{ TemplateID, BuildID string }
	w := call(t, svc, "POST", "/e2b/v3/templates", map[string]any{"name": "uploads"})
	json.Unmarshal(w.Body.Bytes(), &req)
	w = call(t, svc, "GET", "/e2b/templates/"+req.TemplateID+"/files/"+strings.Repeat("1", 64), nil)
	var link struct {
		Present bool
		URL     string
	}
	if w.Code != http.StatusCreated || json.Unmarshal(w.Body.Bytes(), &link) != nil || link.Present || !strings.Contains(link.URL, "token=") {
		t.Fatalf("upload link: %d %s", w.Code, w.Body)
	}
	u := link.URL[strings.Index(link.URL, "/e2b/"):]
	put := func(target string, body []byte, length int64) int {
		r := httptest.NewRequest("PUT", target, bytes.NewReader(body))
		r.ContentLength = length
		w := httptest.NewRecorder()
		svc.ServeHTTP(w, r)
		return w.Code
	}
	if c := put(strings.Replace(u, "token=", "token=x", 1), []byte("data"), 4); c != http.StatusUnauthorized {
		t.Errorf("upload with a wrong token: %d", c)
	}
	if c := put(u, []byte("data"), maxTemplateUpload+1); c != http.StatusRequestEntityTooLarge {
		t.Errorf("upload over the bound: %d", c)
	}
	if c := put(u, []byte("data"), 4); c != http.StatusOK {
		t.Errorf("upload: %d", c)
	}
	w = call(t, svc, "GET", "/e2b/templates/"+req.TemplateID+"/files/"+strings.Repeat("1", 64), nil)
	if !strings.Contains(w.Body.String(), `"present":true`) {
		t.Errorf("the uploaded files are not present: %s", w.Body)
	}
}

// TestTemplateSheds: a template keeps its newest builds (and the tagged
// ones), removing the images of the others, and the uploaded archives
// only its last build used.
func TestTemplateSheds(t *testing.T) {
	imgs := &fakeImages{}
	svc, err := New(context.Background(), fuzzJails{apitest.New()}, Options{DataDir: t.TempDir(), AdminToken: testToken, Images: imgs, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	archive := func(name, body string) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(body))
		tw.Close()
		return buf.Bytes()
	}
	var tplID string
	builds := 0
	// Each build differs (an ENV step of its own): none reuses another.
	build := func(tag, hash string, data []byte) {
		builds++
		var req struct{ TemplateID, BuildID string }
		w := call(t, svc, "POST", "/e2b/v3/templates", map[string]any{"name": "shed:" + tag})
		if json.Unmarshal(w.Body.Bytes(), &req) != nil {
			t.Fatalf("request: %d %s", w.Code, w.Body)
		}
		tplID = req.TemplateID
		var link struct {
			Present bool
			URL     string
		}
		w = call(t, svc, "GET", "/e2b/templates/"+req.TemplateID+"/files/"+hash, nil)
		if json.Unmarshal(w.Body.Bytes(), &link) != nil {
			t.Fatalf("link: %d %s", w.Code, w.Body)
		}
		if !link.Present {
			r := httptest.NewRequest("PUT", link.URL[strings.Index(link.URL, "/e2b/"):], bytes.NewReader(data))
			w := httptest.NewRecorder()
			svc.ServeHTTP(w, r)
			if w.Code != http.StatusOK {
				t.Fatalf("upload: %d %s", w.Code, w.Body)
			}
		}
		w = call(t, svc, "POST", "/e2b/v2/templates/"+req.TemplateID+"/builds/"+req.BuildID, map[string]any{"fromImage": "busybox",
			"steps": []any{map[string]any{"type": "COPY", "args": []string{"f.txt", "/f.txt"}, "filesHash": hash},
				map[string]any{"type": "ENV", "args": []string{"BUILD", strconv.Itoa(builds)}}}})
		if w.Code != http.StatusAccepted {
			t.Fatalf("start: %d %s", w.Code, w.Body)
		}
		svc.templates.wg.Wait()
	}
	hashA, hashB := strings.Repeat("a", 64), strings.Repeat("b", 64)
	build("first", hashA, archive("f.txt", "a"))
	build("second", hashB, archive("f.txt", "b"))
	if _, err := os.Stat(svc.templates.filePath(tplID, hashA)); err == nil {
		t.Error("the first build's archive outlived the next build that did not use it")
	}
	if _, err := os.Stat(svc.templates.filePath(tplID, hashB)); err != nil {
		t.Errorf("the last build's archive: %v", err)
	}
	// Untagged builds past the newest ten go, with their images: the tag
	// "t" moves to each new build.
	for range keepBuilds + 3 {
		build("t", hashB, nil)
	}
	svc.templates.mu.Lock()
	n := len(svc.templates.byID[tplID].Builds)
	svc.templates.mu.Unlock()
	// first and second, tagged, the newest (tagged t) and ten untagged.
	if want := 2 + 1 + keepBuilds; n != want {
		t.Errorf("builds kept: %d, want %d", n, want)
	}
	if len(imgs.removed) != 2 {
		t.Errorf("images of dropped builds removed: %v, want 2", imgs.removed)
	}
}

// buildOnce asks svc for a build of template name, starts it with body,
// waits for it to end and returns its status answer.
func buildOnce(t *testing.T, svc *Service, name string, body map[string]any) string {
	t.Helper()
	var req struct{ TemplateID, BuildID string }
	w := call(t, svc, "POST", "/e2b/v3/templates", map[string]any{"name": name})
	if json.Unmarshal(w.Body.Bytes(), &req) != nil {
		t.Fatalf("request: %d %s", w.Code, w.Body)
	}
	if w := call(t, svc, "POST", "/e2b/v2/templates/"+req.TemplateID+"/builds/"+req.BuildID, body); w.Code != http.StatusAccepted {
		t.Fatalf("start: %d %s", w.Code, w.Body)
	}
	svc.templates.wg.Wait()
	return call(t, svc, "GET", "/e2b/templates/"+req.TemplateID+"/builds/"+req.BuildID+"/status", nil).Body.String()
}

// TestBuildBase: a build takes its base from the daemon's store when it is
// there, as a Dockerfile's FROM does, and pulls it otherwise or when the
// template skips the cache (force).
func TestBuildBase(t *testing.T) {
	imgs := &fakeImages{}
	svc, err := New(context.Background(), fuzzJails{apitest.New()}, Options{DataDir: t.TempDir(), AdminToken: testToken, Images: imgs, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	for _, b := range []map[string]any{
		{"fromImage": "local/tool:1"},
		{"fromImage": "remote/tool:1"},
		{"fromImage": "local/tool:1", "force": true},
		{"fromImage": "private/tool:1", "fromImageRegistry": map[string]any{"type": "registry", "username": "robot", "password": "s3cret"}},
		{"fromImage": "gcr.example/tool:1", "fromImageRegistry": map[string]any{"type": "gcp", "serviceAccountJson": `{"type":"service_account"}`}},
	} {
		st := buildOnce(t, svc, "base-test", b)
		if !strings.Contains(st, `"status":"ready"`) {
			t.Errorf("%v: %s", b, st)
		}
		if strings.Contains(st, "s3cret") || strings.Contains(st, "service_account") {
			t.Errorf("credentials in the build's status: %s", st)
		}
	}
	if want := []string{"remote/tool:1", "local/tool:1", "private/tool:1", "gcr.example/tool:1"}; !slices.Equal(imgs.pulled, want) {
		t.Errorf("pulled %v, want %v", imgs.pulled, want)
	}
	// Credentials reach the pull (a GCP key as the password of _json_key).
	if want := []string{"", "", "robot:s3cret", `_json_key:{"type":"service_account"}`}; !slices.Equal(imgs.auths, want) {
		t.Errorf("pulled with %q, want %q", imgs.auths, want)
	}
}

// TestBuildReuse: a build of a template with nothing changed (base image,
// steps, uploads, commands, resources) reuses the image of the last one
// without running a step; skipCache, a forced step or a changed step
// builds anew; an image removed from the store is built again; shedding
// old builds keeps an image a kept build reuses.
func TestBuildReuse(t *testing.T) {
	jails := apitest.New()
	var mu sync.Mutex
	ran := 0
	jails.ExecHook = func(context.Context, string, model.ExecRequest, model.ExecOutput) (*model.ExecResult, error) {
		mu.Lock()
		ran++
		mu.Unlock()
		return &model.ExecResult{}, nil
	}
	imgs := &fakeImages{}
	svc, err := New(context.Background(), fuzzJails{jails}, Options{DataDir: t.TempDir(), AdminToken: testToken, Images: imgs, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	run := []any{map[string]any{"type": "RUN", "args": []string{"echo hi"}}}
	build := func(body map[string]any) string {
		t.Helper()
		st := buildOnce(t, svc, "reuse", body)
		if !strings.Contains(st, `"status":"ready"`) {
			t.Fatalf("%v: %s", body, st)
		}
		return st
	}
	counts := func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		imgs.mu.Lock()
		defer imgs.mu.Unlock()
		return len(imgs.commits), ran
	}
	body := map[string]any{"fromImage": "remote/tool:1", "steps": run}
	build(body)
	if st := build(body); !strings.Contains(st, "Unchanged since build") {
		t.Errorf("an unchanged build: %s", st)
	}
	if commits, steps := counts(); commits != 1 || steps != 1 {
		t.Errorf("after an unchanged rebuild: %d commits and %d steps run, want 1 and 1", commits, steps)
	}
	for i, b := range []map[string]any{
		{"fromImage": "remote/tool:1", "steps": run, "force": true},
		{"fromImage": "remote/tool:1", "steps": []any{map[string]any{"type": "RUN", "args": []string{"echo hi"}, "force": true}}},
		{"fromImage": "remote/tool:1", "steps": []any{map[string]any{"type": "RUN", "args": []string{"echo changed"}}}},
	} {
		if st := build(b); strings.Contains(st, "Unchanged since build") {
			t.Errorf("build %d (%v) reused an image: %s", i, b, st)
		}
	}
	if commits, _ := counts(); commits != 4 {
		t.Errorf("%d commits, want 4", commits)
	}
	// The last image of body removed from the store: built again.
	imgs.mu.Lock()
	for _, c := range imgs.commits {
		imgs.removed = append(imgs.removed, c.Ref)
	}
	imgs.mu.Unlock()
	if st := build(body); strings.Contains(st, "Unchanged since build") {
		t.Errorf("a build whose image is gone reused it: %s", st)
	}

	// Shedding: the oldest build's image, reused by the newest, stays.
	rec := &templateRecord{}
	for i := range keepBuilds + 2 {
		rec.Builds = append(rec.Builds, &buildRecord{ID: strconv.Itoa(i), Status: buildReady, Image: "img-" + strconv.Itoa(i)})
	}
	rec.Builds[keepBuilds+1].Image = "img-0"
	dropped := svc.templates.trim(rec)
	var gone []string
	for _, d := range dropped {
		gone = append(gone, d.ID+"="+d.Image)
	}
	if want := []string{"1=img-1", "0="}; !slices.Equal(gone, want) {
		t.Errorf("dropped %v, want %v", gone, want)
	}
}
