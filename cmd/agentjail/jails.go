package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/internal/api"
	"github.com/agentjail/agentjail/internal/jail"
	"github.com/agentjail/agentjail/internal/model"
)

func newCreateCmd(g *globals) *cobra.Command {
	var cf createFlags
	cmd := &cobra.Command{
		Use:   "create [flags]",
		Short: "Create a jail (and start it) and print its id",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := cf.request(cmd.InOrStdin())
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			j, err := c.Create(cmd.Context(), req)
			if err != nil {
				return err
			}
			return g.printCreated(cmd.OutOrStdout(), j, j.ID)
		},
	}
	cf.register(cmd.Flags(), true)
	return cmd
}

func newLsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List jails",
		Args:    usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			js, err := c.List(cmd.Context())
			if err != nil {
				return err
			}
			sort.Slice(js, func(a, b int) bool { return js[a].CreatedAt.Before(js[b].CreatedAt) })
			if g.json {
				return printJSONList(cmd.OutOrStdout(), js)
			}
			printTable(cmd.OutOrStdout(), js, time.Now())
			return nil
		},
	}
}

// printTable writes jails as a table.
func printTable(w io.Writer, js []*client.Jail, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSTATUS\tCREATED\tROOTFS\tMEMORY\tDISK")
	for _, j := range js {
		r := j.Config.Isolation.Resources
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", j.ID, j.Name, j.Status,
			ago(now, j.CreatedAt), j.Config.Isolation.Filesystem.Rootfs,
			humanBytes(uint64(max(r.MemoryBytes, 0))), humanBytes(uint64(max(r.DiskBytes, 0))))
	}
	tw.Flush()
}

// ago renders how long before now t was, coarsely.
func ago(now, t time.Time) string {
	d := now.Sub(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return fmt.Sprintf("%dd ago", int(d.Hours()/24))
}

// humanBytes renders a byte count with a binary unit.
func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	v, u := float64(n), 0
	for v >= unit && u < 4 {
		v /= unit
		u++
	}
	s := fmt.Sprintf("%.1f", v)
	s = strings.TrimSuffix(s, ".0")
	return s + []string{"", "KiB", "MiB", "GiB", "TiB"}[u]
}

func newInspectCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect JAIL",
		Short: "Show a jail's state, configuration and live usage",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			j, err := c.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), j)
			}
			printInspect(cmd.OutOrStdout(), j)
			return nil
		},
	}
}

// printInspect writes a jail as "key: value" lines.
func printInspect(w io.Writer, j *client.Jail) {
	tw := tabwriter.NewWriter(w, 0, 8, 1, ' ', 0)
	kv := func(k string, v any) { fmt.Fprintf(tw, "%s:\t%v\n", k, v) }
	ts := func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return t.Local().Format(time.RFC3339)
	}
	iso := j.Config.Isolation
	r := iso.Resources
	kv("id", j.ID)
	kv("name", j.Name)
	kv("status", j.Status)
	if j.Error != "" {
		kv("error", j.Error)
	}
	kv("created", ts(&j.CreatedAt))
	kv("started", ts(j.StartedAt))
	kv("stopped", ts(j.StoppedAt))
	if j.Pid != 0 {
		kv("pid", j.Pid)
	}
	kv("level", iso.Level)
	kv("rootfs", iso.Filesystem.Rootfs)
	kv("workspace", iso.Filesystem.WorkspaceRoot)
	kv("network", iso.Network.Mode)
	kv("user", iso.Process.User)
	kv("cpu shares", r.CPUShares)
	kv("memory limit", humanBytes(uint64(max(r.MemoryBytes, 0))))
	kv("disk size", humanBytes(uint64(max(r.DiskBytes, 0))))
	kv("pids limit", r.PidsLimit)
	if s := j.Stats; s != nil {
		kv("memory used", fmt.Sprintf("%s of %s", humanBytes(s.MemoryBytes), humanBytes(s.MemoryLimitBytes)))
		kv("cpu time", time.Duration(s.CPUTimeNs).Round(time.Millisecond))
		kv("pids", fmt.Sprintf("%d of %d", s.Pids, s.PidsLimit))
		kv("oom kills", s.OOMKills)
		kv("disk used", fmt.Sprintf("%s of %s", humanBytes(s.DiskUsedBytes), humanBytes(s.DiskLimitBytes)))
	}
	tw.Flush()
}

func newStartCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "start JAIL...",
		Short: "Start jails",
		Args:  usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return eachJail(g, cmd, args, func(ctx context.Context, c *client.Client, ref string) (*client.Jail, error) {
				return c.Start(ctx, ref)
			})
		},
	}
}

func newStopCmd(g *globals) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "stop [--timeout 10s] JAIL...",
		Short: "Stop jails (their processes get SIGTERM, then SIGKILL after the timeout)",
		Args:  usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeout < 0 {
				return usageError{fmt.Errorf("--timeout: %s is negative", timeout)}
			}
			return eachJail(g, cmd, args, func(ctx context.Context, c *client.Client, ref string) (*client.Jail, error) {
				return c.Stop(ctx, ref, timeout)
			})
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", api.DefaultStopTimeout, "grace period before the jail's processes are killed")
	return cmd
}

// eachJail applies op to every jail named in args and prints each jail's
// id (or all of them as JSON); it goes on after a failure and reports the
// failures at the end.
func eachJail(g *globals, cmd *cobra.Command, args []string, op func(context.Context, *client.Client, string) (*client.Jail, error)) error {
	c, err := g.client()
	if err != nil {
		return err
	}
	var out []*client.Jail
	var failed []string
	for _, ref := range args {
		j, err := op(cmd.Context(), c, ref)
		if err != nil {
			fmt.Fprintf(cmd.ErrOrStderr(), "agentjail: %s: %v\n", ref, err)
			failed = append(failed, ref)
			continue
		}
		out = append(out, j)
		if !g.json {
			fmt.Fprintln(cmd.OutOrStdout(), j.ID)
		}
	}
	if g.json {
		if err := printJSONList(cmd.OutOrStdout(), out); err != nil {
			return err
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("failed: %s", strings.Join(failed, ", "))
	}
	return nil
}

func newRmCmd(g *globals) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:     "rm [-f] JAIL...",
		Aliases: []string{"destroy"},
		Short:   "Destroy jails (a running one only with -f)",
		Args:    usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			removed, failed := []string{}, []string(nil)
			for _, ref := range args {
				if err := removeJail(cmd.Context(), c, ref, force); err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "agentjail: %s: %v\n", ref, err)
					failed = append(failed, ref)
					continue
				}
				removed = append(removed, ref)
				if !g.json {
					fmt.Fprintln(cmd.OutOrStdout(), ref)
				}
			}
			if g.json {
				if err := printJSON(cmd.OutOrStdout(), removed); err != nil {
					return err
				}
			}
			if len(failed) > 0 {
				return fmt.Errorf("failed: %s", strings.Join(failed, ", "))
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "stop a running jail first")
	return cmd
}

// removeJail destroys a jail. A running jail is refused unless force, in
// which case it is stopped (killed at once) first.
func removeJail(ctx context.Context, c *client.Client, ref string, force bool) error {
	j, err := c.Get(ctx, ref)
	if err != nil {
		return err
	}
	switch j.Status {
	case model.StateRunning, model.StateStarting, model.StateStopping:
		if !force {
			return fmt.Errorf("jail %s is %s; stop it first, or use rm -f", j.Name, j.Status)
		}
		if _, err := c.Stop(ctx, j.ID, 0); err != nil && !client.IsConflict(err) {
			return err
		}
	}
	return c.Destroy(ctx, j.ID)
}

func newTeardownCmd(g *globals) *cobra.Command {
	var lv levelFlags
	cmd := &cobra.Command{
		Use:   "teardown",
		Short: "Destroy every jail of the data directory and release its storage pool (for tests and uninstalling)",
		Long: `Destroy every jail of DATA_DIR and release the storage pool, without a
daemon (stop the daemon first). For tests and uninstalling.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Every level, so that every jail goes.
			lv.unsafeNone = true
			return jail.Teardown(cmd.Context(), jail.Options{DataDir: g.dataDirPath(), Backends: lv.factories()})
		},
	}
	cmd.Flags().StringVar(&lv.runtime, "runtime", "runc", "OCI runtime binary")
	return cmd
}

func newVersionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if g.json {
				return printJSON(cmd.OutOrStdout(), map[string]string{"version": jail.Version})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "agentjail %s\n", jail.Version)
			return nil
		},
	}
}
