package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentjail/agentjail/client"
)

func newAgentCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Install AI agent CLIs and run them in jails on a project",
		Long: `Run an AI agent CLI (claude, codex, gemini, opencode) inside a jail on a
copy of your project. The daemon holds the model API keys (its environment or
DATA_DIR/secrets.env, mode 0600); the jail's agent sees a dummy key and reaches
its model API only through the daemon's proxy, which adds the real one.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newAgentInstallCmd(g), newAgentLsCmd(g), newAgentStartCmd(g), newAgentAttachCmd(g))
	return cmd
}

func newAgentInstallCmd(g *globals) *cobra.Command {
	var version string
	cmd := &cobra.Command{
		Use:   "install AGENT",
		Short: "Install an agent CLI on the daemon's host (once; every jail shares it read-only)",
		Long: `Install an agent CLI with npm into a versioned tool tree under the daemon's
tools dir, with a manifest (name, version, sha256 of the tree). Installing a
version that is there already does nothing; a failed install leaves nothing.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			tool, installed, err := c.InstallAgent(cmd.Context(), args[0], version, func(line string) {
				fmt.Fprintln(cmd.ErrOrStderr(), line)
			})
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), tool)
			}
			what := "installed"
			if !installed {
				what = "already installed"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s %s: %d files, %d MB, sha256 %s\n", tool.Name, tool.Version, what, tool.Files, tool.SizeBytes>>20, tool.SHA256)
			return nil
		},
	}
	cmd.Flags().StringVar(&version, "version", "", "npm version to install (default: agentjail's pinned version)")
	return cmd
}

func newAgentLsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "List the agents, their installed versions and whether the daemon has their key",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			list, err := c.Agents(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), list)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 8, 2, ' ', 0)
			fmt.Fprintln(tw, "AGENT\tINSTALLED\tPINNED\tMODEL HOST\tKEY")
			for _, a := range list {
				var vs []string
				for _, t := range a.Installed {
					vs = append(vs, t.Version)
				}
				inst := strings.Join(vs, ",")
				if inst == "" {
					inst = "-"
				}
				key := a.KeyName + " missing"
				if a.KeyPresent {
					key = a.KeyName
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", a.Name, inst, a.DefaultVersion, a.ModelHost, key)
			}
			return tw.Flush()
		},
	}
}

// agentStartFlags are agent start's options.
type agentStartFlags struct {
	agent, version, project, ref, prompt, endpoint, model, syncMode, homeTemplate string
	syncInterval, syncIdle                                                        int
	detach, noCaches                                                              bool
}

func newAgentStartCmd(g *globals) *cobra.Command {
	var f agentStartFlags
	cmd := &cobra.Command{
		Use:   "start JAIL --agent AGENT --project DIR|URL [--prompt TEXT]",
		Short: "Create a jail with your project and its agent, then attach to it (or run a prompt headless)",
		Long: `Create the jail JAIL with a clone of the project (a host repository, which
is never mounted into the jail, or a git URL) at --ref, and the agent ready in
it. Without --prompt the agent's TUI starts in a terminal session (recorded)
and this terminal attaches to it; ` + detachHelp + ` "agentjail agent attach JAIL"
comes back. With --prompt the agent runs headless: its output streams here and
agentjail exits with its exit code. "agentjail sync JAIL" brings the work back
to the host repository as branch agentjail/JAIL.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.agent == "" {
				return usageError{errors.New("agent start: --agent is required (claude, codex, gemini, opencode)")}
			}
			if f.project == "" {
				return usageError{errors.New("agent start: --project is required (a host repository or a git URL)")}
			}
			repo := f.project
			if !strings.Contains(repo, "://") && !strings.HasPrefix(repo, "git@") {
				abs, err := filepath.Abs(repo)
				if err != nil {
					return usageError{fmt.Errorf("--project: %w", err)}
				}
				repo = abs
			}
			req := client.CreateRequest{Name: args[0]}
			req.Agent = &client.Agent{Name: f.agent, Version: f.version, Endpoint: f.endpoint, Model: f.model, HomeTemplate: f.homeTemplate}
			req.Workspace = &client.Workspace{Repo: repo, Ref: f.ref, Sync: client.Sync{Mode: f.syncMode, IntervalS: f.syncInterval, IdleS: f.syncIdle}}
			if f.noCaches {
				no := false
				req.Workspace.Caches = &no
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			j, err := c.Create(cmd.Context(), req)
			if err != nil {
				return err
			}
			if f.prompt != "" {
				return printStream(cmd, func(fn func(string, []byte) error) (*client.ExecResult, error) {
					return c.RunAgent(cmd.Context(), j.ID, client.AgentRunRequest{Prompt: f.prompt}, fn)
				})
			}
			s, err := c.AgentSession(cmd.Context(), j.ID, client.AgentSessionRequest{})
			if err != nil {
				return err
			}
			if f.detach {
				fmt.Fprintf(cmd.OutOrStdout(), "%s\n", s.ID)
				return nil
			}
			return runTerminal(cmd, c, j.ID, client.TerminalOptions{Session: s.ID})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.agent, "agent", "", "the agent CLI: claude, codex, gemini or opencode")
	fl.StringVar(&f.version, "version", "", "an installed version of it (default: the newest installed)")
	fl.StringVar(&f.project, "project", "", "a host git repository (e.g. .) or a git URL to clone into the jail's workspace")
	fl.StringVar(&f.ref, "ref", "", "branch, tag or commit to check out (default: the repository's HEAD)")
	fl.StringVar(&f.prompt, "prompt", "", "run the agent headless on this task instead of its TUI")
	fl.StringVar(&f.endpoint, "endpoint", "", "the model API's origin instead of the provider's (a local model server, a gateway)")
	fl.StringVar(&f.model, "model", "", "the model the agent asks for")
	fl.StringVar(&f.syncMode, "sync", "", "manual (default), auto-commit or auto-idle")
	fl.IntVar(&f.syncInterval, "sync-interval", 0, "auto-commit: seconds between commits (default 60)")
	fl.IntVar(&f.syncIdle, "sync-idle", 0, "auto-idle: seconds of quiet before a sync (default 30)")
	fl.StringVar(&f.homeTemplate, "home-template", "", "a host directory copied into the agent's home (settings, MCP servers, skills)")
	fl.BoolVarP(&f.detach, "detach", "d", false, "start the agent's session without attaching; print its id")
	fl.BoolVar(&f.noCaches, "no-caches", false, "do not mount the project's shared package caches")
	return cmd
}

func newAgentAttachCmd(g *globals) *cobra.Command {
	var readOnly bool
	cmd := &cobra.Command{
		Use:   "attach JAIL",
		Short: "Attach to the jail's running agent session",
		Long:  `Attach to the newest terminal session of the jail that runs its agent. ` + detachHelp,
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
			if j.Config.Agent == nil {
				return fmt.Errorf("jail %s has no agent", j.Name)
			}
			list, err := c.Terminals(cmd.Context(), j.ID)
			if err != nil {
				return err
			}
			id := ""
			for _, s := range list {
				if len(s.Cmd) > 0 && filepath.Base(s.Cmd[0]) == j.Config.Agent.Name {
					id = s.ID
				}
			}
			if id == "" {
				return fmt.Errorf("jail %s has no running %s session (agentjail agent start makes one)", j.Name, j.Config.Agent.Name)
			}
			return runTerminal(cmd, c, j.ID, client.TerminalOptions{Session: id, ReadOnly: readOnly})
		},
	}
	cmd.Flags().BoolVar(&readOnly, "read-only", false, "watch without typing")
	return cmd
}

func newSyncCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "sync JAIL",
		Short: "Bring the jail's work back to the host repository as branch agentjail/JAIL",
		Long: `Commit what the jail's workspace changed (inside the jail) and fetch it into
the host repository the workspace came from, as branch agentjail/JAIL. The
host's checked-out branch and working tree are not touched. When that branch
moved on the host since the last sync, nothing is written and the conflict is
reported.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.Sync(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), res)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: branch %s at %s (%d commit(s), %d file(s) changed since %.12s)\n",
				res.Repo, res.Branch, res.Commit[:12], res.Commits, len(res.Files), res.Base)
			return nil
		},
	}
}

func newPreviewCmd(g *globals) *cobra.Command {
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "preview JAIL PORT",
		Short: "Print a signed link to a dev server in the jail",
		Long: `Print a link to PORT of the jail, served by the daemon's reverse proxy at
http://PORT-JAIL.localhost:DAEMON-PORT/ (HTTP and WebSocket, so hot reload
works). The link carries a signature valid for --ttl instead of the API token.`,
		Args: usageArgs(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := strconv.Atoi(args[1])
			if err != nil {
				return usageError{fmt.Errorf("preview: PORT %q is not a number", args[1])}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			link, err := c.Preview(cmd.Context(), args[0], port, ttl)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), link)
			}
			fmt.Fprintln(cmd.OutOrStdout(), link.URL)
			return nil
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", time.Hour, "how long the link works")
	return cmd
}
