package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/internal/config"
)

func newEventsCmd(g *globals) *cobra.Command {
	var types []string
	var follow bool
	var since uint64
	cmd := &cobra.Command{
		Use:   "events JAIL",
		Short: "Print a jail's events (syscalls, files, network, processes)",
		Long: `Print a jail's events as JSON lines, the recent past first. With --follow
the stream stays open and prints events as they happen until the jail stops
or Ctrl-C; without it, events recorded so far are printed and the command
ends. --type limits the types: syscall, file, net, proc, lost.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			return c.Events(cmd.Context(), args[0], since, types, follow, func(ev client.Event) error {
				_, err := fmt.Fprintf(out, "%s\n", ev.Data)
				return err
			})
		},
	}
	cmd.Flags().StringSliceVarP(&types, "type", "t", nil, "event types to print (syscall, file, net, proc, lost)")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new events")
	cmd.Flags().Uint64Var(&since, "since", 0, "start after this event sequence number")
	return cmd
}

func newReportCmd(g *globals) *cobra.Command {
	var top int
	cmd := &cobra.Command{
		Use:   "report JAIL",
		Short: "Summarise everything a jail did: syscalls, files, network, processes, changes",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			r, err := c.Report(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), r)
			}
			printReport(cmd.OutOrStdout(), r, top)
			return nil
		},
	}
	cmd.Flags().IntVar(&top, "top", 15, "rows per table")
	return cmd
}

// printReport writes a report as Markdown.
func printReport(w io.Writer, r *client.Report, top int) {
	fmt.Fprintf(w, "# Report of jail %s (%s)\n\n", r.Name, r.JailID)
	fmt.Fprintf(w, "- status: %s\n- tracing: %s\n", r.Status, r.Tracing)
	if r.Since != nil {
		fmt.Fprintf(w, "- observed since: %s\n", r.Since.Format(time.RFC3339))
	}
	if !r.Observation.OK {
		fmt.Fprintf(w, "- observation: OFF — %s\n", r.Observation.Message)
	}
	fmt.Fprintf(w, "- events: %d syscall, %d file, %d net, %d proc\n", r.Events["syscall"], r.Events["file"], r.Events["net"], r.Events["proc"])
	fmt.Fprintf(w, "- lost: %d in the kernel, %d by the writer\n", r.Lost["kernel"], r.Lost["writer"])
	if r.DNS != nil {
		fmt.Fprintf(w, "- DNS queries: %d answered, %d dropped over the rate limit, %d dropped with too many in flight\n",
			r.DNS.Answered, r.DNS.DroppedRateLimit, r.DNS.DroppedBusy)
	}
	fmt.Fprintln(w)

	fmt.Fprintf(w, "## Top syscalls\n\n| syscall | count | errors | total time |\n|---|---:|---:|---:|\n")
	for i, s := range r.Syscalls {
		if i == top {
			fmt.Fprintf(w, "| … %d more | | | |\n", len(r.Syscalls)-top)
			break
		}
		fmt.Fprintf(w, "| %s | %d | %d | %s |\n", s.Name, s.Count, s.Errors, time.Duration(s.TotalNs))
	}
	fmt.Fprintf(w, "\n## Files\n\n| path | read | written | opens |\n|---|---:|---:|---:|\n")
	for i, f := range r.Files {
		if i == top {
			fmt.Fprintf(w, "| … %d more | | | |\n", len(r.Files)-top)
			break
		}
		fmt.Fprintf(w, "| %s | %s | %s | %d |\n", f.Path, humanBytes(uint64(f.BytesRead)), humanBytes(uint64(f.BytesWritten)), f.Opens)
	}
	fmt.Fprintf(w, "\n## Network\n\n| destination | out | in | connections | allowed | blocked |\n|---|---:|---:|---:|---:|---:|\n")
	for i, n := range r.Network {
		if i == top {
			fmt.Fprintf(w, "| … %d more | | | | | |\n", len(r.Network)-top)
			break
		}
		fmt.Fprintf(w, "| %s | %s | %s | %d | %d | %d |\n", n.Destination, humanBytes(uint64(n.BytesOut)), humanBytes(uint64(n.BytesIn)), n.Connections, n.Allowed, n.Blocked)
	}
	fmt.Fprintf(w, "\n## Processes (%d, %d running)\n\n```\n", r.Process.Total, r.Process.Running)
	for _, p := range r.Process.Roots {
		printProcess(w, p, "")
	}
	fmt.Fprintf(w, "```\n")
	if d := r.FsDiff; d != nil {
		fmt.Fprintf(w, "\n## Filesystem changes (%s)\n\n", diffCounts(d))
		for i, ch := range d.Changes {
			if i == top {
				fmt.Fprintf(w, "- … %d more\n", len(d.Changes)-top)
				break
			}
			fmt.Fprintf(w, "- %s %s (%s, %s)\n", ch.Kind, ch.Path, ch.Type, humanBytes(uint64(ch.Size)))
		}
	}
}

// printProcess writes one process and its children as an indented tree.
func printProcess(w io.Writer, p *client.ObservedProcess, indent string) {
	status := "running"
	switch {
	case p.Signal != "":
		status = "killed by " + p.Signal
	case p.ExitCode != nil:
		status = fmt.Sprintf("exit %d", *p.ExitCode)
	}
	cmdline := strings.Join(p.Argv, " ")
	if cmdline == "" {
		cmdline = p.Comm
	}
	if len(cmdline) > 100 {
		cmdline = cmdline[:97] + "..."
	}
	fmt.Fprintf(w, "%s%d %s [%s]\n", indent, p.Pid, cmdline, status)
	for _, c := range p.Children {
		printProcess(w, c, indent+"  ")
	}
}

func newPsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "ps JAIL",
		Short: "Show a jail's process tree as observed (with exit codes)",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			t, err := c.Processes(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), t)
			}
			for _, p := range t.Roots {
				printProcess(cmd.OutOrStdout(), p, "")
			}
			return nil
		},
	}
}

func newChangesCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "changes JAIL",
		Short: "List what a jail changed in its root filesystem",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			d, err := c.FsDiff(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), d)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 8, 2, ' ', 0)
			fmt.Fprintln(tw, "KIND\tPATH\tTYPE\tSIZE\tMODE")
			for _, ch := range d.Changes {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", ch.Kind, ch.Path, ch.Type, humanBytes(uint64(ch.Size)), ch.Mode)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if d.Truncated {
				fmt.Fprintf(cmd.ErrOrStderr(), "agentjail: %s\n", diffCounts(d))
			}
			return nil
		},
	}
}

func newNetworkCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "network",
		Short: "Show a jail's network record or change its policy",
		Args:  usageArgs(cobra.NoArgs),
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "log JAIL",
		Short: "Print every connection attempt of the jail, allowed or refused (JSON lines)",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			rc, err := c.NetworkLog(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			defer rc.Close()
			_, err = io.Copy(cmd.OutOrStdout(), rc)
			return err
		},
	}, &cobra.Command{
		Use:   "set JAIL FILE",
		Short: "Replace the jail's network policy with FILE (YAML or JSON, the isolation.network keys; - for stdin)",
		Args:  usageArgs(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			var data []byte
			var err error
			if args[1] == "-" {
				data, err = io.ReadAll(cmd.InOrStdin())
			} else {
				data, err = os.ReadFile(args[1])
			}
			if err != nil {
				return err
			}
			var n config.Network
			if err := config.DecodeYAML(data, &n); err != nil {
				return usageError{fmt.Errorf("%s: %w", args[1], err)}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			j, err := c.UpdateNetwork(cmd.Context(), args[0], n)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), j)
			}
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			enc.SetIndent("", "  ")
			_ = enc.Encode(j.Config.Isolation.Network)
			fmt.Fprintf(cmd.OutOrStdout(), "network policy of %s is now:\n%s", j.Name, buf.String())
			return nil
		},
	})
	return cmd
}
