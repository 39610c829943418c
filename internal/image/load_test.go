package image

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/image/imagetest"
	"github.com/agentjail/agentjail/internal/model"
)

func TestLoadDockerArchiveAndOCILayout(t *testing.T) {
	s := newStore(t, nil)
	dir := t.TempDir()
	img := layered(t)
	want, _ := img.ConfigName()

	imgs, err := s.Load(context.Background(), imagetest.DockerArchive(t, dir, "example.com/team/tool:1.0", img), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs) != 1 || imgs[0].ID != want.String() || len(imgs[0].Tags) != 1 || imgs[0].Tags[0] != "example.com/team/tool:1.0" || imgs[0].Config.User != "app" {
		t.Fatalf("docker-archive: %+v", imgs)
	}

	other := imagetest.Image(t, v1.Config{Env: []string{"FROM=oci"}}, imagetest.Layer(t, imagetest.Entry{Name: "oci", Body: "layout"}))
	imgs, err = s.Load(context.Background(), imagetest.OCIArchive(t, dir, "example.com/team/oci:2", other), nil)
	if err != nil {
		t.Fatal(err)
	}
	wantOCI, _ := other.ConfigName()
	dg, _ := other.Digest()
	if len(imgs) != 1 || imgs[0].ID != wantOCI.String() || imgs[0].Digest != dg.String() || len(imgs[0].Tags) != 1 || imgs[0].Tags[0] != "example.com/team/oci:2" {
		t.Fatalf("OCI layout: %+v", imgs)
	}
	if ents, _ := os.ReadDir(s.tmpDir()); len(ents) != 0 {
		t.Fatalf("load left %d entries in tmp", len(ents))
	}

	junk := filepath.Join(dir, "junk.tar")
	if err := os.WriteFile(junk, imagetest.Tar(t, imagetest.Entry{Name: "hello", Body: "x"}), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(context.Background(), junk, nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("load of a tar that is no image archive: %v", err)
	}
	if err := os.WriteFile(junk, []byte("not a tar at all, not even close"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(context.Background(), junk, nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("load of a non-tar: %v", err)
	}
}

func TestCommitUpperAsLayer(t *testing.T) {
	s := newStore(t, nil)
	dir := t.TempDir()
	parent, err := s.Load(context.Background(), imagetest.DockerArchive(t, dir, "base:1", layered(t)), nil)
	if err != nil {
		t.Fatal(err)
	}
	// An upper layer as a jail leaves it: a new file, a deleted one (a
	// whiteout), a directory replaced (opaque), the daemon's own files.
	upper := filepath.Join(dir, "upper")
	for _, d := range []string{"workspace", "data", ".agentjail/run", "etc"} {
		if err := os.MkdirAll(filepath.Join(upper, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(upper, "workspace/result.txt"), []byte("committed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(upper, "etc/passwd"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(upper, "data"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(upper, "data/only"), []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(upper, ".agentjail/run/socket"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	img, err := s.Commit(context.Background(), CommitRequest{
		Parent: parent[0].ID, Upper: upper, Tag: "committed:1", Comment: "test",
		Skip: func(p string) bool { return p == "/.agentjail" },
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(img.Layers) != 4 || img.Parent != parent[0].ID || img.Config.User != "app" || img.Tags[0] != "committed:1" || img.Source != "commit" {
		t.Fatalf("commit: %+v", img)
	}
	view, err := s.View(img.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if b, err := os.ReadFile(filepath.Join(view, "workspace/result.txt")); err != nil || string(b) != "committed\n" {
		t.Errorf("committed file: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(view, "etc/passwd")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("deleted file in the committed image: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(view, "data")); len(ents) != 1 || ents[0].Name() != "only" {
		t.Errorf("opaque dir in the committed image: %v", ents)
	}
	if _, err := os.Stat(filepath.Join(view, ".agentjail")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the daemon's files were committed: %v", err)
	}
	// The committed image can be committed on again, its config amended.
	amended, err := s.Commit(context.Background(), CommitRequest{Parent: img.ID, Upper: filepath.Join(upper, "workspace"),
		Changes: &model.ImageConfig{Env: []string{"ADDED=1", "PATH=/opt/bin:/bin"}, WorkingDir: "/srv", Cmd: []string{"serve"}}})
	if err != nil {
		t.Fatal(err)
	}
	c := amended.Config
	if c.User != "app" || c.WorkingDir != "/srv" || !slices.Equal(c.Cmd, []string{"serve"}) ||
		!slices.Contains(c.Env, "ADDED=1") || !slices.Contains(c.Env, "PATH=/opt/bin:/bin") || slices.ContainsFunc(c.Env, func(e string) bool { return e != "PATH=/opt/bin:/bin" && strings.HasPrefix(e, "PATH=") }) {
		t.Errorf("amended config: %+v", c)
	}
	if _, err := s.Commit(context.Background(), CommitRequest{Parent: img.ID, Upper: upper, Changes: &model.ImageConfig{Env: []string{"=x"}}}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("commit with a nameless env entry: %v", err)
	}
	if _, err := s.Commit(context.Background(), CommitRequest{Parent: img.ID, Upper: upper, Tag: "bad@sha256:00"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("commit with a digest as tag: %v", err)
	}
}

// TestCommitTreeTooDeep: a jail can nest directories past the kernel's
// path limit; its commit is refused as unprocessable, naming where, and
// leaves no image and no spooled layer behind.
func TestCommitTreeTooDeep(t *testing.T) {
	s := newStore(t, nil)
	defer s.Close()
	dir := t.TempDir()
	parent, err := s.Load(context.Background(), imagetest.DockerArchive(t, dir, "base:1", layered(t)), nil)
	if err != nil {
		t.Fatal(err)
	}
	before := s.List()
	upper := filepath.Join(dir, "upper")
	if err := os.MkdirAll(filepath.Join(upper, "work"), 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(filepath.Join(upper, "work"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range 500 { // 6 000 bytes of path
		if err := unix.Mkdirat(fd, "d0123456789", 0o755); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, "d0123456789", unix.O_RDONLY|unix.O_DIRECTORY, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	unix.Close(fd)
	_, err = s.Commit(context.Background(), CommitRequest{Parent: parent[0].ID, Upper: upper, Tag: "deep:1"})
	if !errors.Is(err, errdefs.ErrUnprocessable) || !strings.Contains(err.Error(), "/work/d0123456789/") {
		t.Fatalf("commit of a tree nested past the path limit: %v", err)
	}
	after := s.List()
	if len(after) != len(before) {
		t.Errorf("%d images after the refused commit, %d before", len(after), len(before))
	}
	if ents, err := os.ReadDir(s.TmpDir()); err != nil || len(ents) != 0 {
		t.Errorf("spool after the refused commit: %v %v", ents, err)
	}
}
