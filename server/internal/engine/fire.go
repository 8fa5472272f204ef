package engine

import (
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/dtimer/dtimer/server/internal/callback"
	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/timer"
)

// fire hands a due entry to the worker pool. It returns false if the engine
// is stopping (the entry stays open, so no range delete passes it).
func (s *Shard) fire(e *entry) bool {
	s.work.Add(1)
	err := s.deps.Pool.Go(s.ctx, func() {
		defer s.work.Done()
		s.attempt(e)
	})
	if err != nil {
		s.work.Done()
		return false
	}
	return true
}

// attempt runs one callback attempt and persists its outcome.
func (s *Shard) attempt(e *entry) {
	t := e.t
	m := s.deps.Metrics
	start := s.deps.Clock.Now()
	m.FiringLateness.Observe(start.Sub(t.DueAt).Seconds())
	m.CallbacksInFlight.Inc()
	res := s.deps.Firer.Fire(s.cbCtx, t, t.Attempts+1)
	m.CallbacksInFlight.Dec()
	m.CallbackDuration.Observe(s.deps.Clock.Since(start).Seconds())
	m.Callbacks.WithLabelValues(res.Outcome.String()).Inc()

	if res.Outcome == callback.Done {
		s.mu.Lock()
		if e.superseded {
			s.setState(e, gone)
		} else {
			s.setState(e, fired)
		}
		s.mu.Unlock()
		s.signal()
		return
	}
	next := s.outcome(t, res)
	s.persist(e, next)
}

// outcome is the timer's state after a failed or rescheduling attempt.
func (s *Shard) outcome(t *timer.Timer, res callback.Result) *timer.Timer {
	now := s.now()
	n := t.Clone()
	n.UpdatedAt = now
	n.Attempts = t.Attempts + 1
	switch res.Outcome {
	case callback.Reschedule:
		n.ExecuteAt, n.DueAt = res.NextExecuteAt, res.NextExecuteAt
		n.Attempts, n.LastError = 0, ""
		return n
	case callback.Retry:
		if at, ok := t.RetryPolicy.NextAttempt(n.Attempts, t.ExecuteAt, now); ok {
			n.DueAt = timer.TruncateTime(at)
			n.LastError = res.Err
			s.deps.Metrics.Retries.Inc()
			return n
		}
	}
	n.Status = timer.StatusFailed
	n.LastError = res.Err
	return n
}

// persist moves the fired timer to its next state in the store, fenced and
// conditional on the row still being where it fired from. An outcome whose
// write may or may not have applied is resolved by reading the row back;
// until it is, both the old and the new entry stay open, so no range delete
// can pass them.
func (s *Shard) persist(e *entry, next *timer.Timer) {
	defer s.stripe(next.UUID)()
	s.mu.Lock()
	superseded := e.superseded
	if superseded {
		s.setState(e, gone)
	}
	s.mu.Unlock()
	if superseded {
		return // a write replaced the timer while the callback ran
	}
	from := e.pos.DueAt
	for failures := 0; ; failures++ {
		p, err := s.begin(next.UUID, next, e)
		if err != nil {
			return // fenced out: the next owner fires it again
		}
		err = s.deps.Store.TimerUpdate(s.cbCtx, s.fence, store.TimerUpdateParams{Timer: next, IfDueAt: &from})
		if err != nil && !errors.Is(err, store.ErrTimerNotFound) && !errors.Is(err, store.ErrShardOwnershipLost) {
			err = s.resolve(e, next, failures)
		}
		switch {
		case err == nil:
			s.settle(p, applied)
			if next.Status == timer.StatusFailed {
				s.deps.Metrics.TimersFailed.Inc()
				s.log.Info("timer failed", zap.String("id", next.ID), zap.Int("attempts", next.Attempts), zap.String("lastError", next.LastError))
			}
		case errors.Is(err, errGaveUp):
			s.settle(p, unknown) // both stay open: the next owner fires it again
		case errors.Is(err, errRetryWrite):
			s.settle(p, notApplied)
			s.work.Done()
			if !s.sleep(s.backoff(failures)) {
				return
			}
			continue
		case errors.Is(err, store.ErrShardOwnershipLost):
			s.settle(p, notApplied)
			s.mu.Lock()
			s.loseOwnership(err)
			s.mu.Unlock()
		default:
			// Not found, or changed by someone else: the row is not where it
			// fired from any more, so there is nothing left to move.
			s.settle(p, notApplied)
			s.mu.Lock()
			s.setState(e, gone)
			s.mu.Unlock()
		}
		s.work.Done()
		return
	}
}

var (
	errRetryWrite = errors.New("write not applied; retry it")
	errGaveUp     = errors.New("engine stopped before the outcome was known")
)

// resolve finds out whether a move whose outcome is unknown was applied: nil
// if it was, errRetryWrite if the row is still where it fired from,
// store.ErrTimerNotFound if someone else changed it. It retries the read
// until the store answers or the engine gives up on its callbacks.
func (s *Shard) resolve(e *entry, next *timer.Timer, failures int) error {
	for {
		cur, err := s.deps.Store.TimerGet(s.cbCtx, s.fence.Shard, next.ID)
		switch {
		case errors.Is(err, store.ErrTimerNotFound):
			return err
		case err == nil:
			if cur.Status == next.Status && cur.DueAt.Equal(next.DueAt) && cur.UpdatedAt.Equal(next.UpdatedAt) && cur.Attempts == next.Attempts {
				return nil
			}
			if cur.Status == timer.StatusPending && cur.DueAt.Equal(e.pos.DueAt) && cur.UpdatedAt.Equal(e.t.UpdatedAt) {
				return errRetryWrite
			}
			return store.ErrTimerNotFound
		}
		failures++
		s.log.Warn("store unavailable while persisting a callback outcome; retrying", zap.Error(err))
		if !s.sleep(s.backoff(failures)) {
			return errGaveUp
		}
	}
}

// sleep waits d unless the engine gives up on its callbacks first.
func (s *Shard) sleep(d time.Duration) bool {
	select {
	case <-s.deps.Clock.After(d):
		return true
	case <-s.cbCtx.Done():
		return false
	}
}
