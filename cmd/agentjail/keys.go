package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

func newKeysCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Issue, list and remove API keys (for the E2B-compatible API)",
		Long: `API keys authenticate the E2B-compatible API (X-API-KEY; see docs/e2b.md).
Each key has a tenant and a role (admin, user or viewer). The daemon keeps
only an argon2id hash: a key is shown once, when it is made. These commands
need the admin token.`,
		Args: usageArgs(cobra.NoArgs),
	}
	var tenant, role, name string
	create := &cobra.Command{
		Use:   "create [--tenant T] [--role admin|user|viewer] [--name N]",
		Short: "Issue a key and print it (it is not shown again)",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			k, err := c.CreateKey(cmd.Context(), name, tenant, role)
			if err != nil {
				return err
			}
			return g.printCreated(cmd.OutOrStdout(), k, k.Secret)
		},
	}
	create.Flags().StringVar(&tenant, "tenant", "", `the tenant the key acts for (default "default")`)
	create.Flags().StringVar(&role, "role", "", "admin, user (default) or viewer")
	create.Flags().StringVar(&name, "name", "", "a label for the key")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the keys (without their secrets)",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			list, err := c.Keys(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return printJSONList(cmd.OutOrStdout(), list)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 8, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTENANT\tROLE\tNAME\tCREATED")
			for _, k := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.ID, k.Tenant, k.Role, k.Name, k.CreatedAt.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	rm := &cobra.Command{
		Use:   "rm ID...",
		Short: "Remove keys; they stop working at once",
		Args:  usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := c.DeleteKey(cmd.Context(), id); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.AddCommand(create, ls, rm)
	return cmd
}
