package engine_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/dtimer/dtimer/server/internal/callback"
	"github.com/dtimer/dtimer/server/internal/engine"
	"github.com/dtimer/dtimer/server/internal/metrics"
	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/store/sqlite"
	"github.com/dtimer/dtimer/server/internal/timer"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// firing is one callback attempt the fake firer saw.
type firing struct {
	id      string
	attempt int
	at      time.Time
	timer   *timer.Timer
}

// firer answers callbacks as told and reports each attempt. The real HTTP
// client is covered by callback's tests and the end-to-end suite.
type firer struct {
	clock  clockwork.Clock
	mu     sync.Mutex
	answer func(t *timer.Timer, attempt int) callback.Result
	fired  chan firing
}

func (f *firer) Fire(_ context.Context, t *timer.Timer, attempt int) callback.Result {
	f.mu.Lock()
	answer := f.answer
	f.mu.Unlock()
	res := callback.Result{Outcome: callback.Done}
	if answer != nil {
		res = answer(t, attempt)
	}
	f.fired <- firing{id: t.ID, attempt: attempt, at: f.clock.Now(), timer: t}
	return res
}

func (f *firer) setAnswer(a func(t *timer.Timer, attempt int) callback.Result) {
	f.mu.Lock()
	f.answer = a
	f.mu.Unlock()
}

type harness struct {
	t     *testing.T
	clock *clockwork.FakeClock
	store store.Store
	firer *firer
	deps  engine.Deps
	cfg   engine.Config
	shard store.ShardKey
}

func setup(t *testing.T) *harness {
	t.Helper()
	st, err := sqlite.Open(sqlite.Config{Path: filepath.Join(t.TempDir(), "engine.db"), Synchronous: "NORMAL"})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	require.NoError(t, st.Migrate(context.Background()))
	clock := clockwork.NewFakeClockAt(t0)
	f := &firer{clock: clock, fired: make(chan firing, 100000)}
	pool := callback.NewPool(64)
	t.Cleanup(pool.Close) // after the engines' stops, registered later
	return &harness{
		t: t, clock: clock, store: st, firer: f,
		deps: engine.Deps{
			Store: st, Clock: clock, Firer: f, Pool: pool,
			Logger: zaptest.NewLogger(t), Metrics: metrics.New(prometheus.NewRegistry()),
		},
		cfg: engine.Config{
			MinLookAhead: time.Second, MaxLookAhead: time.Minute, BatchReadLimit: 100, QueueSize: 300,
			DeleteBatch: 10, DeleteInterval: time.Second, StoreRetryMin: 10 * time.Millisecond, StoreRetryMax: 100 * time.Millisecond,
		},
		shard: store.ShardKey{Namespace: "ns", Shard: 0},
	}
}

// start claims the shard and runs an engine on it, stopped at cleanup.
func (h *harness) start() *engine.Shard {
	h.t.Helper()
	var prev int64
	if sh, err := h.store.ShardGet(context.Background(), h.shard); err == nil {
		prev = sh.Version
	}
	sh, err := h.store.ShardClaim(context.Background(), store.ShardClaimParams{Shard: h.shard, Owner: "test", PrevVersion: prev, Now: h.clock.Now()})
	require.NoError(h.t, err)
	e := engine.Start(store.Fence{Shard: h.shard, Version: sh.Version}, h.cfg, h.deps)
	h.t.Cleanup(func() { stop(e) })
	return e
}

func stop(e *engine.Shard) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e.Stop(ctx)
}

func newTimer(id string, at time.Time) *timer.Timer {
	return &timer.Timer{
		Namespace: "ns", ID: id, ExecuteAt: at, CallbackURL: "http://127.0.0.1:1/cb",
		RetryPolicy:     timer.RetryPolicy{MaxAttempts: 3, InitialInterval: time.Second, BackoffMultiplier: 2, MaxInterval: 10 * time.Second},
		CallbackTimeout: time.Second,
	}
}

// idle waits until the engine's loop sleeps on its gate (and any other
// clock waiters the test expects).
func (h *harness) idle(waiters int) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(h.t, h.clock.BlockUntilContext(ctx, waiters))
}

func (h *harness) next() firing {
	h.t.Helper()
	select {
	case f := <-h.firer.fired:
		return f
	case <-time.After(10 * time.Second):
		h.t.Fatal("no callback fired")
		return firing{}
	}
}

func (h *harness) none() {
	h.t.Helper()
	select {
	case f := <-h.firer.fired:
		h.t.Fatalf("unexpected callback for %s attempt %d at %s", f.id, f.attempt, f.at)
	default:
	}
}

func (h *harness) create(e *engine.Shard, tm *timer.Timer) *timer.Timer {
	h.t.Helper()
	out, err := e.Create(context.Background(), tm)
	require.NoError(h.t, err)
	return out
}

// pending lists the shard's pending rows in the store.
func (h *harness) pending() []*timer.Timer {
	h.t.Helper()
	ts, err := h.store.TimerGetWindow(context.Background(), store.TimerGetWindowParams{
		Shard: h.shard, DueUntil: time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), Limit: 100000,
	})
	require.NoError(h.t, err)
	return ts
}

func TestFiresAtDueTimeNeverBefore(t *testing.T) {
	t.Parallel()
	h := setup(t)
	e := h.start()
	h.create(e, newTimer("a", t0.Add(10*time.Second)))
	h.idle(1)
	h.clock.Advance(10*time.Second - time.Millisecond)
	h.idle(1)
	h.none()
	h.clock.Advance(time.Millisecond)
	f := h.next()
	require.Equal(t, "a", f.id)
	require.Equal(t, 1, f.attempt)
	require.Equal(t, t0.Add(10*time.Second), f.at)
	h.none()
}

func TestPastTimerFiresAtOnce(t *testing.T) {
	t.Parallel()
	h := setup(t)
	e := h.start()
	h.create(e, newTimer("old", t0.Add(-time.Hour)))
	f := h.next()
	require.Equal(t, "old", f.id)
	require.Equal(t, t0, f.at)
}

func TestBurstFiresEveryTimerOnceAndRangeDeletes(t *testing.T) {
	t.Parallel()
	h := setup(t)
	const n = 1000 // more than the queue (300) and the read limit (100)
	due := t0.Add(5 * time.Second)
	first := h.start()
	for i := range n {
		h.create(first, newTimer(fmt.Sprintf("t%04d", i), due))
	}
	// A new owner finds them all in the store and must page through them.
	stop(first)
	e := h.start()
	h.idle(1)
	h.none()
	h.clock.Advance(5 * time.Second)
	seen := map[string]int{}
	for range n {
		f := h.next()
		seen[f.id]++
		require.False(t, f.at.Before(due), "fired before due")
	}
	require.Len(t, seen, n)
	for id, c := range seen {
		require.Equal(t, 1, c, id)
	}
	// Completed timers leave the store by range deletes, not one by one.
	require.Eventually(t, func() bool {
		h.clock.Advance(time.Second)
		return len(h.pending()) == 0
	}, 10*time.Second, 10*time.Millisecond)
	h.none()
	_ = e
}

func TestRetryMovesTimerWithBackoffThenFails(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.firer.setAnswer(func(*timer.Timer, int) callback.Result {
		return callback.Result{Outcome: callback.Retry, Err: "callback answered HTTP 503"}
	})
	e := h.start()
	h.create(e, newTimer("r", t0))
	f := h.next()
	require.Equal(t, 1, f.attempt)
	// The retry is stored before the attempt is over: attempts 1, due +1s.
	require.Eventually(t, func() bool {
		tm, err := h.store.TimerGet(context.Background(), h.shard, "r")
		return err == nil && tm.Attempts == 1 && tm.DueAt.Equal(t0.Add(time.Second))
	}, 10*time.Second, 5*time.Millisecond)
	h.idle(1)
	h.clock.Advance(time.Second - time.Millisecond)
	h.idle(1)
	h.none()
	h.clock.Advance(time.Millisecond)
	f = h.next()
	require.Equal(t, 2, f.attempt)
	require.Equal(t, t0.Add(time.Second), f.at)
	require.Equal(t, t0, f.timer.ExecuteAt, "the callback keeps the scheduled executeAt")
	// Second backoff is 2s; the third attempt is the last (maxAttempts 3).
	require.Eventually(t, func() bool {
		tm, err := h.store.TimerGet(context.Background(), h.shard, "r")
		return err == nil && tm.Attempts == 2
	}, 10*time.Second, 5*time.Millisecond)
	h.idle(1)
	h.clock.Advance(2 * time.Second)
	f = h.next()
	require.Equal(t, 3, f.attempt)
	require.Eventually(t, func() bool {
		tm, err := h.store.TimerGet(context.Background(), h.shard, "r")
		return err == nil && tm.Status == timer.StatusFailed
	}, 10*time.Second, 5*time.Millisecond)
	tm, err := h.store.TimerGet(context.Background(), h.shard, "r")
	require.NoError(t, err)
	require.Equal(t, 3, tm.Attempts)
	require.Equal(t, "callback answered HTTP 503", tm.LastError)
	h.idle(1)
	h.clock.Advance(time.Hour)
	h.idle(1)
	h.none()
}

func TestPermanentFailureKeepsTimerFailed(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.firer.setAnswer(func(*timer.Timer, int) callback.Result {
		return callback.Result{Outcome: callback.Permanent, Err: "callback answered HTTP 404"}
	})
	e := h.start()
	h.create(e, newTimer("p", t0))
	h.next()
	require.Eventually(t, func() bool {
		tm, err := h.store.TimerGet(context.Background(), h.shard, "p")
		return err == nil && tm.Status == timer.StatusFailed && tm.Attempts == 1
	}, 10*time.Second, 5*time.Millisecond)

	// Replay: a new executeAt makes it pending again.
	h.firer.setAnswer(nil)
	at := t0.Add(time.Second)
	tm, err := e.Update(context.Background(), "p", timer.Patch{ExecuteAt: &at})
	require.NoError(t, err)
	require.Equal(t, timer.StatusPending, tm.Status)
	require.Equal(t, 0, tm.Attempts)
	h.idle(1)
	h.clock.Advance(time.Second)
	f := h.next()
	require.Equal(t, "p", f.id)
	require.Equal(t, 1, f.attempt)
}

func TestRescheduleFromCallback(t *testing.T) {
	t.Parallel()
	h := setup(t)
	later := t0.Add(30 * time.Second)
	h.firer.setAnswer(func(_ *timer.Timer, attempt int) callback.Result {
		if attempt == 1 {
			return callback.Result{Outcome: callback.Reschedule, NextExecuteAt: later}
		}
		return callback.Result{Outcome: callback.Done}
	})
	e := h.start()
	h.create(e, newTimer("s", t0))
	require.Equal(t, t0, h.next().at)
	require.Eventually(t, func() bool {
		tm, err := h.store.TimerGet(context.Background(), h.shard, "s")
		return err == nil && tm.ExecuteAt.Equal(later) && tm.Attempts == 0
	}, 10*time.Second, 5*time.Millisecond)
	h.idle(1)
	h.clock.Advance(30 * time.Second)
	f := h.next()
	require.Equal(t, later, f.at)
	require.Equal(t, 1, f.attempt, "attempts start again")
	require.Equal(t, later, f.timer.ExecuteAt)
}

func TestDeletedTimerNeverFires(t *testing.T) {
	t.Parallel()
	h := setup(t)
	e := h.start()
	h.create(e, newTimer("d", t0.Add(time.Second)))
	h.create(e, newTimer("keep", t0.Add(2*time.Second)))
	require.NoError(t, e.Delete(context.Background(), "d"))
	require.ErrorIs(t, e.Delete(context.Background(), "d"), store.ErrTimerNotFound)
	h.idle(1)
	h.clock.Advance(2 * time.Second)
	require.Equal(t, "keep", h.next().id)
	h.idle(1)
	h.none()
}

func TestUpdateAndUpsertMoveTheTimer(t *testing.T) {
	t.Parallel()
	h := setup(t)
	e := h.start()
	h.create(e, newTimer("u", t0.Add(time.Second)))
	h.create(e, newTimer("c", t0.Add(time.Second)))
	later := t0.Add(3 * time.Second)
	_, err := e.Update(context.Background(), "u", timer.Patch{ExecuteAt: &later})
	require.NoError(t, err)
	h.create(e, newTimer("c", t0.Add(2*time.Second))) // upsert: replaces, one timer
	h.idle(1)
	h.clock.Advance(time.Second)
	h.idle(1)
	h.none()
	h.clock.Advance(time.Second)
	f := h.next()
	require.Equal(t, "c", f.id)
	require.Equal(t, t0.Add(2*time.Second), f.at)
	h.idle(1)
	h.clock.Advance(time.Second)
	f = h.next()
	require.Equal(t, "u", f.id)
	require.Equal(t, later, f.at)
	h.idle(1)
	h.clock.Advance(time.Minute)
	h.idle(1)
	h.none()
}

func TestFencedOutEngineStopsAndNewOwnerFires(t *testing.T) {
	t.Parallel()
	h := setup(t)
	old := h.start()
	h.create(old, newTimer("f", t0.Add(time.Second)))
	// Another node claims the shard while the old owner still runs.
	sh, err := h.store.ShardGet(context.Background(), h.shard)
	require.NoError(t, err)
	_, err = h.store.ShardClaim(context.Background(), store.ShardClaimParams{Shard: h.shard, Owner: "other", PrevVersion: sh.Version, Now: t0})
	require.NoError(t, err)
	_, err = old.Create(context.Background(), newTimer("g", t0.Add(time.Second)))
	require.ErrorIs(t, err, engine.ErrStopped)
	select {
	case <-old.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("engine did not report the lost shard")
	}
	stop(old)
	_, err = h.store.TimerGet(context.Background(), h.shard, "g")
	require.ErrorIs(t, err, store.ErrTimerNotFound, "a fenced write must not be stored")

	e := h.start()
	h.idle(1)
	h.clock.Advance(time.Second)
	require.Equal(t, "f", h.next().id)
	h.idle(1)
	h.none()
	_ = e
}

func TestRestartFiresPendingTimersOnce(t *testing.T) {
	t.Parallel()
	h := setup(t)
	first := h.start()
	// Its first window read must be done: a stop that cancels it leaves
	// the engine unsure of the rows before "early", so it may not
	// range-delete it, and the next owner fires it again (at least once).
	require.Eventually(t, func() bool { return testutil.ToFloat64(h.deps.Metrics.WindowLoads) >= 1 }, 10*time.Second, time.Millisecond)
	h.create(first, newTimer("early", t0))
	require.Equal(t, "early", h.next().id)
	h.create(first, newTimer("late", t0.Add(time.Minute)))
	stop(first) // graceful: the fired prefix is range-deleted
	h.start()
	h.idle(1)
	h.clock.Advance(time.Minute)
	require.Equal(t, "late", h.next().id)
	h.idle(1)
	h.clock.Advance(time.Minute)
	h.idle(1)
	h.none()
}

// TestConcurrentWritesWhileFiring creates, moves and deletes timers from many
// goroutines while the engine reads windows and fires, and checks the
// engine's contract: every timer that exists at the end fired exactly once at
// or after its final due time, and no deleted timer fired.
func TestConcurrentWritesWhileFiring(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.cfg.MaxLookAhead = 3 * time.Second // ops land on both sides of the window
	h.cfg.BatchReadLimit = 7
	h.cfg.QueueSize = 20
	e := h.start()
	const workers, perWorker = 8, 40
	type final struct {
		deleted bool
		due     time.Time
	}
	var mu sync.Mutex
	finals := map[string]final{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				id := fmt.Sprintf("w%d-%d", w, i)
				due := t0.Add(time.Duration((i*7+w)%10+1) * time.Second)
				out, err := e.Create(context.Background(), newTimer(id, due))
				require.NoError(t, err)
				f := final{due: out.DueAt}
				switch i % 4 {
				case 1:
					moved := t0.Add(time.Duration((i*3+w)%10+1) * time.Second)
					out, err := e.Update(context.Background(), id, timer.Patch{ExecuteAt: &moved})
					require.NoError(t, err)
					f.due = out.DueAt
				case 2:
					require.NoError(t, e.Delete(context.Background(), id))
					f.deleted = true
				}
				mu.Lock()
				finals[id] = f
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	live := 0
	for _, f := range finals {
		if !f.deleted {
			live++
		}
	}
	seen := map[string]int{}
	for len(seen) < live {
		h.clock.Advance(500 * time.Millisecond)
		for drained := false; !drained; {
			select {
			case f := <-h.firer.fired:
				fin := finals[f.id]
				require.False(t, fin.deleted, "deleted timer %s fired", f.id)
				require.False(t, f.at.Before(fin.due), "%s fired at %s before its due time %s", f.id, f.at, fin.due)
				seen[f.id]++
			case <-time.After(20 * time.Millisecond):
				drained = true
			}
		}
	}
	for id, c := range seen {
		require.Equal(t, 1, c, "timer %s fired %d times", id, c)
	}
	require.Eventually(t, func() bool {
		h.clock.Advance(time.Second)
		return len(h.pending()) == 0
	}, 10*time.Second, 10*time.Millisecond)
}

// TestTimerWrittenBehindFiredPrefixSurvivesRangeDelete creates a timer whose
// position lies before timers already fired and awaiting their range delete:
// the delete must not take its row while its callback is still running (a
// crash then would lose it).
func TestTimerWrittenBehindFiredPrefixSurvivesRangeDelete(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.cfg.DeleteBatch = 1000
	h.cfg.DeleteInterval = 10 * time.Second
	release := make(chan struct{})
	h.firer.setAnswer(func(tm *timer.Timer, _ int) callback.Result {
		if tm.ID == "behind" {
			<-release
		}
		return callback.Result{Outcome: callback.Done}
	})
	e := h.start()
	h.create(e, newTimer("x", t0))
	require.Equal(t, "x", h.next().id)
	// Wait for the first range delete to finish: the next one is due
	// DeleteInterval after it.
	require.Eventually(t, func() bool { return testutil.ToFloat64(h.deps.Metrics.RangeDeletes) == 1 }, 10*time.Second, time.Millisecond)

	h.create(e, newTimer("a", t0.Add(time.Second)))
	h.idle(1)
	h.clock.Advance(time.Second)
	require.Equal(t, "a", h.next().id)
	// Once the loop has seen "a" complete (nothing open: the queue gauge is
	// 0), "a" is the fired prefix awaiting the next range delete.
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(h.deps.Metrics.QueueLength.WithLabelValues("ns", "0")) == 0
	}, 10*time.Second, time.Millisecond)

	h.create(e, newTimer("behind", t0.Add(-time.Hour)))
	h.idle(1)
	h.clock.Advance(time.Millisecond) // due: at most a millisecond after the fired prefix
	require.Eventually(t, func() bool { return h.deps.Pool.InUse() == 1 }, 10*time.Second, time.Millisecond)
	h.idle(1)
	h.clock.Advance(10 * time.Second) // the range delete of "a" runs now
	require.Eventually(t, func() bool {
		_, err := h.store.TimerGet(context.Background(), h.shard, "a")
		return err != nil
	}, 10*time.Second, 5*time.Millisecond)
	_, err := h.store.TimerGet(context.Background(), h.shard, "behind")
	require.NoError(t, err, "the running timer's row was range-deleted")
	close(release)
	require.Equal(t, "behind", h.next().id)
}

// refusingStore refuses to store timers whose id starts with "big", as a
// driver does with a timer larger than its row limit.
type refusingStore struct{ store.Store }

func (s refusingStore) TimerCreate(ctx context.Context, f store.Fence, t *timer.Timer) error {
	if strings.HasPrefix(t.ID, "big") {
		return fmt.Errorf("driver: %w", store.ErrTimerTooLarge)
	}
	return s.Store.TimerCreate(ctx, f, t)
}

// A timer the store refused (nothing written) must not fire from memory,
// and must not disturb the timer of the same id it would have replaced.
func TestRefusedCreateNeverFires(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.deps.Store = refusingStore{h.store}
	e := h.start()
	h.idle(1) // the window is loaded: a new timer due in it enters memory
	_, err := e.Create(context.Background(), newTimer("big", t0.Add(time.Second)))
	require.ErrorIs(t, err, store.ErrTimerTooLarge)
	h.create(e, newTimer("keep", t0.Add(2*time.Second)))
	h.idle(1)
	h.clock.Advance(2 * time.Second)
	require.Equal(t, "keep", h.next().id)
	h.idle(1)
	h.none()
	_, err = h.store.TimerGet(context.Background(), h.shard, "big")
	require.ErrorIs(t, err, store.ErrTimerNotFound)
}
