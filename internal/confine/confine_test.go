package confine

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/testenv"
)

// The test binary is its own confined child: with AGENTJAIL_CONFINE_TEST
// set it runs Main, which executes the shell script the test gave.
func TestMain(m *testing.M) {
	if os.Getenv("AGENTJAIL_CONFINE_TEST") != "" {
		os.Exit(Main(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func TestPolicyAssembles(t *testing.T) {
	p := Policy()
	prog, err := p.Assemble()
	if err != nil {
		t.Fatal(err)
	}
	if len(prog) < len(Denied) {
		t.Errorf("%d instructions for %d denied syscalls", len(prog), len(Denied))
	}
}

// confined runs script under sh, confined by spec (Path, Argv, Dir set
// here), and returns its output and exit error.
func confined(t *testing.T, spec Spec, script string) (string, error) {
	t.Helper()
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	spec.Path, spec.Argv = sh, []string{"sh", "-c", script}
	if spec.Dir == "" {
		spec.Dir = "/"
	}
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], string(b))
	cmd.Env = append(os.Environ(), "AGENTJAIL_CONFINE_TEST=1")
	cmd.ExtraFiles = []*os.File{r}
	w.Write([]byte{1})
	w.Close()
	out, err := cmd.CombinedOutput()
	r.Close()
	return string(out), err
}

// TestConfinement: the confined program reads and writes only what its
// spec lists, runs as its user without a way back, and cannot make the
// escape syscalls or signal the process that started it.
func TestConfinement(t *testing.T) {
	testenv.RequireRoot(t)
	ws := t.TempDir()
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(ws, 54321, 54321); err != nil {
		t.Fatal(err)
	}
	// t.TempDir's parent is root's alone: let the user through.
	if err := os.Chmod(filepath.Dir(ws), 0o711); err != nil {
		t.Fatal(err)
	}
	spec := Spec{
		Dir: ws, Env: []string{"PATH=/usr/bin:/bin"}, UID: 54321, GID: 54321, Seccomp: true,
		Rlimits: []Rlimit{{Resource: unix.RLIMIT_NOFILE, Cur: 64, Max: 64}},
		Landlock: &Landlock{
			ReadOnly: []string{"/usr", "/bin", "/lib", "/lib64", "/etc", "/proc"}, ReadWrite: []string{ws},
			Devices: []string{"/dev/null"},
		},
	}
	out, err := confined(t, spec, `
id -u; id -G; ulimit -n
echo ok > ./inside && cat ./inside
cat `+secret+` 2>/dev/null || echo no-secret
(echo x > /tmp/confine-test-$$) 2>/dev/null && echo WROTE-TMP || echo no-tmp
echo x > /dev/null && echo devnull
unshare -U true 2>/dev/null && echo UNSHARED || echo no-unshare
kill -0 $PPID 2>/dev/null && echo SIGNALLED || echo no-signal
python3 -c 'import ctypes; l=ctypes.CDLL(None, use_errno=True); print("keyctl", l.syscall(250, 0, -3, 0), ctypes.get_errno())'
`)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	want := []string{"54321", "54321", "64", "ok", "no-secret", "no-tmp", "devnull", "no-unshare", "no-signal", "keyctl -1 1"}
	got := strings.Split(strings.TrimSpace(out), "\n")
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("confined program printed\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestNoRelease: without the daemon's go-ahead nothing runs.
func TestNoRelease(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], `{"path":"/bin/true","argv":["true"],"dir":"/","uid":-1,"gid":-1}`)
	cmd.Env = append(os.Environ(), "AGENTJAIL_CONFINE_TEST=1")
	cmd.ExtraFiles = []*os.File{r}
	w.Close()
	out, err := cmd.CombinedOutput()
	r.Close()
	if err == nil || !strings.Contains(string(out), "go-ahead") {
		t.Errorf("ran without the go-ahead: %v %s", err, out)
	}
}
