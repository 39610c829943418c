package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/agentjail/agentjail/internal/image/imagetest"
	"github.com/agentjail/agentjail/internal/testenv"
)

// e2bProject is the Node project that holds the official e2b SDK
// (package.json and package-lock.json; scripts/setup.sh runs npm ci).
func e2bProject(t testing.TB) string {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "test", "e2b")
	_, nodeErr := exec.LookPath("node")
	_, sdkErr := os.Stat(filepath.Join(dir, "node_modules", "e2b", "package.json"))
	if nodeErr != nil || sdkErr != nil {
		testenv.Need(t, "node and the e2b SDK (scripts/setup.sh runs npm ci in test/e2b)")
	}
	return dir
}

// e2bKey issues an API key on d for the SDK.
func e2bKey(t testing.TB, d *daemon) string {
	t.Helper()
	var k struct {
		Secret string `json:"secret"`
	}
	d.api.want(t, http.StatusCreated, "POST", "/keys", map[string]any{"name": t.Name(), "tenant": "e2b-test"}, &k)
	return k.Secret
}

// e2bEnv is the environment that points the SDK at d.
func e2bEnv(d *daemon, key string) []string {
	base := "http://" + d.addr + "/e2b"
	env := []string{"E2B_API_KEY=" + key, "E2B_API_URL=" + base, "E2B_SANDBOX_URL=" + base + "/envd"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "E2B_") {
			env = append(env, kv)
		}
	}
	return env
}

// TestE2BSDK runs the wire contract's acceptance scenario (test/e2b/
// compat.test.mjs) with the official, unchanged e2b SDK against a daemon:
// create, commands (buffered, streamed, background, stdin, timeout),
// files (read, write, multi-file, stat, list, move, remove, watch, signed
// URLs, gzip), PTY with input and resize, info, timeout, list by
// metadata, connect, pause and resume with a file and a process
// surviving, fork, the report, unsupported routes, kill, and the SDK's
// typed errors.
func TestE2BSDK(t *testing.T) {
	dir := e2bProject(t)
	d := shared(t)
	key := e2bKey(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "--test", "--test-reporter=spec", "compat.test.mjs")
	cmd.Dir = dir
	cmd.Env = e2bEnv(d, key)
	out, err := cmd.CombinedOutput()
	t.Logf("node --test compat.test.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("the E2B SDK scenario failed: %v", err)
	}
	// Nothing of the scenario's sandboxes is left: each was killed.
	var left []map[string]any
	r := d.api.do(t, "GET", "/e2b/v2/sandboxes", nil, "X-API-KEY", key)
	if r.status != http.StatusOK {
		t.Fatalf("listing sandboxes: %s", r)
	}
	if err := json.Unmarshal(r.body, &left); err != nil || len(left) != 0 {
		t.Fatalf("sandboxes left after the scenario: %v %v", left, err)
	}
}

// TestE2BReadmeExample runs the README's "Use it from the E2B SDK" example
// as written, with the three environment variables it names.
func TestE2BReadmeExample(t *testing.T) {
	dir := e2bProject(t)
	root, _ := repoRoot()
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(readme), "## Use it from the E2B SDK")
	if !ok {
		t.Fatal(`README.md has no "Use it from the E2B SDK" section`)
	}
	_, code, ok := strings.Cut(sec, "```js\n")
	if ok {
		code, _, ok = strings.Cut(code, "```")
	}
	if !ok {
		t.Fatal("the README's E2B section has no js example")
	}
	if n := strings.Count(strings.TrimSpace(code), "\n") + 1; n > 6 {
		t.Errorf("the README's E2B example has %d lines", n)
	}
	f, err := os.CreateTemp(dir, "readme-*.mjs")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(f.Name())
	if _, err := f.WriteString(code); err != nil {
		t.Fatal(err)
	}
	f.Close()
	d := shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", filepath.Base(f.Name()))
	cmd.Dir = dir
	cmd.Env = e2bEnv(d, e2bKey(t, d))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Linux") {
		t.Fatalf("the README's example: %v\n%s", err, out)
	}
}

// TestE2BNetwork runs test/e2b/network.test.mjs: the SDK's network
// options (allowInternetAccess, allowOut, denyOut, rules,
// maskRequestHost, updateNetwork) against a daemon whose policy enforces
// them, with a test server that allowed.test and other.test name, and
// the sandbox host names getHost returns (--e2b-domain), public and
// private. The header a rule adds reaches the server, though the sandbox
// never held it.
func TestE2BNetwork(t *testing.T) {
	dir := e2bProject(t)
	in := newTestInternet(t, "allowed.test", "other.test")
	d := newDaemon(t, "--hosts-file", in.hosts, "--e2b-domain", "sandbox.test")
	key := e2bKey(t, d)
	secret := "aj-test-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "--test", "--test-reporter=spec", "network.test.mjs")
	cmd.Dir = dir
	cmd.Env = append(e2bEnv(d, key), "AJ_TEST_INET="+in.addr, "AJ_TEST_SECRET="+secret)
	out, err := cmd.CombinedOutput()
	t.Logf("node --test network.test.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("the E2B network scenario failed: %v", err)
	}
	if got := in.headers("allowed.test", "X-Injected"); !slices.Contains(got, secret) {
		t.Errorf("the rule's header did not reach allowed.test: %q", got)
	}
	var left []map[string]any
	r := d.api.do(t, "GET", "/e2b/v2/sandboxes", nil, "X-API-KEY", key)
	if r.status != http.StatusOK || json.Unmarshal(r.body, &left) != nil {
		t.Fatalf("listing sandboxes: %s", r)
	}
	if len(left) != 0 {
		t.Errorf("sandboxes left after the scenario (a refused create must make none): %v", left)
	}
}

// TestE2BVolume runs test/e2b/volume.test.mjs: the SDK's volumes,
// mounted into sandboxes and served by the content API, and the links a
// sandbox leaves in one, which must not lead the daemon out of it.
func TestE2BVolume(t *testing.T) {
	dir := e2bProject(t)
	d := shared(t)
	key := e2bKey(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "--test", "--test-concurrency=1", "--test-reporter=spec", "volume.test.mjs")
	cmd.Dir = dir
	cmd.Env = append(e2bEnv(d, key), "E2B_VOLUME_API_URL=http://"+d.addr+"/e2b")
	out, err := cmd.CombinedOutput()
	t.Logf("node --test volume.test.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("the E2B volume scenario failed: %v", err)
	}
}

// pushSDKImage pushes to e's registry, as repoTag, an image of busybox
// whose /bin/bash runs busybox's sh (the SDK runs commands with bash),
// with no user or work dir of its own, and returns its reference.
func (e *imageEnv) pushSDKImage(tb testing.TB, repoTag string) string {
	bash := imagetest.Layer(tb, imagetest.Entry{Name: "bin/bash", Body: "#!/bin/sh\nexec /bin/sh \"$@\"\n", Mode: 0o755})
	return e.reg.Push(tb, repoTag, imagetest.Image(tb, v1.Config{Env: []string{"PATH=/bin"}}, e.baseLayer(tb), bash))
}

// TestE2BTemplate runs test/e2b/template.test.mjs: the SDK's
// Template.build against a daemon that pulls from a registry of the
// test's, then sandboxes of the templates. Afterwards no build jail and
// no template image is left.
func TestE2BTemplate(t *testing.T) {
	dir := e2bProject(t)
	e := newImageEnv(t)
	plain := e.pushSDKImage(t, "test/plain/busybox:1")
	private := e.pushSDKImage(t, "private/busybox:1")
	e.reg.RequireAuth("private/", "robot", "s3cret")
	key := e2bKey(t, e.d)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "--test", "--test-concurrency=1", "--test-reporter=spec", "template.test.mjs")
	cmd.Dir = dir
	cmd.Env = append(e2bEnv(e.d, key), "AJ_TEST_IMAGE="+plain, "AJ_TEST_PRIVATE_IMAGE="+private, "AJ_TEST_PRIVATE_AUTH=robot:s3cret", "AJ_TEST_ONE_DAEMON=1")
	out, err := cmd.CombinedOutput()
	t.Logf("node --test template.test.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("the E2B template scenario failed: %v", err)
	}
	var jails struct {
		Jails []struct {
			Name string `json:"name"`
		} `json:"jails"`
	}
	e.d.api.want(t, http.StatusOK, "GET", "/jails", nil, &jails)
	for _, j := range jails.Jails {
		t.Errorf("jail left after the scenario: %s", j.Name)
	}
	images, _, err := e.c.Images(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range images {
		for _, tag := range img.Tags {
			if strings.HasPrefix(tag, "agentjail.template/") {
				t.Errorf("image of a deleted template left: %s", tag)
			}
		}
	}
}
