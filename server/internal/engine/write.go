package engine

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/timer"
)

func (s *Shard) stripe(u uuid.UUID) func() {
	m := &s.stripes[int(u[15])%len(s.stripes)]
	m.Lock()
	return m.Unlock
}

func (s *Shard) now() time.Time { return timer.TruncateTime(s.deps.Clock.Now()) }

// Create stores t, replacing any timer with the same id, and returns the
// timer as stored.
func (s *Shard) Create(ctx context.Context, t *timer.Timer) (*timer.Timer, error) {
	n := t.Clone()
	now := s.now()
	n.Shard = s.fence.Shard.Shard
	n.UUID = timer.UUIDOf(n.Namespace, n.ID)
	n.DueAt = n.ExecuteAt
	n.CreatedAt, n.UpdatedAt = now, now
	n.Attempts, n.Status, n.LastError = 0, timer.StatusPending, ""
	defer s.stripe(n.UUID)()
	err := s.write(ctx, n.UUID, n, func(ctx context.Context) error {
		return s.deps.Store.TimerCreate(ctx, s.fence, n)
	})
	if err != nil {
		return nil, err
	}
	s.deps.Metrics.TimersCreated.Inc()
	return n, nil
}

// Update applies patch to the stored timer and returns the result, or
// store.ErrTimerNotFound.
func (s *Shard) Update(ctx context.Context, id string, patch timer.Patch) (*timer.Timer, error) {
	u := timer.UUIDOf(s.fence.Shard.Namespace, id)
	defer s.stripe(u)()
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	cur, err := s.deps.Store.TimerGet(ctx, s.fence.Shard, id)
	if err != nil {
		return nil, err
	}
	n := patch.Apply(cur, s.now())
	err = s.write(ctx, u, n, func(ctx context.Context) error {
		return s.deps.Store.TimerUpdate(ctx, s.fence, store.TimerUpdateParams{Timer: n})
	})
	if err != nil {
		return nil, err
	}
	s.deps.Metrics.TimersUpdated.Inc()
	return n, nil
}

// Delete removes the timer, or returns store.ErrTimerNotFound. Once it
// returns nil the timer will not fire (a callback already running finishes).
func (s *Shard) Delete(ctx context.Context, id string) error {
	u := timer.UUIDOf(s.fence.Shard.Namespace, id)
	defer s.stripe(u)()
	err := s.write(ctx, u, nil, func(ctx context.Context) error {
		return s.deps.Store.TimerDelete(ctx, s.fence, id)
	})
	if err == nil {
		s.deps.Metrics.TimersDeleted.Inc()
	}
	return err
}

func (s *Shard) checkOpen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping || s.lost != nil {
		return ErrStopped
	}
	return nil
}

// write makes one fenced write of timer u from the API and keeps memory in
// step with it. next is the timer's new state (nil when it is deleted). The
// caller holds u's stripe.
func (s *Shard) write(ctx context.Context, u uuid.UUID, next *timer.Timer, do func(context.Context) error) error {
	p, err := s.begin(u, next, nil)
	if err != nil {
		return err
	}
	defer s.work.Done()
	err = do(ctx)
	switch {
	case err == nil:
		s.settle(p, applied)
	case errors.Is(err, store.ErrTimerNotFound), errors.Is(err, store.ErrTimerTooLarge):
		// Refused: nothing was written, and the new state must not fire.
		s.settle(p, notApplied)
	case errors.Is(err, store.ErrShardOwnershipLost):
		s.settle(p, notApplied)
		s.mu.Lock()
		s.loseOwnership(err)
		s.mu.Unlock()
		err = errors.Join(ErrStopped, err)
	default:
		s.settle(p, unknown)
	}
	return err
}

// pendingWrite is a timer write between begin and settle.
type pendingWrite struct {
	u        uuid.UUID
	next     *timer.Timer
	old      *entry // the timer's entry before the write, if in memory
	prev     *entry // byUUID[u] before the write
	heldOld  bool
	fromFire bool
	ne       *entry // the entry of the new row, once it is inside the window
}

type writeResult int

const (
	applied writeResult = iota
	notApplied
	unknown
)

// begin prepares memory for a write: the timer's current entry is held (it
// must not fire while its row may be changing) and the new row, if it falls
// inside the window, enters memory held. fromFire is the firing entry whose
// outcome the write persists (nil for API writes). On success the caller
// must call settle, and s.work.Done() once it is finished.
func (s *Shard) begin(u uuid.UUID, next *timer.Timer, fromFire *entry) (*pendingWrite, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lost != nil || (s.stopping && fromFire == nil) {
		return nil, ErrStopped
	}
	p := &pendingWrite{u: u, next: next, old: s.byUUID[u], prev: s.byUUID[u], fromFire: fromFire != nil}
	if fromFire != nil {
		p.old = fromFire
	}
	if p.old != nil && p.old.state == waiting {
		s.setState(p.old, held)
		p.heldOld = true
	}
	if next != nil && next.Status == timer.StatusPending {
		// A row at or before the fired prefix would be removed by a range
		// delete without firing; such a timer is due already, so firing it
		// one millisecond after the prefix is the same "as soon as possible".
		if next.Position().Compare(s.deletableUpTo) <= 0 {
			next.DueAt = s.deletableUpTo.DueAt.Add(time.Millisecond)
		}
		if next.Position().Compare(s.horizon()) <= 0 {
			p.ne = s.addEntry(next, held)
		}
	}
	// A window read that ends while the write is in flight consults it
	// (finishLoad).
	s.writing[u] = p
	s.work.Add(1)
	return p, nil
}

// settle brings memory in step with a write's outcome:
//   - applied: the old entry is gone (its row was replaced), the new one
//     waits to fire;
//   - notApplied (not found, fenced out): memory is as before;
//   - unknown (timeout, connection lost): both are kept, so the timer may
//     fire twice but never zero times.
func (s *Shard) settle(p *pendingWrite, r writeResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.writing, p.u)
	pending := p.next != nil && p.next.Status == timer.StatusPending
	if r != notApplied && p.ne == nil && pending && s.loading && p.next.Position().Compare(s.loadingUpTo) <= 0 {
		// The read in flight will end past the new row but may not see it.
		p.ne = s.addEntry(p.next, held)
	}
	switch r {
	case applied:
		if p.old != nil {
			if p.old.state == firing && !p.fromFire {
				p.old.superseded = true // its outcome must not overwrite this write
			} else {
				s.setState(p.old, gone)
			}
		}
		if p.ne != nil {
			s.setState(p.ne, waiting)
			s.byUUID[p.u] = p.ne
		} else if s.byUUID[p.u] == p.old {
			delete(s.byUUID, p.u)
		}
		if s.loading {
			s.mutated[p.u] = struct{}{}
		}
	case notApplied:
		if p.heldOld {
			s.setState(p.old, waiting)
		}
		if p.ne != nil {
			s.setState(p.ne, gone)
			if p.prev != nil {
				s.byUUID[p.u] = p.prev
			} else if s.byUUID[p.u] == p.ne {
				delete(s.byUUID, p.u)
			}
		}
	case unknown:
		if p.heldOld {
			s.setState(p.old, waiting)
		}
		if p.ne != nil {
			s.setState(p.ne, waiting)
		}
	}
}
