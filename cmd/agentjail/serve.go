package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentjail/agentjail/internal/api"
	"github.com/agentjail/agentjail/internal/jail"
)

// shutdownGrace is how long a stopping daemon waits for requests in
// flight before closing their connections (which cancels their commands).
const shutdownGrace = 10 * time.Second

func newServeCmd(g *globals) *cobra.Command {
	var runtime, poolSize string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the daemon",
		Long: `Run the daemon: the jail manager and its REST API.

On first start it writes a random API token to DATA_DIR/api-token (mode 0600).
Once listening it prints "agentjail: listening on http://HOST:PORT" to stderr
and writes HOST:PORT to DATA_DIR/daemon.addr (so --addr 127.0.0.1:0 works).
SIGINT or SIGTERM stop it; running jails keep running and are adopted by the
next start.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var pool int64
			if poolSize != "" {
				n, err := parseSize(poolSize)
				if err != nil {
					return usageError{fmt.Errorf("--pool-size: %w", err)}
				}
				pool = n
			}
			return serve(cmd.Context(), g.dataDirPath(), g.listenAddr(), runtime, pool)
		},
	}
	cmd.Flags().StringVar(&runtime, "runtime", "runc", "OCI runtime binary")
	cmd.Flags().StringVar(&poolSize, "pool-size", "", "size of the storage pool image, e.g. 64g (default: 64 GiB or 90% of the free space)")
	return cmd
}

// serve runs the daemon until ctx is cancelled.
func serve(ctx context.Context, dataDir, addr, runtime string, poolSize int64) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	token, err := api.EnsureToken(dataDir)
	if err != nil {
		return err
	}
	mgr, err := jail.NewManager(ctx, jail.Options{DataDir: dataDir, RuntimeBinary: runtime, PoolSize: poolSize, Logger: log})
	if err != nil {
		return err
	}
	defer func() {
		if err := mgr.Close(); err != nil {
			log.Error("closing the jail manager", "err", err)
		}
	}()
	return listenAndServe(ctx, api.NewServer(mgr, token, log), addr, dataDir, log, os.Stderr)
}

// listenAndServe serves h on addr until ctx is cancelled. Once listening
// it writes the bound HOST:PORT to DATA_DIR/daemon.addr (removed again on
// return) and announces it on stderr in one line.
func listenAndServe(ctx context.Context, h http.Handler, addr, dataDir string, log *slog.Logger, stderr io.Writer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	defer ln.Close()
	bound := ln.Addr().String()
	addrPath := filepath.Join(dataDir, addrFile)
	if err := writeFileAtomic(addrPath, []byte(bound+"\n"), 0o644); err != nil {
		return err
	}
	defer os.Remove(addrPath)

	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	fmt.Fprintf(stderr, "agentjail: listening on http://%s\n", bound)

	select {
	case err := <-done:
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("requests still running at shutdown; closing their connections", "err", err)
		srv.Close()
	}
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving: %w", err)
	}
	return nil
}

// writeFileAtomic replaces path with data: a reader sees the old content
// or the new, never a part.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(data)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr, os.Chmod(tmp.Name(), perm)); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
