package api

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

func TestEnsureToken(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	tok, err := EnsureToken(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(tok) {
		t.Fatalf("token %q is not 32 bytes of hex", tok)
	}
	path := filepath.Join(dir, TokenFile)
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("token file mode %v, want 0600", st.Mode().Perm())
	}
	again, err := EnsureToken(dir)
	if err != nil || again != tok {
		t.Fatalf("second start: %q %v, want the same token", again, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("data dir holds %d entries, want only the token file", len(entries))
	}

	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	_, err = EnsureToken(dir)
	if err == nil || !strings.Contains(err.Error(), "group or other") || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("group-readable token file: err %v, want a refusal saying why", err)
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureToken(dir); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("empty token file: %v", err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/hostname", path); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureToken(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("symlinked token file: %v", err)
	}
}

func TestEnsureTokenConcurrentFirstStart(t *testing.T) {
	dir := t.TempDir()
	toks := make([]string, 8)
	errs := make([]error, 8)
	var wg sync.WaitGroup
	for i := range toks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			toks[i], errs[i] = EnsureToken(dir)
		}()
	}
	wg.Wait()
	for i := range toks {
		if errs[i] != nil || toks[i] != toks[0] {
			t.Fatalf("start %d: %q %v; want every start to agree on %q", i, toks[i], errs[i], toks[0])
		}
	}
}
