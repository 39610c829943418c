package web

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"strings"
	"testing"
)

// TestVendoredAssets checks that the embedded third-party files are the
// ones scripts/web-vendor.sh copied from the pinned npm packages (their
// digests in vendor/SHA256SUMS), and that every file there is listed.
func TestVendoredAssets(t *testing.T) {
	st := Static()
	sums, err := fs.ReadFile(st, "vendor/SHA256SUMS")
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(string(sums)))
	for sc.Scan() {
		want, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q", sc.Text())
		}
		b, err := fs.ReadFile(st, "vendor/"+name)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		if got := hex.EncodeToString(sum[:]); got != want {
			t.Errorf("vendor/%s: sha256 %s, SHA256SUMS says %s (run scripts/web-vendor.sh)", name, got, want)
		}
		listed[name] = true
	}
	ents, err := fs.ReadDir(st, "vendor")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() != "SHA256SUMS" && !listed[e.Name()] {
			t.Errorf("vendor/%s is not in SHA256SUMS", e.Name())
		}
	}
	for _, page := range []string{"index.html", "login.html", "app.js", "login.js", "console.css"} {
		if _, err := fs.Stat(st, page); err != nil {
			t.Errorf("%s: %v", page, err)
		}
	}
}

// TestNoRemoteAssets: the pages load nothing from another site.
func TestNoRemoteAssets(t *testing.T) {
	err := fs.WalkDir(Static(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(p, "vendor/") {
			return err
		}
		b, err := fs.ReadFile(Static(), p)
		if err != nil {
			return err
		}
		for _, bad := range []string{"http://", "https://", "//cdn", "innerHTML"} {
			if strings.Contains(string(b), bad) && !(bad == "http://" && strings.Contains(string(b), "www.w3.org")) {
				t.Errorf("%s contains %q", p, bad)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
