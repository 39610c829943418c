package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/internal/jail"
	"github.com/agentjail/agentjail/internal/mcptools"
)

func newMCPCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "mcp",
		Short: "Serve agentjail's MCP tools over stdio (for Claude Code and other MCP clients)",
		Long: `Serve the MCP server (Model Context Protocol) on standard input and output:
tools to create a jail, run commands in it, read and write its files,
snapshot it, branch and diff snapshots, get its report, and destroy it.

Every tool call is a request to the daemon's API with this command's
credential: AGENTJAIL_TOKEN (an API key from "agentjail keys create", which
binds the tools to its tenant and role), else the daemon's token file.
For Claude Code:

  claude mcp add agentjail -e AGENTJAIL_TOKEN=aj_... -- agentjail mcp

The daemon also serves the same tools at POST /mcp (streamable HTTP).`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			return mcptools.NewServer(c, jail.Version).Run(cmd.Context(), &mcp.StdioTransport{})
		},
	}
}

func newQuotaCmd(g *globals) *cobra.Command {
	var jails, snapshots int
	var memory, disk string
	cmd := &cobra.Command{
		Use:   "quota TENANT",
		Short: "Show a tenant's quota and usage, or set it (admin) with the flags",
		Long: `Show what tenant TENANT may hold and holds: jails, memory (the sum of its
jails' limits), disk (the sum of their sizes) and snapshots. With any flag,
set those limits first (an admin key or the token; 0 is no limit). Creates
over the quota are refused with 429 quota_exceeded.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var q *client.TenantQuota
			if f := cmd.Flags(); f.Changed("jails") || f.Changed("memory") || f.Changed("disk") || f.Changed("snapshots") {
				cur, err := c.GetQuota(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				l := cur.Limits
				if f.Changed("jails") {
					l.Jails = jails
				}
				if f.Changed("snapshots") {
					l.Snapshots = snapshots
				}
				for _, s := range []struct {
					name, val string
					dst       *int64
				}{{"memory", memory, &l.MemoryBytes}, {"disk", disk, &l.DiskBytes}} {
					if !f.Changed(s.name) {
						continue
					}
					if s.val == "0" {
						*s.dst = 0
						continue
					}
					n, err := parseSize(s.val)
					if err != nil {
						return usageError{fmt.Errorf("--%s: %w", s.name, err)}
					}
					*s.dst = n
				}
				q, err = c.SetQuota(cmd.Context(), args[0], l)
				if err != nil {
					return err
				}
			} else if q, err = c.GetQuota(cmd.Context(), args[0]); err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), q)
			}
			limit := func(n int64, size bool) string {
				switch {
				case n == 0:
					return "no limit"
				case size:
					return fmt.Sprintf("%d MiB", n>>20)
				}
				return fmt.Sprint(n)
			}
			var b strings.Builder
			fmt.Fprintf(&b, "tenant %s\n", q.Tenant)
			fmt.Fprintf(&b, "  jails      %d of %s\n", q.Usage.Jails, limit(int64(q.Limits.Jails), false))
			fmt.Fprintf(&b, "  memory     %d MiB of %s\n", q.Usage.MemoryBytes>>20, limit(q.Limits.MemoryBytes, true))
			fmt.Fprintf(&b, "  disk       %d MiB of %s\n", q.Usage.DiskBytes>>20, limit(q.Limits.DiskBytes, true))
			fmt.Fprintf(&b, "  snapshots  %d of %s\n", q.Usage.Snapshots, limit(int64(q.Limits.Snapshots), false))
			_, err = fmt.Fprint(cmd.OutOrStdout(), b.String())
			return err
		},
	}
	cmd.Flags().IntVar(&jails, "jails", 0, "the most jails the tenant may hold (0: no limit)")
	cmd.Flags().StringVar(&memory, "memory", "", "the most memory its jails' limits may add up to, e.g. 8g (0: no limit)")
	cmd.Flags().StringVar(&disk, "disk", "", "the most disk its jails' sizes may add up to, e.g. 50g (0: no limit)")
	cmd.Flags().IntVar(&snapshots, "snapshots", 0, "the most snapshots it may hold (0: no limit)")
	return cmd
}

func newAuditCmd(g *globals) *cobra.Command {
	var limit int
	var tenantName string
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Show the audit log's newest lines (who changed what, when, and how it ended)",
		Long: `Show the newest lines of the daemon's audit log (DATA_DIR/audit.jsonl): every
request that changed state or tried to, with who sent it (the token or an API
key, its tenant and role), the route and target, the status and the result
(ok, denied, error). A key sees its tenant's lines; an admin all of them.
With --json, one JSON object per line.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			list, err := c.Audit(cmd.Context(), limit, tenantName)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if g.json {
				enc := json.NewEncoder(w)
				for _, e := range list {
					if err := enc.Encode(e); err != nil {
						return err
					}
				}
				return nil
			}
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TIME\tWHO\tTENANT\tACTION\tTARGET\tSTATUS\tRESULT")
			for _, e := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", e.Time.Local().Format(time.DateTime), e.Who, e.Tenant, e.Action, e.Target, e.Status, e.Result)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 50, "at most this many lines (1 to 10000)")
	cmd.Flags().StringVar(&tenantName, "tenant", "", "only this tenant's lines (an admin's choice)")
	return cmd
}
