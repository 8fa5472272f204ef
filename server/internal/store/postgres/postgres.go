// Package postgres is the PostgreSQL store driver (pgx, pgxpool).
//
// Every operation is one statement, one round trip. A fenced write is a
// data-modifying CTE whose first step locks the shard row FOR SHARE and only
// if it still has the fence's version, and whose write step reads from that
// step, so the check and the write commit together. FOR SHARE (not FOR KEY
// SHARE) conflicts with the FOR NO KEY UPDATE lock of a claim's UPDATE of
// shard_version: a claim waits for every fenced write in flight, and a fenced
// write that starts while a claim is in flight waits for it, then sees the new
// version and writes nothing. So once ShardClaim has returned, no write made
// under an older fence can commit.
//
// Creates that arrive together share one such statement (batch.go), which
// takes the fence step for each of their fences and writes each row only if
// its own fence held: the same guarantee, row by row.
package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/timer"
)

// Config configures the driver.
type Config struct {
	// URL is a libpq connection URL or keyword/value string.
	URL string
	// Schema holds dtimer's table; default "public". Migrate creates it.
	Schema string
	// MaxConns caps the pool; 0 keeps pgx's default (the larger of 4 and the
	// number of CPUs).
	MaxConns int32
}

// Store implements store.Store on PostgreSQL.
type Store struct {
	pool    *pgxpool.Pool
	schema  string
	q       queries
	creates creates
}

var _ store.Store = (*Store)(nil)

// precision is timestamptz's: microseconds.
const precision = time.Microsecond

// New connects to the database and checks that it answers. It does not
// migrate.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.URL == "" {
		return nil, errors.New("postgres: url is empty")
	}
	if cfg.Schema == "" {
		cfg.Schema = "public"
	}
	if cfg.MaxConns < 0 {
		return nil, fmt.Errorf("postgres: max conns must not be negative, got %d", cfg.MaxConns)
	}
	pc, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		// The message of a parse error may contain the password; do not echo it.
		return nil, errors.New("postgres: cannot parse url")
	}
	if cfg.MaxConns > 0 {
		pc.MaxConns = cfg.MaxConns
	}
	// pgx prepares every statement. Left to choose, PostgreSQL plans the
	// batch create anew on every execution (a custom plan costs it more CPU
	// than the write itself); the generic plans of all the driver's
	// statements are key lookups and key ranges (TestGenericPlansStayOnTheKey),
	// so plan each once per connection. A plan_cache_mode in the URL wins.
	if _, ok := pc.ConnConfig.RuntimeParams["plan_cache_mode"]; !ok {
		pc.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("postgres: connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: connect: %w", err)
	}
	return &Store{
		pool:   pool,
		schema: cfg.Schema,
		q:      newQueries(pgx.Identifier{cfg.Schema, "timers"}.Sanitize()),
	}, nil
}

// Precision implements store.Store.
func (s *Store) Precision() time.Duration { return precision }

// Migrate implements store.Store. Nodes starting together may all migrate: a
// transaction-scoped advisory lock, keyed by the schema, serialises them.
func (s *Store) Migrate(ctx context.Context) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return translate("migrate", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "dtimer.migrate."+s.schema); err != nil {
		return translate("migrate", err)
	}
	// CREATE SCHEMA IF NOT EXISTS needs the CREATE privilege on the database
	// even when the schema exists; a role that may only use an existing schema
	// must still be able to migrate.
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, s.schema).Scan(&exists); err != nil {
		return translate("migrate", err)
	}
	if !exists {
		if _, err := tx.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{s.schema}.Sanitize()); err != nil {
			return translate("migrate", err)
		}
	}
	// Without arguments Exec uses the simple protocol, which runs several
	// statements.
	if _, err := tx.Exec(ctx, schemaDDL(s.q.table)); err != nil {
		return translate("migrate", err)
	}
	return translate("migrate", tx.Commit(ctx))
}

// Ping implements store.Store.
func (s *Store) Ping(ctx context.Context) error {
	return translate("ping", s.pool.Ping(ctx))
}

// Close implements store.Store.
func (s *Store) Close() error {
	s.pool.Close()
	return nil
}

// ShardGet implements store.Store.
func (s *Store) ShardGet(ctx context.Context, key store.ShardKey) (*store.Shard, error) {
	sh := &store.Shard{Key: key}
	err := s.pool.QueryRow(ctx, s.q.shardGet, key.Namespace, key.Shard).Scan(&sh.Version, &sh.Owner, &sh.ClaimedAt)
	if err != nil {
		return nil, translateNoRows("shard get", err, store.ErrShardNotFound)
	}
	sh.ClaimedAt = sh.ClaimedAt.UTC()
	return sh, nil
}

// ShardClaim implements store.Store.
func (s *Store) ShardClaim(ctx context.Context, p store.ShardClaimParams) (*store.Shard, error) {
	var row pgx.Row
	switch {
	case p.PrevVersion == 0:
		row = s.pool.QueryRow(ctx, s.q.shardInsert, p.Shard.Namespace, p.Shard.Shard, p.Owner, utc(p.Now))
	case p.PrevVersion > 0:
		row = s.pool.QueryRow(ctx, s.q.shardClaim, p.Shard.Namespace, p.Shard.Shard, p.Owner, utc(p.Now), p.PrevVersion)
	default:
		return nil, fmt.Errorf("postgres: shard claim: %w: negative previous version %d", store.ErrShardVersionConflict, p.PrevVersion)
	}
	sh := &store.Shard{Key: p.Shard}
	if err := row.Scan(&sh.Version, &sh.Owner, &sh.ClaimedAt); err != nil {
		return nil, translateNoRows("shard claim", err, store.ErrShardVersionConflict)
	}
	sh.ClaimedAt = sh.ClaimedAt.UTC()
	return sh, nil
}

// ShardRelease implements store.Store.
func (s *Store) ShardRelease(ctx context.Context, f store.Fence) error {
	tag, err := s.pool.Exec(ctx, s.q.shardRelease, f.Shard.Namespace, f.Shard.Shard, f.Version)
	if err != nil {
		return translate("shard release", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("postgres: shard release: %w", store.ErrShardOwnershipLost)
	}
	return nil
}

// upsertRetries bounds the retries of a create statement after a unique
// violation on the primary key (see TimerCreate).
const upsertRetries = 3

// TimerCreate implements store.Store. Concurrent creates are written
// together, whatever their shards (see batch.go).
//
// ON CONFLICT only arbitrates the (namespace, shard_id, timer_id) index. Two
// concurrent first inserts of one id at one position both pass that check,
// and the later one then trips over the earlier one in the primary key as a
// unique violation. Retried, it finds the committed row through the id index
// and updates it, which is what it would have done had it come second.
func (s *Store) TimerCreate(ctx context.Context, f store.Fence, t *timer.Timer) error {
	if err := f.Covers(t); err != nil {
		return fmt.Errorf("postgres: timer create: %w", err)
	}
	row, err := newTimerRow(t)
	if err != nil {
		return fmt.Errorf("postgres: timer create: %w", err)
	}
	return s.create(&createOp{ctx: ctx, fence: f, row: row, done: make(chan error, 1)})
}

// TimerUpdate implements store.Store.
func (s *Store) TimerUpdate(ctx context.Context, f store.Fence, p store.TimerUpdateParams) error {
	if p.Timer == nil {
		return errors.New("postgres: timer update: timer is nil")
	}
	if err := f.Covers(p.Timer); err != nil {
		return fmt.Errorf("postgres: timer update: %w", err)
	}
	row, err := newTimerRow(p.Timer)
	if err != nil {
		return fmt.Errorf("postgres: timer update: %w", err)
	}
	args := append([]any{f.Shard.Namespace, f.Shard.Shard, f.Version}, row.args()...)
	q := s.q.timerUpdate
	if p.IfDueAt != nil {
		q = s.q.timerUpdateIfDueAt
		args = append(args, utc(*p.IfDueAt))
	}
	return s.fenced(ctx, "timer update", q, store.ErrTimerNotFound, args...)
}

// TimerGet implements store.Store.
func (s *Store) TimerGet(ctx context.Context, key store.ShardKey, id string) (*timer.Timer, error) {
	rows, err := s.pool.Query(ctx, s.q.timerGet, key.Namespace, key.Shard, id)
	if err != nil {
		return nil, translate("timer get", err)
	}
	t, err := pgx.CollectExactlyOneRow(rows, scanTimer)
	if err != nil {
		return nil, translateNoRows("timer get", err, store.ErrTimerNotFound)
	}
	return t, nil
}

// TimerDelete implements store.Store.
func (s *Store) TimerDelete(ctx context.Context, f store.Fence, id string) error {
	return s.fenced(ctx, "timer delete", s.q.timerDelete, store.ErrTimerNotFound,
		f.Shard.Namespace, f.Shard.Shard, f.Version, id)
}

// TimerGetWindow implements store.Store.
func (s *Store) TimerGetWindow(ctx context.Context, p store.TimerGetWindowParams) ([]*timer.Timer, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, s.q.timerGetWindow, p.Shard.Namespace, p.Shard.Shard,
		utc(p.After.DueAt), p.After.UUID, utc(p.DueUntil), p.Limit)
	if err != nil {
		return nil, translate("timer get window", err)
	}
	ts, err := pgx.CollectRows(rows, scanTimer)
	if err != nil {
		return nil, translate("timer get window", err)
	}
	return ts, nil
}

// TimerDeleteRange implements store.Store. It always reports the count.
func (s *Store) TimerDeleteRange(ctx context.Context, f store.Fence, p store.TimerDeleteRangeParams) (int, error) {
	var fenceOK, n int64
	err := s.pool.QueryRow(ctx, s.q.timerDeleteRange, f.Shard.Namespace, f.Shard.Shard, f.Version,
		utc(p.UpTo.DueAt), p.UpTo.UUID).Scan(&fenceOK, &n)
	if err != nil {
		return 0, translate("timer delete range", err)
	}
	if err := fenceResult("timer delete range", fenceOK, n, nil); err != nil {
		return 0, err
	}
	return int(n), nil
}

// fenced runs a fenced-write statement, which answers (rows the fence step
// locked, rows the write step changed), and turns that answer into an error.
func (s *Store) fenced(ctx context.Context, op, q string, missing error, args ...any) error {
	var fenceOK, written int64
	if err := s.pool.QueryRow(ctx, q, args...).Scan(&fenceOK, &written); err != nil {
		return translate(op, err)
	}
	return fenceResult(op, fenceOK, written, missing)
}

// fenceResult is the one place a fenced write's outcome becomes a store
// error: no locked shard row at the fence's version means ownership is lost
// (and, the write reading from the lock step, nothing was written); a locked
// row but nothing written means the target is missing, where that is an error.
func fenceResult(op string, fenceOK, written int64, missing error) error {
	switch {
	case fenceOK == 0:
		return fmt.Errorf("postgres: %s: %w", op, store.ErrShardOwnershipLost)
	case written == 0 && missing != nil:
		return fmt.Errorf("postgres: %s: %w", op, missing)
	}
	return nil
}

// uniqueViolation is PostgreSQL's SQLSTATE for a unique constraint violation.
const uniqueViolation = "23505"

// translate wraps a native error for op. Context errors stay matchable with
// errors.Is through the wrap.
func translate(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("postgres: %s: %w", op, err)
}

// translateNoRows is translate where "no rows" means the store error notFound.
func translateNoRows(op string, err, notFound error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("postgres: %s: %w", op, notFound)
	}
	return translate(op, err)
}

// utc truncates a time to the stored precision, in UTC.
func utc(t time.Time) time.Time { return t.UTC().Truncate(precision) }

// timerRow is a timer's column values, those of the queries' $4..$16.
type timerRow struct {
	rowType     int16
	dueAt       time.Time
	uuid        pgtype.UUID // not uuid.UUID, which pgx encodes through its string form
	id          string
	executeAt   time.Time
	callbackURL string
	payload     *string // NULL: no payload, JSON null included
	policy      string
	timeoutMS   int64
	createdAt   time.Time
	updatedAt   time.Time
	attempts    int32
	lastError   *string
}

func newTimerRow(t *timer.Timer) (timerRow, error) {
	policy, err := json.Marshal(t.RetryPolicy)
	if err != nil {
		return timerRow{}, fmt.Errorf("encode retry policy: %w", err)
	}
	r := timerRow{
		rowType:     int16(store.RowTypeOf(t.Status)),
		dueAt:       utc(t.DueAt),
		uuid:        pgtype.UUID{Bytes: t.UUID, Valid: true},
		id:          t.ID,
		executeAt:   utc(t.ExecuteAt),
		callbackURL: t.CallbackURL,
		policy:      string(policy),
		timeoutMS:   t.CallbackTimeout.Milliseconds(),
		createdAt:   utc(t.CreatedAt),
		updatedAt:   utc(t.UpdatedAt),
		attempts:    int32(t.Attempts),
	}
	if p := strings.TrimSpace(string(t.Payload)); p != "" && p != "null" {
		r.payload = &p
	}
	if t.LastError != "" {
		r.lastError = &t.LastError
	}
	return r, nil
}

// args are $4..$16 of a single-row write.
func (r *timerRow) args() []any {
	return []any{r.rowType, r.dueAt, r.uuid, r.id, r.executeAt, r.callbackURL, r.payload,
		r.policy, r.timeoutMS, r.createdAt, r.updatedAt, r.attempts, r.lastError}
}

// timerRows are the columns of several timers, one slice each.
type timerRows struct {
	rowType              []int16
	dueAt, executeAt     []time.Time
	uuid                 []pgtype.UUID
	id, callbackURL      []string
	payload, lastError   []*string
	policy               []string
	timeoutMS            []int64
	createdAt, updatedAt []time.Time
	attempts             []int32
}

func (c *timerRows) add(r *timerRow) {
	c.rowType = append(c.rowType, r.rowType)
	c.dueAt = append(c.dueAt, r.dueAt)
	c.uuid = append(c.uuid, r.uuid)
	c.id = append(c.id, r.id)
	c.executeAt = append(c.executeAt, r.executeAt)
	c.callbackURL = append(c.callbackURL, r.callbackURL)
	c.payload = append(c.payload, r.payload)
	c.policy = append(c.policy, r.policy)
	c.timeoutMS = append(c.timeoutMS, r.timeoutMS)
	c.createdAt = append(c.createdAt, r.createdAt)
	c.updatedAt = append(c.updatedAt, r.updatedAt)
	c.attempts = append(c.attempts, r.attempts)
	c.lastError = append(c.lastError, r.lastError)
}

func (c *timerRows) args() []any {
	return []any{c.rowType, c.dueAt, c.uuid, c.id, c.executeAt, c.callbackURL, c.payload,
		c.policy, c.timeoutMS, c.createdAt, c.updatedAt, c.attempts, c.lastError}
}

// scanTimer reads the columns of timerColumns.
func scanTimer(row pgx.CollectableRow) (*timer.Timer, error) {
	var (
		t         timer.Timer
		rowType   int16
		payload   *string
		policy    string
		timeoutMS int64
		lastError *string
	)
	if err := row.Scan(&t.Namespace, &t.Shard, &rowType, &t.DueAt, &t.UUID, &t.ID, &t.ExecuteAt,
		&t.CallbackURL, &payload, &policy, &timeoutMS, &t.CreatedAt, &t.UpdatedAt, &t.Attempts, &lastError); err != nil {
		return nil, err
	}
	t.DueAt, t.ExecuteAt = t.DueAt.UTC(), t.ExecuteAt.UTC()
	t.CreatedAt, t.UpdatedAt = t.CreatedAt.UTC(), t.UpdatedAt.UTC()
	t.Status = timer.StatusPending
	if rowType == store.RowTypeTimerFailed {
		t.Status = timer.StatusFailed
	}
	if payload != nil {
		t.Payload = json.RawMessage(*payload)
	}
	if err := json.Unmarshal([]byte(policy), &t.RetryPolicy); err != nil {
		return nil, fmt.Errorf("decode retry policy of timer %q: %w", t.ID, err)
	}
	t.CallbackTimeout = time.Duration(timeoutMS) * time.Millisecond
	if lastError != nil {
		t.LastError = *lastError
	}
	return &t, nil
}
