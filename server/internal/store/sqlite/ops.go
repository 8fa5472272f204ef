package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/timer"
)

const timerColumns = `namespace, shard_id, row_type, execute_at, timer_uuid, timer_id, timer_execute_at,
	timer_callback_url, timer_payload, timer_retry_policy, timer_callback_timeout_ms,
	timer_created_at, timer_updated_at, timer_attempts, timer_last_error`

var zeroUUID = uuid.UUID{}

func ms(t time.Time) int64 { return t.UnixMilli() }

func fromMS(v int64) time.Time { return time.UnixMilli(v).UTC() }

// ShardGet implements store.Store.
func (s *Store) ShardGet(ctx context.Context, key store.ShardKey) (*store.Shard, error) {
	return shardGet(ctx, s.r, key)
}

type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func shardGet(ctx context.Context, q querier, key store.ShardKey) (*store.Shard, error) {
	var (
		sh      = store.Shard{Key: key}
		owner   sql.NullString
		claimed int64
	)
	err := q.QueryRowContext(ctx, `SELECT shard_version, shard_owner, shard_claimed_at FROM timers
		WHERE namespace = ? AND shard_id = ? AND row_type = 1 AND execute_at = 0 AND timer_uuid = ?`,
		key.Namespace, key.Shard, zeroUUID[:]).Scan(&sh.Version, &owner, &claimed)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, store.ErrShardNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("sqlite: get shard: %w", err)
	}
	sh.Owner = owner.String
	sh.ClaimedAt = fromMS(claimed)
	return &sh, nil
}

// ShardClaim implements store.Store.
func (s *Store) ShardClaim(ctx context.Context, p store.ShardClaimParams) (*store.Shard, error) {
	var claimed *store.Shard
	err := s.write(ctx, func(tx *sql.Tx) error {
		cur, err := shardGet(context.Background(), tx, p.Shard)
		switch {
		case errors.Is(err, store.ErrShardNotFound):
			if p.PrevVersion != 0 {
				return store.ErrShardVersionConflict
			}
			_, err = tx.Exec(`INSERT INTO timers (namespace, shard_id, row_type, execute_at, timer_uuid,
				shard_version, shard_owner, shard_claimed_at) VALUES (?, ?, 1, 0, ?, 1, ?, ?)`,
				p.Shard.Namespace, p.Shard.Shard, zeroUUID[:], p.Owner, ms(p.Now))
		case err != nil:
			return err
		case cur.Version != p.PrevVersion:
			return store.ErrShardVersionConflict
		default:
			_, err = tx.Exec(`UPDATE timers SET shard_version = shard_version + 1, shard_owner = ?, shard_claimed_at = ?
				WHERE namespace = ? AND shard_id = ? AND row_type = 1 AND execute_at = 0 AND timer_uuid = ?`,
				p.Owner, ms(p.Now), p.Shard.Namespace, p.Shard.Shard, zeroUUID[:])
		}
		if err != nil {
			return fmt.Errorf("sqlite: claim shard: %w", err)
		}
		claimed = &store.Shard{Key: p.Shard, Version: p.PrevVersion + 1, Owner: p.Owner, ClaimedAt: fromMS(ms(p.Now))}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return claimed, nil
}

// ShardRelease implements store.Store.
func (s *Store) ShardRelease(ctx context.Context, f store.Fence) error {
	return s.fenced(ctx, f, func(tx *sql.Tx) error {
		_, err := tx.Exec(`UPDATE timers SET shard_owner = '' WHERE namespace = ? AND shard_id = ?
			AND row_type = 1 AND execute_at = 0 AND timer_uuid = ?`, f.Shard.Namespace, f.Shard.Shard, zeroUUID[:])
		return err
	})
}

// fenced runs fn in the write transaction after checking that the shard is
// still at the fence's version; the check and fn commit together.
func (s *Store) fenced(ctx context.Context, f store.Fence, fn func(tx *sql.Tx) error) error {
	return s.write(ctx, func(tx *sql.Tx) error {
		cur, err := shardGet(context.Background(), tx, f.Shard)
		if errors.Is(err, store.ErrShardNotFound) || (err == nil && cur.Version != f.Version) {
			return store.ErrShardOwnershipLost
		}
		if err != nil {
			return err
		}
		return fn(tx)
	})
}

func timerArgs(t *timer.Timer) ([]any, error) {
	policy, err := json.Marshal(t.RetryPolicy)
	if err != nil {
		return nil, fmt.Errorf("sqlite: encode retry policy: %w", err)
	}
	var payload any // NULL for no payload
	if t.Payload != nil {
		payload = string(t.Payload)
	}
	var lastErr any
	if t.LastError != "" {
		lastErr = t.LastError
	}
	return []any{t.Namespace, t.Shard, store.RowTypeOf(t.Status), ms(t.DueAt), t.UUID[:], t.ID, ms(t.ExecuteAt),
		t.CallbackURL, payload, string(policy), t.CallbackTimeout.Milliseconds(),
		ms(t.CreatedAt), ms(t.UpdatedAt), t.Attempts, lastErr}, nil
}

// TimerCreate implements store.Store. The unique id index finds an existing
// timer wherever it is; the upsert moves it to the new position.
func (s *Store) TimerCreate(ctx context.Context, f store.Fence, t *timer.Timer) error {
	args, err := timerArgs(t)
	if err != nil {
		return err
	}
	return s.fenced(ctx, f, func(tx *sql.Tx) error {
		_, err := tx.Exec(`INSERT INTO timers (`+timerColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (namespace, shard_id, timer_id) DO UPDATE SET
				row_type = excluded.row_type, execute_at = excluded.execute_at, timer_uuid = excluded.timer_uuid,
				timer_execute_at = excluded.timer_execute_at, timer_callback_url = excluded.timer_callback_url,
				timer_payload = excluded.timer_payload, timer_retry_policy = excluded.timer_retry_policy,
				timer_callback_timeout_ms = excluded.timer_callback_timeout_ms, timer_created_at = excluded.timer_created_at,
				timer_updated_at = excluded.timer_updated_at, timer_attempts = excluded.timer_attempts,
				timer_last_error = excluded.timer_last_error`, args...)
		if err != nil {
			return fmt.Errorf("sqlite: create timer: %w", err)
		}
		return nil
	})
}

// TimerUpdate implements store.Store.
func (s *Store) TimerUpdate(ctx context.Context, f store.Fence, p store.TimerUpdateParams) error {
	t := p.Timer
	args, err := timerArgs(t)
	if err != nil {
		return err
	}
	query := `UPDATE timers SET row_type = ?, execute_at = ?, timer_uuid = ?, timer_execute_at = ?,
		timer_callback_url = ?, timer_payload = ?, timer_retry_policy = ?, timer_callback_timeout_ms = ?,
		timer_created_at = ?, timer_updated_at = ?, timer_attempts = ?, timer_last_error = ?
		WHERE namespace = ? AND shard_id = ? AND timer_id = ? AND row_type IN (2, 3)`
	// args: namespace, shard, row_type, execute_at, uuid, id, execute_at(user), url, payload, policy, timeout, created, updated, attempts, lastErr
	uargs := append([]any{}, args[2], args[3], args[4], args[6], args[7], args[8], args[9], args[10], args[11], args[12], args[13], args[14],
		t.Namespace, t.Shard, t.ID)
	if p.IfDueAt != nil {
		query += ` AND row_type = 2 AND execute_at = ?`
		uargs = append(uargs, ms(*p.IfDueAt))
	}
	return s.fenced(ctx, f, func(tx *sql.Tx) error {
		res, err := tx.Exec(query, uargs...)
		if err != nil {
			return fmt.Errorf("sqlite: update timer: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return store.ErrTimerNotFound
		}
		return nil
	})
}

// TimerGet implements store.Store.
func (s *Store) TimerGet(ctx context.Context, key store.ShardKey, id string) (*timer.Timer, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+timerColumns+` FROM timers
		WHERE namespace = ? AND shard_id = ? AND timer_id = ? AND row_type IN (2, 3)`, key.Namespace, key.Shard, id)
	if err != nil {
		return nil, fmt.Errorf("sqlite: get timer: %w", err)
	}
	ts, err := scanTimers(rows)
	if err != nil {
		return nil, err
	}
	if len(ts) == 0 {
		return nil, store.ErrTimerNotFound
	}
	return ts[0], nil
}

// TimerDelete implements store.Store.
func (s *Store) TimerDelete(ctx context.Context, f store.Fence, id string) error {
	return s.fenced(ctx, f, func(tx *sql.Tx) error {
		res, err := tx.Exec(`DELETE FROM timers WHERE namespace = ? AND shard_id = ? AND timer_id = ? AND row_type IN (2, 3)`,
			f.Shard.Namespace, f.Shard.Shard, id)
		if err != nil {
			return fmt.Errorf("sqlite: delete timer: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return store.ErrTimerNotFound
		}
		return nil
	})
}

// TimerGetWindow implements store.Store. The row-value comparison walks the
// primary key from p.After.
func (s *Store) TimerGetWindow(ctx context.Context, p store.TimerGetWindowParams) ([]*timer.Timer, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+timerColumns+` FROM timers
		WHERE namespace = ? AND shard_id = ? AND row_type = 2 AND (execute_at, timer_uuid) > (?, ?) AND execute_at <= ?
		ORDER BY execute_at, timer_uuid LIMIT ?`,
		p.Shard.Namespace, p.Shard.Shard, afterMS(p.After), p.After.UUID[:], ms(p.DueUntil), p.Limit)
	if err != nil {
		return nil, fmt.Errorf("sqlite: get window: %w", err)
	}
	return scanTimers(rows)
}

// afterMS maps the zero Position ("from the start") below every stored time.
func afterMS(p timer.Position) int64 {
	if p.DueAt.IsZero() {
		return -1 << 62
	}
	return ms(p.DueAt)
}

// TimerDeleteRange implements store.Store.
func (s *Store) TimerDeleteRange(ctx context.Context, f store.Fence, p store.TimerDeleteRangeParams) (int, error) {
	var n int64
	err := s.fenced(ctx, f, func(tx *sql.Tx) error {
		res, err := tx.Exec(`DELETE FROM timers WHERE namespace = ? AND shard_id = ? AND row_type = 2
			AND (execute_at, timer_uuid) <= (?, ?)`, f.Shard.Namespace, f.Shard.Shard, ms(p.UpTo.DueAt), p.UpTo.UUID[:])
		if err != nil {
			return fmt.Errorf("sqlite: delete range: %w", err)
		}
		n, err = res.RowsAffected()
		return err
	})
	return int(n), err
}

func scanTimers(rows *sql.Rows) ([]*timer.Timer, error) {
	defer rows.Close()
	var out []*timer.Timer
	for rows.Next() {
		var (
			t                                  timer.Timer
			rowType                            int
			due, exec, timeoutMS, created, upd int64
			uuidBytes                          []byte
			payload, lastErr                   sql.NullString
			policy                             string
		)
		if err := rows.Scan(&t.Namespace, &t.Shard, &rowType, &due, &uuidBytes, &t.ID, &exec, &t.CallbackURL,
			&payload, &policy, &timeoutMS, &created, &upd, &t.Attempts, &lastErr); err != nil {
			return nil, fmt.Errorf("sqlite: scan timer: %w", err)
		}
		copy(t.UUID[:], uuidBytes)
		t.DueAt, t.ExecuteAt, t.CreatedAt, t.UpdatedAt = fromMS(due), fromMS(exec), fromMS(created), fromMS(upd)
		t.CallbackTimeout = time.Duration(timeoutMS) * time.Millisecond
		if payload.Valid {
			t.Payload = json.RawMessage(payload.String)
		}
		if err := json.Unmarshal([]byte(policy), &t.RetryPolicy); err != nil {
			return nil, fmt.Errorf("sqlite: decode retry policy of %q: %w", t.ID, err)
		}
		t.LastError = lastErr.String
		t.Status = timer.StatusPending
		if rowType == store.RowTypeTimerFailed {
			t.Status = timer.StatusFailed
		}
		out = append(out, &t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: read timers: %w", err)
	}
	return out, nil
}
