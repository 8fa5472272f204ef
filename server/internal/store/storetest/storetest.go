// Package storetest is the one behaviour suite every store driver passes.
// Each driver's driver_test.go calls Run with a factory of fresh, isolated
// stores; a change of the contract in package store lands here first, so
// drivers cannot drift apart (the pattern of River's riverdrivertest).
//
// The suite talks to drivers only through store.Store: what it checks is what
// the engine, ownership and API can observe. Its times are UTC and whole
// milliseconds, the API's precision, so they must come back exactly; one test
// checks that finer times are truncated to the driver's Precision.
package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/timer"
)

// Run runs the suite. newStore must return a fresh, isolated (own schema,
// database file, keyspace...) and already migrated store on every call, and
// close it (and drop what it created) through t.Cleanup.
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Helper()
	s := &suite{newStore: newStore}

	t.Run("Store", s.testStore)
	t.Run("Shard", s.testShard)
	t.Run("Timer", s.testTimer)
	t.Run("TimerUpdate", s.testTimerUpdate)
	t.Run("TimerGetWindow", s.testTimerGetWindow)
	t.Run("TimerDeleteRange", s.testTimerDeleteRange)
	t.Run("Fencing", s.testFencing)
	t.Run("Concurrency", s.testConcurrency)
}

type suite struct {
	newStore func(t *testing.T) store.Store
}

// Times used throughout: whole milliseconds in UTC.
var (
	base    = time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)
	created = base.Add(-time.Hour)
	// maxTime is the latest time the API can produce.
	maxTime = time.Date(9999, 12, 31, 23, 59, 59, 999_000_000, time.UTC)
	// epoch1ms is the earliest time the suite stores; times before 1970 are
	// not required to work.
	epoch1ms = time.UnixMilli(1).UTC()
	y2000    = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
)

const (
	nsA = "ns-a"
	nsB = "ns-b"
	// nodeA owns the bundle's shard; nodeB is the node that takes it over.
	nodeA = "node-a"
	nodeB = "node-b"
	// all is a window limit larger than any test's timer count.
	all = 1 << 20
)

var (
	keyA1 = store.ShardKey{Namespace: nsA, Shard: 1}
	keyA2 = store.ShardKey{Namespace: nsA, Shard: 2}
	keyB1 = store.ShardKey{Namespace: nsB, Shard: 1}

	defaultPolicy = timer.RetryPolicy{
		MaxAttempts:     3,
		InitialInterval: time.Second,
		// 1.5 checks that the multiplier round-trips as a float.
		BackoffMultiplier: 1.5,
		MaxInterval:       time.Minute,
	}
)

// bundle is what most tests need: a fresh store whose shard keyA1 is claimed
// by nodeA at version 1.
type bundle struct {
	ctx   context.Context
	s     store.Store
	fence store.Fence
}

func (s *suite) setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{ctx: t.Context(), s: s.newStore(t)}
	b.fence = claim(t, b, keyA1, nodeA, 0)
	return b
}

// claim claims key at prev+1 and returns the fence of the claim.
func claim(t *testing.T, b *bundle, key store.ShardKey, owner string, prev int64) store.Fence {
	t.Helper()
	sh, err := b.s.ShardClaim(b.ctx, store.ShardClaimParams{Shard: key, Owner: owner, PrevVersion: prev, Now: base})
	require.NoError(t, err)
	require.Equal(t, prev+1, sh.Version)
	return store.Fence{Shard: key, Version: sh.Version}
}

// newTimer returns a pending timer with every field set, due (and scheduled)
// at due.
func newTimer(key store.ShardKey, id string, due time.Time) *timer.Timer {
	payload, err := json.Marshal(map[string]any{"id": id, "nested": map[string]any{"n": 1, "list": []any{true, nil, "x"}}})
	if err != nil {
		panic(err)
	}
	return &timer.Timer{
		Namespace:       key.Namespace,
		ID:              id,
		Shard:           key.Shard,
		UUID:            timer.UUIDOf(key.Namespace, id),
		ExecuteAt:       due,
		DueAt:           due,
		CallbackURL:     "http://127.0.0.1:8080/callback?id=" + url.QueryEscape(id),
		Payload:         payload,
		RetryPolicy:     defaultPolicy,
		CallbackTimeout: 2500 * time.Millisecond,
		CreatedAt:       created,
		UpdatedAt:       created,
		Status:          timer.StatusPending,
	}
}

// failedTimer returns a timer as the engine stores it once retries are
// exhausted.
func failedTimer(key store.ShardKey, id string, due time.Time) *timer.Timer {
	t := newTimer(key, id, due)
	t.Status = timer.StatusFailed
	t.Attempts = 3
	t.LastError = "callback answered 503 Service Unavailable"
	t.UpdatedAt = due.Add(time.Minute)
	return t
}

func create(t *testing.T, b *bundle, f store.Fence, timers ...*timer.Timer) {
	t.Helper()
	for _, tm := range timers {
		require.NoError(t, b.s.TimerCreate(b.ctx, f, tm), "create %q", tm.ID)
	}
}

// update replaces a stored timer unconditionally.
func update(t *testing.T, b *bundle, f store.Fence, tm *timer.Timer) {
	t.Helper()
	require.NoError(t, b.s.TimerUpdate(b.ctx, f, store.TimerUpdateParams{Timer: tm}), "update %q", tm.ID)
}

func get(t *testing.T, b *bundle, key store.ShardKey, id string) *timer.Timer {
	t.Helper()
	got, err := b.s.TimerGet(b.ctx, key, id)
	require.NoError(t, err, "get %q", id)
	return got
}

func requireNotFound(t *testing.T, b *bundle, key store.ShardKey, id string) {
	t.Helper()
	_, err := b.s.TimerGet(b.ctx, key, id)
	require.ErrorIs(t, err, store.ErrTimerNotFound, "timer %q in %v should not exist", id, key)
}

// window returns every pending timer of the shard.
func window(t *testing.T, b *bundle, key store.ShardKey) []*timer.Timer {
	t.Helper()
	ts, err := b.s.TimerGetWindow(b.ctx, store.TimerGetWindowParams{Shard: key, DueUntil: maxTime, Limit: all})
	require.NoError(t, err)
	return ts
}

func shardGet(t *testing.T, b *bundle, key store.ShardKey) *store.Shard {
	t.Helper()
	sh, err := b.s.ShardGet(b.ctx, key)
	require.NoError(t, err)
	return sh
}

func ids(ts []*timer.Timer) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.ID
	}
	return out
}

func byPosition(a, b *timer.Timer) int { return a.Position().Compare(b.Position()) }

func sorted(ts []*timer.Timer) []*timer.Timer {
	out := slices.Clone(ts)
	slices.SortFunc(out, byPosition)
	return out
}

// requireTimerEqual checks that got is want exactly: every field, times in
// UTC; the payload is compared as JSON, since a driver may store it in a
// normalised form, and an absent payload may come back as JSON null.
func requireTimerEqual(t *testing.T, want, got *timer.Timer) {
	t.Helper()
	require.NotNil(t, got, "timer %q", want.ID)
	for name, tm := range map[string]time.Time{
		"ExecuteAt": got.ExecuteAt, "DueAt": got.DueAt, "CreatedAt": got.CreatedAt, "UpdatedAt": got.UpdatedAt,
	} {
		require.Equal(t, time.UTC, tm.Location(), "timer %q: %s must be returned in UTC", got.ID, name)
	}
	if isNullJSON(want.Payload) {
		require.True(t, isNullJSON(got.Payload), "timer %q: payload: want none, got %s", want.ID, got.Payload)
	} else {
		require.JSONEq(t, string(want.Payload), string(got.Payload), "timer %q: payload", want.ID)
	}
	w, g := *want, *got
	w.Payload, g.Payload = nil, nil
	require.Equal(t, w, g, "timer %q", want.ID)
}

func isNullJSON(b []byte) bool {
	b = bytes.TrimSpace(b)
	return len(b) == 0 || string(b) == "null"
}

// requireTimersEqual checks order first, so that a failure names the ids.
func requireTimersEqual(t *testing.T, want, got []*timer.Timer) {
	t.Helper()
	require.Equal(t, ids(want), ids(got))
	for i := range want {
		requireTimerEqual(t, want[i], got[i])
	}
}

// shardState is what a test can observe of one shard: the shard row, every
// pending timer, and the named timers whether pending or failed.
type shardState struct {
	shard   *store.Shard
	pending []*timer.Timer
	timers  map[string]*timer.Timer // nil value: not found
}

func readState(t *testing.T, b *bundle, key store.ShardKey, timerIDs ...string) shardState {
	t.Helper()
	st := shardState{timers: map[string]*timer.Timer{}}
	sh, err := b.s.ShardGet(b.ctx, key)
	if err != nil {
		require.ErrorIs(t, err, store.ErrShardNotFound)
	}
	st.shard = sh
	st.pending = window(t, b, key)
	for _, id := range timerIDs {
		tm, err := b.s.TimerGet(b.ctx, key, id)
		if err != nil {
			require.ErrorIs(t, err, store.ErrTimerNotFound)
		}
		st.timers[id] = tm
	}
	return st
}

func requireStateEqual(t *testing.T, want, got shardState) {
	t.Helper()
	require.Equal(t, want.shard, got.shard, "shard row")
	requireTimersEqual(t, want.pending, got.pending)
	require.Len(t, got.timers, len(want.timers))
	for id, w := range want.timers {
		if w == nil {
			require.Nil(t, got.timers[id], "timer %q should not exist", id)
			continue
		}
		requireTimerEqual(t, w, got.timers[id])
	}
}

// --- Store -------------------------------------------------------------------

func (s *suite) testStore(t *testing.T) {
	t.Run("MigrateIsIdempotent", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		tm := newTimer(keyA1, "survives-migrate", base)
		create(t, b, b.fence, tm)

		require.NoError(t, b.s.Migrate(b.ctx))
		require.NoError(t, b.s.Migrate(b.ctx))
		// Nodes starting together migrate at the same time.
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Go(func() { errs[i] = b.s.Migrate(b.ctx) })
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}

		requireTimerEqual(t, tm, get(t, b, keyA1, tm.ID))
		require.Equal(t, int64(1), shardGet(t, b, keyA1).Version)
	})

	t.Run("Ping", func(t *testing.T) {
		t.Parallel()
		st := s.newStore(t)
		require.NoError(t, st.Ping(t.Context()))
	})

	t.Run("Precision", func(t *testing.T) {
		t.Parallel()
		st := s.newStore(t)
		p := st.Precision()
		require.Positive(t, p)
		require.LessOrEqual(t, p, time.Millisecond, "no driver may be coarser than a millisecond")
		require.Zero(t, time.Millisecond%p, "precision must divide a millisecond")
	})
}

// --- Shard -------------------------------------------------------------------

func (s *suite) testShard(t *testing.T) {
	t.Run("GetNeverClaimed", func(t *testing.T) {
		t.Parallel()
		st := s.newStore(t)
		_, err := st.ShardGet(t.Context(), keyA1)
		require.ErrorIs(t, err, store.ErrShardNotFound)
	})

	t.Run("FirstClaim", func(t *testing.T) {
		t.Parallel()
		b := &bundle{ctx: t.Context(), s: s.newStore(t)}
		now := base.Add(123 * time.Millisecond)
		sh, err := b.s.ShardClaim(b.ctx, store.ShardClaimParams{Shard: keyA1, Owner: nodeA, PrevVersion: 0, Now: now})
		require.NoError(t, err)
		want := &store.Shard{Key: keyA1, Version: 1, Owner: nodeA, ClaimedAt: now}
		require.Equal(t, want, sh)
		require.Equal(t, want, shardGet(t, b, keyA1))
	})

	t.Run("ClaimAtCurrentVersion", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		now := base.Add(time.Hour + 7*time.Millisecond)
		sh, err := b.s.ShardClaim(b.ctx, store.ShardClaimParams{Shard: keyA1, Owner: nodeB, PrevVersion: 1, Now: now})
		require.NoError(t, err)
		want := &store.Shard{Key: keyA1, Version: 2, Owner: nodeB, ClaimedAt: now}
		require.Equal(t, want, sh)
		require.Equal(t, want, shardGet(t, b, keyA1))

		// The same node may re-claim its own shard, bumping the version.
		claim(t, b, keyA1, nodeB, 2)
		require.Equal(t, int64(3), shardGet(t, b, keyA1).Version)
	})

	t.Run("ClaimConflict", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		claim(t, b, keyA1, nodeA, 1) // version 2
		before := shardGet(t, b, keyA1)

		for _, prev := range []int64{0, 1, 3, 100} {
			_, err := b.s.ShardClaim(b.ctx, store.ShardClaimParams{Shard: keyA1, Owner: nodeB, PrevVersion: prev, Now: base.Add(time.Hour)})
			require.ErrorIs(t, err, store.ErrShardVersionConflict, "claim with PrevVersion %d of a shard at version 2", prev)
			require.Equal(t, before, shardGet(t, b, keyA1), "a failed claim must change nothing")
		}
	})

	t.Run("ClaimNeverClaimedWithVersion", func(t *testing.T) {
		t.Parallel()
		b := &bundle{ctx: t.Context(), s: s.newStore(t)}
		_, err := b.s.ShardClaim(b.ctx, store.ShardClaimParams{Shard: keyA1, Owner: nodeA, PrevVersion: 3, Now: base})
		require.ErrorIs(t, err, store.ErrShardVersionConflict)
		_, err = b.s.ShardGet(b.ctx, keyA1)
		require.ErrorIs(t, err, store.ErrShardNotFound)
	})

	t.Run("ConcurrentClaims", func(t *testing.T) {
		t.Parallel()
		b := &bundle{ctx: t.Context(), s: s.newStore(t)}
		const n = 16
		// Round 1 races on creating the shard row, round 2 on bumping it.
		for prev := int64(0); prev < 2; prev++ {
			var wg sync.WaitGroup
			shards := make([]*store.Shard, n)
			errs := make([]error, n)
			for i := range n {
				wg.Go(func() {
					shards[i], errs[i] = b.s.ShardClaim(b.ctx, store.ShardClaimParams{
						Shard: keyA1, Owner: fmt.Sprintf("node-%d", i), PrevVersion: prev, Now: base,
					})
				})
			}
			wg.Wait()
			winner := -1
			for i, err := range errs {
				if err == nil {
					require.Equal(t, -1, winner, "two claims with PrevVersion %d won: node-%d and node-%d", prev, winner, i)
					winner = i
					continue
				}
				require.ErrorIs(t, err, store.ErrShardVersionConflict)
			}
			require.NotEqual(t, -1, winner, "no claim with PrevVersion %d won", prev)
			want := &store.Shard{Key: keyA1, Version: prev + 1, Owner: fmt.Sprintf("node-%d", winner), ClaimedAt: base}
			require.Equal(t, want, shards[winner])
			require.Equal(t, want, shardGet(t, b, keyA1))
		}
	})

	t.Run("Release", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		require.NoError(t, b.s.ShardRelease(b.ctx, b.fence))
		sh := shardGet(t, b, keyA1)
		require.Equal(t, keyA1, sh.Key)
		require.Equal(t, int64(1), sh.Version, "release keeps the version")
		require.Empty(t, sh.Owner, "release clears the owner")

		// A released shard is claimed from its kept version.
		_, err := b.s.ShardClaim(b.ctx, store.ShardClaimParams{Shard: keyA1, Owner: nodeB, PrevVersion: 0, Now: base})
		require.ErrorIs(t, err, store.ErrShardVersionConflict)
		claim(t, b, keyA1, nodeB, 1)
		require.Equal(t, nodeB, shardGet(t, b, keyA1).Owner)
	})

	t.Run("ReleaseStale", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		claim(t, b, keyA1, nodeB, 1)
		before := shardGet(t, b, keyA1)
		require.ErrorIs(t, b.s.ShardRelease(b.ctx, b.fence), store.ErrShardOwnershipLost)
		require.Equal(t, before, shardGet(t, b, keyA1))
	})

	t.Run("ReleaseNeverClaimed", func(t *testing.T) {
		t.Parallel()
		b := &bundle{ctx: t.Context(), s: s.newStore(t)}
		for _, v := range []int64{0, 1} {
			err := b.s.ShardRelease(b.ctx, store.Fence{Shard: keyA1, Version: v})
			require.ErrorIs(t, err, store.ErrShardOwnershipLost)
		}
		_, err := b.s.ShardGet(b.ctx, keyA1)
		require.ErrorIs(t, err, store.ErrShardNotFound, "a failed release must not create the shard row")
	})

	t.Run("PerNamespace", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)              // (a, 1) at version 1
		claim(t, b, keyA1, nodeA, 1) // (a, 1) at version 2
		_, err := b.s.ShardGet(b.ctx, keyB1)
		require.ErrorIs(t, err, store.ErrShardNotFound, "shard 1 of another namespace is another shard")

		claim(t, b, keyB1, nodeB, 0)
		require.Equal(t, &store.Shard{Key: keyB1, Version: 1, Owner: nodeB, ClaimedAt: base}, shardGet(t, b, keyB1))
		require.Equal(t, &store.Shard{Key: keyA1, Version: 2, Owner: nodeA, ClaimedAt: base}, shardGet(t, b, keyA1))

		require.NoError(t, b.s.ShardRelease(b.ctx, store.Fence{Shard: keyB1, Version: 1}))
		require.Equal(t, nodeA, shardGet(t, b, keyA1).Owner, "releasing (b, 1) leaves (a, 1) alone")
	})
}

// --- Timer CRUD ----------------------------------------------------------------

func (s *suite) testTimer(t *testing.T) {
	t.Run("CreateGet", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		tm := newTimer(keyA1, "every-field", base.Add(90*time.Second))
		// A timer that is retrying: due later than scheduled.
		tm.ExecuteAt = base.Add(-time.Minute)
		tm.Attempts = 2
		tm.LastError = "callback timed out after 2.5s"
		tm.UpdatedAt = base.Add(-30 * time.Second)
		tm.RetryPolicy = timer.RetryPolicy{
			MaxAttempts:         7,
			MaxAttemptsDuration: 36 * time.Hour,
			InitialInterval:     1500 * time.Millisecond,
			BackoffMultiplier:   2.25,
			MaxInterval:         90 * time.Minute,
		}
		create(t, b, b.fence, tm)
		requireTimerEqual(t, tm, get(t, b, keyA1, tm.ID))
	})

	t.Run("CreateDoesNotAlias", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		tm := newTimer(keyA1, "alias", base)
		want := tm.Clone()
		create(t, b, b.fence, tm)
		tm.Payload[0] = ' ' // a caller reusing its buffer must not change the stored timer
		tm.CallbackURL = "changed"
		requireTimerEqual(t, want, get(t, b, keyA1, want.ID))
	})

	t.Run("Payload", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		payloads := map[string]string{
			"absent":  "",
			"null":    "null",
			"object":  `{"b": 1, "a": [1, 2.5, {"c": null}], "s": "x\"y"}`,
			"empty":   `{}`,
			"array":   `[1, "two", false]`,
			"string":  `"just a string"`,
			"number":  `-12.5e3`,
			"bool":    `true`,
			"unicode": `{"text": "żółw 🐢 \u00e9", "escaped": "tab\tnul\u0000end", "html": "<a&b>"}`,
			"big":     `{"n": 123456789012345678901234567890, "f": 0.1}`,
		}
		for id, p := range payloads {
			tm := newTimer(keyA1, id, base)
			tm.Payload = nil
			if p != "" {
				tm.Payload = json.RawMessage(p)
			}
			create(t, b, b.fence, tm)
			requireTimerEqual(t, tm, get(t, b, keyA1, id))
		}
		// The window returns payloads as TimerGet does.
		for _, got := range window(t, b, keyA1) {
			want := newTimer(keyA1, got.ID, base)
			want.Payload = json.RawMessage(payloads[got.ID])
			requireTimerEqual(t, want, got)
		}
	})

	t.Run("GetNotFound", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		requireNotFound(t, b, keyA1, "nope")
		create(t, b, b.fence, newTimer(keyA1, "only-in-a", base))
		claim(t, b, keyB1, nodeA, 0)
		requireNotFound(t, b, keyB1, "only-in-a")
	})

	t.Run("Delete", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		keep := newTimer(keyA1, "keep", base)
		create(t, b, b.fence, newTimer(keyA1, "gone", base), keep)
		require.NoError(t, b.s.TimerDelete(b.ctx, b.fence, "gone"))
		requireNotFound(t, b, keyA1, "gone")
		requireTimersEqual(t, []*timer.Timer{keep}, window(t, b, keyA1))
		require.ErrorIs(t, b.s.TimerDelete(b.ctx, b.fence, "gone"), store.ErrTimerNotFound)
	})

	t.Run("DeleteFailed", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		create(t, b, b.fence, newTimer(keyA1, "f", base))
		update(t, b, b.fence, failedTimer(keyA1, "f", base))
		require.NoError(t, b.s.TimerDelete(b.ctx, b.fence, "f"))
		requireNotFound(t, b, keyA1, "f")
	})

	t.Run("DeleteUnknown", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		require.ErrorIs(t, b.s.TimerDelete(b.ctx, b.fence, "never-created"), store.ErrTimerNotFound)
		// Same id in another namespace does not count.
		fb := claim(t, b, keyB1, nodeA, 0)
		create(t, b, fb, newTimer(keyB1, "in-b", base))
		require.ErrorIs(t, b.s.TimerDelete(b.ctx, b.fence, "in-b"), store.ErrTimerNotFound)
		get(t, b, keyB1, "in-b")
	})

	t.Run("UpsertMoves", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		other := newTimer(keyA1, "other", base.Add(30*time.Second))
		first := newTimer(keyA1, "x", base)
		create(t, b, b.fence, other, first)

		later := newTimer(keyA1, "x", base.Add(time.Minute))
		later.CallbackURL = "http://127.0.0.1:8080/elsewhere"
		later.Payload = json.RawMessage(`{"second": true}`)
		later.UpdatedAt = base
		create(t, b, b.fence, later)
		requireTimerEqual(t, later, get(t, b, keyA1, "x"))
		requireTimersEqual(t, []*timer.Timer{other, later}, window(t, b, keyA1))
		// Not at the old position any more.
		old, err := b.s.TimerGetWindow(b.ctx, store.TimerGetWindowParams{Shard: keyA1, DueUntil: base.Add(time.Second), Limit: all})
		require.NoError(t, err)
		require.Empty(t, old)

		earlier := newTimer(keyA1, "x", base.Add(-time.Minute))
		create(t, b, b.fence, earlier)
		requireTimerEqual(t, earlier, get(t, b, keyA1, "x"))
		requireTimersEqual(t, []*timer.Timer{earlier, other}, window(t, b, keyA1))

		// Same position again: still one timer.
		create(t, b, b.fence, earlier)
		requireTimersEqual(t, []*timer.Timer{earlier, other}, window(t, b, keyA1))
	})

	t.Run("UpsertOverFailed", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		create(t, b, b.fence, newTimer(keyA1, "x", base))
		update(t, b, b.fence, failedTimer(keyA1, "x", base))
		require.Empty(t, window(t, b, keyA1))

		again := newTimer(keyA1, "x", base.Add(time.Hour))
		create(t, b, b.fence, again)
		requireTimerEqual(t, again, get(t, b, keyA1, "x"))
		requireTimersEqual(t, []*timer.Timer{again}, window(t, b, keyA1))

		// And at the very position it failed at.
		update(t, b, b.fence, failedTimer(keyA1, "x", base))
		same := newTimer(keyA1, "x", base)
		create(t, b, b.fence, same)
		requireTimerEqual(t, same, get(t, b, keyA1, "x"))
		requireTimersEqual(t, []*timer.Timer{same}, window(t, b, keyA1))
	})

	t.Run("SameIDTwoNamespaces", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		fb := claim(t, b, keyB1, nodeA, 0)
		ta := newTimer(keyA1, "shared-id", base)
		tb := newTimer(keyB1, "shared-id", base)
		tb.CallbackURL = "http://127.0.0.1:8080/b"
		require.NotEqual(t, ta.UUID, tb.UUID)
		create(t, b, b.fence, ta)
		create(t, b, fb, tb)
		requireTimerEqual(t, ta, get(t, b, keyA1, "shared-id"))
		requireTimerEqual(t, tb, get(t, b, keyB1, "shared-id"))
		requireTimersEqual(t, []*timer.Timer{ta}, window(t, b, keyA1))
		requireTimersEqual(t, []*timer.Timer{tb}, window(t, b, keyB1))

		require.NoError(t, b.s.TimerDelete(b.ctx, fb, "shared-id"))
		requireNotFound(t, b, keyB1, "shared-id")
		requireTimerEqual(t, ta, get(t, b, keyA1, "shared-id"))
	})

	t.Run("TimesRoundTrip", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		for i, at := range []time.Time{
			epoch1ms,
			y2000,
			base.Add(999 * time.Millisecond),
			time.Date(2038, 1, 19, 3, 14, 8, 1_000_000, time.UTC), // past 32-bit Unix seconds
			maxTime,
		} {
			tm := newTimer(keyA1, fmt.Sprintf("t%d", i), at)
			tm.ExecuteAt, tm.CreatedAt, tm.UpdatedAt = at, at, at
			create(t, b, b.fence, tm)
			requireTimerEqual(t, tm, get(t, b, keyA1, tm.ID))
		}
		now := maxTime
		sh, err := b.s.ShardClaim(b.ctx, store.ShardClaimParams{Shard: keyA1, Owner: nodeB, PrevVersion: 1, Now: now})
		require.NoError(t, err)
		require.Equal(t, now, sh.ClaimedAt)
		require.Equal(t, now, shardGet(t, b, keyA1).ClaimedAt)
	})

	t.Run("FinerTimesAreTruncated", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		p := b.s.Precision()
		fine := base.Add(123*time.Millisecond + 456*time.Microsecond + 789*time.Nanosecond)
		tm := newTimer(keyA1, "fine", fine)
		tm.CreatedAt, tm.UpdatedAt = fine.Add(-time.Hour), fine.Add(-time.Minute)
		create(t, b, b.fence, tm)

		want := tm.Clone()
		want.ExecuteAt, want.DueAt = fine.Truncate(p), fine.Truncate(p)
		want.CreatedAt, want.UpdatedAt = tm.CreatedAt.Truncate(p), tm.UpdatedAt.Truncate(p)
		requireTimerEqual(t, want, get(t, b, keyA1, "fine"))
		requireTimersEqual(t, []*timer.Timer{want}, window(t, b, keyA1))

		sh, err := b.s.ShardClaim(b.ctx, store.ShardClaimParams{Shard: keyA1, Owner: nodeB, PrevVersion: 1, Now: fine})
		require.NoError(t, err)
		require.Equal(t, fine.Truncate(p), sh.ClaimedAt)
		require.Equal(t, fine.Truncate(p), shardGet(t, b, keyA1).ClaimedAt)
	})
}

// --- TimerUpdate -----------------------------------------------------------------

func (s *suite) testTimerUpdate(t *testing.T) {
	t.Run("ReplacesEveryField", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		other := newTimer(keyA1, "other", base.Add(time.Minute))
		tm := newTimer(keyA1, "x", base)
		create(t, b, b.fence, tm, other)

		n := tm.Clone()
		n.ExecuteAt = base.Add(-time.Hour)
		n.DueAt = base.Add(2 * time.Minute)
		n.CallbackURL = "https://example.test/hook"
		n.Payload = json.RawMessage(`[1,2,3]`)
		n.RetryPolicy = timer.RetryPolicy{MaxAttempts: 9, MaxAttemptsDuration: time.Hour, InitialInterval: 3 * time.Second, BackoffMultiplier: 3, MaxInterval: 10 * time.Minute}
		n.CallbackTimeout = 45 * time.Second
		n.CreatedAt = created.Add(-time.Hour)
		n.UpdatedAt = base.Add(time.Second)
		n.Attempts = 4
		n.LastError = "connection refused"
		update(t, b, b.fence, n)
		requireTimerEqual(t, n, get(t, b, keyA1, "x"))
		requireTimersEqual(t, []*timer.Timer{other, n}, window(t, b, keyA1))

		// Clearing fields clears them.
		c := n.Clone()
		c.Payload = nil
		c.LastError = ""
		c.Attempts = 0
		update(t, b, b.fence, c)
		requireTimerEqual(t, c, get(t, b, keyA1, "x"))
	})

	t.Run("PendingToFailedAndBack", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		before := newTimer(keyA1, "before", base.Add(-time.Second))
		after := newTimer(keyA1, "after", base.Add(time.Second))
		create(t, b, b.fence, before, newTimer(keyA1, "x", base), after)

		failed := failedTimer(keyA1, "x", base)
		update(t, b, b.fence, failed)
		requireTimerEqual(t, failed, get(t, b, keyA1, "x"))
		requireTimersEqual(t, []*timer.Timer{before, after}, window(t, b, keyA1))

		// A failed timer is outside the range the engine deletes.
		n, err := b.s.TimerDeleteRange(b.ctx, b.fence, store.TimerDeleteRangeParams{UpTo: timer.Position{DueAt: maxTime, UUID: timer.MaxUUID}})
		require.NoError(t, err)
		if n >= 0 {
			require.Equal(t, 2, n)
		}
		require.Empty(t, window(t, b, keyA1))
		requireTimerEqual(t, failed, get(t, b, keyA1, "x"))

		// Replay: pending again, at a new time.
		replay := newTimer(keyA1, "x", base.Add(time.Hour))
		replay.UpdatedAt = base.Add(time.Minute)
		update(t, b, b.fence, replay)
		requireTimerEqual(t, replay, get(t, b, keyA1, "x"))
		requireTimersEqual(t, []*timer.Timer{replay}, window(t, b, keyA1))

		// Failed and back at the same position.
		update(t, b, b.fence, failedTimer(keyA1, "x", replay.DueAt))
		require.Empty(t, window(t, b, keyA1))
		update(t, b, b.fence, replay)
		requireTimersEqual(t, []*timer.Timer{replay}, window(t, b, keyA1))
	})

	t.Run("Missing", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		err := b.s.TimerUpdate(b.ctx, b.fence, store.TimerUpdateParams{Timer: newTimer(keyA1, "missing", base)})
		require.ErrorIs(t, err, store.ErrTimerNotFound)
		requireNotFound(t, b, keyA1, "missing")
		require.Empty(t, window(t, b, keyA1), "an update must not create")

		due := base
		err = b.s.TimerUpdate(b.ctx, b.fence, store.TimerUpdateParams{Timer: newTimer(keyA1, "missing", base), IfDueAt: &due})
		require.ErrorIs(t, err, store.ErrTimerNotFound)
		requireNotFound(t, b, keyA1, "missing")
	})

	t.Run("IfDueAt", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		d1, d2, d3 := base, base.Add(time.Second), base.Add(time.Minute)
		tm := newTimer(keyA1, "x", d1)
		create(t, b, b.fence, tm)

		// The engine fired the timer due at d1 and schedules a retry at d3.
		retry := tm.Clone()
		retry.DueAt = d3
		retry.Attempts = 1
		retry.LastError = "503"

		// Someone moved it: a different due time does not match.
		err := b.s.TimerUpdate(b.ctx, b.fence, store.TimerUpdateParams{Timer: retry, IfDueAt: &d2})
		require.ErrorIs(t, err, store.ErrTimerNotFound)
		requireTimerEqual(t, tm, get(t, b, keyA1, "x"))
		requireTimersEqual(t, []*timer.Timer{tm}, window(t, b, keyA1))

		require.NoError(t, b.s.TimerUpdate(b.ctx, b.fence, store.TimerUpdateParams{Timer: retry, IfDueAt: &d1}))
		requireTimerEqual(t, retry, get(t, b, keyA1, "x"))
		requireTimersEqual(t, []*timer.Timer{retry}, window(t, b, keyA1))

		// d1 is stale now.
		stale := tm.Clone()
		stale.Attempts = 7
		err = b.s.TimerUpdate(b.ctx, b.fence, store.TimerUpdateParams{Timer: stale, IfDueAt: &d1})
		require.ErrorIs(t, err, store.ErrTimerNotFound)
		requireTimerEqual(t, retry, get(t, b, keyA1, "x"))

		// A failed timer is not pending at any due time.
		failed := failedTimer(keyA1, "x", d3)
		update(t, b, b.fence, failed)
		err = b.s.TimerUpdate(b.ctx, b.fence, store.TimerUpdateParams{Timer: retry, IfDueAt: &d3})
		require.ErrorIs(t, err, store.ErrTimerNotFound)
		requireTimerEqual(t, failed, get(t, b, keyA1, "x"))
		require.Empty(t, window(t, b, keyA1))

		// Conditional transition to failed, as the engine does when retries
		// are exhausted.
		update(t, b, b.fence, retry)
		failed2 := failedTimer(keyA1, "x", d3)
		require.NoError(t, b.s.TimerUpdate(b.ctx, b.fence, store.TimerUpdateParams{Timer: failed2, IfDueAt: &d3}))
		requireTimerEqual(t, failed2, get(t, b, keyA1, "x"))
		require.Empty(t, window(t, b, keyA1))
	})
}

// --- TimerGetWindow --------------------------------------------------------------

// windowFixture is a shard with timers at the edges the window must handle,
// and neighbours it must leave out.
type windowFixture struct {
	// pending are the pending timers of keyA1 in Position order.
	pending []*timer.Timer
	// failed is a failed timer of keyA1 due among the ties.
	failed *timer.Timer
	// neighbours are pending timers of other shards, by shard.
	neighbours map[store.ShardKey][]*timer.Timer
	fences     map[store.ShardKey]store.Fence
}

func buildWindowFixture(t *testing.T, b *bundle) *windowFixture {
	t.Helper()
	f := &windowFixture{
		neighbours: map[store.ShardKey][]*timer.Timer{},
		fences:     map[store.ShardKey]store.Fence{keyA1: b.fence},
	}
	retrying := newTimer(keyA1, "retrying", base.Add(-time.Millisecond))
	retrying.ExecuteAt = base.Add(-time.Hour) // ordered by DueAt, not ExecuteAt
	retrying.Attempts = 2
	pending := []*timer.Timer{
		newTimer(keyA1, "epoch+1ms", epoch1ms),
		newTimer(keyA1, "y2000", y2000),
		retrying,
		newTimer(keyA1, "later-0", base.Add(time.Second)),
		newTimer(keyA1, "later-1", base.Add(time.Second)),
		newTimer(keyA1, "later-2", base.Add(time.Second+time.Millisecond)),
		newTimer(keyA1, "far", maxTime),
	}
	// Ties at base: order among them is by UUID bytes alone.
	for i := range 8 {
		pending = append(pending, newTimer(keyA1, fmt.Sprintf("tie-%d", i), base))
	}
	create(t, b, b.fence, pending...)
	f.pending = sorted(pending)

	f.failed = failedTimer(keyA1, "failed-at-base", base)
	create(t, b, b.fence, newTimer(keyA1, f.failed.ID, base))
	update(t, b, b.fence, f.failed)

	for _, key := range []store.ShardKey{keyA2, keyB1} {
		fence := claim(t, b, key, nodeA, 0)
		f.fences[key] = fence
		ns := []*timer.Timer{
			newTimer(key, "tie-0", base), // same id as in keyA1 where the namespace differs
			newTimer(key, "neighbour-early", y2000),
			newTimer(key, "neighbour-base", base),
			newTimer(key, "neighbour-late", base.Add(time.Second)),
		}
		create(t, b, fence, ns...)
		f.neighbours[key] = sorted(ns)
	}
	return f
}

// modelWindow is what TimerGetWindow must return, computed from the sorted
// pending timers.
func modelWindow(pending []*timer.Timer, p store.TimerGetWindowParams) []*timer.Timer {
	out := []*timer.Timer{}
	for _, t := range pending {
		if len(out) >= p.Limit {
			break
		}
		if t.Position().Compare(p.After) > 0 && !t.DueAt.After(p.DueUntil) {
			out = append(out, t)
		}
	}
	return out
}

func (s *suite) testTimerGetWindow(t *testing.T) {
	t.Parallel()
	b := s.setup(t)
	f := buildWindowFixture(t, b)
	getWindow := func(t *testing.T, p store.TimerGetWindowParams) []*timer.Timer {
		t.Helper()
		got, err := b.s.TimerGetWindow(b.ctx, p)
		require.NoError(t, err)
		return got
	}
	var ties []*timer.Timer
	for _, tm := range f.pending {
		if tm.DueAt.Equal(base) {
			ties = append(ties, tm)
		}
	}
	require.Len(t, ties, 8)
	// The fixture is only useful if UUID order differs from id order.
	require.NotEqual(t, []string{"tie-0", "tie-1", "tie-2", "tie-3", "tie-4", "tie-5", "tie-6", "tie-7"}, ids(ties))

	t.Run("All", func(t *testing.T) {
		got := getWindow(t, store.TimerGetWindowParams{Shard: keyA1, DueUntil: maxTime, Limit: all})
		requireTimersEqual(t, f.pending, got)
		for i := 1; i < len(got); i++ {
			require.Negative(t, byPosition(got[i-1], got[i]), "window out of Position order at %d", i)
		}
	})

	t.Run("OnlyThatShard", func(t *testing.T) {
		for key, want := range f.neighbours {
			requireTimersEqual(t, want, getWindow(t, store.TimerGetWindowParams{Shard: key, DueUntil: maxTime, Limit: all}))
		}
		empty := getWindow(t, store.TimerGetWindowParams{Shard: store.ShardKey{Namespace: nsA, Shard: 3}, DueUntil: maxTime, Limit: all})
		require.Empty(t, empty)
	})

	t.Run("TieBreakByUUID", func(t *testing.T) {
		got := getWindow(t, store.TimerGetWindowParams{Shard: keyA1, After: timer.Position{DueAt: base}, DueUntil: base, Limit: all})
		requireTimersEqual(t, ties, got)
		for i := 1; i < len(got); i++ {
			require.Negative(t, bytes.Compare(got[i-1].UUID[:], got[i].UUID[:]))
		}
	})

	t.Run("DueUntilInclusive", func(t *testing.T) {
		got := getWindow(t, store.TimerGetWindowParams{Shard: keyA1, DueUntil: base, Limit: all})
		require.Equal(t, append([]string{"epoch+1ms", "y2000", "retrying"}, ids(ties)...), ids(got))
		got = getWindow(t, store.TimerGetWindowParams{Shard: keyA1, DueUntil: base.Add(-time.Millisecond), Limit: all})
		require.Equal(t, []string{"epoch+1ms", "y2000", "retrying"}, ids(got))
		got = getWindow(t, store.TimerGetWindowParams{Shard: keyA1, DueUntil: epoch1ms, Limit: all})
		require.Equal(t, []string{"epoch+1ms"}, ids(got))
		got = getWindow(t, store.TimerGetWindowParams{Shard: keyA1, DueUntil: time.Unix(0, 0).UTC(), Limit: all})
		require.Empty(t, got)
	})

	t.Run("AfterExclusive", func(t *testing.T) {
		// After a timer's own position: the timers after it, not it.
		for i, tm := range f.pending {
			got := getWindow(t, store.TimerGetWindowParams{Shard: keyA1, After: tm.Position(), DueUntil: maxTime, Limit: all})
			require.Equal(t, ids(f.pending[i+1:]), ids(got), "after %q", tm.ID)
		}
		// Within one instant, by UUID.
		got := getWindow(t, store.TimerGetWindowParams{Shard: keyA1, After: ties[3].Position(), DueUntil: base, Limit: all})
		require.Equal(t, ids(ties[4:]), ids(got))
		// The last position at an instant excludes everything at it.
		got = getWindow(t, store.TimerGetWindowParams{Shard: keyA1, After: timer.Position{DueAt: base, UUID: timer.MaxUUID}, DueUntil: base.Add(time.Second), Limit: all})
		require.Equal(t, []string{"later-0", "later-1"}, sortedIDs(got))
		// A position between timers.
		got = getWindow(t, store.TimerGetWindowParams{Shard: keyA1, After: timer.Position{DueAt: base.Add(-2 * time.Millisecond), UUID: timer.MaxUUID}, DueUntil: base.Add(-time.Millisecond), Limit: all})
		require.Equal(t, []string{"retrying"}, ids(got))
	})

	t.Run("Limit", func(t *testing.T) {
		got := getWindow(t, store.TimerGetWindowParams{Shard: keyA1, DueUntil: maxTime, Limit: 3})
		requireTimersEqual(t, f.pending[:3], got)
		got = getWindow(t, store.TimerGetWindowParams{Shard: keyA1, DueUntil: maxTime, Limit: 1})
		requireTimersEqual(t, f.pending[:1], got)
		got = getWindow(t, store.TimerGetWindowParams{Shard: keyA1, DueUntil: maxTime, Limit: len(f.pending)})
		requireTimersEqual(t, f.pending, got)
		got = getWindow(t, store.TimerGetWindowParams{Shard: keyA1, After: ties[1].Position(), DueUntil: base, Limit: 2})
		requireTimersEqual(t, ties[2:4], got)
	})

	t.Run("Paging", func(t *testing.T) {
		for _, limit := range []int{1, 2, 3, 5} {
			var walked []*timer.Timer
			after := timer.Position{}
			for range len(f.pending) + 2 {
				page := getWindow(t, store.TimerGetWindowParams{Shard: keyA1, After: after, DueUntil: maxTime, Limit: limit})
				require.LessOrEqual(t, len(page), limit)
				walked = append(walked, page...)
				if len(page) < limit {
					break
				}
				after = page[len(page)-1].Position()
			}
			requireTimersEqual(t, f.pending, walked)
		}
	})

	t.Run("Model", func(t *testing.T) {
		afters := []timer.Position{
			{},
			{DueAt: base},
			{DueAt: base, UUID: timer.MaxUUID},
			{DueAt: base.Add(time.Second), UUID: timer.MaxUUID},
			{DueAt: maxTime, UUID: timer.MaxUUID},
		}
		for _, tm := range f.pending {
			afters = append(afters, tm.Position())
		}
		untils := []time.Time{epoch1ms, y2000, base.Add(-time.Millisecond), base, base.Add(time.Second), maxTime.Add(-time.Millisecond), maxTime}
		for _, after := range afters {
			for _, until := range untils {
				for _, limit := range []int{1, 2, 4, all} {
					p := store.TimerGetWindowParams{Shard: keyA1, After: after, DueUntil: until, Limit: limit}
					want := modelWindow(f.pending, p)
					require.Equal(t, ids(want), ids(getWindow(t, p)), "after %v/%s until %v limit %d", after.DueAt, after.UUID, until, limit)
				}
			}
		}
	})
}

func sortedIDs(ts []*timer.Timer) []string {
	out := ids(ts)
	slices.Sort(out)
	return out
}

// --- TimerDeleteRange ------------------------------------------------------------

func (s *suite) testTimerDeleteRange(t *testing.T) {
	t.Run("Progressive", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		f := buildWindowFixture(t, b)
		var ties []*timer.Timer
		for _, tm := range f.pending {
			if tm.DueAt.Equal(base) {
				ties = append(ties, tm)
			}
		}
		remaining := f.pending
		steps := []struct {
			name string
			upTo timer.Position
		}{
			{"zero position", timer.Position{}},
			{"before epoch+1ms", timer.Position{DueAt: epoch1ms.Add(-time.Millisecond), UUID: timer.MaxUUID}},
			{"first instant of base", timer.Position{DueAt: base}},
			{"a tie, inclusive", ties[2].Position()},
			{"the same tie again", ties[2].Position()},
			{"between ties", timer.Position{DueAt: base, UUID: uuidBetween(ties[4].UUID, ties[5].UUID)}},
			{"last instant of base", timer.Position{DueAt: base, UUID: timer.MaxUUID}},
			{"later-1 exactly", findPosition(f.pending, "later-1")},
			{"everything", timer.Position{DueAt: maxTime, UUID: timer.MaxUUID}},
		}
		for _, step := range steps {
			var want, gone []*timer.Timer
			for _, tm := range remaining {
				if tm.Position().Compare(step.upTo) <= 0 {
					gone = append(gone, tm)
				} else {
					want = append(want, tm)
				}
			}
			n, err := b.s.TimerDeleteRange(b.ctx, b.fence, store.TimerDeleteRangeParams{UpTo: step.upTo})
			require.NoError(t, err, step.name)
			if n >= 0 {
				require.Equal(t, len(gone), n, "%s: rows removed", step.name)
			} else {
				require.Equal(t, -1, n, "%s: a count it cannot report is -1", step.name)
			}
			requireTimersEqual(t, want, window(t, b, keyA1))
			for _, tm := range gone {
				requireNotFound(t, b, keyA1, tm.ID)
			}
			remaining = want
		}
		require.Empty(t, remaining)

		// Nothing else was touched.
		requireTimerEqual(t, f.failed, get(t, b, keyA1, f.failed.ID))
		for key, want := range f.neighbours {
			requireTimersEqual(t, want, window(t, b, key))
		}
		require.Equal(t, &store.Shard{Key: keyA1, Version: 1, Owner: nodeA, ClaimedAt: base}, shardGet(t, b, keyA1))
		claim(t, b, keyA1, nodeB, 1)
	})

	t.Run("EmptyShard", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		n, err := b.s.TimerDeleteRange(b.ctx, b.fence, store.TimerDeleteRangeParams{UpTo: timer.Position{DueAt: maxTime, UUID: timer.MaxUUID}})
		require.NoError(t, err)
		require.Contains(t, []int{0, -1}, n)
		require.Equal(t, int64(1), shardGet(t, b, keyA1).Version)
	})
}

// uuidBetween returns a UUID strictly between a and b (a < b, not adjacent
// in practice: they are random).
func uuidBetween(a, b uuid.UUID) uuid.UUID {
	m := a
	for i := 15; i >= 0; i-- {
		if m[i] < 0xff {
			m[i]++
			break
		}
		m[i] = 0
	}
	if bytes.Compare(m[:], b[:]) >= 0 {
		panic("uuids are adjacent")
	}
	return m
}

func findPosition(ts []*timer.Timer, id string) timer.Position {
	for _, t := range ts {
		if t.ID == id {
			return t.Position()
		}
	}
	panic("no timer " + id)
}

// --- Fencing ---------------------------------------------------------------------

func (s *suite) testFencing(t *testing.T) {
	// Each fenced write, made with a fence that is not the shard's current
	// version, fails with ErrShardOwnershipLost and writes nothing; made with
	// the current fence it succeeds, which shows the write would have done
	// something.
	type fixture struct {
		x, y, failed *timer.Timer
	}
	far := timer.Position{DueAt: maxTime, UUID: timer.MaxUUID}
	writes := []struct {
		name string
		do   func(b *bundle, f store.Fence, fx fixture) error
	}{
		{"TimerCreateNew", func(b *bundle, f store.Fence, _ fixture) error {
			return b.s.TimerCreate(b.ctx, f, newTimer(keyA1, "z", base))
		}},
		{"TimerCreateReplace", func(b *bundle, f store.Fence, fx fixture) error {
			n := newTimer(keyA1, fx.x.ID, base.Add(time.Hour))
			return b.s.TimerCreate(b.ctx, f, n)
		}},
		{"TimerCreateOverFailed", func(b *bundle, f store.Fence, fx fixture) error {
			return b.s.TimerCreate(b.ctx, f, newTimer(keyA1, fx.failed.ID, base))
		}},
		{"TimerUpdate", func(b *bundle, f store.Fence, fx fixture) error {
			n := fx.x.Clone()
			n.DueAt = base.Add(time.Hour)
			n.Attempts = 1
			return b.s.TimerUpdate(b.ctx, f, store.TimerUpdateParams{Timer: n})
		}},
		{"TimerUpdateIfDueAt", func(b *bundle, f store.Fence, fx fixture) error {
			n := fx.x.Clone()
			n.DueAt = base.Add(time.Hour)
			return b.s.TimerUpdate(b.ctx, f, store.TimerUpdateParams{Timer: n, IfDueAt: &fx.x.DueAt})
		}},
		{"TimerUpdateToFailed", func(b *bundle, f store.Fence, fx fixture) error {
			return b.s.TimerUpdate(b.ctx, f, store.TimerUpdateParams{Timer: failedTimer(keyA1, fx.y.ID, fx.y.DueAt)})
		}},
		{"TimerUpdateFailedToPending", func(b *bundle, f store.Fence, fx fixture) error {
			return b.s.TimerUpdate(b.ctx, f, store.TimerUpdateParams{Timer: newTimer(keyA1, fx.failed.ID, base)})
		}},
		{"TimerDelete", func(b *bundle, f store.Fence, fx fixture) error {
			return b.s.TimerDelete(b.ctx, f, fx.x.ID)
		}},
		{"TimerDeleteFailed", func(b *bundle, f store.Fence, fx fixture) error {
			return b.s.TimerDelete(b.ctx, f, fx.failed.ID)
		}},
		{"TimerDeleteRange", func(b *bundle, f store.Fence, _ fixture) error {
			_, err := b.s.TimerDeleteRange(b.ctx, f, store.TimerDeleteRangeParams{UpTo: far})
			return err
		}},
		{"ShardRelease", func(b *bundle, f store.Fence, _ fixture) error {
			return b.s.ShardRelease(b.ctx, f)
		}},
	}

	for _, w := range writes {
		t.Run("Stale/"+w.name, func(t *testing.T) {
			t.Parallel()
			b := s.setup(t)
			fx := fixture{
				x:      newTimer(keyA1, "x", base),
				y:      newTimer(keyA1, "y", base.Add(time.Second)),
				failed: failedTimer(keyA1, "failed", base.Add(-time.Second)),
			}
			create(t, b, b.fence, fx.x, fx.y, newTimer(keyA1, fx.failed.ID, fx.failed.DueAt))
			update(t, b, b.fence, fx.failed)
			// nodeB takes the shard over: nodeA's fence (version 1) is stale.
			current := claim(t, b, keyA1, nodeB, 1)
			before := readState(t, b, keyA1, "x", "y", "z", "failed")

			for _, v := range []int64{0, 1, 3} { // older, the previous claim, newer
				err := w.do(b, store.Fence{Shard: keyA1, Version: v}, fx)
				require.ErrorIs(t, err, store.ErrShardOwnershipLost, "fence version %d, shard at 2", v)
				requireStateEqual(t, before, readState(t, b, keyA1, "x", "y", "z", "failed"))
			}
			// A fence naming the same shard number in another namespace, at
			// the version keyA1 has, is not keyA1's fence.
			claim(t, b, keyB1, nodeA, 0)
			err := w.do(b, store.Fence{Shard: keyB1, Version: current.Version}, fx)
			require.Error(t, err)
			requireStateEqual(t, before, readState(t, b, keyA1, "x", "y", "z", "failed"))

			require.NoError(t, w.do(b, current, fx), "the same write with the current fence")
			after := readState(t, b, keyA1, "x", "y", "z", "failed")
			require.NotEqual(t, describe(before), describe(after), "the write with the current fence changed nothing")
		})
	}

	t.Run("NeverClaimed", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		key := store.ShardKey{Namespace: nsA, Shard: 7}
		for _, v := range []int64{0, 1} {
			f := store.Fence{Shard: key, Version: v}
			require.ErrorIs(t, b.s.TimerCreate(b.ctx, f, newTimer(key, "z", base)), store.ErrShardOwnershipLost)
			require.ErrorIs(t, b.s.TimerUpdate(b.ctx, f, store.TimerUpdateParams{Timer: newTimer(key, "z", base)}), store.ErrShardOwnershipLost)
			require.ErrorIs(t, b.s.TimerDelete(b.ctx, f, "z"), store.ErrShardOwnershipLost)
			_, err := b.s.TimerDeleteRange(b.ctx, f, store.TimerDeleteRangeParams{UpTo: far})
			require.ErrorIs(t, err, store.ErrShardOwnershipLost)
			require.ErrorIs(t, b.s.ShardRelease(b.ctx, f), store.ErrShardOwnershipLost)
		}
		requireNotFound(t, b, key, "z")
		require.Empty(t, window(t, b, key))
		_, err := b.s.ShardGet(b.ctx, key)
		require.ErrorIs(t, err, store.ErrShardNotFound)
	})

	t.Run("NotFoundNeedsValidFence", func(t *testing.T) {
		// With a stale fence, ownership loss wins over "not found": the
		// caller must learn that it is no longer the owner.
		t.Parallel()
		b := s.setup(t)
		claim(t, b, keyA1, nodeB, 1)
		require.ErrorIs(t, b.s.TimerDelete(b.ctx, b.fence, "missing"), store.ErrShardOwnershipLost)
		require.ErrorIs(t, b.s.TimerUpdate(b.ctx, b.fence, store.TimerUpdateParams{Timer: newTimer(keyA1, "missing", base)}), store.ErrShardOwnershipLost)
	})
}

// describe renders a state for a coarse "did anything change" comparison.
func describe(st shardState) string {
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "shard %+v\n", st.shard)
	for _, t := range st.pending {
		fmt.Fprintf(&buf, "pending %+v\n", *t)
	}
	keys := make([]string, 0, len(st.timers))
	for id := range st.timers {
		keys = append(keys, id)
	}
	slices.Sort(keys)
	for _, id := range keys {
		if t := st.timers[id]; t != nil {
			fmt.Fprintf(&buf, "timer %+v\n", *t)
		} else {
			fmt.Fprintf(&buf, "timer %s absent\n", id)
		}
	}
	return buf.String()
}

// --- Concurrency -----------------------------------------------------------------

func (s *suite) testConcurrency(t *testing.T) {
	t.Run("CreatesInOneShard", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		const workers, each = 16, 16
		var wg sync.WaitGroup
		errs := make(chan error, workers*each)
		var want []*timer.Timer
		for w := range workers {
			var mine []*timer.Timer
			for i := range each {
				// Several timers per instant, across workers.
				mine = append(mine, newTimer(keyA1, fmt.Sprintf("w%d-%d", w, i), base.Add(time.Duration(i%4)*time.Second)))
			}
			want = append(want, mine...)
			wg.Go(func() {
				for _, tm := range mine {
					errs <- b.s.TimerCreate(b.ctx, b.fence, tm)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		requireTimersEqual(t, sorted(want), window(t, b, keyA1))
	})

	t.Run("CreatesOfSameID", func(t *testing.T) {
		t.Parallel()
		b := s.setup(t)
		const n = 16
		versions := make([]*timer.Timer, n)
		for i := range versions {
			// Some share a position, some do not.
			tm := newTimer(keyA1, "same", base.Add(time.Duration(i%4)*time.Second))
			tm.Payload = json.RawMessage(fmt.Sprintf(`{"writer": %d}`, i))
			tm.Attempts = i
			versions[i] = tm
		}
		for round := range 3 {
			var wg sync.WaitGroup
			errs := make([]error, n)
			for i := range n {
				wg.Go(func() { errs[i] = b.s.TimerCreate(b.ctx, b.fence, versions[i]) })
			}
			wg.Wait()
			for i, err := range errs {
				require.NoError(t, err, "round %d writer %d", round, i)
			}
			got := get(t, b, keyA1, "same")
			require.GreaterOrEqual(t, got.Attempts, 0)
			require.Less(t, got.Attempts, n)
			requireTimerEqual(t, versions[got.Attempts], got)
			requireTimersEqual(t, []*timer.Timer{versions[got.Attempts]}, window(t, b, keyA1))
		}
	})

	t.Run("FirstCreatesOfSameID", func(t *testing.T) {
		// Racing first inserts of one key at one position (a client retrying
		// a create against two nodes) are the hardest case for an upsert.
		t.Parallel()
		b := s.setup(t)
		const ids, writers = 100, 8
		var want []*timer.Timer
		for i := range ids {
			tm := newTimer(keyA1, fmt.Sprintf("first-%d", i), base)
			want = append(want, tm)
			var wg sync.WaitGroup
			errs := make([]error, writers)
			for w := range writers {
				wg.Go(func() { errs[w] = b.s.TimerCreate(b.ctx, b.fence, tm) })
			}
			wg.Wait()
			for w, err := range errs {
				require.NoError(t, err, "timer %q writer %d", tm.ID, w)
			}
		}
		requireTimersEqual(t, sorted(want), window(t, b, keyA1))
	})

	t.Run("ClaimRacesFencedCreates", func(t *testing.T) {
		// The property fencing exists for: once a claim has returned, the new
		// owner's window read sees every write the old owner was told
		// succeeded, and no write of the old owner succeeds any more. A
		// driver that lets a claim overtake a write in flight fails this only
		// when the timing is right, hence several rounds, each handing the
		// shard to the next owner while the previous one is writing.
		t.Parallel()
		b := s.setup(t)
		fence := b.fence
		var ok []*timer.Timer
		for round := range 8 {
			ok = append(ok, claimDuringCreates(t, b, fence, round)...)
			fence = store.Fence{Shard: keyA1, Version: fence.Version + 1}
			require.Equal(t, fence.Version, shardGet(t, b, keyA1).Version)
			requireTimersEqual(t, sorted(ok), window(t, b, keyA1))
		}
		// The last owner writes as usual.
		create(t, b, fence, newTimer(keyA1, "after-claims", base))
	})

	t.Run("ClaimRacesCreatesInTwoShards", func(t *testing.T) {
		// Creates of two shards interleave while one of the shards is
		// claimed away: a driver may write creates of several shards
		// together, but a stale fence must fail its own creates only, with
		// the same guarantees as for one shard.
		t.Parallel()
		b := s.setup(t)
		other := claim(t, b, keyA2, nodeA, 0)
		claimDuringTwoShardCreates(t, b, b.fence, other)
	})

	t.Run("ClaimRacesFencedDeleteRange", func(t *testing.T) {
		// A range delete is the longest fenced write. Racing a claim, it
		// either commits before the claim (the new owner never sees the
		// timers it removed) or fails and removes nothing; never does the new
		// owner load timers that the old owner's delete then removes.
		t.Parallel()
		b := s.setup(t)
		fence := b.fence
		const n = 1000
		for round := range 4 {
			timers := make([]*timer.Timer, n)
			for i := range timers {
				timers[i] = newTimer(keyA1, fmt.Sprintf("r%d-%d", round, i), base.Add(time.Duration(i)*time.Millisecond))
			}
			createConcurrently(t, b, fence, timers)

			type result struct {
				n   int
				err error
			}
			deleted := make(chan result, 1)
			go func() {
				n, err := b.s.TimerDeleteRange(b.ctx, fence, store.TimerDeleteRangeParams{UpTo: timer.Position{DueAt: maxTime, UUID: timer.MaxUUID}})
				deleted <- result{n, err}
			}()
			next := claim(t, b, keyA1, nodeB, fence.Version)
			seen := window(t, b, keyA1)
			res := <-deleted

			if res.err == nil {
				require.Empty(t, ids(seen), "round %d: the claim returned before the range delete committed", round)
				if res.n >= 0 {
					require.Equal(t, n, res.n)
				}
			} else {
				require.ErrorIs(t, res.err, store.ErrShardOwnershipLost)
				requireTimersEqual(t, sorted(timers), seen)
			}
			requireTimersEqual(t, seen, window(t, b, keyA1))
			// The new owner clears the shard for the next round.
			_, err := b.s.TimerDeleteRange(b.ctx, next, store.TimerDeleteRangeParams{UpTo: timer.Position{DueAt: maxTime, UUID: timer.MaxUUID}})
			require.NoError(t, err)
			fence = next
		}
	})
}

// claimDuringTwoShardCreates has workers create timers in two shards, under
// claimed and kept, and claims the first shard for nodeB while they are at
// it. Creates under kept must all succeed; those under claimed as in
// claimDuringCreates.
func claimDuringTwoShardCreates(t *testing.T, b *bundle, claimed, kept store.Fence) {
	t.Helper()
	const workers = 8
	const maxPerWorker = 2000 // a bound in case the claim never gets through
	var (
		wg        sync.WaitGroup
		succeeded atomic.Int64
		enough    = make(chan struct{})
		once      sync.Once
		oks       = make([][]*timer.Timer, workers)
		losts     = make([][]*timer.Timer, workers)
		keptOKs   = make([][]*timer.Timer, workers)
		others    = make([]error, workers)
	)
	for w := range workers {
		wg.Go(func() {
			lostInARow := 0
			for i := range maxPerWorker {
				at := base.Add(time.Duration(w*maxPerWorker+i) * time.Millisecond)
				// The kept shard's create first, then the claimed one's:
				// each worker's pair may share a batch with other pairs.
				k := newTimer(kept.Shard, fmt.Sprintf("kept-w%d-%d", w, i), at)
				if err := b.s.TimerCreate(b.ctx, kept, k); err != nil {
					others[w] = fmt.Errorf("create %q under the kept fence: %w", k.ID, err)
					return
				}
				keptOKs[w] = append(keptOKs[w], k)
				tm := newTimer(claimed.Shard, fmt.Sprintf("claimed-w%d-%d", w, i), at)
				err := b.s.TimerCreate(b.ctx, claimed, tm)
				switch {
				case err == nil:
					if lostInARow > 0 {
						others[w] = fmt.Errorf("create %q succeeded after a create failed with ownership lost", tm.ID)
						return
					}
					oks[w] = append(oks[w], tm)
					if succeeded.Add(1) == 2*workers {
						once.Do(func() { close(enough) })
					}
				case errors.Is(err, store.ErrShardOwnershipLost):
					losts[w] = append(losts[w], tm)
					if lostInARow++; lostInARow == 3 {
						return
					}
				default:
					others[w] = fmt.Errorf("create %q: %w", tm.ID, err)
					return
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-enough:
	case <-done:
	}
	claim(t, b, claimed.Shard, nodeB, claimed.Version)
	seen := window(t, b, claimed.Shard)
	<-done

	for _, err := range others {
		require.NoError(t, err)
	}
	var ok, lost, keptOK []*timer.Timer
	for w := range workers {
		ok = append(ok, oks[w]...)
		lost = append(lost, losts[w]...)
		keptOK = append(keptOK, keptOKs[w]...)
	}
	require.GreaterOrEqual(t, len(ok), 2*workers)
	require.NotEmpty(t, lost, "no create saw the claim")
	requireTimersEqual(t, sorted(ok), seen)
	for _, tm := range lost {
		requireNotFound(t, b, claimed.Shard, tm.ID)
	}
	requireTimersEqual(t, sorted(keptOK), window(t, b, kept.Shard))
}

// createConcurrently creates timers from several goroutines.
func createConcurrently(t *testing.T, b *bundle, f store.Fence, timers []*timer.Timer) {
	t.Helper()
	const workers = 8
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < len(timers); i += workers {
				if err := b.s.TimerCreate(b.ctx, f, timers[i]); err != nil {
					errs[w] = fmt.Errorf("create %q: %w", timers[i].ID, err)
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
}

// claimDuringCreates has workers create timers under fence until they see
// ErrShardOwnershipLost, and claims the shard for another node while they
// are at it. It checks what the new owner reads right after its claim and
// returns the timers whose create succeeded.
func claimDuringCreates(t *testing.T, b *bundle, fence store.Fence, round int) []*timer.Timer {
	t.Helper()
	const workers = 8
	const maxPerWorker = 2000 // a bound in case the claim never gets through
	var (
		wg        sync.WaitGroup
		succeeded atomic.Int64
		enough    = make(chan struct{})
		once      sync.Once
		oks       = make([][]*timer.Timer, workers)
		losts     = make([][]*timer.Timer, workers)
		others    = make([]error, workers)
	)
	for w := range workers {
		wg.Go(func() {
			lostInARow := 0
			for i := range maxPerWorker {
				id := fmt.Sprintf("r%d-w%d-%d", round, w, i)
				tm := newTimer(keyA1, id, base.Add(time.Duration((round*workers+w)*maxPerWorker+i)*time.Millisecond))
				err := b.s.TimerCreate(b.ctx, fence, tm)
				switch {
				case err == nil:
					if lostInARow > 0 {
						others[w] = fmt.Errorf("create %q succeeded after a create failed with ownership lost", id)
						return
					}
					oks[w] = append(oks[w], tm)
					if succeeded.Add(1) == 2*workers {
						once.Do(func() { close(enough) })
					}
				case errors.Is(err, store.ErrShardOwnershipLost):
					losts[w] = append(losts[w], tm)
					if lostInARow++; lostInARow == 3 {
						return
					}
				default:
					others[w] = fmt.Errorf("create %q: %w", id, err)
					return
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-enough:
	case <-done:
	}

	owner := nodeB
	if round%2 == 1 {
		owner = nodeA
	}
	claim(t, b, keyA1, owner, fence.Version)
	seen := window(t, b, keyA1)
	<-done

	for _, err := range others {
		require.NoError(t, err)
	}
	var ok, lost []*timer.Timer
	for w := range workers {
		ok = append(ok, oks[w]...)
		lost = append(lost, losts[w]...)
	}
	require.GreaterOrEqual(t, len(ok), 2*workers)
	require.NotEmpty(t, lost, "no create saw the claim")
	var seenNow []*timer.Timer
	for _, tm := range seen {
		if strings.HasPrefix(tm.ID, fmt.Sprintf("r%d-", round)) {
			seenNow = append(seenNow, tm)
		}
	}
	requireTimersEqual(t, sorted(ok), seenNow)
	for _, tm := range lost {
		requireNotFound(t, b, keyA1, tm.ID)
	}
	return ok
}
