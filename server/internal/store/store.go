// Package store is the storage contract of dtimer: one interface that every
// database driver implements and that the engine, ownership and API use.
// It imports no driver; drivers import it.
//
// The data model is one table (or collection) per deployment. Every row
// belongs to a shard partition (namespace, shard) and is one of:
//
//   - a shard row (row type 1): the shard's ownership claim: version, owner
//     and claim time;
//   - a timer row (row type 2 pending, row type 3 failed), clustered within the
//     partition by Position (due time, timer UUID), with a unique index on
//     (namespace, shard, timer id).
//
// Every write an owner makes to a shard carries a Fence: the shard version it
// claimed. A driver applies the write only if the shard row still has that
// version, atomically with the write (a conditional statement, a locked row or
// a transaction), and otherwise returns ErrShardOwnershipLost and writes
// nothing. That makes a stale owner harmless: once a new owner has claimed the
// shard (version+1) and loaded its window, nothing the old owner does can add
// a timer the new owner does not know about, or delete one it has not fired.
//
// "Now" is always passed in; drivers never read the clock. Times come back
// in UTC, truncated to Precision; durations are stored in whole
// milliseconds. A nil Payload and a JSON null may both read back as nil.
//
// Errors: the sentinels below mean the write was certainly not applied. A
// fenced write with a stale fence returns ErrShardOwnershipLost even when the
// timer does not exist. Any other error (a timeout, a lost connection) may or
// may not have been applied: the caller must find out by reading before it
// relies on either.
package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dtimer/dtimer/server/internal/timer"
)

// Store is implemented by each driver. Methods are safe for concurrent use.
type Store interface {
	// Migrate creates or upgrades the schema. It is idempotent.
	Migrate(ctx context.Context) error
	// Ping checks that the database answers.
	Ping(ctx context.Context) error
	// Close releases the driver's connections.
	Close() error
	// Precision is the finest time the driver stores exactly; times written
	// are truncated to it. No driver may be coarser than a millisecond.
	Precision() time.Duration

	// ShardGet returns the shard row, or ErrShardNotFound if the shard was
	// never claimed.
	ShardGet(ctx context.Context, shard ShardKey) (*Shard, error)
	// ShardClaim takes ownership of a shard: it writes Owner and version
	// PrevVersion+1 only if the stored version is still PrevVersion (0 means
	// "no shard row yet"). A lost race returns ErrShardVersionConflict.
	ShardClaim(ctx context.Context, p ShardClaimParams) (*Shard, error)
	// ShardRelease clears the owner of a shard still held at fence.Version,
	// so that another node sees it is free; the version is kept (the next
	// claim increments it, which is what fences the releasing node). It returns
	// ErrShardOwnershipLost if the shard was claimed by someone else since.
	ShardRelease(ctx context.Context, fence Fence) error

	// TimerCreate inserts the timer, or replaces the timer with the same
	// (namespace, id) wherever it was in the shard's order and whatever its
	// status: one timer per key, always.
	TimerCreate(ctx context.Context, fence Fence, t *timer.Timer) error
	// TimerUpdate replaces the stored timer with the same (namespace, id) by t
	// (all fields, its position and status included). With IfDueAt set it
	// applies only if the stored timer is still pending at that due time;
	// otherwise, or when there is no such timer, it returns ErrTimerNotFound.
	TimerUpdate(ctx context.Context, fence Fence, p TimerUpdateParams) error
	// TimerGet returns the timer, pending or failed, or ErrTimerNotFound.
	TimerGet(ctx context.Context, shard ShardKey, id string) (*timer.Timer, error)
	// TimerDelete removes the timer, or returns ErrTimerNotFound.
	TimerDelete(ctx context.Context, fence Fence, id string) error
	// TimerGetWindow returns pending timers of the shard with a position after
	// p.After (exclusive; the zero Position means from the start) and a due
	// time at or before p.DueUntil, in Position order, at most p.Limit of them
	// (Limit must be positive).
	TimerGetWindow(ctx context.Context, p TimerGetWindowParams) ([]*timer.Timer, error)
	// TimerDeleteRange removes every pending timer of the shard at or before
	// p.UpTo in Position order, and nothing else. It returns how many rows
	// it removed where the database reports it (-1 where it does not).
	TimerDeleteRange(ctx context.Context, fence Fence, p TimerDeleteRangeParams) (int, error)
}

// ShardKey names a shard partition: shards are numbered per namespace.
type ShardKey struct {
	Namespace string
	Shard     int
}

// Shard is a shard row: who claimed the shard, and at which version.
type Shard struct {
	Key ShardKey
	// Version increases by one with every claim; writes are fenced by it.
	Version int64
	// Owner is the claiming node's name; empty once released.
	Owner     string
	ClaimedAt time.Time
}

// Fence is the claim a write is made under.
type Fence struct {
	Shard   ShardKey
	Version int64
}

// Covers rejects a timer of another shard: the fence would not protect the
// row written. Drivers call it before every fenced timer write.
func (f Fence) Covers(t *timer.Timer) error {
	if t.Namespace != f.Shard.Namespace || t.Shard != f.Shard.Shard {
		return fmt.Errorf("timer %q of shard (%q, %d) written under a fence for shard (%q, %d)",
			t.ID, t.Namespace, t.Shard, f.Shard.Namespace, f.Shard.Shard)
	}
	return nil
}

// ShardClaimParams are the arguments of Store.ShardClaim.
type ShardClaimParams struct {
	Shard       ShardKey
	Owner       string
	PrevVersion int64
	Now         time.Time
}

// TimerUpdateParams are the arguments of Store.TimerUpdate.
type TimerUpdateParams struct {
	Timer *timer.Timer
	// IfDueAt, when set, makes the update conditional on the stored timer
	// being pending at this due time: the engine moves a timer it fired only
	// if nobody changed it while the callback ran.
	IfDueAt *time.Time
}

// TimerGetWindowParams are the arguments of Store.TimerGetWindow.
type TimerGetWindowParams struct {
	Shard    ShardKey
	After    timer.Position
	DueUntil time.Time
	Limit    int
}

// TimerDeleteRangeParams are the arguments of Store.TimerDeleteRange.
type TimerDeleteRangeParams struct {
	UpTo timer.Position
}

// Errors every driver returns, wrapped or not; callers test with errors.Is.
var (
	ErrTimerNotFound        = errors.New("timer not found")
	ErrShardNotFound        = errors.New("shard not found")
	ErrShardVersionConflict = errors.New("shard version conflict")
	// ErrShardOwnershipLost means the write's fence is stale: another claim
	// happened. Nothing was written; the caller must stop acting as owner.
	ErrShardOwnershipLost = errors.New("shard ownership lost")
	// ErrTimerTooLarge means the timer does not fit in one row of the
	// driver's database (DynamoDB's item limit is the smallest). Nothing was
	// written.
	ErrTimerTooLarge = errors.New("timer too large for the store")
)

// Row types of the unified table.
const (
	RowTypeShard        = 1
	RowTypeTimerPending = 2
	RowTypeTimerFailed  = 3
)

// RowTypeOf returns the row type a timer is stored under.
func RowTypeOf(s timer.Status) int {
	if s == timer.StatusFailed {
		return RowTypeTimerFailed
	}
	return RowTypeTimerPending
}
