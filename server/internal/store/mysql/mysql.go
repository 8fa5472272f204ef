// Package mysql is the MySQL and MariaDB store driver
// (github.com/go-sql-driver/mysql), for MySQL 8 and MariaDB 10.11 on InnoDB.
//
// Schema (see schema.go): one table, clustered by its primary key (namespace,
// shard_id, row_type, execute_at, timer_uuid), so the engine's window read and
// range delete are range scans of the clustered index; a unique key on
// (namespace, shard_id, timer_id) finds a timer by id.
//
// Fencing: a fenced write is one batch of statements sent in one round trip
// (queries.go, fenceBegin): it opens a transaction, locks the shard row in
// share mode and records whether it still has the fence's version in a user
// variable, runs the write with that variable in its WHERE, and commits. The
// share lock conflicts with the exclusive lock of a claim's UPDATE, so a claim
// waits for every fenced write in flight and a fenced write that starts while
// a claim is in flight waits for it, then sees the new version and writes
// nothing. So once ShardClaim has returned, no write made under an older
// fence can commit.
//
// InnoDB resolves a deadlock by rolling one transaction back whole; the driver
// retries such a transaction (and an upsert that lost a race to insert the same
// timer) a few times before it returns the error, so callers do not see the
// deadlocks that concurrent writes to one shard cause.
package mysql

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/timer"
)

// Config configures the driver.
type Config struct {
	// DSN is a go-sql-driver/mysql data source name,
	// user:password@tcp(host:port)/database?param=value. The database must
	// exist; Migrate creates the driver's table in it. The driver sets the
	// parameters it depends on itself (parseTime, loc, interpolateParams,
	// multiStatements, clientFoundRows, sql_mode, autocommit), whatever the
	// DSN says. Leave the isolation level out of it: MySQL 8 names it
	// transaction_isolation and MariaDB 10.11 tx_isolation, each refuses the
	// other's name, and the driver sets the level it needs per transaction.
	DSN string
	// MaxConns caps the open connections; 0 means DefaultMaxConns.
	MaxConns int
}

// DefaultMaxConns is the pool size when Config.MaxConns is 0.
const DefaultMaxConns = 16

// Store implements store.Store on MySQL or MariaDB.
type Store struct {
	db       *sql.DB
	database string
}

var _ store.Store = (*Store)(nil)

// precision is DATETIME(3)'s: milliseconds.
const precision = time.Millisecond

// sqlMode is the session's: strict, so that a value that does not fit is an
// error instead of being cut short, and without modes that change how the
// statements parse (ANSI_QUOTES, NO_BACKSLASH_ESCAPES...) or that let the
// server create the table in another engine than InnoDB.
const sqlMode = "'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION'"

// New connects to the database and checks that it answers. It does not
// migrate.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.DSN == "" {
		return nil, errors.New("mysql: dsn is empty")
	}
	if cfg.MaxConns < 0 {
		return nil, fmt.Errorf("mysql: max conns must not be negative, got %d", cfg.MaxConns)
	}
	if cfg.MaxConns == 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	dc, err := gomysql.ParseDSN(cfg.DSN)
	if err != nil {
		// A parse error may quote the DSN, password included; do not echo it.
		return nil, errors.New("mysql: cannot parse dsn (user:password@tcp(host:port)/database?param=value)")
	}
	if dc.DBName == "" {
		return nil, errors.New("mysql: dsn names no database (…/database at its end)")
	}
	// DATETIME values carry no zone: they are written and read as UTC.
	dc.ParseTime = true
	dc.Loc = time.UTC
	// Arguments are escaped into the statement text by the client: one round
	// trip per statement instead of prepare, execute and close, and batches of
	// statements (multiStatements) with arguments.
	dc.InterpolateParams = true
	dc.MultiStatements = true
	// Rows matched, not rows changed: an UPDATE that writes the values a row
	// already has still reports the row, which the fenced writes rely on.
	dc.ClientFoundRows = true
	if dc.Params == nil {
		dc.Params = map[string]string{}
	}
	dc.Params["sql_mode"] = sqlMode
	// Claims and releases are single statements that must commit on their
	// own; fenced writes open their transaction explicitly.
	dc.Params["autocommit"] = "1"
	if dc.Timeout == 0 {
		dc.Timeout = 10 * time.Second
	}
	conn, err := gomysql.NewConnector(dc)
	if err != nil {
		// Its errors name a setting, not the DSN: an unsafe collation with
		// interpolateParams, an unknown TLS config.
		return nil, fmt.Errorf("mysql: invalid dsn: %w", err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(cfg.MaxConns)
	db.SetMaxIdleConns(cfg.MaxConns)
	// Below the servers' and proxies' usual idle timeouts.
	db.SetConnMaxLifetime(3 * time.Minute)
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, translate("connect", err)
	}
	return &Store{db: db, database: dc.DBName}, nil
}

// Precision implements store.Store.
func (s *Store) Precision() time.Duration { return precision }

// migrateLockWait bounds how long Migrate waits for another node's migration.
const migrateLockWait = 60 // seconds

// Migrate implements store.Store. Nodes starting together may all migrate: a
// named lock, keyed by the database, serialises them. (CREATE TABLE IF NOT
// EXISTS alone is safe to race; the lock is for the ALTERs of later
// versions.)
func (s *Store) Migrate(ctx context.Context) error {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return translate("migrate", err)
	}
	defer conn.Close()

	// Lock names are at most 64 characters, database names too: hash it.
	sum := sha256.Sum256([]byte(s.database))
	lock := "dtimer.migrate." + hex.EncodeToString(sum[:16])
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, ?)`, lock, migrateLockWait).Scan(&got); err != nil {
		return translate("migrate", err)
	}
	if got.Int64 != 1 {
		return fmt.Errorf("mysql: migrate: another node held the migration lock for %ds", migrateLockWait)
	}
	defer func() {
		// The lock also goes when the connection closes.
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), `DO RELEASE_LOCK(?)`, lock)
	}()
	if _, err := conn.ExecContext(ctx, schemaSQL); err != nil {
		return translate("migrate", err)
	}
	return nil
}

// Ping implements store.Store.
func (s *Store) Ping(ctx context.Context) error {
	return translate("ping", s.db.PingContext(ctx))
}

// Close implements store.Store.
func (s *Store) Close() error {
	return s.db.Close()
}

// ShardGet implements store.Store.
func (s *Store) ShardGet(ctx context.Context, key store.ShardKey) (*store.Shard, error) {
	sh := &store.Shard{Key: key}
	var owner []byte
	err := s.db.QueryRowContext(ctx, shardGet, []byte(key.Namespace), key.Shard).Scan(&sh.Version, &owner, &sh.ClaimedAt)
	if err != nil {
		return nil, translateNoRows("shard get", err, store.ErrShardNotFound)
	}
	sh.Owner = string(owner)
	sh.ClaimedAt = sh.ClaimedAt.UTC()
	return sh, nil
}

// ShardClaim implements store.Store.
func (s *Store) ShardClaim(ctx context.Context, p store.ShardClaimParams) (*store.Shard, error) {
	if p.PrevVersion < 0 {
		return nil, fmt.Errorf("mysql: shard claim: %w: negative previous version %d", store.ErrShardVersionConflict, p.PrevVersion)
	}
	now := utc(p.Now)
	var res sql.Result
	err := retry(ctx, false, func() error {
		var err error
		if p.PrevVersion == 0 {
			res, err = s.db.ExecContext(ctx, shardInsert, []byte(p.Shard.Namespace), p.Shard.Shard, []byte(p.Owner), datetime(now))
		} else {
			res, err = s.db.ExecContext(ctx, shardClaim, []byte(p.Owner), datetime(now),
				[]byte(p.Shard.Namespace), p.Shard.Shard, p.PrevVersion)
		}
		return err
	})
	if isDuplicate(err) {
		return nil, fmt.Errorf("mysql: shard claim: %w", store.ErrShardVersionConflict)
	}
	if err != nil {
		return nil, translate("shard claim", err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return nil, fmt.Errorf("mysql: shard claim: %w", store.ErrShardVersionConflict)
	}
	return &store.Shard{Key: p.Shard, Version: p.PrevVersion + 1, Owner: p.Owner, ClaimedAt: now}, nil
}

// ShardRelease implements store.Store.
func (s *Store) ShardRelease(ctx context.Context, f store.Fence) error {
	var res sql.Result
	err := retry(ctx, false, func() error {
		var err error
		res, err = s.db.ExecContext(ctx, shardRelease, []byte(f.Shard.Namespace), f.Shard.Shard, f.Version)
		return err
	})
	if err != nil {
		return translate("shard release", err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return fmt.Errorf("mysql: shard release: %w", store.ErrShardOwnershipLost)
	}
	return nil
}

// TimerCreate implements store.Store: it deletes the timer with the same id
// wherever it is and inserts the new one, in one transaction (timerCreate). Two concurrent
// first creates of one id both find nothing to delete; the later insert then
// meets the earlier one's row as a duplicate key, and its retry replaces
// that row, which is what it would have done had it come second.
func (s *Store) TimerCreate(ctx context.Context, f store.Fence, t *timer.Timer) error {
	if err := f.Covers(t); err != nil {
		return fmt.Errorf("mysql: timer create: %w", err)
	}
	args, err := timerArgs(t)
	if err != nil {
		return fmt.Errorf("mysql: timer create: %w", err)
	}
	ns := []byte(f.Shard.Namespace)
	all := append([]any{ns, f.Shard.Shard, []byte(t.ID), ns, f.Shard.Shard, ns, f.Shard.Shard}, args...)
	_, err = s.fenced(ctx, "timer create", f, timerCreate, nil, true, all...)
	return err
}

// TimerUpdate implements store.Store.
func (s *Store) TimerUpdate(ctx context.Context, f store.Fence, p store.TimerUpdateParams) error {
	if p.Timer == nil {
		return errors.New("mysql: timer update: timer is nil")
	}
	if err := f.Covers(p.Timer); err != nil {
		return fmt.Errorf("mysql: timer update: %w", err)
	}
	args, err := timerArgs(p.Timer)
	if err != nil {
		return fmt.Errorf("mysql: timer update: %w", err)
	}
	ns := []byte(f.Shard.Namespace)
	args = append([]any{ns, f.Shard.Shard, []byte(p.Timer.ID)}, args...)
	args = append(args, ns, f.Shard.Shard)
	q := timerUpdate
	if p.IfDueAt != nil {
		q += timerIfDueAt
		args = append(args, datetime(*p.IfDueAt))
	}
	_, err = s.fenced(ctx, "timer update", f, q, store.ErrTimerNotFound, false, args...)
	return err
}

// TimerGet implements store.Store.
func (s *Store) TimerGet(ctx context.Context, key store.ShardKey, id string) (*timer.Timer, error) {
	t, err := scanTimer(s.db.QueryRowContext(ctx, timerGet, []byte(key.Namespace), key.Shard, []byte(id)))
	if err != nil {
		return nil, translateNoRows("timer get", err, store.ErrTimerNotFound)
	}
	return t, nil
}

// TimerDelete implements store.Store.
func (s *Store) TimerDelete(ctx context.Context, f store.Fence, id string) error {
	ns := []byte(f.Shard.Namespace)
	_, err := s.fenced(ctx, "timer delete", f, timerDelete, store.ErrTimerNotFound, false,
		ns, f.Shard.Shard, []byte(id), ns, f.Shard.Shard)
	return err
}

// TimerGetWindow implements store.Store.
func (s *Store) TimerGetWindow(ctx context.Context, p store.TimerGetWindowParams) ([]*timer.Timer, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	after := datetime(p.After.DueAt)
	rows, err := s.db.QueryContext(ctx, timerGetWindow, []byte(p.Shard.Namespace), p.Shard.Shard,
		after, after, p.After.UUID[:], datetime(p.DueUntil), p.Limit)
	if err != nil {
		return nil, translate("timer get window", err)
	}
	defer rows.Close()
	var ts []*timer.Timer
	for rows.Next() {
		t, err := scanTimer(rows)
		if err != nil {
			return nil, translate("timer get window", err)
		}
		ts = append(ts, t)
	}
	if err := rows.Err(); err != nil {
		return nil, translate("timer get window", err)
	}
	return ts, nil
}

// TimerDeleteRange implements store.Store. It always reports the count.
func (s *Store) TimerDeleteRange(ctx context.Context, f store.Fence, p store.TimerDeleteRangeParams) (int, error) {
	upTo := datetime(p.UpTo.DueAt)
	n, err := s.fenced(ctx, "timer delete range", f, timerDeleteRange, nil, false,
		[]byte(f.Shard.Namespace), f.Shard.Shard, upTo, upTo, p.UpTo.UUID[:])
	return int(n), err
}

// fenced runs write, one or more statements ending in fenceHeld, as a fenced
// batch under f (see fenceBegin), and turns its answer into an error with
// fenceResult. It returns the rows the last statement matched. Deadlocks are
// retried, and with retryDuplicate a duplicate key too.
func (s *Store) fenced(ctx context.Context, op string, f store.Fence, write string, missing error, retryDuplicate bool, args ...any) (int64, error) {
	q := fenceBegin + write + fenceEnd
	args = append([]any{[]byte(f.Shard.Namespace), f.Shard.Shard, f.Version}, args...)
	var held, rows int64
	err := retry(ctx, retryDuplicate, func() error {
		var err error
		held, rows, err = s.batch(ctx, q, args)
		return err
	})
	if err != nil {
		return 0, translate(op, err)
	}
	return rows, fenceResult(op, held, rows, missing)
}

// batch runs a fenced batch on a connection of its own. When a statement
// fails, the server skips the rest, which may leave the batch's transaction
// open with its locks: batch rolls it back before the connection goes back
// to the pool, or has the pool discard the connection (which the server
// rolls back) when it cannot.
func (s *Store) batch(ctx context.Context, q string, args []any) (held, rows int64, err error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	var h, r sql.NullInt64
	err = conn.QueryRowContext(ctx, q, args...).Scan(&h, &r)
	if err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, rerr := conn.ExecContext(rctx, `ROLLBACK`); rerr != nil {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
		return 0, 0, err
	}
	return h.Int64, r.Int64, nil
}

// retryAttempts bounds the attempts of a write that InnoDB rolled back in a
// deadlock. Each attempt after the first waits a little, at random, so that
// the transactions that collided do not collide again in lockstep.
const retryAttempts = 8

// retry runs do until it succeeds, fails with an error that is not a
// deadlock (or, with duplicate, a duplicate key), or has made retryAttempts
// attempts. Only errors that guarantee the attempt wrote nothing are retried.
func retry(ctx context.Context, duplicate bool, do func() error) error {
	for attempt := 1; ; attempt++ {
		err := do()
		if err == nil || attempt == retryAttempts || !(isDeadlock(err) || duplicate && isDuplicate(err)) {
			return err
		}
		wait := time.Duration(rand.Int64N(int64(attempt) * int64(time.Millisecond)))
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
	}
}

// MySQL and MariaDB error numbers the driver tells apart.
const (
	errDuplicateKey = 1062 // ER_DUP_ENTRY
	errNoSuchTable  = 1146 // ER_NO_SUCH_TABLE
	errDeadlock     = 1213 // ER_LOCK_DEADLOCK: the whole transaction was rolled back
)

func isErrorNumber(err error, n uint16) bool {
	var me *gomysql.MySQLError
	return errors.As(err, &me) && me.Number == n
}

func isDeadlock(err error) bool  { return isErrorNumber(err, errDeadlock) }
func isDuplicate(err error) bool { return isErrorNumber(err, errDuplicateKey) }

// fenceResult is the one place a fenced write's outcome becomes a store
// error: the shard row not at the fence's version means ownership is lost
// (and, the writes being conditioned on it, nothing was written); the fence
// held but nothing matched means the target is missing, where that is an
// error.
func fenceResult(op string, held, rows int64, missing error) error {
	switch {
	case held != 1:
		return fmt.Errorf("mysql: %s: %w", op, store.ErrShardOwnershipLost)
	case rows == 0 && missing != nil:
		return fmt.Errorf("mysql: %s: %w", op, missing)
	}
	return nil
}

// translate wraps a native error for op. Context errors stay matchable with
// errors.Is through the wrap.
func translate(op string, err error) error {
	if err == nil {
		return nil
	}
	if isErrorNumber(err, errNoSuchTable) {
		return fmt.Errorf("mysql: %s: %w (has the store been migrated?)", op, err)
	}
	return fmt.Errorf("mysql: %s: %w", op, err)
}

// translateNoRows is translate where "no rows" means the store error notFound.
func translateNoRows(op string, err, notFound error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("mysql: %s: %w", op, notFound)
	}
	return translate(op, err)
}

// utc truncates a time to the stored precision, in UTC.
func utc(t time.Time) time.Time { return t.UTC().Truncate(precision) }

// datetime is a time as a DATETIME(3) literal in UTC. The driver's own
// formatting would write the zero time.Time, the start of a window, as the
// invalid date '0000-00-00'.
func datetime(t time.Time) string { return utc(t).Format("2006-01-02 15:04:05.000") }

// timerArgs are a timer's column values in the order of timerColumns after
// the namespace and shard. Strings go as []byte, which the driver sends as
// binary literals: stored exactly, whatever the connection's character set.
func timerArgs(t *timer.Timer) ([]any, error) {
	policy, err := json.Marshal(t.RetryPolicy)
	if err != nil {
		return nil, fmt.Errorf("encode retry policy: %w", err)
	}
	var payload []byte // NULL: no payload, JSON null included
	if p := strings.TrimSpace(string(t.Payload)); p != "" && p != "null" {
		payload = []byte(p)
	}
	var lastError []byte
	if t.LastError != "" {
		lastError = []byte(t.LastError)
	}
	return []any{
		store.RowTypeOf(t.Status),
		datetime(t.DueAt),
		t.UUID[:],
		[]byte(t.ID),
		datetime(t.ExecuteAt),
		[]byte(t.CallbackURL),
		payload,
		policy,
		t.CallbackTimeout.Milliseconds(),
		datetime(t.CreatedAt),
		datetime(t.UpdatedAt),
		t.Attempts,
		lastError,
	}, nil
}

// scanner is a *sql.Row or *sql.Rows.
type scanner interface{ Scan(dest ...any) error }

// scanTimer reads the columns of timerColumns.
func scanTimer(row scanner) (*timer.Timer, error) {
	var (
		t                                   timer.Timer
		rowType                             int
		ns, uuid, id, url, payload, lastErr []byte
		policy                              []byte
		timeoutMS                           int64
	)
	if err := row.Scan(&ns, &t.Shard, &rowType, &t.DueAt, &uuid, &id, &t.ExecuteAt,
		&url, &payload, &policy, &timeoutMS, &t.CreatedAt, &t.UpdatedAt, &t.Attempts, &lastErr); err != nil {
		return nil, err
	}
	t.Namespace, t.ID, t.CallbackURL, t.LastError = string(ns), string(id), string(url), string(lastErr)
	if copy(t.UUID[:], uuid) != len(t.UUID) {
		return nil, fmt.Errorf("timer %q: uuid has %d bytes", t.ID, len(uuid))
	}
	t.DueAt, t.ExecuteAt = t.DueAt.UTC(), t.ExecuteAt.UTC()
	t.CreatedAt, t.UpdatedAt = t.CreatedAt.UTC(), t.UpdatedAt.UTC()
	t.Status = timer.StatusPending
	if rowType == store.RowTypeTimerFailed {
		t.Status = timer.StatusFailed
	}
	if payload != nil {
		t.Payload = json.RawMessage(payload)
	}
	if err := json.Unmarshal(policy, &t.RetryPolicy); err != nil {
		return nil, fmt.Errorf("decode retry policy of timer %q: %w", t.ID, err)
	}
	t.CallbackTimeout = time.Duration(timeoutMS) * time.Millisecond
	return &t, nil
}
