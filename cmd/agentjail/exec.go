package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/client"
)

// Exit statuses of exec and run beyond the command's own.
const (
	exitTimedOut    = 124 // the command's --timeout expired (as timeout(1))
	exitInterrupted = 130 // this process got SIGINT or SIGTERM
)

// rmTimeout bounds run --rm's cleanup, which runs after an interrupt too.
const rmTimeout = time.Minute

func newExecCmd(g *globals) *cobra.Command {
	var ef execFlags
	var env []string
	var tty bool
	cmd := &cobra.Command{
		Use:   "exec [flags] JAIL [--] CMD [ARG...]",
		Short: "Run a command in a running jail, streaming its output",
		Long: `Run a command in a running jail. Its stdout and stderr are written here as
they happen; agentjail exits with the command's status (128+N when killed by
signal N, 124 when --timeout expired). With -i, this process's stdin goes to
the command as it comes (of any size), and its end ends the command's stdin.

With -t, the command runs on a terminal in the jail (a terminal session,
recorded): this terminal is put in raw mode and connected to it, window size
changes follow. ` + detachHelp,
		Args: usageArgs(cobra.MinimumNArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			ref, argv := args[0], args[1:]
			if argv[0] == "--" {
				argv = argv[1:]
			}
			if len(argv) == 0 {
				return usageError{errors.New("exec: no command given after the jail")}
			}
			envMap, err := parseEnv("--env", env)
			if err != nil {
				return usageError{err}
			}
			if tty {
				if ef.timeout != 0 {
					return usageError{errors.New("exec: --timeout does not apply to -t")}
				}
				c, err := g.client()
				if err != nil {
					return err
				}
				return runTerminal(cmd, c, ref, client.TerminalOptions{Cmd: argv, Env: envMap, User: ef.user, Cwd: ef.cwd})
			}
			req, err := ef.request(argv, envMap)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			return ef.runExec(cmd, c, ref, req)
		},
	}
	// Flags go before the jail; everything after it is the command.
	cmd.Flags().SetInterspersed(false)
	ef.register(cmd.Flags())
	cmd.Flags().StringArrayVarP(&env, "env", "e", nil, "KEY=VALUE added to the command's environment (repeatable)")
	cmd.Flags().BoolVarP(&tty, "tty", "t", false, "run the command on a terminal, attached to this one")
	return cmd
}

// streamExec runs req in the jail, writing its output live, and returns
// the command's exit status as an exitCode (nil for 0).
func streamExec(cmd *cobra.Command, c *client.Client, ref string, req client.ExecRequest) error {
	return printStream(cmd, func(fn func(string, []byte) error) (*client.ExecResult, error) {
		return c.ExecStream(cmd.Context(), ref, req, fn)
	})
}

// runExec runs req in jail ref, writing its output live, and returns the
// command's exit status as an exitCode (nil for 0). With -i this
// process's stdin goes to the command as it comes, over the command
// WebSocket, with no bound on its size; a daemon without that route gets
// it whole in the request, read to its end first.
func (f *execFlags) runExec(cmd *cobra.Command, c *client.Client, ref string, req client.ExecRequest) error {
	if !f.stdin {
		return streamExec(cmd, c, ref, req)
	}
	ctx := cmd.Context()
	cm, err := c.Command(ctx, ref, client.CommandOptions{Cmd: req.Cmd, Env: req.Env, Cwd: req.Cwd, User: req.User, TimeoutMs: req.TimeoutMs, Stdin: true})
	if ae := (*client.APIError)(nil); errors.As(err, &ae) && ae.Status == http.StatusNotImplemented {
		b, err := io.ReadAll(cmd.InOrStdin())
		if err != nil {
			return fmt.Errorf("reading stdin: %w", err)
		}
		req.Stdin = string(b)
		return streamExec(cmd, c, ref, req)
	}
	if err != nil {
		return err
	}
	defer cm.Close()
	// The input goes until stdin ends, or the daemon refuses it: the
	// command closed its stdin or exited (409; as in a shell pipeline, the
	// rest is then dropped quietly), or it stopped reading (a warning).
	// Output and the exit status come either way.
	var stopOnce sync.Once
	stopped := make(chan struct{})
	stop := func() { stopOnce.Do(func() { close(stopped) }) }
	go func() {
		in := cmd.InOrStdin()
		buf := make([]byte, 32<<10)
		for {
			n, err := in.Read(buf)
			select {
			case <-stopped:
				return
			default:
			}
			if n > 0 {
				if _, err := cm.Write(buf[:n]); err != nil {
					return
				}
			}
			if errors.Is(err, io.EOF) {
				_ = cm.CloseStdin(ctx)
			}
			if err != nil {
				return
			}
		}
	}()
	warned := false
	return printStream(cmd, func(fn func(string, []byte) error) (*client.ExecResult, error) {
		for {
			stream, data, err := cm.Next(ctx)
			if errors.Is(err, io.EOF) {
				ex, _ := cm.Exit()
				return &client.ExecResult{ExitCode: ex.Code, Signal: ex.Signal, TimedOut: ex.TimedOut}, nil
			}
			var refused *client.APIError
			if errors.As(err, &refused) {
				stop()
				if !warned && !client.IsConflict(refused) {
					fmt.Fprintf(cmd.ErrOrStderr(), "agentjail: %v; the rest of stdin is not sent\n", refused)
				}
				warned = true
				continue
			}
			if err != nil {
				return nil, err
			}
			name := "stdout"
			if stream == client.Stderr {
				name = "stderr"
			}
			if err := fn(name, data); err != nil {
				return nil, err
			}
		}
	})
}

// printStream runs a streamed command (run passes fn each chunk), writes
// its output here as it comes, and turns its exit into agentjail's.
func printStream(cmd *cobra.Command, run func(fn func(stream string, data []byte) error) (*client.ExecResult, error)) error {
	stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
	res, err := run(func(stream string, data []byte) error {
		w := stdout
		if stream == "stderr" {
			w = stderr
		}
		_, err := w.Write(data)
		return err
	})
	if err != nil {
		if cmd.Context().Err() != nil {
			return exitCode(exitInterrupted)
		}
		return err
	}
	if code := resultStatus(res); code != 0 {
		return exitCode(code)
	}
	return nil
}

// resultStatus is the exit status that reflects a command's result.
func resultStatus(res *client.ExecResult) int {
	switch {
	case res.TimedOut:
		return exitTimedOut
	case res.Signal != "" && res.ExitCode < 128:
		if n := unix.SignalNum(res.Signal); n != 0 {
			return 128 + int(n)
		}
	}
	return res.ExitCode
}

func newRunCmd(g *globals) *cobra.Command {
	var cf createFlags
	var ef execFlags
	var rm bool
	cmd := &cobra.Command{
		Use:   "run [--rm] [flags] [IMAGE] [--] CMD [ARG...]",
		Short: "Create a jail, run one command in it, and exit with its status",
		Long: `Create and start a jail, run CMD in it streaming its output, and exit with its
status. With --rm the jail is destroyed afterwards, also when interrupted.

With an IMAGE before "--" (or a lone argument that names an image, holding ':',
'/' or '@'), the jail's root is that image (pulled first when the daemon lacks
it), with its Env, WorkingDir and User; CMD follows the image's entrypoint and
defaults to its Cmd:

  agentjail run --rm python:3.12-slim -- python -c 'print(1)'`,
		Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] == "--" {
				args = args[1:]
			}
			var imageRef string
			switch {
			case len(args) >= 2 && args[1] == "--":
				imageRef, args = args[0], args[2:]
			case len(args) == 1 && strings.ContainsAny(args[0], ":/@"):
				imageRef, args = args[0], nil
			}
			if len(args) == 0 && imageRef == "" {
				return usageError{errors.New("run: no command given")}
			}
			creq, err := cf.request(cmd.InOrStdin())
			if err != nil {
				return err
			}
			var c *client.Client
			if imageRef != "" {
				if c, err = g.client(); err != nil {
					return err
				}
				img, err := ensureImage(cmd.Context(), c, imageRef, cmd.ErrOrStderr())
				if err != nil {
					return err
				}
				creq.Config.Isolation.Filesystem.Rootfs = "image:" + imageRef
				if args = imageCommand(img.Config, args); len(args) == 0 {
					return usageError{fmt.Errorf("run: image %s has no Cmd or Entrypoint: give a command after --", imageRef)}
				}
			}
			if cf.file == "-" && ef.stdin {
				return usageError{errors.New("run: -f - and -i both read stdin")}
			}
			ereq, err := ef.request(args, nil)
			if err != nil {
				return err
			}
			if c == nil {
				if c, err = g.client(); err != nil {
					return err
				}
			}
			j, err := c.Create(cmd.Context(), creq)
			if err != nil {
				return err
			}
			runErr := ef.runExec(cmd, c, j.ID, ereq)
			if rm {
				// The command's context may be cancelled (Ctrl-C); clean up
				// on a context of our own.
				ctx, cancel := context.WithTimeout(context.Background(), rmTimeout)
				defer cancel()
				if err := removeJail(ctx, c, j.ID, true); err != nil {
					err = fmt.Errorf("removing jail %s: %w", j.ID, err)
					if runErr == nil {
						return err
					}
					// Keep the command's status; still say what was left behind.
					fmt.Fprintf(cmd.ErrOrStderr(), "agentjail: %v\n", err)
				}
			} else if !g.json {
				fmt.Fprintf(cmd.ErrOrStderr(), "agentjail: jail %s kept (remove it with: agentjail rm -f %s)\n", j.ID, j.ID)
			}
			return runErr
		},
	}
	cmd.Flags().SetInterspersed(false)
	cf.register(cmd.Flags(), false)
	ef.register(cmd.Flags())
	cmd.Flags().BoolVar(&rm, "rm", false, "destroy the jail when the command ends")
	return cmd
}
