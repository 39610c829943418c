// Package conventions holds tests of rules that the whole repository
// keeps, rather than of one package's behaviour.
package conventions

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// repoRoot is the directory of go.mod above the test's directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test")
		}
		dir = parent
	}
}

// goPackageDirs lists the directories of the module that hold Go
// packages (not testdata, vendored or hidden trees, node_modules).
func goPackageDirs(t *testing.T, root string) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if p != root && (name == "testdata" || name == "node_modules" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
			return filepath.SkipDir
		}
		matches, _ := filepath.Glob(filepath.Join(p, "*.go"))
		for _, m := range matches {
			if !strings.HasSuffix(m, "_test.go") {
				dirs = append(dirs, p)
				break
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// TestEveryPackageHasADocComment fails for a package none of whose files
// carries a doc comment ("// Package name ..." above its package clause;
// a command's may start otherwise).
func TestEveryPackageHasADocComment(t *testing.T) {
	root := repoRoot(t)
	dirs := goPackageDirs(t, root)
	if len(dirs) < 20 {
		t.Fatalf("found only %d package directories under %s", len(dirs), root)
	}
	for _, dir := range dirs {
		rel, _ := filepath.Rel(root, dir)
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		docs := map[string]string{} // package name → its doc comment
		for _, file := range files {
			if strings.HasSuffix(file, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.PackageClauseOnly|parser.ParseComments)
			if err != nil {
				t.Errorf("%s: %v", file, err)
				continue
			}
			name := f.Name.Name
			if _, ok := docs[name]; !ok {
				docs[name] = ""
			}
			if f.Doc != nil && docs[name] == "" {
				docs[name] = f.Doc.Text()
			}
		}
		for name, doc := range docs {
			switch {
			case doc == "":
				t.Errorf("%s: package %s has no doc comment (a \"// Package %s ...\" comment above the package clause of one file, e.g. doc.go)", rel, name, name)
			case name != "main" && !strings.HasPrefix(doc, "Package "+name+" "):
				t.Errorf("%s: the doc comment of package %s starts %q, want \"Package %s ...\"", rel, name, firstLine(doc), name)
			}
		}
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
