// Package river runs River (github.com/riverqueue/river), a PostgreSQL job
// queue, as the benchmark's peer system: each timer becomes a River job
// scheduled at the timer's execute time, whose worker POSTs the callback to
// the receiver, so both systems do the same job against the same database.
//
// River is measured twice. At its defaults, because that is what a user gets
// and its defaults favour a light database load over punctuality (it looks
// for due jobs once a second). Tuned, because a comparison against River at
// settings it was never meant to be judged by would be unfair: fetching every
// millisecond with many workers shows the best precision and throughput it
// reaches here.
//
// Its job scheduler, which turns "scheduled" jobs into "available" ones,
// cannot be tuned: River v0.51.1 keeps its interval in an unexported Config
// field, fixed at 5 s. Each pass promotes the jobs due within the next 5 s
// (a look-ahead) and workers only lock jobs already due, so a job in the
// table at the last pass before its time runs within about a fetch poll
// interval of it, while a job inserted after that pass (less than 5 s before
// it is due) waits for the next pass: up to 5 s late, tuned or not.
package river

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	riverq "github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// River's effective defaults, as v0.51.1 defines them.
const (
	// DefaultWorkers is the MaxWorkers River's documentation configures for
	// the default queue (doc.go, "Starting a client"); River has no default
	// of its own and requires it to be given.
	DefaultWorkers = 100
	// SchedulerInterval is JobSchedulerIntervalDefault in River's
	// internal/maintenance/job_scheduler.go; it cannot be configured.
	SchedulerInterval = 5 * time.Second

	// Tuned defaults.
	TunedWorkers           = 1000
	TunedFetchCooldown     = time.Millisecond // riverq.FetchCooldownMin
	TunedFetchPollInterval = time.Millisecond // riverq.FetchPollIntervalMin

	jobKind     = "dtimer_benchmark_callback"
	stopTimeout = 10 * time.Second
)

// Job is one scheduled callback.
type Job struct {
	ID        string          // the timer id, unique per run
	ExecuteAt time.Time       // when it is due (River's ScheduledAt)
	URL       string          // receiver URL to POST to
	Payload   json.RawMessage // small JSON object
}

// callbackArgs are the job's River args. ExecuteAt is kept here, not only in
// River's scheduled_at, because River overwrites scheduled_at on a retry.
type callbackArgs struct {
	ID        string          `json:"id"`
	ExecuteAt time.Time       `json:"executeAt"`
	URL       string          `json:"url"`
	Payload   json.RawMessage `json:"payload,omitempty"`
}

func (callbackArgs) Kind() string { return jobKind }

// insertParams turns j into River insert parameters. A job not due in the
// future is inserted without ScheduledAt, River's way to run a job now: a
// ScheduledAt, even a past one, makes the job wait for the scheduler's next
// pass (up to 5 s). A future time is rounded up to PostgreSQL's microsecond
// so that River never runs the job before ExecuteAt.
func insertParams(j Job, now time.Time) riverq.InsertManyParams {
	p := riverq.InsertManyParams{Args: callbackArgs{ID: j.ID, ExecuteAt: j.ExecuteAt, URL: j.URL, Payload: j.Payload}}
	if j.ExecuteAt.After(now) {
		at := j.ExecuteAt.Truncate(time.Microsecond)
		if at.Before(j.ExecuteAt) {
			at = at.Add(time.Microsecond)
		}
		p.InsertOpts = &riverq.InsertOpts{ScheduledAt: at}
	}
	return p
}

// Version is the River module version linked in (v0.51.1 if unknown).
func Version() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == "github.com/riverqueue/river" {
				if m.Replace != nil && m.Replace.Version != "" {
					return m.Replace.Version
				}
				if m.Version != "" && m.Version != "(devel)" {
					return m.Version
				}
			}
		}
	}
	return "v0.51.1"
}

// logger keeps River's own logging (warnings and errors) off stdout, which
// River uses by default and the benchmark keeps for its results.
func logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// newPool opens a pgx pool of size conns (pgxpool's default when 0).
func newPool(ctx context.Context, pgURL string, size int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(pgURL)
	if err != nil {
		return nil, fmt.Errorf("river: parse postgres url: %w", err)
	}
	if size > 0 {
		cfg.MaxConns = size
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("river: open pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("river: ping postgres: %w", err)
	}
	return pool, nil
}

// Migrate creates River's tables (rivermigrate up to the latest) in the
// database at pgURL. Idempotent.
func Migrate(ctx context.Context, pgURL string) error {
	pool, err := newPool(ctx, pgURL, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	m, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: logger()})
	if err != nil {
		return fmt.Errorf("river: migrator: %w", err)
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river: migrate up: %w", err)
	}
	return nil
}

// Inserter inserts jobs from the benchmark's client side: an insert-only
// River client (no queues, no workers).
type Inserter struct {
	pool   *pgxpool.Pool
	client *riverq.Client[pgx.Tx]
}

// NewInserter opens a pool of poolSize connections to pgURL (pgxpool's
// default when 0).
func NewInserter(ctx context.Context, pgURL string, poolSize int32) (*Inserter, error) {
	pool, err := newPool(ctx, pgURL, poolSize)
	if err != nil {
		return nil, err
	}
	client, err := riverq.NewClient(riverpgxv5.New(pool), &riverq.Config{Logger: logger()})
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("river: insert client: %w", err)
	}
	return &Inserter{pool: pool, client: client}, nil
}

// Insert inserts one job with River's Client.Insert (one transaction).
func (i *Inserter) Insert(ctx context.Context, j Job) error {
	p := insertParams(j, time.Now())
	if _, err := i.client.Insert(ctx, p.Args, p.InsertOpts); err != nil {
		return fmt.Errorf("river: insert %s: %w", j.ID, err)
	}
	return nil
}

// InsertMany inserts jobs in one transaction with River's fastest bulk
// insert, InsertManyFast (COPY FROM). Callers bound the batch size.
func (i *Inserter) InsertMany(ctx context.Context, jobs []Job) error {
	if len(jobs) == 0 {
		return nil
	}
	now := time.Now()
	params := make([]riverq.InsertManyParams, len(jobs))
	for k, j := range jobs {
		params[k] = insertParams(j, now)
	}
	n, err := i.client.InsertManyFast(ctx, params)
	if err != nil {
		return fmt.Errorf("river: insert %d jobs: %w", len(jobs), err)
	}
	if n != len(jobs) {
		return fmt.Errorf("river: inserted %d of %d jobs", n, len(jobs))
	}
	return nil
}

// Close closes the pool.
func (i *Inserter) Close() { i.pool.Close() }

// WorkerConfig selects River's settings.
type WorkerConfig struct {
	PGURL string
	// Tuned false: River's defaults for everything; the fetch settings below
	// are ignored and Workers defaults to DefaultWorkers. Tuned true: the
	// settings below, each defaulting to its Tuned* constant when zero.
	Tuned bool
	// Workers is the default queue's MaxWorkers.
	Workers int
	// FetchCooldown and FetchPollInterval are River's Config fields of the
	// same name (tuned only; River's minimum is 1 ms for both).
	FetchCooldown, FetchPollInterval time.Duration
	// SchedulerInterval must be zero or SchedulerInterval (5 s): River
	// v0.51.1 does not let it be changed (see the package comment).
	SchedulerInterval time.Duration
	// PoolSize is the pgx pool size (pgxpool's default, max(4, NumCPU), when 0).
	PoolSize int32
}

// effective are the settings a WorkerConfig runs River with.
type effective struct {
	workers                  int
	fetchCooldown, fetchPoll time.Duration
}

func (c WorkerConfig) effective() effective {
	if !c.Tuned {
		return effective{
			workers:       cmpOr(c.Workers, DefaultWorkers),
			fetchCooldown: riverq.FetchCooldownDefault,
			fetchPoll:     riverq.FetchPollIntervalDefault,
		}
	}
	return effective{
		workers:       cmpOr(c.Workers, TunedWorkers),
		fetchCooldown: cmpOr(c.FetchCooldown, TunedFetchCooldown),
		fetchPoll:     cmpOr(c.FetchPollInterval, TunedFetchPollInterval),
	}
}

func cmpOr[T comparable](v, dflt T) T {
	var zero T
	if v == zero {
		return dflt
	}
	return v
}

// Describe returns a one-line human description of the effective settings.
func (c WorkerConfig) Describe() string {
	e := c.effective()
	mode := "defaults"
	if c.Tuned {
		mode = "tuned"
	}
	pool := "pgxpool default"
	if c.PoolSize > 0 {
		pool = fmt.Sprint(c.PoolSize)
	}
	return fmt.Sprintf("River %s %s: %d workers, fetch cooldown %s, fetch poll interval %s, scheduler interval %s (fixed, %s look-ahead), pool %s",
		Version(), mode, e.workers, e.fetchCooldown, e.fetchPoll, SchedulerInterval, SchedulerInterval, pool)
}

// clientConfig builds River's Config for c. Fetch settings are only set
// when tuned, so that the defaults config really is River's defaults.
func (c WorkerConfig) clientConfig(workers *riverq.Workers) *riverq.Config {
	e := c.effective()
	rc := &riverq.Config{
		Logger:  logger(),
		Queues:  map[string]riverq.QueueConfig{riverq.QueueDefault: {MaxWorkers: e.workers}},
		Workers: workers,
	}
	if c.Tuned {
		rc.FetchCooldown = e.fetchCooldown
		rc.FetchPollInterval = e.fetchPoll
	}
	return rc
}

// RunWorker runs a River client working the default queue until ctx is done,
// then stops it gracefully: running jobs get up to 10 s to finish before
// they are cancelled. ready (if not nil) is closed once the client started.
func RunWorker(ctx context.Context, cfg WorkerConfig, ready chan<- struct{}) error {
	if cfg.SchedulerInterval != 0 && cfg.SchedulerInterval != SchedulerInterval {
		return fmt.Errorf("river: SchedulerInterval %s: River %s fixes it at %s", cfg.SchedulerInterval, Version(), SchedulerInterval)
	}
	e := cfg.effective()
	pool, err := newPool(ctx, cfg.PGURL, cfg.PoolSize)
	if err != nil {
		return err
	}
	defer pool.Close()

	workers := riverq.NewWorkers()
	riverq.AddWorker(workers, &callbackWorker{http: newHTTPClient(e.workers)})
	client, err := riverq.NewClient(riverpgxv5.New(pool), cfg.clientConfig(workers))
	if err != nil {
		return fmt.Errorf("river: client: %w", err)
	}
	// Cancelling Start's context would be a hard stop (running jobs
	// cancelled at once), so the client runs detached and is stopped below.
	if err := client.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("river: start: %w", err)
	}
	if ready != nil {
		close(ready)
	}
	<-ctx.Done()

	stopCtx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	if err := client.Stop(stopCtx); err == nil {
		return nil
	}
	hardCtx, cancelHard := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelHard()
	if err := client.StopAndCancel(hardCtx); err != nil {
		return fmt.Errorf("river: stop: %w", err)
	}
	return fmt.Errorf("river: jobs still running %s after stop were cancelled", stopTimeout)
}

// newHTTPClient returns a keep-alive client that can hold an idle
// connection per worker.
func newHTTPClient(workers int) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = workers
	t.MaxIdleConnsPerHost = workers
	return &http.Client{Transport: t, Timeout: 30 * time.Second}
}

// callbackBody is what the worker POSTs, field for field like dtimer's
// callback.
type callbackBody struct {
	Namespace string          `json:"namespace"`
	TimerID   string          `json:"timerId"`
	ExecuteAt string          `json:"executeAt"`
	Payload   json.RawMessage `json:"payload"`
	Attempt   int             `json:"attempt"`
}

type callbackWorker struct {
	riverq.WorkerDefaults[callbackArgs]
	http *http.Client
}

// Work POSTs the callback; an error (River retries it) on a transport error
// or a non-2xx answer.
func (w *callbackWorker) Work(ctx context.Context, job *riverq.Job[callbackArgs]) error {
	a := job.Args
	body, err := json.Marshal(callbackBody{
		Namespace: "river",
		TimerID:   a.ID,
		ExecuteAt: a.ExecuteAt.UTC().Format(time.RFC3339Nano),
		Payload:   a.Payload,
		Attempt:   job.Attempt,
	})
	if err != nil {
		return fmt.Errorf("encode callback: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.URL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("callback request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := w.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	// Drain (boundedly) so that the connection is reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return errors.New("callback answered " + resp.Status)
	}
	return nil
}
