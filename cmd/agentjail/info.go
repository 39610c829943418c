package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/agentjail/agentjail/client"
)

func newInfoCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "info",
		Short: "Show the daemon's state and the isolation levels this host offers, with what each can do",
		Long: `Show the daemon's state and every isolation level it knows: whether this host
offers it (and if not, why and how to get it), and what it can do — network
modes, root filesystems, enforced limits, terminals, observation, snapshots —
and what it guarantees. An UNSAFE level isolates nothing.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			h, err := c.Health(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), h)
			}
			printInfo(cmd.OutOrStdout(), h)
			return nil
		},
	}
}

// printInfo writes the daemon's state and a block per level.
func printInfo(w io.Writer, h *client.Health) {
	fmt.Fprintf(w, "agentjail %s: %s, %d jails (%d running)\n", h.Version, h.Status, h.Jails, h.Running)
	for _, l := range h.Levels {
		fmt.Fprintln(w)
		if !l.Available {
			fmt.Fprintf(w, "%s: unavailable: %s\n", l.Name, l.Reason)
			continue
		}
		c := l.Capabilities
		name := l.Name
		if c.Unsafe {
			name += " (UNSAFE: no isolation; development only)"
		}
		fmt.Fprintf(w, "%s: available\n", name)
		tw := tabwriter.NewWriter(w, 0, 8, 1, ' ', 0)
		kv := func(k string, v any) { fmt.Fprintf(tw, "  %s:\t%v\n", k, v) }
		list := func(v []string) string {
			if len(v) == 0 {
				return "none"
			}
			return strings.Join(v, ", ")
		}
		yes := func(b bool) string {
			if b {
				return "yes"
			}
			return "no"
		}
		kv("runtime", c.Runtime)
		kv("network modes", list(c.NetworkModes))
		kv("root filesystems", list(c.RootfsKinds))
		kv("enforced limits", list(c.Limits))
		kv("terminals", yes(c.PTY))
		kv("other users", yes(c.Users))
		kv("user namespaces", yes(c.UserNamespaces))
		kv("observation", list(c.Observers))
		kv("filesystem snapshots", yes(c.FSSnapshot))
		checkpoint := yes(c.Checkpoint)
		if !c.Checkpoint && c.CheckpointReason != "" {
			checkpoint += " (" + c.CheckpointReason + ")"
		}
		kv("process snapshots", checkpoint)
		if len(c.Exposes) > 0 {
			kv("sees of the host", list(c.Exposes))
		}
		kv("guarantees", c.Guarantees)
		tw.Flush()
	}
}
