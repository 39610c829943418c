package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/internal/model"
)

func newSnapshotCmd(g *globals) *cobra.Command {
	var name string
	var fsOnly bool
	cmd := &cobra.Command{
		Use:   "snapshot JAIL [--name NAME] [--fs-only]",
		Short: "Snapshot a running jail (processes and filesystem) and print the snapshot's id",
		Long: `Snapshot a running jail. By default its processes are checkpointed with its
filesystem, consistently; the jail keeps running. --fs-only records the
filesystem only (no CRIU needed); restoring such a snapshot boots a fresh init.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			req := client.SnapshotRequest{Name: name}
			if fsOnly {
				req.Mode = model.SnapshotFS
			}
			s, err := c.Snapshot(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			return g.printCreated(cmd.OutOrStdout(), s, s.ID)
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "the snapshot's name (default: JAIL-<id>)")
	cmd.Flags().BoolVar(&fsOnly, "fs-only", false, "record the filesystem only, not the processes")
	return cmd
}

func newSnapshotsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "snapshots [JAIL]",
		Short: "List the snapshots of a jail (of every jail without JAIL)",
		Args:  usageArgs(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ref := ""
			if len(args) == 1 {
				ref = args[0]
			}
			list, err := c.Snapshots(cmd.Context(), ref)
			if err != nil {
				return err
			}
			if g.json {
				return printJSONList(cmd.OutOrStdout(), list)
			}
			printSnapshots(cmd.OutOrStdout(), list, time.Now())
			return nil
		},
	}
}

// printSnapshots writes snapshots as a table.
func printSnapshots(w io.Writer, list []*client.Snapshot, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tJAIL\tMODE\tCREATED\tFROZEN\tPROCESSES")
	for _, s := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.0fms\t%s\n", s.ID, s.Name, s.JailName, s.Mode,
			ago(now, s.CreatedAt), s.FrozenMs, humanBytes(uint64(max(s.ProcessBytes, 0))))
	}
	tw.Flush()
}

func newRestoreCmd(g *globals) *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "restore SNAPSHOT [--name NAME]",
		Short: "Make a new running jail from a snapshot and print its id",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			j, err := c.Restore(cmd.Context(), args[0], name)
			if err != nil {
				return err
			}
			return g.printCreated(cmd.OutOrStdout(), j, j.ID)
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "the new jail's name")
	return cmd
}

func newBranchCmd(g *globals) *cobra.Command {
	var n int
	var prefix string
	var names []string
	cmd := &cobra.Command{
		Use:   "branch SNAPSHOT [-n N] [--prefix NAME | --name NAME...]",
		Short: "Make N independent running jails from one snapshot and print their ids",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if n < 0 || n > model.MaxBranches {
				return usageError{fmt.Errorf("branch: -n %d must be between 1 and %d", n, model.MaxBranches)}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			js, err := c.Branch(cmd.Context(), args[0], client.BranchRequest{Count: n, NamePrefix: prefix, Names: names})
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), js)
			}
			for _, j := range js {
				fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s\n", j.ID, j.Name)
			}
			return nil
		},
	}
	cmd.Flags().IntVarP(&n, "count", "n", 0, "how many jails (default 1, or the number of --name)")
	cmd.Flags().StringVar(&prefix, "prefix", "", "name the jails PREFIX-1 ... (default: the snapshot's name and six hex digits of each jail's id)")
	cmd.Flags().StringArrayVar(&names, "name", nil, "a jail's name (repeat for each jail)")
	return cmd
}

func newDiffCmd(g *globals) *cobra.Command {
	var text bool
	cmd := &cobra.Command{
		Use:   "diff FROM TO [--text]",
		Short: "Show the filesystem changes from one jail or snapshot to another",
		Long: `Show what was added (A), modified (M) and deleted (D) going from FROM to TO,
each a jail (id or name) or a snapshot id. --text prints unified diffs of
text files.`,
		Args: usageArgs(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			d, err := c.Diff(cmd.Context(), args[0], args[1], text)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), d)
			}
			printDiff(cmd.OutOrStdout(), d)
			return nil
		},
	}
	cmd.Flags().BoolVar(&text, "text", false, "include unified diffs of text files")
	return cmd
}

// printDiff writes one line per change, then any text diffs.
func printDiff(w io.Writer, d *client.FsDiff) {
	for _, ch := range d.Changes {
		mark := strings.ToUpper(ch.Kind[:1])
		size := ""
		if ch.Type == "file" {
			size = humanBytes(uint64(max(ch.Size, 0)))
		}
		fmt.Fprintf(w, "%s %-7s %s %s\n", mark, ch.Type, ch.Path, size)
	}
	for _, ch := range d.Changes {
		if ch.Diff != "" {
			fmt.Fprint(w, ch.Diff)
		}
	}
	fmt.Fprintln(w, diffCounts(d))
}

// diffCounts sums a diff up in one line.
func diffCounts(d *client.FsDiff) string {
	s := fmt.Sprintf("%d added, %d modified, %d deleted", d.Added, d.Changed, d.Deleted)
	if d.Truncated {
		s += " (truncated: more than 100 000 paths changed, or directories are nested past the path limit; these are the changes among the paths read)"
	}
	return s
}

func newRmsnapCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rmsnap SNAPSHOT...",
		Short: "Delete snapshots",
		Args:  usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			for _, sid := range args {
				if err := c.DeleteSnapshot(cmd.Context(), sid); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

func newPushsnapCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "pushsnap SNAPSHOT REF",
		Short: "Push a snapshot to an OCI registry (REF: registry/repository:tag) and print its digest reference",
		Long: `Push a snapshot (its record, process images and disk image) to an OCI
registry as an artifact, so that another daemon can pull it (pullsnap) and
restore or branch it there. The daemon pushes with its own registry
credentials (~/.docker/config.json) and reaches plain-HTTP registries only
when they are named with serve --insecure-registry.`,
		Args: usageArgs(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.PushSnapshot(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), res)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s in %.0fms\n", res.Ref, humanBytes(uint64(max(res.Bytes, 0))), res.DurationMs)
			return nil
		},
	}
}

func newPullsnapCmd(g *globals) *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "pullsnap REF [--name NAME]",
		Short: "Pull a snapshot pushed to an OCI registry into a new snapshot and print its id",
		Long: `Pull a snapshot artifact (pushed by pushsnap, here or on another daemon)
into a new snapshot of this daemon, ready to restore or branch. A snapshot
this daemon could not restore (another level, a rootfs it lacks) is
refused before its layers are fetched.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			s, err := c.PullSnapshot(cmd.Context(), args[0], name)
			if err != nil {
				return err
			}
			return g.printCreated(cmd.OutOrStdout(), s, s.ID)
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "the new snapshot's name (default: the pushed snapshot's)")
	return cmd
}

func newTreeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "tree",
		Short: "Draw the family tree of jails and snapshots",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			js, err := c.List(cmd.Context())
			if err != nil {
				return err
			}
			snaps, err := c.Snapshots(cmd.Context(), "")
			if err != nil {
				return err
			}
			drawTree(cmd.OutOrStdout(), js, snaps)
			return nil
		},
	}
}

// treeNode is a jail or snapshot in the family tree.
type treeNode struct {
	label    string
	at       time.Time
	children []*treeNode
}

// drawTree prints jails and snapshots as a tree: a jail's children are
// its snapshots, a snapshot's children the jails restored from it. Jails
// that are gone appear once, marked, as the parents of their snapshots.
func drawTree(w io.Writer, js []*client.Jail, snaps []*client.Snapshot) {
	jails := map[string]*treeNode{}
	var roots []*treeNode
	for _, j := range js {
		jails[j.ID] = &treeNode{label: fmt.Sprintf("jail %s (%s) %s", j.Name, j.ID, j.Status), at: j.CreatedAt}
	}
	snapNodes := map[string]*treeNode{}
	for _, s := range snaps {
		snapNodes[s.ID] = &treeNode{label: fmt.Sprintf("snapshot %s (%s) %s", s.Name, s.ID, s.Mode), at: s.CreatedAt}
	}
	for _, s := range snaps {
		parent, ok := jails[s.JailID]
		if !ok {
			parent = &treeNode{label: fmt.Sprintf("jail %s (%s) destroyed", s.JailName, s.JailID), at: s.CreatedAt}
			jails[s.JailID] = parent
			roots = append(roots, parent)
		}
		parent.children = append(parent.children, snapNodes[s.ID])
	}
	for _, j := range js {
		n := jails[j.ID]
		if j.Parent != nil && j.Parent.Kind == model.LineageSnapshot {
			if p, ok := snapNodes[j.Parent.ID]; ok {
				p.children = append(p.children, n)
				continue
			}
			n.label += fmt.Sprintf(" (from deleted snapshot %s)", j.Parent.ID)
		}
		roots = append(roots, n)
	}
	sortTree(roots)
	for _, r := range roots {
		fmt.Fprintln(w, r.label)
		printChildren(w, r, "")
	}
}

func sortTree(nodes []*treeNode) {
	sort.SliceStable(nodes, func(a, b int) bool { return nodes[a].at.Before(nodes[b].at) })
	for _, n := range nodes {
		sortTree(n.children)
	}
}

func printChildren(w io.Writer, n *treeNode, indent string) {
	for i, ch := range n.children {
		branch, next := "├── ", "│   "
		if i == len(n.children)-1 {
			branch, next = "└── ", "    "
		}
		fmt.Fprintln(w, indent+branch+ch.label)
		printChildren(w, ch, indent+next)
	}
}
