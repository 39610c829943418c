package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/internal/api"
)

// Defaults of the global flags.
const (
	defaultAddr    = "127.0.0.1:8082"
	defaultDataDir = "/var/lib/agentjail"
	// addrFile is where a running daemon writes the address it listens on.
	addrFile = "daemon.addr"
)

// globals are the flags every verb has.
type globals struct {
	addr    string
	dataDir string
	json    bool
	cmd     *cobra.Command // the root, to tell set flags from defaults
}

func newRootCmd() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "agentjail",
		Short: "Sandboxes for AI agents: the daemon, its client and the in-jail init",
		Long: `agentjail runs jails (OCI containers with their own root, limits and network
namespace) for AI agents. "agentjail serve" is the daemon; the other verbs are
its client, talking to it over its REST API.

The client finds the daemon at --addr, else $AGENTJAIL_ADDR, else the address a
daemon wrote to DATA_DIR/daemon.addr, else ` + defaultAddr + `. Its token is
$AGENTJAIL_TOKEN, else the content of DATA_DIR/api-token.`,
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cmd.Help()
		},
	}
	g.cmd = root
	pf := root.PersistentFlags()
	pf.StringVar(&g.addr, "addr", defaultAddr, "daemon address host:port (env AGENTJAIL_ADDR)")
	pf.StringVar(&g.dataDir, "data-dir", defaultDataDir, "data directory (env AGENTJAIL_DATA_DIR)")
	pf.BoolVar(&g.json, "json", false, "print machine-readable JSON")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(
		newServeCmd(g), newCreateCmd(g), newLsCmd(g), newInspectCmd(g), newStartCmd(g),
		newStopCmd(g), newRmCmd(g), newExecCmd(g), newCpCmd(g), newRunCmd(g),
		newTeardownCmd(g), newVersionCmd(g), newInfoCmd(g),
		newEventsCmd(g), newReportCmd(g), newPsCmd(g), newChangesCmd(g), newNetworkCmd(g),
		newAttachCmd(g), newTerminalsCmd(g), newRecordingsCmd(g), newReplayCmd(g),
		newSnapshotCmd(g), newSnapshotsCmd(g), newRestoreCmd(g), newBranchCmd(g),
		newDiffCmd(g), newTreeCmd(g), newRmsnapCmd(g), newPushsnapCmd(g), newPullsnapCmd(g), newKeysCmd(g),
		newAgentCmd(g), newSyncCmd(g), newPreviewCmd(g),
		newPullCmd(g), newImagesCmd(g), newRmiCmd(g), newLoadCmd(g), newCommitCmd(g), newImageCmd(g), newProfileCmd(g),
		newMCPCmd(g), newQuotaCmd(g), newAuditCmd(g),
	)
	return root
}

// usageArgs marks the errors of an argument validator as usage errors.
func usageArgs(v cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := v(cmd, args); err != nil {
			if cmd.HasParent() {
				err = fmt.Errorf("%s: %w", cmd.Name(), err)
			}
			return usageError{fmt.Errorf("%w (see %s --help)", err, cmd.CommandPath())}
		}
		return nil
	}
}

// dataDirPath returns --data-dir, else $AGENTJAIL_DATA_DIR, else the default.
func (g *globals) dataDirPath() string {
	if g.cmd.PersistentFlags().Changed("data-dir") {
		return g.dataDir
	}
	if d := os.Getenv("AGENTJAIL_DATA_DIR"); d != "" {
		return d
	}
	return defaultDataDir
}

// listenAddr is the address the daemon listens on: --addr, else
// $AGENTJAIL_ADDR, else the default.
func (g *globals) listenAddr() string {
	if g.cmd.PersistentFlags().Changed("addr") {
		return g.addr
	}
	if a := os.Getenv("AGENTJAIL_ADDR"); a != "" {
		return a
	}
	return defaultAddr
}

// daemonAddr is the address the client calls: as listenAddr, but a
// running daemon's DATA_DIR/daemon.addr comes before the default.
func (g *globals) daemonAddr() string {
	if g.cmd.PersistentFlags().Changed("addr") || os.Getenv("AGENTJAIL_ADDR") != "" {
		return g.listenAddr()
	}
	if b, err := os.ReadFile(filepath.Join(g.dataDirPath(), addrFile)); err == nil {
		if a := strings.TrimSpace(string(b)); a != "" {
			return a
		}
	}
	return defaultAddr
}

// client returns a client of the daemon, with the token from
// $AGENTJAIL_TOKEN or DATA_DIR/api-token.
func (g *globals) client() (*client.Client, error) {
	tok := os.Getenv("AGENTJAIL_TOKEN")
	if tok == "" {
		path := filepath.Join(g.dataDirPath(), api.TokenFile)
		var err error
		tok, err = api.ReadToken(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("no API token: set AGENTJAIL_TOKEN, or point --data-dir at the daemon's data directory (%s does not exist)", path)
		}
		if err != nil {
			return nil, err
		}
	}
	return client.New(g.daemonAddr(), tok), nil
}

// printJSON writes v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printCreated reports a created object: as JSON with --json, else its id
// alone, for scripts.
func (g *globals) printCreated(w io.Writer, v any, id string) error {
	if g.json {
		return printJSON(w, v)
	}
	_, err := fmt.Fprintln(w, id)
	return err
}

// printJSONList writes a list as JSON: an empty list is [], never null.
func printJSONList[T any](w io.Writer, list []T) error {
	if list == nil {
		list = []T{}
	}
	return printJSON(w, list)
}
