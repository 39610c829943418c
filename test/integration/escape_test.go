package integration

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/backend/conformance"
)

// newCanary places a canary file (conformance.Canary) in a new directory
// under parent.
func newCanary(t *testing.T, parent string) *conformance.Canary {
	return conformance.NewCanary(t, parent)
}

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestEscapeSyscalls runs the escape probe in a jail as the default user
// and as root in the jail: every attempt must be stopped.
func TestEscapeSyscalls(t *testing.T) {
	d := shared(t)
	varCanary := newCanary(t, "/var/tmp")
	rootCanary := newCanary(t, "/root")
	other := d.createJail(t, nil)
	otherSecret := "other-jail-secret-" + randHex(8)
	d.putFile(t, other.ID, "/workspace/secret.txt", []byte(otherSecret))
	j := d.createJail(t, nil)

	var disk unix.Stat_t
	if err := unix.Stat("/dev/vda", &disk); err != nil {
		// Any block device of the host does; use the one backing /.
		var root unix.Stat_t
		if err := unix.Stat("/", &root); err != nil {
			t.Fatal(err)
		}
		disk.Rdev = root.Dev
	}
	hostFiles := []map[string]string{
		{"path": varCanary.Path, "sha256": sha256Hex([]byte(varCanary.Content))},
		{"path": rootCanary.Path, "sha256": sha256Hex([]byte(rootCanary.Content))},
		{"path": filepath.Join(d.dir, "api-token"), "sha256": sha256Hex([]byte(d.token + "\n"))},
		{"path": filepath.Join(d.dir, "jails", other.ID, "rootfs", "merged", "workspace", "secret.txt"), "sha256": sha256Hex([]byte(otherSecret))},
		{"path": "/workspace/secret.txt", "sha256": sha256Hex([]byte(otherSecret))},
	}
	if b, err := os.ReadFile("/etc/shadow"); err == nil {
		hostFiles = append(hostFiles, map[string]string{"path": "/etc/shadow", "sha256": sha256Hex(b)})
	}
	probeArgs, err := json.Marshal(map[string]any{
		"host_pids":  []int{os.Getpid(), d.pid},
		"host_files": hostFiles,
		"disk":       []uint32{unix.Major(uint64(disk.Rdev)), unix.Minor(uint64(disk.Rdev))},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, user := range []string{"", "root"} {
		label := "agent"
		if user != "" {
			label = user
		}
		t.Run(label, func(t *testing.T) {
			res := d.exec(t, j.ID, execReq{
				Cmd: []string{"python3", "-", string(probeArgs)}, Stdin: conformance.EscapeProbe, User: user, TimeoutMs: 120_000,
			})
			if res.ExitCode != 0 {
				t.Fatalf("the probe failed: %s", &res)
			}
			var results []struct {
				Name    string `json:"name"`
				Escaped bool   `json:"escaped"`
				Detail  string `json:"detail"`
			}
			if err := json.Unmarshal([]byte(res.Stdout), &results); err != nil {
				t.Fatalf("the probe's output: %v\n%s", err, &res)
			}
			if len(results) < 25 {
				t.Fatalf("the probe reported %d attempts, want all of them: %s", len(results), &res)
			}
			for _, r := range results {
				if r.Escaped {
					t.Errorf("%s (as %s): NOT STOPPED: %s", r.Name, label, r.Detail)
				} else {
					t.Logf("%s (as %s): stopped: %s", r.Name, label, r.Detail)
				}
			}
			for _, c := range []*conformance.Canary{varCanary, rootCanary} {
				c.Check(t, "escape probe", res.Stdout, res.Stderr)
			}
			if strings.Contains(res.Stdout+res.Stderr, otherSecret) {
				t.Errorf("another jail's file leaked into the probe's output")
			}
		})
	}
}

// TestEscapeTools tries the same escapes with the host's tools, as a user
// in the jail would: each command must fail.
func TestEscapeTools(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, nil)
	now := time.Now().UTC().Format("2006-01-02 15:04:05")
	cmds := []string{
		"mount -t tmpfs none /tmp",
		"mount --bind / /mnt",
		"umount -l /usr",
		"unshare -U -r true",
		"unshare -U -r -m mount -t tmpfs none /tmp",
		"unshare -m true",
		"unshare -n true",
		"nsenter -t 1 -m -u -i -n -p true",
		"nsenter --net=/proc/1/ns/net true",
		"date -u -s '" + now + "'",
		"mknod /tmp/sda b 8 0",
		"echo 1 > /proc/sys/vm/drop_caches",
		"echo 1 > /proc/sys/kernel/sysrq",
		"test -e /sys/fs/cgroup/memory/cgroup.procs && echo $$ > /sys/fs/cgroup/memory/cgroup.procs",
		"test -e /sys/fs/cgroup/pids/cgroup.procs && echo $$ > /sys/fs/cgroup/pids/cgroup.procs",
		"echo 999999999999 > /sys/fs/cgroup/memory/memory.limit_in_bytes",
		"echo max > /sys/fs/cgroup/pids/pids.max",
		"chroot / true",
	}
	for _, user := range []string{"", "root"} {
		for _, c := range cmds {
			res := d.shAs(t, j.ID, user, c)
			if res.ExitCode == 0 && res.Signal == "" {
				t.Errorf("as %q: %q succeeded in the jail: %s", user, c, &res)
			}
		}
	}
	// The jail is still whole afterwards.
	if out := d.mustSh(t, j.ID, "echo ok"); out != "ok\n" {
		t.Errorf("the jail does not answer after the attempts: %q", out)
	}
}

// TestEscapeCapabilities checks the capability sets of the jail's users:
// the default user has none; root keeps only the minimal default set.
func TestEscapeCapabilities(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, nil)
	// Bits that reach the kernel, devices or the network stack.
	forbidden := map[int]string{
		2: "CAP_DAC_READ_SEARCH", 12: "CAP_NET_ADMIN", 13: "CAP_NET_RAW", 16: "CAP_SYS_MODULE",
		17: "CAP_SYS_RAWIO", 18: "CAP_SYS_CHROOT", 19: "CAP_SYS_PTRACE", 21: "CAP_SYS_ADMIN",
		22: "CAP_SYS_BOOT", 24: "CAP_SYS_RESOURCE", 25: "CAP_SYS_TIME", 27: "CAP_MKNOD",
		38: "CAP_PERFMON", 39: "CAP_BPF", 40: "CAP_CHECKPOINT_RESTORE",
	}
	for _, user := range []string{"", "root"} {
		out := d.shAs(t, j.ID, user, "grep -E '^(CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status")
		if out.ExitCode != 0 {
			t.Fatalf("reading /proc/self/status: %s", &out)
		}
		fields := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(out.Stdout), "\n") {
			k, v, _ := strings.Cut(line, ":")
			fields[k] = strings.TrimSpace(v)
		}
		for _, k := range []string{"CapEff", "CapPrm", "CapBnd", "CapAmb"} {
			var mask uint64
			if _, err := fmt.Sscanf(fields[k], "%x", &mask); err != nil {
				t.Fatalf("as %q: %s %q: %v", user, k, fields[k], err)
			}
			for bit, name := range forbidden {
				if mask&(1<<bit) != 0 {
					t.Errorf("as %q: %s holds %s (%s)", user, k, name, fields[k])
				}
			}
			if user == "" && k != "CapBnd" && mask != 0 {
				t.Errorf("the default user has capabilities: %s %s", k, fields[k])
			}
		}
		if fields["Seccomp"] != "2" {
			t.Errorf("as %q: seccomp is not in filter mode (Seccomp: %q)", user, fields["Seccomp"])
		}
		if fields["NoNewPrivs"] != "1" {
			t.Errorf("as %q: no_new_privs is not set (NoNewPrivs: %q)", user, fields["NoNewPrivs"])
		}
	}
}

// TestEscapeHostSecrets checks that the host's secrets are invisible in a
// jail: /root, /etc/shadow, the data dir, the api-token.
func TestEscapeHostSecrets(t *testing.T) {
	d := shared(t)
	rootCanary := newCanary(t, "/root")
	j := d.createJail(t, nil)
	hostShadow, _ := os.ReadFile("/etc/shadow")
	for _, user := range []string{"", "root"} {
		ls := d.shAs(t, j.ID, user, "ls -laR /root /home 2>&1")
		if strings.Contains(ls.Stdout, filepath.Base(rootCanary.Dir)) {
			t.Errorf("as %q: the host's /root is visible in the jail:\n%s", user, ls.Stdout)
		}
		res := d.shAs(t, j.ID, user, fmt.Sprintf(
			"cat %s 2>&1; cat /etc/shadow 2>&1; ls -la %s 2>&1; cat %s/api-token 2>&1; env; cat /proc/1/environ 2>&1 | tr '\\0' '\\n'; cat /proc/1/cmdline 2>&1",
			rootCanary.Path, d.dir, d.dir))
		all := res.Stdout + res.Stderr
		rootCanary.Check(t, "reading host secrets as "+user, all)
		if strings.Contains(all, d.token) {
			t.Errorf("as %q: the API token is visible in the jail", user)
		}
		if len(hostShadow) > 0 {
			for _, line := range strings.Split(string(hostShadow), "\n") {
				// A hashed password of the host (root:*: and such are not secrets).
				name, rest, ok := strings.Cut(line, ":")
				if ok && len(rest) > 2 && strings.HasPrefix(rest, "$") && strings.Contains(all, name+":"+rest[:strings.IndexByte(rest+":", ':')]) {
					t.Errorf("as %q: the host's password hash of %s is visible in the jail", user, name)
				}
			}
		}
		// The token is nowhere in the jail's files (fed on stdin, so it is
		// not on a command line).
		grep := d.exec(t, j.ID, execReq{
			Cmd:   []string{"sh", "-c", "grep -rlF -f - /etc /.agentjail /workspace /home /tmp /root /var 2>/dev/null; true"},
			Stdin: d.token, User: user, TimeoutMs: 120_000,
		})
		if strings.TrimSpace(grep.Stdout) != "" {
			t.Errorf("as %q: files in the jail hold the API token: %s", user, grep.Stdout)
		}
		ls = d.shAs(t, j.ID, user, "test -e "+d.dir+" && echo visible; test -e "+filepath.Join(d.dir, "jails")+" && echo visible; true")
		if strings.Contains(ls.Stdout, "visible") {
			t.Errorf("as %q: the data dir %s is visible in the jail", user, d.dir)
		}
	}
}

// TestEscapeFileAPI attacks the files API: .. traversal (plain and
// encoded), absolute and relative symlinks to host files, /proc/1/root,
// symlinks swapped during requests, and hard links.
func TestEscapeFileAPI(t *testing.T) {
	d := shared(t)
	c := newCanary(t, "/var/tmp")
	j := d.createJail(t, nil)
	base := "/jails/" + j.ID + "/files"
	rel := strings.TrimPrefix(c.Path, "/")
	relDir := strings.TrimPrefix(c.Dir, "/")

	t.Run("traversal", func(t *testing.T) {
		var paths []string
		for _, up := range []string{"..", "%2e%2e", "%2E%2E", ".%2e", "%252e%252e", "..%2f..", "..%5c.."} {
			for _, sep := range []string{"/", "%2f", "%2F"} {
				p := "/workspace"
				for range 8 {
					p += sep + up
				}
				paths = append(paths, p+sep+rel, p+"/"+rel)
			}
		}
		paths = append(paths, "//"+rel, "/./../"+rel, "/proc/1/root/"+rel, "/proc/self/root/"+rel,
			"/proc/1/cwd/../../../../"+rel, "/workspace/../../../"+rel+"%00")
		for _, p := range paths {
			for _, m := range []string{"GET", "PUT", "DELETE"} {
				var body any
				if m == "PUT" {
					body = "pwned"
				}
				r, err := d.api.send(m, base+p, body)
				if err != nil {
					t.Fatalf("%s %s: %v", m, p, err)
				}
				if m == "GET" && r.status/100 == 2 {
					// Answering with a path inside the jail is fine; the
					// host file's content is not.
					t.Logf("%s %s: %s", m, p, r)
				}
				c.Check(t, m+" "+p, string(r.body))
			}
		}
	})

	t.Run("symlinks", func(t *testing.T) {
		d.mustSh(t, j.ID, fmt.Sprintf(`set -e; cd /workspace
ln -sfn %[1]s abs; ln -sfn ../../../../../../../%[2]s rel; ln -sfn %[3]s dirlink
ln -sfn ../../../../../../%[4]s reldir; ln -sfn / rootlink; ln -sfn /proc/1/root p1root
ln -sfn /proc/self/root selfroot; ln -sfn /proc/1/cwd p1cwd`, c.Path, rel, c.Dir, relDir))
		gets := []string{"/workspace/abs", "/workspace/rel", "/workspace/dirlink/canary", "/workspace/reldir/canary",
			"/workspace/rootlink/" + rel, "/workspace/p1root/" + rel, "/workspace/selfroot/" + rel,
			"/workspace/p1cwd/../../../../../" + rel, "/workspace/dirlink", "/workspace/reldir"}
		for _, p := range gets {
			for _, q := range []string{"", "?stat=true", "?access=read", "?access=write"} {
				r := d.api.do(t, "GET", base+p+q, nil)
				c.Check(t, "GET "+p+q, string(r.body))
				var listing struct {
					Entries []fileInfo `json:"entries"`
				}
				if q == "" && r.status == http.StatusOK && json.Unmarshal(r.body, &listing) == nil {
					for _, e := range listing.Entries {
						if e.Name == "canary" {
							t.Errorf("GET %s listed the host directory %s: %s", p, c.Dir, r)
						}
					}
				}
			}
		}
		for _, p := range []string{"/workspace/abs", "/workspace/rel", "/workspace/dirlink/canary", "/workspace/dirlink/new",
			"/workspace/reldir/canary", "/workspace/reldir/new", "/workspace/p1root/" + rel, "/workspace/rootlink/" + rel} {
			r := d.api.do(t, "PUT", base+p, "pwned")
			c.Check(t, "PUT "+p, string(r.body))
			r = d.api.do(t, "PUT", base+p+"?type=dir", nil)
			c.Check(t, "PUT "+p+"?type=dir", string(r.body))
		}
		for _, p := range []string{"/workspace/dirlink/canary", "/workspace/reldir/canary", "/workspace/p1root/" + rel,
			"/workspace/dirlink?recursive=true", "/workspace/reldir?recursive=true"} {
			r := d.api.do(t, "DELETE", base+p, nil)
			c.Check(t, "DELETE "+p, string(r.body))
		}
	})

	t.Run("swapped symlinks", func(t *testing.T) {
		done := make(chan execResult, 1)
		go func() {
			res, _ := d.api.send("POST", "/jails/"+j.ID+"/exec", execReq{
				Cmd: []string{"python3", "-", c.Path, c.Dir, "4"}, Stdin: swapProbe, TimeoutMs: 60_000,
			})
			var er execResult
			if res != nil {
				_ = json.Unmarshal(res.body, &er)
			}
			done <- er
		}()
		var (
			mu       sync.Mutex
			requests int
			leaks    []string
		)
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					var r *response
					var err error
					switch (i + w) % 5 {
					case 0:
						r, err = d.api.send("GET", base+"/workspace/swap", nil)
					case 1:
						r, err = d.api.send("PUT", base+"/workspace/swap", "pwned")
					case 2:
						r, err = d.api.send("GET", base+"/workspace/swapdir/canary", nil)
					case 3:
						r, err = d.api.send("PUT", base+"/workspace/swapdir/new", "pwned")
					case 4:
						r, err = d.api.send("DELETE", base+"/workspace/swapdir/canary", nil)
					}
					mu.Lock()
					requests++
					if err == nil && strings.Contains(string(r.body), c.Content) {
						leaks = append(leaks, fmt.Sprintf("request %d: %s", i, r))
					}
					mu.Unlock()
				}
			}()
		}
		res := <-done
		close(stop)
		wg.Wait()
		if res.ExitCode != 0 {
			t.Fatalf("the swapping loop failed: %s", &res)
		}
		t.Logf("%d requests against %s swaps", requests, strings.TrimSpace(res.Stdout))
		if len(leaks) > 0 {
			t.Errorf("the host canary leaked: %v", leaks)
		}
		c.Check(t, "swapped symlinks")
	})

	t.Run("hard links", func(t *testing.T) {
		// Files the host lends the jail sit on other mounts: a hard link to
		// them is refused, and if one were made, writing through it must
		// not reach the host's file.
		lent := map[string]string{"/usr/bin/env": "/usr/bin/env"}
		if bins, _ := filepath.Glob(filepath.Join(d.dir, "bin", "agentjail*")); len(bins) > 0 {
			lent["/.agentjail/agentjail"] = bins[0]
		}
		for src, host := range lent {
			before, err := os.ReadFile(host)
			if err != nil {
				t.Fatal(err)
			}
			link := "/workspace/hl-" + filepath.Base(src)
			for _, user := range []string{"", "root"} {
				res := d.shAs(t, j.ID, user, "ln "+src+" "+link)
				if res.ExitCode == 0 {
					// Harmless if it is a copy inside the jail: the host's
					// file is checked below.
					t.Logf("as %q: a hard link to %s was allowed in the jail", user, src)
					d.api.do(t, "PUT", base+link, "pwned")
					d.shAs(t, j.ID, "root", "rm -f "+link)
				}
			}
			after, err := os.ReadFile(host)
			if err != nil {
				t.Fatal(err)
			}
			if sha256Hex(before) != sha256Hex(after) {
				t.Fatalf("the host file %s changed through a hard link in the jail", host)
			}
		}
		c.Check(t, "hard links")
	})
}

// TestEscapeControlDir: init's control directory is bound into the jail
// read-write, and the jail's root can write there. It is a bounded tmpfs
// of its own, not the data dir's disk: root filling it gets "no space
// left" after at most its bound, the host's disk is untouched, the jail
// runs on, gives the room back when it stops, starts again with its init's
// log kept, and the mount goes with the jail.
func TestEscapeControlDir(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, nil)
	const bound = 64 << 20 // an eighth of the default 512 MiB of memory
	host := filepath.Join(d.dir, "jails", j.ID, "run")
	res := d.shAs(t, j.ID, "root", "dd if=/dev/zero of=/.agentjail/run/fill bs=1M count=200 2>&1; echo rc=$?")
	if !strings.Contains(res.Stdout, "No space left on device") || strings.Contains(res.Stdout, "rc=0") {
		t.Fatalf("writing 200 MiB into the control dir as the jail's root: %s", res.String())
	}
	var st unix.Statfs_t
	if err := unix.Statfs(host, &st); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(host, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Type != unix.TMPFS_MAGIC || fi.Size() > bound {
		t.Fatalf("the control dir is a filesystem of type %#x; the jail wrote %d bytes there (bound %d)", st.Type, fi.Size(), bound)
	}
	d.mustSh(t, j.ID, "echo still answering")
	log, err := os.ReadFile(filepath.Join(host, "init.log"))
	if err != nil {
		t.Fatal(err)
	}

	d.api.want(t, http.StatusOK, "POST", "/jails/"+j.ID+"/stop", nil, nil)
	if _, err := os.Stat(filepath.Join(host, "fill")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("what the jail's root left in the control dir still holds its room while the jail is stopped: %v", err)
	}
	d.api.want(t, http.StatusOK, "POST", "/jails/"+j.ID+"/start", nil, nil)
	if again, err := os.ReadFile(filepath.Join(host, "init.log")); err != nil || !bytes.HasPrefix(again, log) {
		t.Errorf("init's log was not kept across the restart: %v", err)
	}
	d.mustSh(t, j.ID, "echo started again")
	d.destroy(t, j.ID)
	if m := mountsUnder(host); len(m) > 0 {
		t.Errorf("the control dir is still mounted after the jail was destroyed: %v", m)
	}
}
