package profile

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
)

// NixPrefix starts the rootfs value of the nix provider ("nix:FLAKEREF").
const NixPrefix = "nix:"

// Nix returns the image of a flake's closure: `nix build` of ref, its
// runtime closure under /nix/store, its bin/ first on PATH. Where nix is
// not installed this is a clear errdefs.ErrUnprocessable.
func (b *Builder) Nix(ctx context.Context, ref string) (*model.Image, error) {
	if ref == "" || strings.ContainsAny(ref, " \t\n") {
		return nil, errdefs.Unprocessablef("isolation.filesystem.rootfs: nix:%s: give a flake reference (nix:nixpkgs#python3)", ref)
	}
	nix, err := exec.LookPath("nix")
	if err != nil {
		return nil, errdefs.Unprocessablef("isolation.filesystem.rootfs: nix:%s: nix is not installed on this host; the nix: provider builds the flake's closure with `nix build` (install nix, or use a profile: or image: root filesystem)", ref)
	}
	sum := sha256.Sum256([]byte(ref))
	tag := "agentjail.nix/" + hex.EncodeToString(sum[:8]) + ":latest"
	run := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, nix, append([]string{"--extra-experimental-features", "nix-command flakes"}, args...)...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			return "", errdefs.Unavailablef("nix %s: %v\n%s", strings.Join(args, " "), err, strings.TrimSpace(errOut.String()))
		}
		return strings.TrimSpace(out.String()), nil
	}
	outPaths, err := run("build", "--no-link", "--print-out-paths", ref)
	if err != nil {
		return nil, err
	}
	out := strings.Fields(outPaths)[0]
	closure, err := run("path-info", "--recursive", out)
	if err != nil {
		return nil, err
	}
	tree, err := os.MkdirTemp(b.opts.CacheDir, "nix-")
	if err != nil {
		return nil, fmt.Errorf("nix: %w", err)
	}
	defer os.RemoveAll(tree)
	for _, d := range []string{"nix/store", "etc", "tmp", "root"} {
		if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil {
			return nil, fmt.Errorf("nix: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(tree, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644); err != nil {
		return nil, fmt.Errorf("nix: %w", err)
	}
	for _, p := range strings.Fields(closure) {
		if o, err := exec.CommandContext(ctx, "cp", "-a", p, filepath.Join(tree, "nix/store")+"/").CombinedOutput(); err != nil {
			return nil, fmt.Errorf("nix: copy %s: %v: %s", p, err, o)
		}
	}
	tarball := tree + ".tar"
	defer os.Remove(tarball)
	if o, err := exec.CommandContext(ctx, "tar", "-C", tree, "-cf", tarball, ".").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("nix: tar: %v: %s", err, o)
	}
	cfg := model.ImageConfig{Env: []string{"PATH=" + out + "/bin:/usr/bin:/bin"}, User: "0"}
	return b.opts.Images.ImportRootfs(ctx, tarball, cfg, tag, "nix")
}
