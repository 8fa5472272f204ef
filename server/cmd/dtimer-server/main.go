// Command dtimer-server runs a dtimer node.
//
//	dtimer-server [serve] [--config FILE]   serve the API and fire timers
//	dtimer-server migrate [--config FILE]   create or upgrade the store schema
//	dtimer-server healthcheck [--ready]     ask the local node's /health (or
//	                                        /ready); exit 0 if it answers 200
//
// healthcheck is for container images without a shell or curl.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/dtimer/dtimer/server/internal/app"
	"github.com/dtimer/dtimer/server/internal/config"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "dtimer-server:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	cmd := "serve"
	if len(args) > 0 && (args[0] == "serve" || args[0] == "migrate" || args[0] == "healthcheck") {
		cmd, args = args[0], args[1:]
	}
	fs := flag.NewFlagSet("dtimer-server "+cmd, flag.ContinueOnError)
	path := fs.String("config", "", "YAML config file (every key can also be set as DTIMER_<KEY>)")
	ready := fs.Bool("ready", false, "healthcheck: ask /ready (store reachable, shards owned) instead of /health")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (commands: serve, migrate, healthcheck)", fs.Arg(0))
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	if cmd == "healthcheck" {
		path := "/health"
		if *ready {
			path = "/ready"
		}
		return healthcheck(cfg.HTTP.Address, path)
	}
	log, err := newLogger(cfg.Log)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cmd == "migrate" {
		if err := app.Migrate(ctx, cfg); err != nil {
			return err
		}
		log.Info("schema is up to date", zap.String("store", cfg.Store.Driver))
		return nil
	}
	return app.Run(ctx, cfg, log, nil)
}

func newLogger(c config.Log) (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(c.Level)
	if err != nil {
		return nil, fmt.Errorf("config key log.level: %w", err)
	}
	zc := zap.NewProductionConfig()
	if c.Format == "console" {
		zc = zap.NewDevelopmentConfig()
	}
	zc.Level = zap.NewAtomicLevelAt(level)
	zc.Sampling = nil
	return zc.Build()
}

// healthcheck GETs path from the node listening on address (http.address),
// over loopback when it listens on every interface.
func healthcheck(address, path string) error {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("config key http.address: %w", err)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	client := &http.Client{Timeout: 3 * time.Second}
	resp, err := client.Get("http://" + net.JoinHostPort(host, port) + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %s", path, resp.Status)
	}
	return nil
}
