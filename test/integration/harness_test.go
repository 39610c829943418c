package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/testenv"
)

// Timeouts of the harness.
const (
	// startTimeout bounds a daemon's start (the first start makes the
	// storage pool and the host rootfs).
	startTimeout = 2 * time.Minute
	// stopTimeout bounds a daemon's graceful exit after SIGTERM.
	stopTimeout = 30 * time.Second
	// requestTimeout bounds one API request.
	requestTimeout = 2 * time.Minute
)

var (
	// binPath is the agentjail binary built by TestMain.
	binPath string
	// envMissing says what the suite lacks to run here (root).
	envMissing string
	// buildErr is the failure to build the binary: every test fails on it.
	buildErr error

	sharedMu     sync.Mutex
	sharedDaemon *daemon
	sharedErr    error
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if n, ok := os.LookupEnv(relayEnv); ok {
		depth, err := strconv.Atoi(n)
		if err == nil {
			err = runRelay(depth)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "integration: relay:", err)
			return 1
		}
		return 0
	}
	binDir, err := os.MkdirTemp("", "agentjail-it-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
		return 1
	}
	defer os.RemoveAll(binDir)
	switch {
	case os.Geteuid() != 0:
		envMissing = "root (mounts, loop devices, cgroups, namespaces)"
	default:
		binPath = filepath.Join(binDir, "agentjail")
		buildErr = buildBinary(binPath)
	}
	code := m.Run()
	if err := stopShared(); err != nil {
		fmt.Fprintln(os.Stderr, "integration: shutting down the shared daemon:", err)
		code = 1
	}
	return code
}

// stopShared shuts the shared daemon down, if one runs.
func stopShared() error {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	d := sharedDaemon
	sharedDaemon, sharedErr = nil, nil
	if d == nil {
		return nil
	}
	return d.shutdown()
}

// buildBinary builds ./cmd/agentjail (static) to out.
func buildBinary(out string) error {
	gobin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("building the binary: %w (the Makefile puts /usr/local/go/bin on PATH)", err)
	}
	root, err := repoRoot()
	if err != nil {
		return err
	}
	cmd := exec.Command(gobin, "build", "-trimpath", "-o", out, "./cmd/agentjail")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building agentjail: %w\n%s", err, b)
	}
	return nil
}

// repoRoot is the module root (two levels above this package).
func repoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	root := filepath.Clean(filepath.Join(wd, "..", ".."))
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return "", fmt.Errorf("module root not found above %s: %w", wd, err)
	}
	return root, nil
}

// requireEnv skips (or, with CI=true, fails) a test that cannot run here,
// and fails every test when the binary did not build.
func requireEnv(tb testing.TB) {
	tb.Helper()
	if buildErr != nil {
		tb.Fatal(buildErr)
	}
	testenv.Need(tb, envMissing)
}

// shared returns the daemon most tests share, starting it on first use.
func shared(tb testing.TB) *daemon {
	tb.Helper()
	requireEnv(tb)
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedDaemon == nil && sharedErr == nil {
		sharedDaemon, sharedErr = startDaemon("")
	}
	if sharedErr != nil {
		tb.Fatalf("shared daemon: %v", sharedErr)
	}
	return sharedDaemon
}

// newDaemon starts a daemon of the test's own on a fresh data dir, beside
// the shared one, with serve's extra flags; it is shut down, torn down and
// checked for leftovers when the test ends.
func newDaemon(t testing.TB, flags ...string) *daemon {
	t.Helper()
	requireEnv(t)
	d, err := startDaemon("", flags...)
	if err != nil {
		t.Fatalf("starting a daemon: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			// What went wrong inside shows in CI's output, which keeps
			// no log files.
			t.Logf("the daemon's last errors and warnings:\n%s", d.problemLines(40))
		}
		if err := d.shutdown(); err != nil {
			t.Errorf("shutting down the daemon: %v", err)
		}
	})
	return d
}

// daemon is one running `agentjail serve`.
type daemon struct {
	dir   string // data dir
	addr  string // host:port
	token string
	pid   int

	cmd     *exec.Cmd
	logPath string
	exited  chan struct{} // closed when the process has been waited for
	waitErr error
	api     *client
	// ids records every jail id the daemon ever used (see idWatcher).
	ids *idWatcher
	// flags are added to serve's command line.
	flags []string
	// bin, when set, is the agentjail binary run instead of binPath.
	bin string
}

var listeningRE = regexp.MustCompile(`agentjail: listening on http://(\S+)`)

// netSeq numbers the test daemons' jail networks.
var netSeq atomic.Int64

// netFlags returns serve flags giving a daemon a jail network of its own:
// the interfaces, nftables table and subnet of a daemon are host-wide, so
// daemons side by side (and others on this host) need distinct ones.
func netFlags() []string {
	n := (os.Getpid()*7 + int(netSeq.Add(1))) % 100
	return []string{"--net-prefix", fmt.Sprintf("t%02d", n), "--subnet", fmt.Sprintf("10.%d.0.0/16", 120+n)}
}

// startDaemon starts `agentjail serve` on dir (a new temp dir when empty)
// and waits until it listens. The daemon keeps no ready jails (their
// background starts would blur the tests' inventories of what a jail
// holds) unless flags ask for them with --warm-jails.
func startDaemon(dir string, flags ...string) (*daemon, error) {
	if dir == "" {
		var err error
		dir, err = os.MkdirTemp("", "agentjail-it-")
		if err != nil {
			return nil, err
		}
	}
	d := &daemon{dir: dir, exited: make(chan struct{}), flags: append(append(netFlags(), "--warm-jails", "0"), flags...)}
	err := d.start()
	if err == nil {
		d.ids, err = watchIDs(filepath.Join(dir, "jails"))
	}
	if err != nil {
		if serr := d.shutdown(); serr != nil {
			err = fmt.Errorf("%w\nand cleaning up: %v", err, serr)
		}
		return nil, err
	}
	return d, nil
}

// start runs the daemon process on d.dir and waits for its ready line.
func (d *daemon) start() error {
	d.exited = make(chan struct{})
	d.logPath = d.dir + ".log"
	logf, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	bin := binPath
	if d.bin != "" {
		bin = d.bin
	}
	cmd := exec.Command(bin, append([]string{"serve", "--data-dir", d.dir, "--addr", "127.0.0.1:0"}, d.flags...)...)
	cmd.Stdout = logf
	stderr, err := cmd.StderrPipe()
	if err != nil {
		logf.Close()
		return err
	}
	// Its own process group: a signal to the test's group does not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting %s: %w", bin, err)
	}
	d.cmd = cmd
	d.pid = cmd.Process.Pid
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logf, line)
			if m := listeningRE.FindStringSubmatch(line); m != nil {
				select {
				case ready <- m[1]:
				default:
				}
			}
		}
		d.waitErr = cmd.Wait()
		logf.Close()
		close(d.exited)
	}()
	select {
	case addr := <-ready:
		d.addr = addr
	case <-d.exited:
		return fmt.Errorf("the daemon exited before listening (%v); log:\n%s", d.waitErr, d.logTail())
	case <-time.After(startTimeout):
		d.kill()
		return fmt.Errorf("the daemon did not listen within %v; log:\n%s", startTimeout, d.logTail())
	}
	b, err := os.ReadFile(filepath.Join(d.dir, "daemon.addr"))
	if err != nil {
		return fmt.Errorf("daemon.addr: %w", err)
	}
	if got := strings.TrimSpace(string(b)); got != d.addr {
		return fmt.Errorf("daemon.addr holds %q, the ready line said %q", got, d.addr)
	}
	tok, err := os.ReadFile(filepath.Join(d.dir, "api-token"))
	if err != nil {
		return fmt.Errorf("api-token: %w", err)
	}
	d.token = strings.TrimSpace(string(tok))
	d.api = newClient("http://"+d.addr, d.token)
	return nil
}

// logTail returns the last lines of the daemon's log.
func (d *daemon) logTail() string {
	b, _ := os.ReadFile(d.logPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 60 {
		lines = lines[len(lines)-60:]
	}
	return strings.Join(lines, "\n")
}

// errorLines returns the last n error lines of the daemon's log.
func (d *daemon) errorLines(n int) string { return d.logLines(n, "level=ERROR") }

// problemLines returns the last n error and warning lines of the daemon's log.
func (d *daemon) problemLines(n int) string { return d.logLines(n, "level=ERROR", "level=WARN") }

// logLines returns the last n lines of the daemon's log that hold one of
// marks.
func (d *daemon) logLines(n int, marks ...string) string {
	b, _ := os.ReadFile(d.logPath)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if slices.ContainsFunc(marks, func(m string) bool { return strings.Contains(l, m) }) {
			out = append(out, l)
		}
	}
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return strings.Join(out, "\n")
}

// kill SIGKILLs the daemon and waits for it.
func (d *daemon) kill() {
	if d.cmd == nil {
		return
	}
	_ = syscall.Kill(d.pid, syscall.SIGKILL)
	<-d.exited
}

// stop asks the daemon to exit (SIGTERM) and waits, killing it after
// stopTimeout.
func (d *daemon) stop() error {
	if d.cmd == nil {
		return nil
	}
	select {
	case <-d.exited:
		return nil
	default:
	}
	_ = syscall.Kill(d.pid, syscall.SIGTERM)
	select {
	case <-d.exited:
		return nil
	case <-time.After(stopTimeout):
		d.kill()
		return fmt.Errorf("the daemon ignored SIGTERM for %v; killed it", stopTimeout)
	}
}

// restart starts a new daemon process on the same data dir.
func (d *daemon) restart() error {
	return d.start()
}

// teardown runs `agentjail teardown` on the data dir.
func (d *daemon) teardown() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, binPath, "teardown", "--data-dir", d.dir).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("agentjail teardown: %w\n%s", err, out)
	}
	return string(out), nil
}

// shutdown stops the daemon, tears its data dir down, checks that nothing
// of it is left on the host, and removes the data dir.
func (d *daemon) shutdown() error {
	var errs []error
	if err := d.stop(); err != nil {
		errs = append(errs, err)
	}
	if _, err := d.teardown(); err != nil {
		errs = append(errs, err)
	}
	if d.ids != nil {
		defer d.ids.close()
	}
	// Killed processes may take a moment to be reaped.
	var left []string
	_ = waitFor(15*time.Second, func() error {
		left = d.leftovers()
		if len(left) > 0 {
			return errors.New("leftovers")
		}
		return nil
	})
	if len(left) > 0 {
		errs = append(errs, fmt.Errorf("left behind after teardown of %s:\n  %s", d.dir, strings.Join(left, "\n  ")))
		// Still leave the host clean: what teardown missed is released
		// here (the failure above stands).
		if err := forceRelease(d.dir); err != nil {
			errs = append(errs, err)
		} else if err := os.RemoveAll(d.dir); err != nil {
			errs = append(errs, err)
		}
	} else if err := os.RemoveAll(d.dir); err != nil {
		errs = append(errs, err)
	} else {
		os.Remove(d.logPath)
	}
	if len(errs) > 0 {
		errs = append(errs, fmt.Errorf("daemon log:\n%s", d.logTail()))
	}
	return errors.Join(errs...)
}

// leftovers lists what of the data dir is still held on the host after
// teardown: mounts under it, loop devices backed by its files, network
// namespaces bound there, the cgroups and processes of its jails, and its
// jail network (interfaces, routes, nftables table).
func (d *daemon) leftovers() []string {
	inv := takeInventory(d.dir)
	var out []string
	for _, m := range inv.Mounts {
		out = append(out, "mount "+m)
	}
	for _, l := range inv.Loops {
		out = append(out, "loop device "+l)
	}
	for _, n := range inv.Netns {
		if isNsfs(filepath.Join(d.dir, "run", "netns", n)) {
			out = append(out, "netns "+n)
		}
	}
	for _, c := range inv.Cgroups {
		if d.owns(c) {
			out = append(out, "cgroup "+c)
		}
	}
	for _, p := range inv.Procs {
		if d.owns(p) {
			out = append(out, "process "+p)
		}
	}
	for _, h := range inv.Helpers {
		out = append(out, "helper process "+h)
	}
	for _, l := range inv.Links {
		out = append(out, "interface "+l)
	}
	for _, r := range inv.Routes {
		out = append(out, "route "+r)
	}
	for _, n := range inv.Nft {
		out = append(out, "nft "+n)
	}
	return out
}

// procState returns the state letter of process pid ("" when it is gone).
func procState(pid string) string {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return ""
	}
	// pid (comm) state ppid ...
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		if f := strings.Fields(s[i+1:]); len(f) > 0 {
			return f[0]
		}
	}
	return ""
}

// forceRelease lazily unmounts everything mounted under dir and detaches
// the loop devices its files back, for when teardown failed.
func forceRelease(dir string) error {
	mounts := mountsUnder(dir)
	slices.SortFunc(mounts, func(a, b string) int { return len(b) - len(a) }) // deepest first
	var errs []error
	for _, m := range mounts {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	for _, l := range loopsUnder(dir) {
		dev, _, _ := strings.Cut(l, " ")
		fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		if err := unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
			errs = append(errs, fmt.Errorf("detach %s: %w", dev, err))
		}
		unix.Close(fd)
	}
	return errors.Join(errs...)
}

// owns reports whether a host-wide item (a cgroup path, a process line)
// belongs to one of the daemon's jails.
func (d *daemon) owns(item string) bool {
	return d.ids != nil && d.ids.owns(item)
}

// client is a minimal client of the REST API.
type client struct {
	base  string
	token string
	hc    *http.Client
}

func newClient(base, token string) *client {
	return &client{base: base, token: token, hc: &http.Client{
		Timeout: requestTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}}
}

// response is a whole HTTP response.
type response struct {
	status int
	header http.Header
	body   []byte
}

// apiError is the body of an error response.
type apiError struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func (r *response) String() string {
	body := string(r.body)
	if len(body) > 2000 {
		body = body[:2000] + "…"
	}
	return fmt.Sprintf("HTTP %d %s", r.status, strings.TrimSpace(body))
}

// errorMessage returns the message of an error body ("" when there is none).
func (r *response) errorMessage() string {
	var e apiError
	if json.Unmarshal(r.body, &e) != nil {
		return ""
	}
	return e.Error.Message
}

// send makes one request. in is nil (no body), []byte or string (sent as
// is), or a value sent as JSON. path is used verbatim (not cleaned).
func (c *client) send(method, path string, in any, header ...string) (*response, error) {
	var body io.Reader
	ctype := ""
	switch v := in.(type) {
	case nil:
	case []byte:
		body = bytes.NewReader(v)
	case string:
		body = strings.NewReader(v)
	case io.Reader: // sent chunked, without a length
		body = v
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
		ctype = "application/json"
	}
	req, err := http.NewRequest(method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: reading the body: %w", method, path, err)
	}
	return &response{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// do is send that fails the test on a transport error.
func (c *client) do(tb testing.TB, method, path string, in any, header ...string) *response {
	tb.Helper()
	r, err := c.send(method, path, in, header...)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

// want makes a request, fails the test unless the status is want, and
// decodes the body into out (when not nil).
func (c *client) want(tb testing.TB, want int, method, path string, in, out any) *response {
	tb.Helper()
	r := c.do(tb, method, path, in)
	if r.status != want {
		tb.Fatalf("%s %s: want HTTP %d, got %s", method, path, want, r)
	}
	if out != nil {
		if err := json.Unmarshal(r.body, out); err != nil {
			tb.Fatalf("%s %s: decoding %q: %v", method, path, r.body, err)
		}
	}
	return r
}

// The wire types, spelled out from the documented contract (not imported,
// so that a renamed field breaks these tests).

type jailInfo struct {
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Status    string          `json:"status"`
	CreatedAt time.Time       `json:"created_at"`
	Error     string          `json:"error"`
	Pid       int             `json:"pid"`
	Config    json.RawMessage `json:"config"`
	Stats     *jailStats      `json:"stats"`
}

type jailStats struct {
	MemoryBytes    uint64 `json:"memory_bytes"`
	CPUTimeNs      uint64 `json:"cpu_time_ns"`
	Pids           uint64 `json:"pids"`
	PidsLimit      uint64 `json:"pids_limit"`
	OOMKills       uint64 `json:"oom_kills"`
	DiskUsedBytes  uint64 `json:"disk_used_bytes"`
	DiskLimitBytes uint64 `json:"disk_limit_bytes"`
}

type execReq struct {
	Cmd       []string          `json:"cmd"`
	Env       map[string]string `json:"env,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	Stdin     string            `json:"stdin,omitempty"`
	TimeoutMs int64             `json:"timeout_ms,omitempty"`
	User      string            `json:"user,omitempty"`
}

type execResult struct {
	ExitCode   int     `json:"exit_code"`
	Signal     string  `json:"signal"`
	Stdout     string  `json:"stdout"`
	Stderr     string  `json:"stderr"`
	Truncated  bool    `json:"truncated"`
	TimedOut   bool    `json:"timed_out"`
	OOMKilled  bool    `json:"oom_killed"`
	DurationMs float64 `json:"duration_ms"`
}

func (r *execResult) String() string {
	clip := func(s string) string {
		if len(s) > 1500 {
			return s[:1500] + "…"
		}
		return s
	}
	return fmt.Sprintf("exit %d signal %q timed_out %v oom_killed %v\nstdout: %s\nstderr: %s",
		r.ExitCode, r.Signal, r.TimedOut, r.OOMKilled, clip(r.Stdout), clip(r.Stderr))
}

type fileInfo struct {
	Name string `json:"name"`
	Path string `json:"path"`
	Type string `json:"type"`
	Size int64  `json:"size"`
	Mode string `json:"mode"`
	UID  int    `json:"uid"`
	GID  int    `json:"gid"`
}

var nameSeq atomic.Int64

// uniqueName returns a valid jail name derived from the test's name.
func uniqueName(tb testing.TB) string {
	n := strings.ToLower(tb.Name())
	n = regexp.MustCompile(`[^a-z0-9_.-]+`).ReplaceAllString(n, "-")
	n = strings.Trim(n, "-._")
	if len(n) > 40 {
		n = n[len(n)-40:]
		n = strings.TrimLeft(n, "-._")
	}
	return fmt.Sprintf("%s-%d", n, nameSeq.Add(1))
}

// createJail creates (and by default starts) a jail from spec, which is the
// POST /jails body without the name; it is destroyed when the test ends.
func (d *daemon) createJail(tb testing.TB, spec map[string]any) jailInfo {
	tb.Helper()
	body := map[string]any{"name": uniqueName(tb)}
	for k, v := range spec {
		body[k] = v
	}
	var j jailInfo
	d.api.want(tb, http.StatusCreated, "POST", "/jails", body, &j)
	if j.ID == "" {
		tb.Fatalf("POST /jails: no id in the answer")
	}
	tb.Cleanup(func() { d.destroy(tb, j.ID) })
	return j
}

// destroy deletes a jail, accepting that it is already gone.
func (d *daemon) destroy(tb testing.TB, id string) {
	tb.Helper()
	r, err := d.api.send("DELETE", "/jails/"+id, nil)
	if err != nil {
		tb.Errorf("DELETE /jails/%s: %v", id, err)
		return
	}
	if r.status != http.StatusNoContent && r.status != http.StatusNotFound {
		tb.Errorf("DELETE /jails/%s: %s", id, r)
	}
}

// getJail returns GET /jails/{id}.
func (d *daemon) getJail(tb testing.TB, id string) jailInfo {
	tb.Helper()
	var j jailInfo
	d.api.want(tb, http.StatusOK, "GET", "/jails/"+id, nil, &j)
	return j
}

// exec runs req in the jail and returns the result (HTTP 200 required).
func (d *daemon) exec(tb testing.TB, id string, req execReq) execResult {
	tb.Helper()
	var res execResult
	d.api.want(tb, http.StatusOK, "POST", "/jails/"+id+"/exec", req, &res)
	return res
}

// shAs runs `sh -c script` as user ("" is the jail's default user).
func (d *daemon) shAs(tb testing.TB, id, user, script string) execResult {
	tb.Helper()
	return d.exec(tb, id, execReq{Cmd: []string{"sh", "-c", script}, User: user, TimeoutMs: 120_000})
}

// waitSh waits until `sh -c script`, run as root, exits 0; what names the
// awaited state in the failure.
func (d *daemon) waitSh(tb testing.TB, id, script string, timeout time.Duration, what string) {
	tb.Helper()
	if err := waitFor(timeout, func() error {
		if res := d.shAs(tb, id, "root", script); res.ExitCode != 0 {
			return fmt.Errorf("jail %s: %s", id, what)
		}
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
}

// mustSh runs `sh -c script` as the default user, requires exit 0 and
// returns stdout.
func (d *daemon) mustSh(tb testing.TB, id, script string) string {
	tb.Helper()
	res := d.shAs(tb, id, "", script)
	if res.ExitCode != 0 || res.Signal != "" {
		tb.Fatalf("sh -c %q: %s", script, &res)
	}
	return res.Stdout
}

// putFile writes a file through the files API (HTTP 201 required).
func (d *daemon) putFile(tb testing.TB, id, path string, data []byte) {
	tb.Helper()
	d.api.want(tb, http.StatusCreated, "PUT", "/jails/"+id+"/files"+path, data, nil)
}

// healthInfo is the part of GET /health the tests read.
type healthInfo struct {
	Status string `json:"status"`
	Jails  int    `json:"jails"`
	Warm   *struct {
		Size   int    `json:"size"`
		Max    int    `json:"max"`
		Target int    `json:"target"`
		Ready  int    `json:"ready"`
		Taken  uint64 `json:"taken"`
		Error  string `json:"error"`
	} `json:"warm"`
}

func (d *daemon) health(tb testing.TB) healthInfo {
	tb.Helper()
	var h healthInfo
	d.api.want(tb, http.StatusOK, "GET", "/health", nil, &h)
	return h
}

// waitWarm waits until the daemon's pool of ready jails is full.
func (d *daemon) waitWarm(tb testing.TB) {
	tb.Helper()
	err := waitFor(3*time.Minute, func() error {
		h := d.health(tb)
		switch {
		case h.Warm == nil:
			return fmt.Errorf("the daemon keeps no ready jails")
		case h.Warm.Ready < max(h.Warm.Size, h.Warm.Target):
			return fmt.Errorf("%d of %d ready jails (last error: %q)", h.Warm.Ready, max(h.Warm.Size, h.Warm.Target), h.Warm.Error)
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("warm pool: %v", err)
	}
}

// waitFor polls cond every 50 ms until it returns nil or the deadline
// passes; it returns cond's last error.
func waitFor(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runBin runs the agentjail binary with args and env added to the test's
// environment, returning its stdout, stderr and exit code.
func runBin(tb testing.TB, env []string, stdin string, args ...string) (string, string, int) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return stdout.String(), stderr.String(), 0
	case errors.As(err, &ee):
		return stdout.String(), stderr.String(), ee.ExitCode()
	default:
		tb.Fatalf("agentjail %s: %v", strings.Join(args, " "), err)
		return "", "", -1
	}
}
