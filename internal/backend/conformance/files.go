package conformance

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentjail/agentjail/client"
)

// Canary is a world-readable host file holding a random secret: no jail
// may read, change or delete it, nor add to its directory.
type Canary struct {
	// Dir is the host directory holding it (and nothing else), Path its
	// host path, Content the secret.
	Dir, Path, Content string
}

// NewCanary places a canary in a new directory under parent, removed
// when the test ends.
func NewCanary(t *testing.T, parent string) *Canary {
	t.Helper()
	dir, err := os.MkdirTemp(parent, "agentjail-conformance-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	c := &Canary{Dir: dir, Path: filepath.Join(dir, "canary"), Content: "canary-" + randHex(16)}
	if err := os.WriteFile(c.Path, []byte(c.Content), 0o644); err != nil {
		t.Fatal(err)
	}
	return c
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

// Check fails t when the canary changed, went, gained a sibling, or when
// one of leaks holds its secret.
func (c *Canary) Check(t *testing.T, what string, leaks ...string) {
	t.Helper()
	for _, l := range leaks {
		if strings.Contains(l, c.Content) {
			t.Errorf("%s: the host file %s leaked into the jail", what, c.Path)
		}
	}
	b, err := os.ReadFile(c.Path)
	if err != nil || string(b) != c.Content {
		t.Fatalf("%s: the host file %s was changed or removed (%q, %v)", what, c.Path, b, err)
	}
	if ents, _ := os.ReadDir(c.Dir); len(ents) != 1 {
		t.Fatalf("%s: the host directory %s gained entries: %v", what, c.Dir, ents)
	}
}

// files: the file API reads and writes what commands see, and neither
// reaches a host file, whatever the path or link.
func (h *harness) files(t *testing.T) {
	j := h.jail(t, nil)
	ctx := callCtx(t)
	ws := j.Config.Isolation.Filesystem.WorkspaceRoot
	t.Run("round trip", func(t *testing.T) {
		body := "written through the API\n" + randHex(8)
		if _, err := h.Client.Mkdir(ctx, j.ID, ws+"/dir", client.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
		fi, err := h.Client.WriteFile(ctx, j.ID, ws+"/dir/f.txt", strings.NewReader(body), client.WriteOptions{})
		if err != nil || fi.Size != int64(len(body)) {
			t.Fatalf("write: %+v %v", fi, err)
		}
		if got := h.sh(t, j.ID, "cat "+ws+"/dir/f.txt"); got != body {
			t.Errorf("the command read %q", got)
		}
		h.sh(t, j.ID, "echo from-a-command > "+ws+"/dir/g.txt")
		_, rc, err := h.Client.ReadFile(ctx, j.ID, ws+"/dir/g.txt")
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(rc)
		rc.Close()
		if string(got) != "from-a-command\n" {
			t.Errorf("the API read %q", got)
		}
		list, err := h.Client.ReadDir(ctx, j.ID, ws+"/dir")
		if err != nil || len(list) != 2 {
			t.Errorf("listing: %+v %v", list, err)
		}
		if err := h.Client.Remove(ctx, j.ID, ws+"/dir", true); err != nil {
			t.Fatal(err)
		}
		if res := h.run(t, j.ID, client.ExecRequest{Cmd: []string{"test", "-e", ws + "/dir"}}); res.ExitCode == 0 {
			t.Errorf("the removed directory is still there")
		}
		if _, err := h.Client.Stat(ctx, j.ID, ws+"/dir"); !client.IsNotFound(err) {
			t.Errorf("stat of a removed path: %v", err)
		}
	})
	t.Run("containment", func(t *testing.T) {
		c := NewCanary(t, "/var/tmp")
		read := func(p string) string {
			_, rc, err := h.Client.ReadFile(ctx, j.ID, p)
			if err != nil {
				return err.Error()
			}
			defer rc.Close()
			b, _ := io.ReadAll(io.LimitReader(rc, 1<<20))
			return string(b)
		}
		var leaks []string
		leaks = append(leaks, read(c.Path), read(ws+"/../../../../.."+c.Path))
		h.sh(t, j.ID, "ln -s "+c.Path+" "+ws+"/link; ln -s "+c.Dir+" "+ws+"/dirlink; ln -s /../../../.."+c.Dir+" "+ws+"/rel")
		leaks = append(leaks, read(ws+"/link"), read(ws+"/dirlink/canary"), read(ws+"/rel/canary"))
		for _, p := range []string{ws + "/link", ws + "/dirlink/new", ws + "/rel/new", c.Dir + "/new", c.Path} {
			h.Client.WriteFile(ctx, j.ID, p, strings.NewReader("overwritten"), client.WriteOptions{})
		}
		h.Client.Remove(ctx, j.ID, c.Path, false)
		res := h.run(t, j.ID, client.ExecRequest{Cmd: []string{"sh", "-c",
			"cat " + c.Path + " " + ws + "/link " + ws + "/dirlink/canary; echo x > " + c.Dir + "/new; echo x > " + ws + "/dirlink/new2; rm -f " + c.Path}})
		leaks = append(leaks, res.Stdout, res.Stderr)
		c.Check(t, "file API and commands", leaks...)
	})
}
