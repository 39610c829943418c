package integration

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode"
)

// cli runs the agentjail client against d, with the token in the
// environment and the address as a flag.
func (d *daemon) cli(t *testing.T, stdin string, args ...string) (string, string, int) {
	t.Helper()
	return runBin(t, []string{"AGENTJAIL_TOKEN=" + d.token}, stdin, append([]string{"--addr", d.addr}, args...)...)
}

// mustCLI is cli that requires exit status 0 and returns stdout.
func (d *daemon) mustCLI(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, code := d.cli(t, "", args...)
	if code != 0 {
		t.Fatalf("agentjail %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

func TestCLI(t *testing.T) {
	d := shared(t)
	name := uniqueName(t)
	var created jailInfo
	if err := json.Unmarshal([]byte(d.mustCLI(t, "--json", "create", "--name", name, "--memory", "256m", "--env", "FROM_CLI=yes")), &created); err != nil {
		t.Fatalf("create --json: %v", err)
	}
	t.Cleanup(func() { d.destroy(t, created.ID) })
	if created.Name != name || created.Status != "running" || created.ID == "" {
		t.Fatalf("create --json: %+v", created)
	}

	t.Run("data dir instead of token", func(t *testing.T) {
		out, errOut, code := runBin(t, nil, "", "--data-dir", d.dir, "ls")
		if code != 0 || !strings.Contains(out, name) {
			t.Errorf("ls with --data-dir: exit %d\n%s%s", code, out, errOut)
		}
	})
	t.Run("ls and inspect", func(t *testing.T) {
		var list []jailInfo
		if err := json.Unmarshal([]byte(d.mustCLI(t, "--json", "ls")), &list); err != nil {
			t.Fatalf("ls --json: %v", err)
		}
		found := false
		for _, j := range list {
			found = found || j.ID == created.ID
		}
		if !found {
			t.Errorf("ls --json does not list %s", created.ID)
		}
		var j jailInfo
		if err := json.Unmarshal([]byte(d.mustCLI(t, "--json", "inspect", name)), &j); err != nil {
			t.Fatalf("inspect --json: %v", err)
		}
		var cfg struct {
			Isolation struct {
				Resources struct {
					MemoryBytes int64 `json:"memory_bytes"`
				} `json:"resources"`
			} `json:"isolation"`
			Env map[string]string `json:"env"`
		}
		if err := json.Unmarshal(j.Config, &cfg); err != nil {
			t.Fatalf("inspect --json: config: %v", err)
		}
		if j.ID != created.ID || j.Stats == nil || cfg.Isolation.Resources.MemoryBytes != 256<<20 || cfg.Env["FROM_CLI"] != "yes" {
			t.Errorf("inspect --json: %+v %s", j, j.Config)
		}
		if out := d.mustCLI(t, "inspect", name); !strings.Contains(out, "running") {
			t.Errorf("inspect: %q", out)
		}
	})
	t.Run("exec", func(t *testing.T) {
		out, errOut, code := d.cli(t, "", "exec", name, "--", "sh", "-c", "echo out; echo err >&2; echo $FROM_CLI; exit 3")
		if code != 3 || out != "out\nyes\n" || errOut != "err\n" {
			t.Errorf("exec: exit %d, stdout %q, stderr %q", code, out, errOut)
		}
		out, _, code = d.cli(t, "piped in", "exec", "-i", name, "cat")
		if code != 0 || out != "piped in" {
			t.Errorf("exec -i: exit %d, %q", code, out)
		}
		// Input above any request body's bound, and the command's status.
		big := make([]byte, 9<<20)
		rand.Read(big)
		sum := sha256.Sum256(big)
		out, errOut, code = d.cli(t, string(big), "exec", "-i", name, "sh", "-c", "sha256sum; exit 5")
		if code != 5 || !strings.HasPrefix(out, hex.EncodeToString(sum[:])+" ") {
			t.Errorf("exec -i of 9 MiB: exit %d, stdout %q, stderr %q; want exit 5 and digest %x", code, out, errOut, sum)
		}
		// A command that stops reading early ends the input quietly, as a
		// shell pipeline does: its output and status are what count.
		var lines strings.Builder
		for i := 1; i <= 200000; i++ {
			fmt.Fprintln(&lines, i)
		}
		out, errOut, code = d.cli(t, lines.String(), "exec", "-i", name, "sh", "-c", "head -1; exit 4")
		if code != 4 || out != "1\n" || errOut != "" {
			t.Errorf("exec -i into head -1: exit %d, stdout %q, stderr %q; want exit 4 and the first line", code, out, errOut)
		}
		t.Run("stream", func(t *testing.T) { cliInteractive(t, d, name) })
		out, _, code = d.cli(t, "", "exec", "-u", "root", "-e", "X=1", "--cwd", "/tmp", name, "sh", "-c", "echo $(id -u) $X $(pwd)")
		if code != 0 || out != "0 1 /tmp\n" {
			t.Errorf("exec -u root -e X=1 --cwd /tmp: exit %d, %q", code, out)
		}
		if _, _, code = d.cli(t, "", "exec", "--timeout", "1s", name, "sleep", "100"); code != 124 {
			t.Errorf("exec --timeout: exit %d, want 124", code)
		}
		if _, _, code = d.cli(t, "", "exec", name, "sh", "-c", "kill -KILL $$"); code != 137 {
			t.Errorf("exec of a command killed by SIGKILL: exit %d, want 137", code)
		}
		if _, errOut, code = d.cli(t, "", "exec", "no-such-jail", "true"); code == 0 || !strings.Contains(errOut, "no-such-jail") {
			t.Errorf("exec in an unknown jail: exit %d, %q", code, errOut)
		}
	})
	t.Run("cp", func(t *testing.T) {
		local := t.TempDir()
		tree := filepath.Join(local, "tree")
		if err := os.MkdirAll(filepath.Join(tree, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		for file, content := range map[string]string{"tree/a.txt": "alpha", "tree/sub/run.sh": "#!/bin/sh\necho ran\n", "single": "one file"} {
			mode := os.FileMode(0o644)
			switch file {
			case "tree/sub/run.sh":
				mode = 0o755
			case "single":
				mode = 0o600
			}
			if err := os.WriteFile(filepath.Join(local, file), []byte(content), mode); err != nil {
				t.Fatal(err)
			}
		}

		if err := os.Symlink("sub/run.sh", filepath.Join(tree, "latest")); err != nil {
			t.Fatal(err)
		}
		d.mustCLI(t, "cp", filepath.Join(local, "single"), name+":/workspace/single")
		d.mustCLI(t, "cp", tree, name+":/workspace/")
		if out := d.mustSh(t, created.ID, "cat /workspace/single; echo; cat /workspace/tree/a.txt; echo; /workspace/tree/sub/run.sh; stat -c %a /workspace/single"); out != "one file\nalpha\nran\n600\n" {
			t.Errorf("after cp in: %q", out)
		}
		// A link is copied as a link, owned by the jail's user; copied
		// again, it replaces the one there.
		if out := d.mustSh(t, created.ID, "readlink /workspace/tree/latest; /workspace/tree/latest; stat -c %U /workspace/tree/latest"); out != "sub/run.sh\nran\nagent\n" {
			t.Errorf("the copied link: %q", out)
		}
		if err := os.Remove(filepath.Join(tree, "latest")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("a.txt", filepath.Join(tree, "latest")); err != nil {
			t.Fatal(err)
		}
		d.mustCLI(t, "cp", tree, name+":/workspace/")
		if out := d.mustSh(t, created.ID, "readlink /workspace/tree/latest"); out != "a.txt\n" {
			t.Errorf("the link copied again: %q", out)
		}
		c := newCanary(t, "/var/tmp")
		d.mustSh(t, created.ID, "echo made inside > /workspace/tree/inside.txt; ln -s "+c.Path+" /workspace/tree/link")
		back := filepath.Join(local, "back")
		if err := os.Mkdir(back, 0o755); err != nil {
			t.Fatal(err)
		}
		d.mustCLI(t, "cp", name+":/workspace/tree", back)
		d.mustCLI(t, "cp", name+":/workspace/single", filepath.Join(local, "single-back"))
		for file, want := range map[string]string{
			"back/tree/a.txt": "alpha", "back/tree/inside.txt": "made inside\n",
			"back/tree/sub/run.sh": "#!/bin/sh\necho ran\n", "single-back": "one file",
		} {
			b, err := os.ReadFile(filepath.Join(local, file))
			if err != nil || string(b) != want {
				t.Errorf("cp out: %s: %q, %v", file, b, err)
			}
		}
		if st, err := os.Stat(filepath.Join(back, "tree", "sub", "run.sh")); err != nil || st.Mode().Perm() != 0o755 {
			t.Errorf("cp out kept no mode: %v %v", st, err)
		}
		c.Check(t, "cp out of a tree with a symlink to the host")
	})
	t.Run("stop start rm", func(t *testing.T) {
		d.mustCLI(t, "stop", "--timeout", "1s", name)
		if j := d.getJail(t, created.ID); j.Status != "stopped" {
			t.Errorf("after stop: %s", j.Status)
		}
		d.mustCLI(t, "start", name)
		if _, _, code := d.cli(t, "", "rm", name); code == 0 {
			t.Errorf("rm of a running jail without -f succeeded")
		}
		d.mustCLI(t, "rm", "-f", name)
		if r := d.api.do(t, "GET", "/jails/"+created.ID, nil); r.status != 404 {
			t.Errorf("after rm -f: %s", r)
		}
	})
}

func TestCLIRunRm(t *testing.T) {
	d := shared(t)
	base := baseline(t, d)
	before := jailCount(t, d)
	out, errOut, code := d.cli(t, "", "run", "--rm", "--", "sh", "-c", "echo hi; exit 5")
	if code != 5 || out != "hi\n" {
		t.Errorf("run --rm: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, _, code = d.cli(t, "", "run", "--rm", "--memory", "128m", "echo", "ok")
	if code != 0 || out != "ok\n" {
		t.Errorf("run --rm echo ok: exit %d, %q", code, out)
	}
	if after := jailCount(t, d); after != before {
		t.Errorf("run --rm left jails: %d before, %d after", before, after)
	}
	expectClean(t, d, base, "run --rm")
}

func jailCount(t *testing.T, d *daemon) int {
	t.Helper()
	var list struct {
		Jails []jailInfo `json:"jails"`
	}
	d.api.want(t, 200, "GET", "/jails", nil, &list)
	return len(list.Jails)
}

// TestCLISnapshotTreeDiff: snapshot and branch from the CLI; `tree` draws
// the jail, its snapshot and the branches under it, and `diff` lists a
// file one branch added, with its text diff on request.
func TestCLISnapshotTreeDiff(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, nil)
	sid := strings.TrimSpace(d.mustCLI(t, "snapshot", j.ID))
	t.Cleanup(func() { d.cli(t, "", "rmsnap", sid) })
	var ids []string
	for _, line := range strings.Split(strings.TrimSpace(d.mustCLI(t, "branch", sid, "-n", "2")), "\n") {
		id := strings.Fields(line)[0] // "ID NAME"
		ids = append(ids, id)
		t.Cleanup(func() { d.destroy(t, id) })
	}
	if len(ids) != 2 {
		t.Fatalf("branch -n 2 printed %q", ids)
	}
	tree := d.mustCLI(t, "tree")
	jl, sl, b0, b1 := lineOf(tree, j.Name), lineOf(tree, sid), lineOf(tree, ids[0][:12]), lineOf(tree, ids[1][:12])
	if jl < 0 || sl <= jl || b0 <= sl || b1 <= sl || indent(tree, sl) <= indent(tree, jl) || indent(tree, b0) <= indent(tree, sl) {
		t.Fatalf("tree does not draw jail → snapshot → branches:\n%s", tree)
	}
	d.mustSh(t, ids[0], "echo only-here > /workspace/branch-file.txt")
	out := d.mustCLI(t, "diff", ids[1], ids[0], "--text")
	added := false
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "A" && strings.Contains(l, "/workspace/branch-file.txt") {
			added = true
		}
	}
	if !added || !strings.Contains(out, "+only-here") {
		t.Fatalf("diff between the branches:\n%s", out)
	}
}

// lineOf is the index of the first line of s containing sub, or -1.
func lineOf(s, sub string) int {
	for i, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return i
		}
	}
	return -1
}

// indent is the display width before the first letter or digit of line i
// of s (the tree's drawing characters count one each).
func indent(s string, i int) int {
	l := strings.Split(s, "\n")[i]
	n := 0
	for _, r := range l {
		if unicode.IsLetter(r) || unicode.IsDigit(r) {
			break
		}
		n++
	}
	return n
}

// cliInteractive checks that exec -i streams both ways: the command
// answers each line of its input before the next is written.
func cliInteractive(t *testing.T, d *daemon, name string) {
	cmd := exec.Command(binPath, "--addr", d.addr, "exec", "-i", name, "sh", "-c", `while read l; do echo "got $l"; done; echo bye`)
	cmd.Env = append(os.Environ(), "AGENTJAIL_TOKEN="+d.token)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(outPipe)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func() string {
		select {
		case l := <-lines:
			return l
		case <-time.After(30 * time.Second):
			t.Fatal("no answer within 30 s while the input stays open")
			return ""
		}
	}
	for _, w := range []string{"one", "two"} {
		if _, err := io.WriteString(in, w+"\n"); err != nil {
			t.Fatal(err)
		}
		if got := next(); got != "got "+w {
			t.Fatalf("after writing %q: read %q", w, got)
		}
	}
	in.Close()
	if got := next(); got != "bye" {
		t.Fatalf("after closing the input: read %q, want bye", got)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exec -i: %v", err)
	}
}
