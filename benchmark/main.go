// Command benchmark measures dtimer: how late its timers fire, how many it
// fires and takes per second, and what that costs its database, on every
// store driver it can reach, side by side with a peer (River on the same
// PostgreSQL) and with this machine's own ceilings, in one run.
//
//	go run ./benchmark                      # every workload, every reachable driver
//	go run ./benchmark --smoke              # seconds: proves the harness works
//	go run ./benchmark --target http://host:8080 --workloads create,burst,steady
//
// See benchmark/README.md for the workloads, flags and how to read results.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/dtimer/dtimer/benchmark/internal/river"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "river-worker" {
		os.Exit(riverWorker(os.Args[2:]))
	}
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "benchmark:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "benchmark:", err)
		os.Exit(1)
	}
}

// riverWorker is the child process that runs the peer's workers (see
// system.River): it prints "ready" once River runs and stops on SIGTERM.
func riverWorker(args []string) int {
	fs := flag.NewFlagSet("river-worker", flag.ContinueOnError)
	var c river.WorkerConfig
	var pool int
	fs.StringVar(&c.PGURL, "pg-url", "", "")
	fs.BoolVar(&c.Tuned, "tuned", false, "")
	fs.IntVar(&c.Workers, "workers", 0, "")
	fs.DurationVar(&c.FetchCooldown, "fetch-cooldown", 0, "")
	fs.DurationVar(&c.FetchPollInterval, "fetch-poll-interval", 0, "")
	fs.DurationVar(&c.SchedulerInterval, "scheduler-interval", 0, "")
	fs.IntVar(&pool, "pool", 0, "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	c.PoolSize = int32(pool)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ready := make(chan struct{})
	go func() {
		select {
		case <-ready:
			fmt.Println("ready")
		case <-ctx.Done():
		}
	}()
	if err := river.RunWorker(ctx, c, ready); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "river-worker:", err)
		return 1
	}
	return 0
}

// deadline bounds a whole run.
const deadline = 3 * time.Hour
