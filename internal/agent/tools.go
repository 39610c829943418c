package agent

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/lazyre"
	"github.com/agentjail/agentjail/internal/model"
)

// ManifestName is the manifest's file name in a tool tree.
const ManifestName = "manifest.json"

// Manifest describes one installed tool tree (written as manifest.json
// in it, without Dir).
type Manifest = model.AgentTool

// Tools is the store of installed agent CLIs: DIR/<name>/<version>/ each,
// made by Install and never changed afterwards (jails mount them
// read-only, all jails of a version share one tree).
type Tools struct {
	dir string
	// npm is the npm binary (default "npm" on PATH).
	npm string
}

// NewTools opens (making it when missing) the tool store at dir and
// removes what interrupted installs left.
func NewTools(dir string) (*Tools, error) {
	if err := os.MkdirAll(filepath.Join(dir, ".staging"), 0o755); err != nil {
		return nil, fmt.Errorf("tool store: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, fmt.Errorf("tool store: %w", err)
	}
	t := &Tools{dir: dir, npm: "npm"}
	// Staging trees of installs that did not finish (a crash): nothing
	// uses them. A live install elsewhere holds its agent's lock.
	ents, _ := os.ReadDir(filepath.Join(dir, ".staging"))
	for _, e := range ents {
		name, _, _ := strings.Cut(e.Name(), "@")
		unlock, err := t.lockAgent(name, false)
		if err != nil {
			continue
		}
		os.RemoveAll(filepath.Join(dir, ".staging", e.Name()))
		unlock()
	}
	return t, nil
}

// Dir is the store's directory.
func (t *Tools) Dir() string { return t.dir }

// versionRE accepts npm versions (and dist-tags such as "latest").
var versionRE = lazyre.New(`^[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}$`)

// Progress receives an install's progress lines.
type Progress func(line string)

// Install installs the agent name at version (default: its pinned
// version) with npm, unless that version is installed already (then it
// returns the existing manifest and installed false). The tree is built in
// a staging directory and renamed into place: a failed or interrupted
// install leaves no tree. progress receives what npm and the installer
// say, line by line.
func (t *Tools) Install(ctx context.Context, name, version string, progress Progress) (m *Manifest, installed bool, err error) {
	def, err := Lookup(name)
	if err != nil {
		return nil, false, err
	}
	if version == "" {
		version = def.DefaultVersion
	}
	if !versionRE().MatchString(version) {
		return nil, false, errdefs.Invalidf("version: %q is not an npm version", version)
	}
	if progress == nil {
		progress = func(string) {}
	}
	unlock, err := t.lockAgent(name, true)
	if err != nil {
		return nil, false, err
	}
	defer unlock()
	if m, err := t.Get(name, version); err == nil {
		progress(fmt.Sprintf("%s %s is already installed at %s", name, version, m.Dir))
		return m, false, nil
	}
	if _, err := exec.LookPath(t.npm); err != nil {
		return nil, false, errdefs.Unavailablef("installing %s needs npm on the daemon's host (apt-get install npm): %v", name, err)
	}
	staging := filepath.Join(t.dir, ".staging", name+"@"+version+"-"+randHex(4))
	if err := os.Mkdir(staging, 0o755); err != nil {
		return nil, false, fmt.Errorf("staging %s: %w", name, err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(staging)
		}
	}()
	pkgs := append([]string{def.Package + "@" + version}, def.Extra...)
	progress(fmt.Sprintf("npm install %s", strings.Join(pkgs, " ")))
	args := append([]string{"install", "--prefix", staging, "--no-audit", "--no-fund", "--no-update-notifier",
		"--loglevel=http", "--foreground-scripts"}, pkgs...)
	if err := t.runNPM(ctx, args, progress); err != nil {
		return nil, false, fmt.Errorf("installing %s %s: %w", name, version, err)
	}
	got, err := installedVersion(staging, def.Package)
	if err != nil {
		return nil, false, err
	}
	if got != version && numericVersion(version) {
		return nil, false, errdefs.Unprocessablef("installing %s: npm installed %s %s, not %s", name, def.Package, got, version)
	}
	for _, p := range def.Prune {
		if err := os.RemoveAll(filepath.Join(staging, p)); err != nil {
			return nil, false, err
		}
	}
	bins, err := linkBins(staging, def)
	if err != nil {
		return nil, false, fmt.Errorf("installing %s: %w", name, err)
	}
	progress("hashing the tool tree")
	sum, files, size, err := HashTree(staging)
	if err != nil {
		return nil, false, fmt.Errorf("hashing %s: %w", name, err)
	}
	m = &Manifest{Name: name, Package: def.Package, Version: got, Extra: def.Extra, SHA256: sum, Files: files,
		SizeBytes: size, Bin: bins, InstalledAt: time.Now().UTC()}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, false, err
	}
	if err := os.WriteFile(filepath.Join(staging, ManifestName), append(data, '\n'), 0o644); err != nil {
		return nil, false, err
	}
	final := filepath.Join(t.dir, name, got)
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return nil, false, err
	}
	if err := os.Rename(staging, final); err != nil {
		return nil, false, fmt.Errorf("installing %s: %w", name, err)
	}
	m.Dir = final
	progress(fmt.Sprintf("installed %s %s (%d files, %d MB, sha256 %s) at %s", name, got, files, size>>20, sum[:12], final))
	return m, true, nil
}

// runNPM runs npm, passing its output lines to progress; a failure's
// error carries npm's last lines.
func (t *Tools) runNPM(ctx context.Context, args []string, progress Progress) error {
	cmd := exec.CommandContext(ctx, t.npm, args...)
	cmd.Env = append(os.Environ(), "npm_config_update_notifier=false", "npm_config_fund=false")
	cmd.WaitDelay = 5 * time.Second
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return err
	}
	var tail []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			progress(line)
			tail = append(tail, line)
			if len(tail) > 8 {
				tail = tail[1:]
			}
		}
		io.Copy(io.Discard, pr)
	}()
	err := cmd.Wait()
	pw.Close()
	<-done
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("npm: %w", ctx.Err())
		}
		return errdefs.Unprocessablef("npm %s: %v: %s", args[0], err, strings.Join(tail, " | "))
	}
	return nil
}

// installedVersion reads the version npm put in the tree.
func installedVersion(root, pkg string) (string, error) {
	data, err := os.ReadFile(filepath.Join(root, "node_modules", filepath.FromSlash(pkg), "package.json"))
	if err != nil {
		return "", fmt.Errorf("npm did not install %s: %w", pkg, err)
	}
	var p struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(data, &p); err != nil || p.Version == "" {
		return "", fmt.Errorf("%s's package.json has no version", pkg)
	}
	return p.Version, nil
}

// linkBins makes bin/NAME → target for each of the definition's
// executables (relative links, so the tree works wherever it is mounted).
func linkBins(root string, def *Definition) ([]string, error) {
	if err := os.Mkdir(filepath.Join(root, "bin"), 0o755); err != nil {
		return nil, err
	}
	var names []string
	for name, pattern := range def.Bin {
		matches, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil || len(matches) == 0 {
			return nil, fmt.Errorf("the package has no %s (looked for %s)", name, pattern)
		}
		target := matches[0]
		st, err := os.Stat(target)
		if err != nil || !st.Mode().IsRegular() {
			return nil, fmt.Errorf("%s: %s is not a file", name, target)
		}
		if st.Mode()&0o111 == 0 {
			if err := os.Chmod(target, st.Mode()|0o755); err != nil {
				return nil, err
			}
		}
		rel, err := filepath.Rel(filepath.Join(root, "bin"), target)
		if err != nil {
			return nil, err
		}
		if err := os.Symlink(rel, filepath.Join(root, "bin", name)); err != nil {
			return nil, err
		}
		names = append(names, name)
	}
	sort.Strings(names)
	return names, nil
}

// HashTree digests the tree at root (the manifest excluded) and counts
// its regular files and their bytes, each inode once (npm's installs
// hard-link native binaries to a second name).
func HashTree(root string) (sum string, files int, size int64, err error) {
	h := sha256.New()
	inodes := map[uint64][]byte{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == ManifestName {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%o\x00", rel, info.Mode()&(fs.ModeType|fs.ModePerm))
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "%s\x00", t)
		case info.Mode().IsRegular():
			var ino uint64
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				ino = st.Ino
			}
			digest, seen := inodes[ino]
			if !seen || ino == 0 {
				f, err := os.Open(p)
				if err != nil {
					return err
				}
				fh := sha256.New()
				n, err := io.Copy(fh, f)
				f.Close()
				if err != nil {
					return err
				}
				digest = fh.Sum(nil)
				inodes[ino] = digest
				files++
				size += n
			}
			h.Write(digest)
		}
		return nil
	})
	if err != nil {
		return "", 0, 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), files, size, nil
}

// Get returns the manifest of an installed version (ErrNotFound with how
// to install it otherwise).
func (t *Tools) Get(name, version string) (*Manifest, error) {
	if _, err := Lookup(name); err != nil {
		return nil, err
	}
	if !versionRE().MatchString(version) {
		return nil, errdefs.Invalidf("version: %q is not an npm version", version)
	}
	dir := filepath.Join(t.dir, name, version)
	data, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errdefs.NotFoundf("agent %s %s is not installed (agentjail agent install %s --version %s)", name, version, name, version)
	}
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, ManifestName), err)
	}
	m.Dir = dir
	return &m, nil
}

// Resolve returns the installed version asked for, or the newest
// installed one when version is empty (ErrNotFound saying how to install
// it when there is none).
func (t *Tools) Resolve(name, version string) (*Manifest, error) {
	if _, err := Lookup(name); err != nil {
		return nil, err
	}
	if version != "" {
		return t.Get(name, version)
	}
	list, err := t.List()
	if err != nil {
		return nil, err
	}
	var best *Manifest
	for i := range list {
		m := &list[i]
		if m.Name == name && (best == nil || compareVersions(m.Version, best.Version) > 0) {
			best = m
		}
	}
	if best == nil {
		return nil, errdefs.NotFoundf("agent %s is not installed on this daemon (agentjail agent install %s)", name, name)
	}
	return best, nil
}

// List returns every installed tool, by name then version.
func (t *Tools) List() ([]Manifest, error) {
	var out []Manifest
	for _, name := range Names() {
		ents, err := os.ReadDir(filepath.Join(t.dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			if m, err := t.Get(name, e.Name()); err == nil {
				out = append(out, *m)
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return compareVersions(out[i].Version, out[j].Version) < 0
	})
	return out, nil
}

// lockAgent serialises installs of one agent, across processes too (an
// flock on DIR/.<name>.lock). With wait false it fails at once when held.
func (t *Tools) lockAgent(name string, wait bool) (func(), error) {
	f, err := os.OpenFile(filepath.Join(t.dir, "."+name+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	how := unix.LOCK_EX
	if !wait {
		how |= unix.LOCK_NB
	}
	if err := unix.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// numericVersion reports whether v is a release version (1.2.3), not a
// dist-tag or range.
func numericVersion(v string) bool {
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return false
	}
	for _, p := range parts {
		if _, err := strconv.Atoi(p); err != nil {
			return false
		}
	}
	return true
}

// compareVersions orders dotted versions numerically where they are
// numbers (1.10.0 after 1.9.2), else as strings.
func compareVersions(a, b string) int {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(pa) && i < len(pb); i++ {
		na, ea := strconv.Atoi(pa[i])
		nb, eb := strconv.Atoi(pb[i])
		switch {
		case ea == nil && eb == nil && na != nb:
			return cmp.Compare(na, nb)
		case (ea != nil || eb != nil) && pa[i] != pb[i]:
			return strings.Compare(pa[i], pb[i])
		}
	}
	return cmp.Compare(len(pa), len(pb))
}
