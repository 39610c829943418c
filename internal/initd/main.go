// Package initd is agentjail's in-jail init: PID 1 of every jail. It reads
// its configuration from the control directory, serves the control
// protocol of internal/initproto on a unix socket there, starts every
// command of the jail as its own descendant, reaps every zombie, forwards
// termination signals to the commands, and performs file operations
// confined to the jail's root.
//
// Commands. Init never forks commands itself: each runs under a shim, a
// root process re-executed from init's own binary (`init --shim`) that is
// a child subreaper, so every descendant of the command, including
// setsid() daemons and double-forked orphans, stays below it and can be
// killed (on timeout, cancellation, client disconnect or shutdown) until
// none is left. Shims are reused: one whose command left nothing behind
// returns to a small idle pool, so a command costs one fork+exec, not a Go
// runtime start-up. An exec ends when the command exits: output it wrote
// is delivered; background processes it left keep running (their shim
// stays with them until they exit) but lose the exec's stdout and stderr.
//
// Terminals. A PTY exec starts a terminal session: init allocates the
// pseudo-terminal from the jail's own devpts, the shim makes it the
// command's controlling terminal in a new session, and the session
// outlives the connections attached to it. Init keeps 256 KiB of recent
// output for connections that attach later, fans the output out to every
// attachment through bounded queues (one that falls behind loses output,
// never slows the others), and records the session as asciicast v2 in the
// control directory, flushed every second.
//
// Files. File operations run with init's (root) privileges and resolve
// every path with openat2(RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS) relative
// to the root's directory fd; the jail's blocked paths are checked on the
// resolved path. Writes go to a temporary file renamed over the target.
//
// The package imports only the standard library (without net/http),
// golang.org/x/sys and, for the shims' Landlock domain, internal/confine,
// so the init stays small; a test enforces it.
package initd

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentjail/agentjail/internal/initproto"
)

// shutdownGrace is how long init waits on SIGTERM/SIGINT for commands
// (and, as PID 1, every other process of the jail) to exit before it
// kills them.
const shutdownGrace = 10 * time.Second

// Main runs `agentjail init` with the arguments after "init" and returns
// the process exit code.
//
// Without flags it is the jail's init: it reads ControlDir/init.json,
// listens on ControlDir/init.sock (mode 0600), writes initproto.ReadyLine
// to its original stdout, then redirects stdout and stderr to
// ControlDir/init.log and serves until SIGTERM or SIGINT, on which it
// forwards the signal to every command, waits up to 10 s for them to exit,
// kills what is left, and returns 0. SIGHUP is forwarded only. A start
// failure is written to the original stderr and returns 1.
//
// Flags: --control-dir DIR replaces ControlDir; --shim runs the
// per-command shim (started by init itself, never by hand), confined by
// --landlock JSON (an initproto.Landlock) when given, giving each command
// --oom-score-adj when it is not 0.
func Main(args []string) int {
	fs := flag.NewFlagSet("init", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	shim := fs.Bool("shim", false, "run as a command shim (internal)")
	controlDir := fs.String("control-dir", initproto.ControlDir, "control directory")
	landlock := fs.String("landlock", "", "the shim's Landlock domain, JSON (internal)")
	oomScoreAdj := fs.Int("oom-score-adj", 0, "the oom_score_adj the shim gives each command; 0: as inherited (internal)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "agentjail init: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *shim {
		var ll *initproto.Landlock
		if *landlock != "" {
			ll = new(initproto.Landlock)
			if err := json.Unmarshal([]byte(*landlock), ll); err != nil {
				fmt.Fprintf(os.Stderr, "agentjail shim: --landlock: %v\n", err)
				return 2
			}
		}
		return runShim(ll, *oomScoreAdj)
	}
	if err := runInit(*controlDir); err != nil {
		fmt.Fprintf(os.Stderr, "agentjail init: %v\n", err)
		return 1
	}
	return 0
}

// runInit is init's life; it returns only a start error or nil after a
// graceful shutdown.
func runInit(dir string) error { return Run(dir, nil, nil) }

// Run is the life of an init whose control dir is dir: as Main describes
// (configuration, log, reaping, signals, graceful shutdown), serving the
// control protocol on l when it is not nil (connections the caller has
// vouched for: no peer check; a virtual machine's control channel), else
// on dir's control socket. Readiness is signalled by calling ready when it
// is not nil, else by writing initproto.ReadyLine to stdout. It returns a
// start error, or nil after a graceful shutdown.
func Run(dir string, l net.Listener, ready func() error) error {
	// Nothing in the jail, root included, may trace or stop init.
	if err := protectSelf(); err != nil {
		return err
	}
	// Every thread init will need, now: a full jail cannot give it one
	// later (threads.go).
	reserveThreads(initThreads)
	// Descriptors inherited beyond stdio must not reach shims and commands.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("mark inherited descriptors close-on-exec: %w", err)
	}
	data, err := os.ReadFile(filepath.Join(dir, initproto.ConfigName))
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	var cfg initproto.InitConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("parse config %s: %w", initproto.ConfigName, err)
	}
	// The daemon creates the control directory 0700; keep it so even if
	// something in the jail's image changed it.
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("control directory: %w", err)
	}
	logFile, err := os.OpenFile(filepath.Join(dir, initproto.LogName), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open log: %w", err)
	}
	defer logFile.Close()
	if os.Getpid() != 1 {
		// Outside a pid namespace, orphans of commands must still come to
		// init to be reaped.
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("set child subreaper: %w", err)
		}
	}
	// Catch the signals before anything can send them.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGHUP)

	logger := log.New(os.Stderr, "agentjail init: ", log.LstdFlags|log.Lmicroseconds)
	srv, err := NewServer(Options{
		Config: cfg, PeerCheck: l == nil, ReapAll: true, Log: logger,
		RecordDir: filepath.Join(dir, initproto.RecordingsName),
	})
	if err != nil {
		return err
	}
	if l == nil {
		if l, err = listen(filepath.Join(dir, initproto.SocketName)); err != nil {
			srv.Shutdown(context.Background())
			return err
		}
	}
	if ready == nil {
		ready = func() error {
			_, err := io.WriteString(os.Stdout, initproto.ReadyLine)
			return err
		}
	}
	if err := ready(); err != nil {
		l.Close()
		srv.Shutdown(context.Background())
		return fmt.Errorf("signal readiness: %w", err)
	}
	if err := redirectStdio(logFile); err != nil {
		// Readiness is signalled; init keeps serving and logs nowhere.
		logger.SetOutput(io.Discard)
	}
	logger.Printf("jail %s: serving on %s", cfg.JailID, l.Addr())
	go func() {
		if err := srv.Serve(l); err != nil {
			logger.Printf("serve: %v", err)
		}
	}()
	var stopped chan struct{} // closed when a shutdown has completed
	for {
		select {
		case sig := <-sigs:
			s := sig.(unix.Signal)
			// Forwarded during the grace period too. As PID 1, SIGTERM and
			// SIGINT go to every process of the jail (kill(-1) spares
			// init), background ones included; SIGHUP and an init outside
			// a pid namespace reach the running commands only.
			if os.Getpid() == 1 && s != unix.SIGHUP {
				_ = unix.Kill(-1, s)
			} else {
				srv.Forward(s)
			}
			if s == unix.SIGHUP || stopped != nil {
				continue
			}
			logger.Printf("%v: shutting down", s)
			stopped = make(chan struct{})
			go func() {
				defer close(stopped)
				ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
				defer cancel()
				if err := srv.Shutdown(ctx); err != nil {
					logger.Printf("shutdown: commands killed after %v", shutdownGrace)
				}
			}()
		case <-stopped:
			logger.Printf("shut down")
			return nil
		}
	}
}

// listen creates the control socket with mode 0600. The umask is tightened
// while it is created, so the socket is never reachable with wider
// permissions, and set to 022 afterwards, which commands inherit.
func listen(path string) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket: %w", err)
	}
	unix.Umask(0o077)
	l, err := net.Listen("unix", path)
	unix.Umask(0o022)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("chmod %s: %w", path, err)
	}
	return l, nil
}

// redirectStdio points stdout and stderr at the log and stdin at
// /dev/null, closing the original stdio inherited from the daemon.
func redirectStdio(logFile *os.File) error {
	null, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open /dev/null: %w", err)
	}
	defer unix.Close(null)
	if err := unix.Dup3(null, 0, 0); err != nil {
		return fmt.Errorf("redirect stdin: %w", err)
	}
	for _, fd := range []int{1, 2} {
		if err := unix.Dup3(int(logFile.Fd()), fd, 0); err != nil {
			return fmt.Errorf("redirect fd %d: %w", fd, err)
		}
	}
	return nil
}
