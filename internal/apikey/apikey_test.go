package apikey

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentjail/agentjail/internal/errdefs"
)

func TestCreateVerifyRemove(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	k, tok, err := s.Create("ci", "team-a", RoleViewer)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tok, Prefix+k.ID+"_") || k.Tenant != "team-a" || k.Role != RoleViewer {
		t.Fatalf("key %+v, token %q", k, tok)
	}
	data, err := os.ReadFile(filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	secret := tok[len(Prefix+k.ID+"_"):]
	if strings.Contains(string(data), secret) {
		t.Fatal("the store file holds the secret in clear")
	}
	if fi, _ := os.Stat(filepath.Join(dir, FileName)); fi.Mode().Perm() != 0o600 {
		t.Fatalf("store file mode %v", fi.Mode().Perm())
	}
	for range 2 { // the second check is served by the verified-key cache
		got, err := s.Verify(tok)
		if err != nil || got.ID != k.ID || got.Tenant != "team-a" {
			t.Fatalf("Verify: %+v, %v", got, err)
		}
	}
	// A reopened store knows the key (and has an empty cache).
	s2, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Verify(tok); err != nil {
		t.Fatalf("reopened store: %v", err)
	}
	last := "A"
	if strings.HasSuffix(tok, last) {
		last = "B"
	}
	bad := []string{
		"", "aj_", "nope", tok + "x", tok[:len(tok)-1] + last,
		Prefix + "000000000000_" + secret, strings.Replace(tok, Prefix, "xx_", 1),
	}
	for _, b := range bad {
		if _, err := s.Verify(b); !errors.Is(err, errdefs.ErrUnauthorized) {
			t.Errorf("Verify(%q) = %v, want unauthorized", b, err)
		}
	}
	if err := s.Remove(k.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Verify(tok); !errors.Is(err, errdefs.ErrUnauthorized) {
		t.Fatalf("a removed key still verifies: %v", err)
	}
	if err := s.Remove(k.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second Remove: %v", err)
	}
	if s3, _ := Open(dir); len(s3.List()) != 0 {
		t.Fatal("the removed key is still stored")
	}
}

func TestCreateRefusesBadInput(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, tenant string
		role         Role
	}{
		{"x", "Team", RoleUser}, {"x", "a/b", RoleUser}, {"x", "ok", "root"}, {"bad\nname", "ok", RoleUser},
	} {
		if _, _, err := s.Create(c.name, c.tenant, c.role); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Create(%q, %q, %q) = %v, want invalid", c.name, c.tenant, c.role, err)
		}
	}
	k, _, err := s.Create("", "", "")
	if err != nil || k.Tenant != DefaultTenant || k.Role != RoleUser {
		t.Fatalf("defaults: %+v, %v", k, err)
	}
}

// BenchmarkVerifyCached is the per-request cost of checking a key that was
// verified before (the target is < 0.05 ms).
func BenchmarkVerifyCached(b *testing.B) {
	s, err := Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	_, tok, err := s.Create("bench", "", RoleUser)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.Verify(tok); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := s.Verify(tok); err != nil {
			b.Fatal(err)
		}
	}
}
