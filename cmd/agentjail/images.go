package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/agentjail/agentjail/client"
)

// progressPrinter prints a pull's or load's progress to w: one line per
// layer state change, and the bytes of a download at most every second.
type progressPrinter struct {
	w    io.Writer
	mu   sync.Mutex
	last map[string]time.Time
}

func newProgressPrinter(w io.Writer) func(client.PullProgress) {
	p := &progressPrinter{w: w, last: map[string]time.Time{}}
	return p.print
}

func (p *progressPrinter) print(ev client.PullProgress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	layer := ev.Layer
	if i := strings.IndexByte(layer, ':'); i >= 0 && len(layer) > i+13 {
		layer = layer[i+1 : i+13]
	}
	switch {
	case ev.Layer == "":
		fmt.Fprintf(p.w, "%s\n", ev.Status)
	case ev.Status == "downloading":
		if time.Since(p.last[ev.Layer]) < time.Second {
			return
		}
		p.last[ev.Layer] = time.Now()
		if ev.Total > 0 {
			fmt.Fprintf(p.w, "%s: downloading %s / %s\n", layer, humanBytes(uint64(ev.Current)), humanBytes(uint64(ev.Total)))
		} else {
			fmt.Fprintf(p.w, "%s: downloading %s\n", layer, humanBytes(uint64(ev.Current)))
		}
	case ev.Status == "failed":
		fmt.Fprintf(p.w, "%s: failed: %s\n", layer, ev.Error)
	default:
		fmt.Fprintf(p.w, "%s: %s\n", layer, ev.Status)
	}
}

func newPullCmd(g *globals) *cobra.Command {
	var quiet, passwordStdin bool
	var username string
	cmd := &cobra.Command{
		Use:   "pull REF",
		Short: "Pull an image from its registry into the daemon's store",
		Long: `Pull an image (python:3.12-slim, registry.example.com/team/tool:1) for this
host's platform. Every layer's digest is verified and each layer is unpacked
once: all jails of an image share it. Credentials come from the daemon's
~/.docker/config.json, or for this pull alone from --username and
--password-stdin (a private image: the password or token is read from
standard input and not kept); plain-HTTP registries need serve
--insecure-registry.`,
		Example: `  agentjail pull python:3.12-slim
  echo "$TOKEN" | agentjail pull --username robot --password-stdin registry.example.com/team/tool:1`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (username == "") != !passwordStdin {
				return usageError{errors.New("pull: --username and --password-stdin go together")}
			}
			var auth *client.RegistryAuth
			if username != "" {
				pw, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), 64<<10))
				if err != nil {
					return fmt.Errorf("reading the password: %w", err)
				}
				auth = &client.RegistryAuth{Username: username, Password: strings.TrimRight(string(pw), "\r\n")}
				if auth.Password == "" {
					return usageError{errors.New("pull: --password-stdin: standard input holds no password")}
				}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			var progress func(client.PullProgress)
			if !quiet && !g.json {
				progress = newProgressPrinter(cmd.ErrOrStderr())
			}
			img, err := c.PullWithAuth(cmd.Context(), args[0], auth, progress)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), img)
			}
			fmt.Fprintln(cmd.OutOrStdout(), img.ID)
			return nil
		},
	}
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print only the image id")
	cmd.Flags().StringVarP(&username, "username", "u", "", "the registry user name for this pull (with --password-stdin)")
	cmd.Flags().BoolVar(&passwordStdin, "password-stdin", false, "read the registry password or token from standard input")
	return cmd
}

func shortID(id string) string {
	id = strings.TrimPrefix(id, "sha256:")
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func printImages(w io.Writer, imgs []*client.Image) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "IMAGE ID\tTAGS\tLAYERS\tSIZE\tSOURCE\tCREATED")
	for _, img := range imgs {
		tags := strings.Join(img.Tags, ",")
		if tags == "" {
			tags = "<none>"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", shortID(img.ID), tags, len(img.Layers), humanBytes(uint64(img.Size)), img.Source, img.Created.Local().Format(time.DateTime))
	}
	return tw.Flush()
}

func newImagesCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "images",
		Short: "List the images of the daemon's store and its disk use",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return listImages(cmd, g)
		},
	}
}

func listImages(cmd *cobra.Command, g *globals) error {
	c, err := g.client()
	if err != nil {
		return err
	}
	imgs, usage, err := c.Images(cmd.Context())
	if err != nil {
		return err
	}
	if g.json {
		return printJSON(cmd.OutOrStdout(), map[string]any{"images": imgs, "usage": usage})
	}
	if err := printImages(cmd.OutOrStdout(), imgs); err != nil {
		return err
	}
	if usage != nil {
		fmt.Fprintf(cmd.OutOrStdout(), "\n%d images, %d layers: %s unpacked, %s on disk; %d unused layers (%s) go with `agentjail image prune`; registry cache %s of %s\n",
			usage.Images, usage.Layers, humanBytes(uint64(usage.LayerBytes)), humanBytes(uint64(usage.DiskBytes)), usage.UnusedLayers, humanBytes(uint64(usage.UnusedBytes)),
			humanBytes(uint64(usage.CacheBytes)), humanBytes(uint64(usage.CacheMaxBytes)))
	}
	return nil
}

func newRmiCmd(g *globals) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "rmi [-f] REF...",
		Short: "Remove image tags, and the images nothing else names or uses",
		Long: `Remove image tags. An image whose last tag goes, and that no jail or snapshot
uses, is removed; its layers go with the next "agentjail image prune".
Removing by id an image in use fails unless -f, which only untags it.`,
		Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			for _, ref := range args {
				res, err := c.RemoveImage(cmd.Context(), ref, force)
				if err != nil {
					return err
				}
				if g.json {
					if err := printJSON(cmd.OutOrStdout(), res); err != nil {
						return err
					}
					continue
				}
				for _, t := range res.Untagged {
					fmt.Fprintf(cmd.OutOrStdout(), "untagged: %s\n", t)
				}
				if res.Deleted != "" {
					fmt.Fprintf(cmd.OutOrStdout(), "deleted: %s\n", res.Deleted)
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "untag an image in use named by id")
	return cmd
}

func newLoadCmd(g *globals) *cobra.Command {
	var input string
	cmd := &cobra.Command{
		Use:   "load [-i FILE]",
		Short: "Load images from a docker-archive or OCI layout tar (docker save, skopeo copy oci-archive:)",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var r io.Reader = cmd.InOrStdin()
			if input != "" && input != "-" {
				f, err := os.Open(input)
				if err != nil {
					return err
				}
				defer f.Close()
				r = f
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			var progress func(client.PullProgress)
			if !g.json {
				progress = newProgressPrinter(cmd.ErrOrStderr())
			}
			imgs, err := c.Load(cmd.Context(), r, progress)
			if err != nil {
				return err
			}
			if g.json {
				return printJSONList(cmd.OutOrStdout(), imgs)
			}
			for _, img := range imgs {
				fmt.Fprintf(cmd.OutOrStdout(), "loaded: %s %s\n", img.ID, strings.Join(img.Tags, " "))
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&input, "input", "i", "", `the archive ("-" or unset: stdin)`)
	return cmd
}

func newCommitCmd(g *globals) *cobra.Command {
	var comment string
	cmd := &cobra.Command{
		Use:   "commit JAIL [REF]",
		Short: "Write an image jail's current files as a new image (a layer on top of its image)",
		Args:  usageArgs(cobra.RangeArgs(1, 2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			req := client.CommitRequest{Comment: comment}
			if len(args) == 2 {
				req.Ref = args[1]
			}
			img, err := c.Commit(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), img)
			}
			fmt.Fprintln(cmd.OutOrStdout(), img.ID)
			return nil
		},
	}
	cmd.Flags().StringVarP(&comment, "message", "m", "", "a comment for the image's history")
	return cmd
}

func newImageCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Manage the daemon's image store (ls, prune)",
		Args:  usageArgs(cobra.NoArgs),
	}
	var all bool
	prune := &cobra.Command{
		Use:   "prune [--all]",
		Short: "Remove untagged unused images and every layer no image references",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.PruneImages(cmd.Context(), all)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), res)
			}
			for _, id := range res.Images {
				fmt.Fprintf(cmd.OutOrStdout(), "deleted image: %s\n", id)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %d layers, reclaimed %s\n", len(res.Layers), humanBytes(uint64(res.ReclaimedBytes)))
			return nil
		},
	}
	prune.Flags().BoolVarP(&all, "all", "a", false, "also remove tagged images no jail or snapshot uses")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the images (as agentjail images)",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return listImages(cmd, g)
		},
	}
	inspect := &cobra.Command{
		Use:   "inspect REF",
		Short: "Print an image's record as JSON",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			img, err := c.GetImage(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), img)
		},
	}
	cmd.AddCommand(prune, ls, inspect)
	return cmd
}

// ensureImage returns the image ref names, pulling it (progress on w)
// when the daemon's store lacks it.
func ensureImage(ctx context.Context, c *client.Client, ref string, w io.Writer) (*client.Image, error) {
	img, err := c.GetImage(ctx, ref)
	if client.IsNotFound(err) {
		fmt.Fprintf(w, "agentjail: pulling %s\n", ref)
		return c.Pull(ctx, ref, newProgressPrinter(w))
	}
	return img, err
}

// imageCommand is the command of `run IMAGE [-- ARG...]`: the image's
// entrypoint followed by args, or by its Cmd when args is empty.
func imageCommand(ic client.ImageConfig, args []string) []string {
	if len(args) == 0 {
		args = ic.Cmd
	}
	return append(append([]string{}, ic.Entrypoint...), args...)
}

func newProfileCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "profile",
		Short: "Profiles: base trees the daemon builds with mmdebstrap (ls, build, add, rm)",
		Long: `Profiles are named package lists the daemon builds into images with mmdebstrap
from the Debian archive: minimal, python, node and build (compilers, git) are
built in; "agentjail profile add NAME -f profile.yaml" adds yours (base:
python, packages: [sqlite3]). A build is cached by (profile, suite, package
list). A jail's rootfs "profile:NAME" builds it on first use.`,
		Args: usageArgs(cobra.NoArgs),
	}
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the profiles",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ps, err := c.Profiles(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return printJSONList(cmd.OutOrStdout(), ps)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 8, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSUITE\tIMAGE\tPACKAGES")
			for _, p := range ps {
				img := "(not built)"
				if p.Image != "" {
					img = shortID(p.Image)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", p.Name, p.Suite, img, strings.Join(p.Packages, " "))
			}
			return tw.Flush()
		},
	}
	build := &cobra.Command{
		Use:   "build NAME",
		Short: "Build a profile's image (or find it cached) and print its id",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.BuildProfile(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), res)
			}
			how := "built"
			if res.Cached {
				how = "cached"
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "agentjail: profile %s %s in %.1f s (%s)\n", args[0], how, res.Seconds, res.Profile.Tag)
			fmt.Fprintln(cmd.OutOrStdout(), res.Image.ID)
			return nil
		},
	}
	var file string
	add := &cobra.Command{
		Use:   "add NAME -f FILE",
		Short: "Save a user profile from YAML (base, suite, packages)",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			data, err := readInput(cmd, file)
			if err != nil {
				return err
			}
			var p client.Profile
			if err := yaml.UnmarshalStrict(data, &p); err != nil {
				return usageError{fmt.Errorf("profile add: %s: %w", file, err)}
			}
			p.Name = args[0]
			c, err := g.client()
			if err != nil {
				return err
			}
			out, err := c.PutProfile(cmd.Context(), p)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), out)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", out.Name, strings.Join(out.Packages, " "))
			return nil
		},
	}
	add.Flags().StringVarP(&file, "file", "f", "-", `the profile's YAML ("-": stdin)`)
	rm := &cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove user profiles",
		Args:  usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			for _, n := range args {
				if err := c.DeleteProfile(cmd.Context(), n); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.AddCommand(ls, build, add, rm)
	return cmd
}

// readInput reads the file name, or stdin for "-".
func readInput(cmd *cobra.Command, name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(cmd.InOrStdin())
	}
	return os.ReadFile(name)
}
