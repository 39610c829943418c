// Package profile builds named, reproducible base trees for jails with
// mmdebstrap from the Debian archive — minimal, python, node and build
// (compilers, git), and user profiles that add packages to one of them —
// and records each as an image of the daemon's image store, so that jails
// of a profile share its layer like any image's. A build is cached by
// (profile, suite, package list): the store's tag names the key, and the
// tarball is kept in a cache directory that outlives data dirs. The `nix:`
// provider builds a flake's closure where nix is installed.
package profile

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/image"
	"github.com/agentjail/agentjail/internal/lazyre"
	"github.com/agentjail/agentjail/internal/model"
)

// recipeVersion changes whenever the way a profile is built changes.
const recipeVersion = "1"

// DefaultSuite is the Debian suite profiles are built from unless the
// host names another (its /etc/os-release VERSION_CODENAME).
const DefaultSuite = "bookworm"

// BuildTimeout bounds one mmdebstrap run.
const BuildTimeout = 20 * time.Minute

// Profile is a profile (model.Profile).
type Profile = model.Profile

// builtIn are the profiles every daemon knows.
var builtIn = map[string][]string{
	"minimal": {"ca-certificates"},
	"python":  {"ca-certificates", "python3", "python3-pip", "python3-venv"},
	"node":    {"ca-certificates", "nodejs", "npm"},
	"build":   {"ca-certificates", "build-essential", "git", "pkg-config"},
}

var (
	nameRE    = lazyre.New(`^[a-z0-9][a-z0-9_.-]{0,63}$`)
	packageRE = lazyre.New(`^[a-z0-9][a-z0-9+.-]{0,127}(:[a-z0-9]+)?(=[A-Za-z0-9.+~:-]+)?$`)
	suiteRE   = lazyre.New(`^[a-z]{2,32}$`)
)

// Options configure a Builder.
type Options struct {
	// Dir holds the user profiles (NAME.yaml).
	Dir string
	// CacheDir keeps built tarballs by key across data dirs.
	CacheDir string
	// Images is the store the profiles' images go to.
	Images *image.Store
	// Mirror is the Debian mirror URL (default: mmdebstrap's).
	Mirror string
}

// Builder builds and caches profiles. Safe for concurrent use.
type Builder struct {
	opts  Options
	suite string
	mu    sync.Mutex
	// flights are builds in progress, by key.
	flights map[string]*flight
}

type flight struct {
	done chan struct{}
	res  BuildResult
	err  error
}

// New returns a builder.
func New(opts Options) (*Builder, error) {
	for _, d := range []string{opts.Dir, opts.CacheDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("profiles: %w", err)
		}
	}
	return &Builder{opts: opts, suite: hostSuite(), flights: map[string]*flight{}}, nil
}

// hostSuite is the host's Debian codename when it has one.
func hostSuite() string {
	data, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return DefaultSuite
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VERSION_CODENAME="); ok && suiteRE().MatchString(strings.Trim(v, `"`)) {
			return strings.Trim(v, `"`)
		}
	}
	return DefaultSuite
}

// resolve completes p: the base's packages, the suite, the key and tag.
func (b *Builder) resolve(p Profile) (Profile, error) {
	if pk, ok := builtIn[p.Name]; ok && p.Base == "" {
		p.Packages, p.BuiltIn = slices.Clone(pk), true
	} else if p.Base != "" {
		base, ok := builtIn[p.Base]
		if !ok {
			return p, errdefs.Unprocessablef("profile %s: base %q is not a built-in profile (minimal, python, node, build)", p.Name, p.Base)
		}
		p.Packages = append(slices.Clone(base), p.Packages...)
	}
	if p.Suite == "" {
		p.Suite = b.suite
	}
	if !suiteRE().MatchString(p.Suite) {
		return p, errdefs.Unprocessablef("profile %s: suite %q is not a Debian codename", p.Name, p.Suite)
	}
	for _, pkg := range p.Packages {
		if !packageRE().MatchString(pkg) {
			return p, errdefs.Unprocessablef("profile %s: %q is not a Debian package name", p.Name, pkg)
		}
	}
	sort.Strings(p.Packages)
	p.Packages = slices.Compact(p.Packages)
	h := sha256.New()
	fmt.Fprintf(h, "recipe %s\nsuite %s\narch %s\nmirror %s\n", recipeVersion, p.Suite, runtime.GOARCH, b.opts.Mirror)
	for _, pkg := range p.Packages {
		fmt.Fprintf(h, "package %s\n", pkg)
	}
	p.Key = hex.EncodeToString(h.Sum(nil))[:16]
	p.Tag = "agentjail.profile/" + p.Name + ":" + p.Suite + "-" + p.Key
	if img, err := b.opts.Images.Get(p.Tag); err == nil {
		p.Image = img.ID
	}
	return p, nil
}

// Get returns the profile name: a built-in one, or a user profile of the
// profiles directory. errdefs.ErrNotFound when there is none.
func (b *Builder) Get(name string) (Profile, error) {
	if !nameRE().MatchString(name) {
		return Profile{}, errdefs.Invalidf("profile name %q: use lower-case letters, digits, '.', '_' and '-'", name)
	}
	if _, ok := builtIn[name]; ok {
		return b.resolve(Profile{Name: name})
	}
	data, err := os.ReadFile(filepath.Join(b.opts.Dir, name+".yaml"))
	if errors.Is(err, fs.ErrNotExist) {
		return Profile{}, errdefs.NotFoundf("no profile %q (built in: minimal, python, node, build)", name)
	}
	if err != nil {
		return Profile{}, fmt.Errorf("profile %s: %w", name, err)
	}
	var p Profile
	if err := yaml.UnmarshalStrict(data, &p); err != nil {
		return Profile{}, errdefs.Wrap(errdefs.ErrUnprocessable, err, "profile %s", name)
	}
	p.Name = name
	return b.resolve(p)
}

// List returns the built-in profiles and the user profiles, by name.
func (b *Builder) List() ([]Profile, error) {
	names := []string{}
	for n := range builtIn {
		names = append(names, n)
	}
	ents, err := os.ReadDir(b.opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("profiles: %w", err)
	}
	for _, e := range ents {
		if n, ok := strings.CutSuffix(e.Name(), ".yaml"); ok && nameRE().MatchString(n) {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var out []Profile
	for _, n := range names {
		p, err := b.Get(n)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// Put saves the user profile p (YAML: base, suite, packages). Built-in
// names cannot be replaced (errdefs.ErrConflict).
func (b *Builder) Put(p Profile) (Profile, error) {
	if _, ok := builtIn[p.Name]; ok {
		return Profile{}, errdefs.Conflictf("profile %s is built in; give yours another name", p.Name)
	}
	if !nameRE().MatchString(p.Name) {
		return Profile{}, errdefs.Invalidf("profile name %q: use lower-case letters, digits, '.', '_' and '-'", p.Name)
	}
	if p.Base == "" {
		p.Base = "minimal"
	}
	stored := Profile{Base: p.Base, Suite: p.Suite, Packages: p.Packages}
	if _, err := b.resolve(Profile{Name: p.Name, Base: stored.Base, Suite: stored.Suite, Packages: slices.Clone(stored.Packages)}); err != nil {
		return Profile{}, err
	}
	data, err := yaml.Marshal(stored)
	if err != nil {
		return Profile{}, err
	}
	tmp := filepath.Join(b.opts.Dir, "."+p.Name+".yaml")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return Profile{}, fmt.Errorf("profile %s: %w", p.Name, err)
	}
	if err := os.Rename(tmp, filepath.Join(b.opts.Dir, p.Name+".yaml")); err != nil {
		os.Remove(tmp)
		return Profile{}, fmt.Errorf("profile %s: %w", p.Name, err)
	}
	return b.Get(p.Name)
}

// Delete removes the user profile name (its built images stay until
// pruned).
func (b *Builder) Delete(name string) error {
	if _, ok := builtIn[name]; ok {
		return errdefs.Conflictf("profile %s is built in", name)
	}
	if !nameRE().MatchString(name) {
		return errdefs.Invalidf("profile name %q: use lower-case letters, digits, '.', '_' and '-'", name)
	}
	err := os.Remove(filepath.Join(b.opts.Dir, name+".yaml"))
	if errors.Is(err, fs.ErrNotExist) {
		return errdefs.NotFoundf("no user profile %q", name)
	}
	return err
}

// BuildResult is the answer to Build (model.ProfileBuild).
type BuildResult = model.ProfileBuild

// Build returns the image of profile name, building it with mmdebstrap
// unless the store or the cache has it. Concurrent builds of one profile
// run mmdebstrap once. errdefs.ErrUnavailable when mmdebstrap is missing
// or the archive cannot be reached (with its output).
func (b *Builder) Build(ctx context.Context, name string) (BuildResult, error) {
	start := time.Now()
	p, err := b.Get(name)
	if err != nil {
		return BuildResult{}, err
	}
	if p.Image != "" {
		img, err := b.opts.Images.Get(p.Image)
		if err == nil {
			return BuildResult{Profile: p, Image: img, Cached: true, Seconds: time.Since(start).Seconds()}, nil
		}
	}
	b.mu.Lock()
	f := b.flights[p.Key]
	if f != nil {
		b.mu.Unlock()
		select {
		case <-f.done:
			return f.res, f.err
		case <-ctx.Done():
			return BuildResult{}, ctx.Err()
		}
	}
	f = &flight{done: make(chan struct{})}
	b.flights[p.Key] = f
	b.mu.Unlock()
	f.res, f.err = b.build(ctx, p)
	f.res.Seconds = time.Since(start).Seconds()
	b.mu.Lock()
	delete(b.flights, p.Key)
	close(f.done)
	b.mu.Unlock()
	return f.res, f.err
}

// profileConfig is the config of every profile image: the agent user
// (uid 1000) as default user, as on host jails.
var profileConfig = model.ImageConfig{
	Env:  []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"},
	User: "agent",
}

func (b *Builder) build(ctx context.Context, p Profile) (BuildResult, error) {
	tarball := filepath.Join(b.opts.CacheDir, p.Key+".tar")
	cached := true
	if _, err := os.Stat(tarball); err != nil {
		cached = false
		if err := b.mmdebstrap(ctx, p, tarball); err != nil {
			return BuildResult{}, err
		}
	}
	img, err := b.opts.Images.ImportRootfs(ctx, tarball, profileConfig, p.Tag, "profile")
	if err != nil {
		return BuildResult{}, fmt.Errorf("profile %s: %w", p.Name, err)
	}
	p.Image = img.ID
	return BuildResult{Profile: p, Image: img, Cached: cached}, nil
}

// mmdebstrap builds p's root filesystem as a tarball at out.
func (b *Builder) mmdebstrap(ctx context.Context, p Profile, out string) error {
	bin, err := exec.LookPath("mmdebstrap")
	if err != nil {
		return errdefs.Unavailablef("profile %s: mmdebstrap is not installed (apt-get install mmdebstrap)", p.Name)
	}
	ctx, cancel := context.WithTimeout(ctx, BuildTimeout)
	defer cancel()
	tmp := out + ".part." + strings.TrimPrefix(fmt.Sprint(time.Now().UnixNano()), "-")
	defer os.Remove(tmp)
	args := []string{
		"--variant=minbase", "--mode=root", "--format=tar", "--quiet",
		"--include=" + strings.Join(p.Packages, ","),
		"--customize-hook=chroot \"$1\" useradd --create-home --uid 1000 --user-group --shell /bin/bash agent",
		"--customize-hook=rm -rf \"$1\"/var/lib/apt/lists/* \"$1\"/var/cache/apt/*.bin",
		p.Suite, tmp,
	}
	if b.opts.Mirror != "" {
		args = append(args, b.opts.Mirror)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "TMPDIR="+b.opts.CacheDir)
	var output bytes.Buffer
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Run(); err != nil {
		msg := output.String()
		if len(msg) > 4096 {
			msg = "…" + msg[len(msg)-4096:]
		}
		if ctx.Err() != nil {
			return errdefs.Wrap(errdefs.ErrTimeout, ctx.Err(), "profile %s: mmdebstrap did not finish in %s", p.Name, BuildTimeout)
		}
		return errdefs.Unavailablef("profile %s: mmdebstrap %s failed: %v\n%s", p.Name, p.Suite, err, strings.TrimSpace(msg))
	}
	if err := os.Rename(tmp, out); err != nil {
		return fmt.Errorf("profile %s: %w", p.Name, err)
	}
	return nil
}
