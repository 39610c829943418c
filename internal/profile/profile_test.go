package profile

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/image"
	"github.com/agentjail/agentjail/internal/model"
)

func newBuilder(t *testing.T) *Builder {
	t.Helper()
	dir := t.TempDir()
	st, err := image.Open(image.Options{Dir: filepath.Join(dir, "images")})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Options{Dir: filepath.Join(dir, "profiles"), CacheDir: filepath.Join(dir, "cache"), Images: st})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestProfilesResolveAndValidate(t *testing.T) {
	b := newBuilder(t)
	py, err := b.Get("python")
	if err != nil {
		t.Fatal(err)
	}
	if !py.BuiltIn || py.Suite == "" || !strings.HasPrefix(py.Tag, "agentjail.profile/python:"+py.Suite+"-") || py.Image != "" {
		t.Fatalf("python profile: %+v", py)
	}
	// A user profile on top of python: its key differs, and is stable
	// whatever the order and duplicates of its packages.
	u1, err := b.Put(model.Profile{Name: "data", Base: "python", Packages: []string{"sqlite3", "curl", "sqlite3"}})
	if err != nil {
		t.Fatal(err)
	}
	u2, err := b.Put(model.Profile{Name: "data", Base: "python", Packages: []string{"curl", "sqlite3"}})
	if err != nil {
		t.Fatal(err)
	}
	if u1.Key != u2.Key || u1.Key == py.Key || !strings.Contains(strings.Join(u1.Packages, " "), "python3 python3-pip python3-venv sqlite3") {
		t.Fatalf("user profile: %+v / %+v", u1, u2)
	}
	list, err := b.List()
	if err != nil || len(list) != 5 {
		t.Fatalf("list: %d profiles, %v", len(list), err)
	}
	for _, c := range []struct {
		p    model.Profile
		kind error
	}{
		{model.Profile{Name: "python", Packages: []string{"x"}}, errdefs.ErrConflict},
		{model.Profile{Name: "Bad Name"}, errdefs.ErrInvalid},
		{model.Profile{Name: "x", Packages: []string{"rm -rf /"}}, errdefs.ErrUnprocessable},
		{model.Profile{Name: "x", Packages: []string{"--option=1"}}, errdefs.ErrUnprocessable},
		{model.Profile{Name: "x", Base: "nope"}, errdefs.ErrUnprocessable},
		{model.Profile{Name: "x", Suite: "../etc"}, errdefs.ErrUnprocessable},
	} {
		if _, err := b.Put(c.p); !errors.Is(err, c.kind) {
			t.Errorf("put %+v: %v, want %v", c.p, err, c.kind)
		}
	}
	if _, err := b.Get("missing"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("get missing: %v", err)
	}
	if err := b.Delete("data"); err != nil {
		t.Fatal(err)
	}
	if err := b.Delete("data"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("delete twice: %v", err)
	}
}

func TestNixAbsentIsAClearError(t *testing.T) {
	if _, err := exec.LookPath("nix"); err == nil {
		t.Skip("nix is installed here: the error of its absence cannot be shown")
	}
	b := newBuilder(t)
	_, err := b.Nix(context.Background(), "nixpkgs#python3")
	if !errors.Is(err, errdefs.ErrUnprocessable) || !strings.Contains(err.Error(), "nix is not installed on this host") {
		t.Fatalf("nix: provider without nix: %v", err)
	}
}
