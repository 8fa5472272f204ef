// Package ceiling measures the machine's own limits for the operations a
// timer service is built from: POSTing a callback over HTTP, and inserting
// and deleting a timer-shaped row in PostgreSQL, each done as plainly as
// possible. A timer service cannot beat these rates on the same machine, so
// they put the benchmark's figures for dtimer and River in proportion: how
// much of the available speed each system's own work (scheduling, locking,
// bookkeeping) costs.
package ceiling

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dtimer/dtimer/benchmark/internal/stats"
)

// Result is the outcome of one measurement.
type Result struct {
	Name        string  `json:"name"` // "http-post", "pg-insert", "pg-delete"
	Concurrency int     `json:"concurrency"`
	Ops         int     `json:"ops"`
	Seconds     float64 `json:"seconds"`
	PerSecond   float64 `json:"perSecond"`
	P50Ms       float64 `json:"p50Ms"`
	P99Ms       float64 `json:"p99Ms"`
}

// result summarises per-op durations measured over elapsed wall time.
func result(name string, concurrency int, durs []time.Duration, elapsed time.Duration) Result {
	r := Result{Name: name, Concurrency: concurrency, Ops: len(durs), Seconds: elapsed.Seconds()}
	if r.Seconds > 0 {
		r.PerSecond = float64(r.Ops) / r.Seconds
	}
	sum := stats.Summarize(durs)
	r.P50Ms, r.P99Ms = sum.P50, sum.P99
	return r
}

// run calls op from concurrency goroutines, each until op reports it is out
// of work (false), d has passed or an error occurs, and returns the per-op
// durations and the wall time until all goroutines stopped. op receives its
// goroutine's index and its call count within that goroutine.
func run(ctx context.Context, concurrency int, d time.Duration, op func(ctx context.Context, g, n int) (more bool, err error)) ([]time.Duration, time.Duration, error) {
	if concurrency < 1 {
		return nil, 0, fmt.Errorf("concurrency %d < 1", concurrency)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	perG := make([][]time.Duration, concurrency)
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for g := range concurrency {
		wg.Go(func() {
			for n := 0; time.Now().Before(deadline) && ctx.Err() == nil; n++ {
				t0 := time.Now()
				more, err := op(ctx, g, n)
				if err != nil {
					cancel(err)
					return
				}
				if !more {
					return
				}
				perG[g] = append(perG[g], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := context.Cause(ctx); err != nil {
		return nil, 0, err
	}
	return slices.Concat(perG...), elapsed, nil
}

// HTTPPost measures the rate at which a keep-alive Go http.Client POSTs body
// (as application/json) to url from concurrency goroutines for d. Any
// transport error or non-2xx answer ends the measurement with an error.
func HTTPPost(ctx context.Context, url string, body []byte, concurrency int, d time.Duration) (Result, error) {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = concurrency
	t.MaxIdleConnsPerHost = concurrency
	client := &http.Client{Transport: t, Timeout: 30 * time.Second}
	defer t.CloseIdleConnections()

	durs, elapsed, err := run(ctx, concurrency, d, func(ctx context.Context, _, _ int) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return false, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return false, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode > 299 {
			return false, errors.New("POST answered " + resp.Status)
		}
		return true, nil
	})
	if err != nil {
		return Result{}, fmt.Errorf("ceiling: http-post: %w", err)
	}
	return result("http-post", concurrency, durs, elapsed), nil
}

// PGInsert measures single-row INSERTs only (see PGInsertDelete).
func PGInsert(ctx context.Context, pgURL string, concurrency int, d time.Duration) (Result, error) {
	ins, _, err := pgInsertDelete(ctx, pgURL, concurrency, d, false)
	return ins, err
}

// PGInsertDelete measures the PostgreSQL at pgURL with a pool of concurrency
// connections and as many goroutines: first single-row INSERTs into a
// throw-away timer-shaped table for d, then single-row DELETEs by primary
// key of the inserted rows for d, or until they are all deleted. Every
// statement is autocommitted and prepared (pgx's default). The table is
// dropped afterwards.
func PGInsertDelete(ctx context.Context, pgURL string, concurrency int, d time.Duration) (insert, delete Result, err error) {
	return pgInsertDelete(ctx, pgURL, concurrency, d, true)
}

func pgInsertDelete(ctx context.Context, pgURL string, concurrency int, d time.Duration, withDelete bool) (ins, del Result, err error) {
	if concurrency < 1 {
		return Result{}, Result{}, fmt.Errorf("ceiling: concurrency %d < 1", concurrency)
	}
	cfg, err := pgxpool.ParseConfig(pgURL)
	if err != nil {
		return Result{}, Result{}, fmt.Errorf("ceiling: parse postgres url: %w", err)
	}
	cfg.MaxConns = int32(concurrency)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return Result{}, Result{}, fmt.Errorf("ceiling: open pool: %w", err)
	}
	defer pool.Close()
	if err := warm(ctx, pool, concurrency); err != nil {
		return Result{}, Result{}, fmt.Errorf("ceiling: connect: %w", err)
	}

	b := make([]byte, 6)
	_, _ = rand.Read(b)
	table := pgx.Identifier{"ceiling_timers_" + hex.EncodeToString(b)}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+table+
		" (id text PRIMARY KEY, execute_at timestamptz, callback_url text, payload text)"); err != nil {
		return Result{}, Result{}, fmt.Errorf("ceiling: create table: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if _, derr := pool.Exec(dctx, "DROP TABLE IF EXISTS "+table); derr != nil && err == nil {
			err = fmt.Errorf("ceiling: drop table: %w", derr)
		}
	}()

	const callbackURL = "http://127.0.0.1:8080/callback"
	const payload = `{"orderId":"ord-000123","action":"expire","attempt":1,"note":"ceiling"}`
	insertSQL := "INSERT INTO " + table + " (id, execute_at, callback_url, payload) VALUES ($1, $2, $3, $4)"
	base := time.Now().Add(time.Hour)
	inserted := make([]int, concurrency) // rows inserted per goroutine; ids are g<g>-<n>
	durs, elapsed, err := run(ctx, concurrency, d, func(ctx context.Context, g, n int) (bool, error) {
		at := base.Add(time.Duration(n*concurrency+g) * time.Microsecond)
		if _, err := pool.Exec(ctx, insertSQL, rowID(g, n), at, callbackURL, payload); err != nil {
			return false, err
		}
		inserted[g] = n + 1
		return true, nil
	})
	if err != nil {
		return Result{}, Result{}, fmt.Errorf("ceiling: pg-insert: %w", err)
	}
	ins = result("pg-insert", concurrency, durs, elapsed)
	if !withDelete {
		return ins, Result{}, nil
	}

	deleteSQL := "DELETE FROM " + table + " WHERE id = $1"
	durs, elapsed, err = run(ctx, concurrency, d, func(ctx context.Context, g, n int) (bool, error) {
		if n >= inserted[g] {
			return false, nil // out of rows
		}
		tag, err := pool.Exec(ctx, deleteSQL, rowID(g, n))
		if err != nil {
			return false, err
		}
		if tag.RowsAffected() != 1 {
			return false, fmt.Errorf("delete %s: %d rows affected", rowID(g, n), tag.RowsAffected())
		}
		return true, nil
	})
	if err != nil {
		return ins, Result{}, fmt.Errorf("ceiling: pg-delete: %w", err)
	}
	return ins, result("pg-delete", concurrency, durs, elapsed), nil
}

func rowID(g, n int) string { return fmt.Sprintf("g%d-%d", g, n) }

// warm opens all n pool connections before timing starts.
func warm(ctx context.Context, pool *pgxpool.Pool, n int) error {
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	return nil
}
