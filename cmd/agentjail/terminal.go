package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/agentjail/agentjail/client"
	"github.com/agentjail/agentjail/internal/asciicast"
)

// The detach sequence: Ctrl-P then Ctrl-Q.
const (
	detachKey1 = 0x10
	detachKey2 = 0x11
	ctrlC      = 0x03
)

const detachHelp = `Ctrl-P Ctrl-Q detaches: the session keeps running in the jail and can be
attached again with "agentjail attach JAIL --session ID". Ctrl-P followed by
any other key sends both keys. Attached with --readonly, typed keys are
discarded, and Ctrl-C detaches too.`

func newAttachCmd(g *globals) *cobra.Command {
	var session string
	var readOnly bool
	cmd := &cobra.Command{
		Use:   "attach [flags] JAIL",
		Short: "Attach this terminal to a terminal session in a jail",
		Long: `Attach this terminal to a running terminal session of a jail (started with
"agentjail exec -t" or over the API): its recent output is shown, then the
live stream. Without --session, the jail must have exactly one session.
agentjail exits with the command's status when it ends.

` + detachHelp,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if session == "" {
				list, err := c.Terminals(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				switch len(list) {
				case 0:
					return fmt.Errorf("jail %s has no terminal session (start one with: agentjail exec -t %s -- bash)", args[0], args[0])
				case 1:
					session = list[0].ID
				default:
					ids := make([]string, len(list))
					for i, s := range list {
						ids[i] = s.ID
					}
					return usageError{fmt.Errorf("jail %s has %d terminal sessions (%s): choose one with --session", args[0], len(list), strings.Join(ids, ", "))}
				}
			}
			return runTerminal(cmd, c, args[0], client.TerminalOptions{Session: session, ReadOnly: readOnly})
		},
	}
	cmd.Flags().StringVar(&session, "session", "", "the session's id (see agentjail terminals)")
	cmd.Flags().BoolVar(&readOnly, "readonly", false, "watch only: typed keys are not sent")
	return cmd
}

// runTerminal connects this process's terminal to a terminal session:
// raw mode (always restored), window size changes forwarded, the detach
// sequence handled. It returns the command's exit status as an exitCode.
func runTerminal(cmd *cobra.Command, c *client.Client, ref string, opts client.TerminalOptions) error {
	ctx := cmd.Context()
	stdinFd := int(os.Stdin.Fd())
	isTTY := term.IsTerminal(stdinFd)
	if isTTY && opts.Session == "" {
		if cols, rows, err := term.GetSize(stdinFd); err == nil {
			opts.Rows, opts.Cols = rows, cols
		}
	}
	if opts.Term == "" {
		opts.Term = os.Getenv("TERM")
	}
	t, err := c.Terminal(ctx, ref, opts)
	if err != nil {
		return err
	}
	defer t.Close()
	if isTTY {
		old, err := term.MakeRaw(stdinFd)
		if err != nil {
			return fmt.Errorf("terminal raw mode: %w", err)
		}
		defer term.Restore(stdinFd, old)
	}
	// SIGHUP ends this process; the deferred restores still run.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGWINCH, syscall.SIGHUP)
	defer signal.Stop(sigs)
	if isTTY && !opts.ReadOnly {
		if cols, rows, err := term.GetSize(stdinFd); err == nil && opts.Session != "" {
			_ = t.Resize(ctx, rows, cols)
		}
	}

	outDone := make(chan error, 1)
	go func() {
		_, err := io.Copy(cmd.OutOrStdout(), t)
		outDone <- err
	}()
	detached := make(chan struct{})
	go forwardInput(os.Stdin, t, opts.ReadOnly, detached)

	for {
		select {
		case err := <-outDone:
			if err != nil {
				return err
			}
			exit, _ := t.Exit()
			if exit.Code != 0 {
				return exitCode(exit.Code)
			}
			return nil
		case <-detached:
			s := t.Session()
			restoreNote := fmt.Sprintf("\r\n[detached from session %s of jail %s; attach again with: agentjail attach %s --session %s]\r\n", s.ID, ref, ref, s.ID)
			fmt.Fprint(cmd.ErrOrStderr(), restoreNote)
			return nil
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				return exitCode(exitInterrupted)
			}
			if isTTY && !opts.ReadOnly {
				if cols, rows, err := term.GetSize(stdinFd); err == nil {
					_ = t.Resize(ctx, rows, cols)
				}
			}
		case <-ctx.Done():
			return exitCode(exitInterrupted)
		}
	}
}

// forwardInput sends what is typed to the terminal until the detach
// sequence (then it closes detached) or the end of input.
func forwardInput(in io.Reader, t *client.Terminal, readOnly bool, detached chan<- struct{}) {
	buf := make([]byte, 4096)
	held := false // a Ctrl-P waits for the next key
	for {
		n, err := in.Read(buf)
		out := make([]byte, 0, n+1)
		for _, b := range buf[:n] {
			switch {
			case held && b == detachKey2:
				close(detached)
				return
			case held:
				held = false
				out = append(out, detachKey1)
			}
			switch {
			case b == detachKey1:
				held = true
			case readOnly && b == ctrlC:
				close(detached)
				return
			default:
				out = append(out, b)
			}
		}
		if len(out) > 0 && !readOnly {
			if _, werr := t.Write(out); werr != nil {
				return
			}
		}
		if err != nil {
			return // end of input: the session goes on; output still flows
		}
	}
}

func newTerminalsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "terminals JAIL",
		Short: "List a jail's terminal sessions",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			list, err := c.Terminals(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), list)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 8, 2, ' ', 0)
			fmt.Fprintln(tw, "SESSION\tPID\tATTACHED\tSIZE\tSTARTED\tRECORDING\tCOMMAND")
			for _, s := range list {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%dx%d\t%s\t%s\t%s\n", s.ID, s.Pid, s.Attached, s.Cols, s.Rows,
					s.StartedAt.Local().Format(time.DateTime), s.RecordingID, strings.Join(s.Cmd, " "))
			}
			return tw.Flush()
		},
	}
}

func newRecordingsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "recordings JAIL",
		Short: "List a jail's terminal session recordings",
		Long:  `List a jail's terminal session recordings; play one with "agentjail replay ID".`,
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			list, err := c.Recordings(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), list)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 8, 2, ' ', 0)
			fmt.Fprintln(tw, "RECORDING\tSTATUS\tSIZE\tSTARTED\tCOMMAND")
			for _, r := range list {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", r.ID, r.Status, r.Size, r.StartedAt.Local().Format(time.DateTime), r.Command)
			}
			return tw.Flush()
		},
	}
}

func newReplayCmd(g *globals) *cobra.Command {
	var speed float64
	var idle time.Duration
	cmd := &cobra.Command{
		Use:   "replay [flags] RECORDING",
		Short: "Play a terminal session recording in this terminal",
		Long: `Play a recording (an id from "agentjail recordings") in this terminal at the
speed it was recorded, or --speed times faster. --idle-limit caps every pause.
A recording that was modified after it was stored is refused.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if speed <= 0 {
				return usageError{fmt.Errorf("--speed: %v must be positive", speed)}
			}
			if idle < 0 {
				return usageError{fmt.Errorf("--idle-limit: %v is negative", idle)}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			rc, err := c.OpenRecording(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			defer rc.Close()
			return replay(cmd.Context(), rc, cmd.OutOrStdout(), speed, idle)
		},
	}
	cmd.Flags().Float64Var(&speed, "speed", 1, "playback speed factor")
	cmd.Flags().DurationVar(&idle, "idle-limit", 0, "longest pause between events, e.g. 2s (0: as recorded)")
	return cmd
}

// replay writes a recording's output events to w at their pace.
func replay(ctx context.Context, r io.Reader, w io.Writer, speed float64, idle time.Duration) error {
	rd, err := asciicast.NewReader(r)
	if err != nil {
		return err
	}
	start := time.Now()
	var at time.Duration // the playback position
	last := 0.0
	timer := time.NewTimer(0)
	<-timer.C
	for {
		ev, err := rd.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		gap := time.Duration((ev.Time - last) * float64(time.Second))
		last = ev.Time
		if gap < 0 {
			gap = 0
		}
		if idle > 0 && gap > idle {
			gap = idle
		}
		at += time.Duration(float64(gap) / speed)
		if wait := time.Until(start.Add(at)); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return exitCode(exitInterrupted)
			}
		}
		if ev.Code == asciicast.Output {
			if _, err := io.WriteString(w, ev.Data); err != nil {
				return err
			}
		}
	}
}
