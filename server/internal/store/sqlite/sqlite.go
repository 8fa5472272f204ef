// Package sqlite is the embedded default store: one file, no server, no cgo
// (modernc.org/sqlite).
//
// SQLite has one writer at a time, so the driver embraces it: every write goes
// through a single goroutine that groups the writes waiting at that moment
// into one transaction (group commit), each under its own savepoint. A fenced
// write reads the shard row's version inside that transaction, so the check
// and the write are atomic. Reads use a separate pool and see every committed
// write (WAL mode).
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/dtimer/dtimer/server/internal/store"
)

// Config configures the driver.
type Config struct {
	// Path of the database file; its directory is created if missing.
	Path string
	// Synchronous is SQLite's synchronous pragma: FULL (default) makes every
	// acknowledged write survive power loss; NORMAL survives a process crash
	// but may lose the last commits on power loss.
	Synchronous string
	// MaxBatch bounds how many waiting writes share one transaction.
	MaxBatch int
}

// Store implements store.Store on SQLite.
type Store struct {
	w, r   *sql.DB
	ops    chan *op
	stop   chan struct{}
	done   chan struct{}
	closed sync.Once
	batch  int
}

type op struct {
	ctx  context.Context
	fn   func(tx *sql.Tx) error
	done chan error
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the database file. It does not migrate.
func Open(cfg Config) (*Store, error) {
	if cfg.Path == "" {
		return nil, errors.New("sqlite: path is empty")
	}
	syncMode := strings.ToUpper(cfg.Synchronous)
	if syncMode == "" {
		syncMode = "FULL"
	}
	if syncMode != "FULL" && syncMode != "NORMAL" && syncMode != "EXTRA" {
		return nil, fmt.Errorf("sqlite: synchronous must be FULL, NORMAL or EXTRA, got %q", cfg.Synchronous)
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 512
	}
	if dir := filepath.Dir(cfg.Path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("sqlite: create directory: %w", err)
		}
	}
	dsn := func(extra ...string) string {
		q := url.Values{}
		q.Add("_pragma", "busy_timeout(10000)")
		q.Add("_pragma", "journal_mode(WAL)")
		q.Add("_pragma", "synchronous("+syncMode+")")
		for i := 0; i+1 < len(extra); i += 2 {
			q.Add(extra[i], extra[i+1])
		}
		return "file:" + cfg.Path + "?" + q.Encode()
	}
	w, err := sql.Open("sqlite", dsn("_txlock", "immediate"))
	if err != nil {
		return nil, fmt.Errorf("sqlite: open: %w", err)
	}
	w.SetMaxOpenConns(1)
	w.SetConnMaxIdleTime(0)
	r, err := sql.Open("sqlite", dsn("_pragma", "query_only(1)"))
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("sqlite: open: %w", err)
	}
	r.SetMaxOpenConns(4)
	// The first connection sets WAL mode, which a query_only reader cannot.
	if err := w.Ping(); err != nil {
		w.Close()
		r.Close()
		return nil, fmt.Errorf("sqlite: open %s: %w", cfg.Path, err)
	}
	s := &Store{w: w, r: r, ops: make(chan *op), stop: make(chan struct{}), done: make(chan struct{}), batch: cfg.MaxBatch}
	go s.writer()
	return s, nil
}

// Precision implements store.Store: times are stored as Unix milliseconds.
func (s *Store) Precision() time.Duration { return time.Millisecond }

// Migrate implements store.Store.
func (s *Store) Migrate(ctx context.Context) error {
	if _, err := s.w.ExecContext(ctx, schema); err != nil {
		return fmt.Errorf("sqlite: migrate: %w", err)
	}
	return nil
}

// Ping implements store.Store.
func (s *Store) Ping(ctx context.Context) error {
	return s.r.PingContext(ctx)
}

// Close implements store.Store. Writes waiting at that moment fail.
func (s *Store) Close() error {
	var err error
	s.closed.Do(func() {
		close(s.stop)
		<-s.done
		err = errors.Join(s.w.Close(), s.r.Close())
	})
	return err
}

var errClosed = errors.New("sqlite: store closed")

// write runs fn in the writer goroutine's current transaction and waits for
// the commit. fn must not use the caller's context for its statements: a
// cancelled statement would abort the whole shared transaction. fn runs under its own savepoint: if it fails, its changes are
// rolled back and the other writes of the batch still commit.
func (s *Store) write(ctx context.Context, fn func(tx *sql.Tx) error) error {
	o := &op{ctx: ctx, fn: fn, done: make(chan error, 1)}
	select {
	case s.ops <- o:
	case <-s.stop:
		return errClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	// Once taken, the op is answered: the writer never drops one.
	return <-o.done
}

func (s *Store) writer() {
	defer close(s.done)
	batch := make([]*op, 0, s.batch)
	for {
		batch = batch[:0]
		select {
		case o := <-s.ops:
			batch = append(batch, o)
		case <-s.stop:
			return
		}
	drain:
		for len(batch) < s.batch {
			select {
			case o := <-s.ops:
				batch = append(batch, o)
			default:
				break drain
			}
		}
		s.commit(batch)
	}
}

func (s *Store) commit(batch []*op) {
	results := make([]error, len(batch))
	tx, err := s.w.BeginTx(context.Background(), nil)
	if err != nil {
		for _, o := range batch {
			o.done <- fmt.Errorf("sqlite: begin: %w", err)
		}
		return
	}
	for i, o := range batch {
		if err := o.ctx.Err(); err != nil {
			results[i] = err
			continue
		}
		if _, err := tx.Exec("SAVEPOINT op"); err != nil {
			results[i] = fmt.Errorf("sqlite: savepoint: %w", err)
			continue
		}
		results[i] = o.fn(tx)
		if results[i] != nil {
			if _, err := tx.Exec("ROLLBACK TO op"); err != nil {
				results[i] = errors.Join(results[i], err)
			}
		}
		if _, err := tx.Exec("RELEASE op"); err != nil && results[i] == nil {
			results[i] = fmt.Errorf("sqlite: release savepoint: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		for i := range results {
			results[i] = fmt.Errorf("sqlite: commit: %w", err)
		}
	}
	for i, o := range batch {
		o.done <- results[i]
	}
}
