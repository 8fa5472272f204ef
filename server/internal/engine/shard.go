package engine

import (
	"container/heap"
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"

	"github.com/dtimer/dtimer/server/internal/callback"
	"github.com/dtimer/dtimer/server/internal/metrics"
	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/timer"
)

// Config tunes every shard engine of a node.
type Config struct {
	// MinLookAhead: a new window is read once the loaded one reaches less than
	// this far past now.
	MinLookAhead time.Duration
	// MaxLookAhead: how far past now one window read reaches.
	MaxLookAhead time.Duration
	// BatchReadLimit is the row limit of one window read.
	BatchReadLimit int
	// QueueSize bounds the open timers a shard holds in memory before it
	// stops reading further windows (timers written through the API inside
	// the loaded window are still added: the view must stay complete).
	QueueSize int
	// DeleteBatch: a range delete runs once this many fired timers wait for
	// one, or DeleteInterval after the previous one, whichever comes first.
	DeleteBatch    int
	DeleteInterval time.Duration
	// StoreRetryMin and StoreRetryMax bound the backoff after a store error.
	StoreRetryMin time.Duration
	StoreRetryMax time.Duration
}

// Firer delivers one attempt of a timer; callback.Client implements it.
type Firer interface {
	Fire(ctx context.Context, t *timer.Timer, attempt int) callback.Result
}

// Deps are what a shard engine works with; one set per node.
type Deps struct {
	Store   store.Store
	Clock   clockwork.Clock
	Firer   Firer
	Pool    *callback.Pool
	Logger  *zap.Logger
	Metrics *metrics.Metrics
}

// ErrStopped is returned for writes to a shard whose engine is stopping or was
// fenced out: the caller should retry once the shard has an owner again.
var ErrStopped = errors.New("shard engine stopped")

// firesPerRound bounds how many due timers one round of the loop hands to the
// worker pool before it looks at loads and deletes again.
const firesPerRound = 256

// deleteTimeout bounds one range delete; finalDeleteTimeout the one a
// stopping engine makes.
const (
	deleteTimeout      = 30 * time.Second
	finalDeleteTimeout = 5 * time.Second
)

// Shard is the engine of one owned shard. See doc.go for the algorithm and
// its invariants.
type Shard struct {
	cfg   Config
	deps  Deps
	fence store.Fence
	log   *zap.Logger
	// labels of the per-shard gauges
	lns, lshard string

	// stripes serialise writes to one timer (API writes and the engine's own
	// moves after a callback) across the read-decide-write sequence.
	stripes [64]sync.Mutex

	mu             sync.Mutex
	byUUID         map[uuid.UUID]*entry // the entry of each timer's current row
	fires          fireHeap
	order          orderHeap
	openCount      int
	loadedUpTo     timer.Position // every pending row at or before it is in memory
	loadingUpTo    timer.Position // bound of the window read in flight; loadedUpTo when none
	loading        bool
	lastLoadFull   bool
	loadFailures   int
	nextLoadAt     time.Time
	mutated        map[uuid.UUID]struct{}      // timers written while a window read was in flight
	writing        map[uuid.UUID]*pendingWrite // writes in flight, by timer (one at a time: stripes)
	deletableUpTo  timer.Position              // end of the fired prefix handed to range deletes
	pendingDeletes int                         // fired rows at or before deletableUpTo not yet deleted
	deleting       bool
	deleteFailures int
	lastDeleteAt   time.Time
	nextDeleteAt   time.Time
	stopping       bool
	lost           error

	wake     chan struct{}
	ctx      context.Context // cancelled by Stop: ends the loop and window reads
	cancel   context.CancelFunc
	cbCtx    context.Context // callbacks; cancelled when Stop gives up waiting
	cbCancel context.CancelFunc
	lostCh   chan struct{}
	lostOnce sync.Once
	loops    sync.WaitGroup // the loop, a window read, a range delete
	work     sync.WaitGroup // callbacks and writes in flight
}

// Start runs the engine of a shard claimed at fence.
func Start(fence store.Fence, cfg Config, deps Deps) *Shard {
	s := &Shard{
		cfg:     cfg,
		deps:    deps,
		fence:   fence,
		log:     deps.Logger.With(zap.String("namespace", fence.Shard.Namespace), zap.Int("shard", fence.Shard.Shard), zap.Int64("version", fence.Version)),
		lns:     fence.Shard.Namespace,
		lshard:  strconv.Itoa(fence.Shard.Shard),
		byUUID:  make(map[uuid.UUID]*entry),
		writing: make(map[uuid.UUID]*pendingWrite),
		wake:    make(chan struct{}, 1),
		lostCh:  make(chan struct{}),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.cbCtx, s.cbCancel = context.WithCancel(context.Background())
	s.loops.Add(1)
	go s.run()
	return s
}

// Fence is the claim this engine writes under.
func (s *Shard) Fence() store.Fence { return s.fence }

// Lost is closed when a write found the shard claimed by someone else; the
// owner must then Stop the engine.
func (s *Shard) Lost() <-chan struct{} { return s.lostCh }

// Stop stops firing, refuses new writes, waits for callbacks and writes in
// flight until ctx is done, then range-deletes the fired prefix so that the
// next owner does not fire those timers again.
func (s *Shard) Stop(ctx context.Context) {
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
	s.cancel()
	s.loops.Wait()

	drained := make(chan struct{})
	go func() { s.work.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-ctx.Done():
		s.log.Warn("callbacks still in flight at shard stop; their timers will fire again on the next owner")
		s.cbCancel()
	}

	s.mu.Lock()
	s.popCompleted()
	upTo, n, lost := s.deletableUpTo, s.pendingDeletes, s.lost
	s.mu.Unlock()
	if n > 0 && lost == nil {
		// Its own bound: a drain that used up ctx still deserves this one
		// statement, which spares the next owner firing these again.
		dctx, cancel := context.WithTimeout(context.Background(), finalDeleteTimeout)
		defer cancel()
		if _, err := s.deps.Store.TimerDeleteRange(dctx, s.fence, store.TimerDeleteRangeParams{UpTo: upTo}); err != nil {
			s.log.Warn("final range delete failed; fired timers may fire again on the next owner", zap.Error(err))
		}
	}
	s.cbCancel()
	s.deps.Metrics.QueueLength.DeleteLabelValues(s.lns, s.lshard)
	s.deps.Metrics.WindowAhead.DeleteLabelValues(s.lns, s.lshard)
}

func (s *Shard) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// loseOwnership records that the fence is stale. Called with mu held.
func (s *Shard) loseOwnership(err error) {
	if s.lost == nil {
		s.lost = err
		s.log.Warn("shard ownership lost: another node claimed it", zap.Error(err))
	}
	s.lostOnce.Do(func() { close(s.lostCh) })
}

// run is the shard's loop: fire what is due, start window reads and range
// deletes when they are needed, then sleep until the earliest of the next due
// timer, the next read, the next delete, or a wake-up.
func (s *Shard) run() {
	defer s.loops.Done()
	gate := s.deps.Clock.NewTimer(time.Hour)
	defer gate.Stop()
	for {
		s.mu.Lock()
		if s.stopping || s.lost != nil {
			s.mu.Unlock()
			return
		}
		now := s.deps.Clock.Now()
		due := s.popDue(now)
		s.popCompleted()
		s.maybeLoad(now)
		s.maybeDelete(now)
		wait := s.nextWake(now)
		if len(due) == firesPerRound {
			wait = 0
		}
		s.deps.Metrics.QueueLength.WithLabelValues(s.lns, s.lshard).Set(float64(s.openCount))
		s.deps.Metrics.WindowAhead.WithLabelValues(s.lns, s.lshard).Set(s.loadedUpTo.DueAt.Sub(now).Seconds())
		s.mu.Unlock()

		for _, e := range due {
			if !s.fire(e) {
				return
			}
		}
		if wait <= 0 {
			continue
		}
		gate.Reset(wait)
		select {
		case <-gate.Chan():
		case <-s.wake:
			if !gate.Stop() {
				// Drain a fire that raced with the wake-up, so the next Reset
				// starts clean.
				select {
				case <-gate.Chan():
				default:
				}
			}
		case <-s.ctx.Done():
			return
		}
	}
}

// popDue takes the waiting entries due at now, in order, and marks them
// firing.
func (s *Shard) popDue(now time.Time) []*entry {
	var due []*entry
	for len(due) < firesPerRound {
		e := s.fires.peek()
		if e == nil || e.pos.DueAt.After(now) {
			break
		}
		s.setState(e, firing)
		due = append(due, e)
	}
	return due
}

// nextWake is how long the loop may sleep.
func (s *Shard) nextWake(now time.Time) time.Duration {
	next := now.Add(s.cfg.MaxLookAhead)
	if e := s.fires.peek(); e != nil && e.pos.DueAt.Before(next) {
		next = e.pos.DueAt
	}
	if !s.loading {
		at := s.loadedUpTo.DueAt.Add(-s.cfg.MinLookAhead)
		if s.lastLoadFull {
			at = now // more rows wait; read as soon as there is room
		}
		if at.Before(s.nextLoadAt) {
			at = s.nextLoadAt
		}
		if s.openCount < s.cfg.QueueSize && at.Before(next) {
			next = at
		}
	}
	if s.pendingDeletes > 0 && !s.deleting {
		at := s.lastDeleteAt.Add(s.cfg.DeleteInterval)
		if at.Before(s.nextDeleteAt) {
			at = s.nextDeleteAt
		}
		if at.Before(next) {
			next = at
		}
	}
	return next.Sub(now)
}

// addEntry creates the entry of a timer row. Called with mu held.
func (s *Shard) addEntry(t *timer.Timer, st state) *entry {
	e := &entry{t: t, pos: t.Position(), state: held, fireIdx: -1}
	heap.Push(&s.order, e)
	s.openCount++
	s.byUUID[t.UUID] = e
	s.setState(e, st)
	return e
}

// setState moves an entry to st, keeping the fire heap and the open count
// true. Called with mu held.
func (s *Shard) setState(e *entry, st state) {
	if e.state == st {
		return
	}
	if e.state == waiting {
		s.fires.remove(e)
	}
	if e.open() && (st == fired || st == gone) {
		s.openCount--
	}
	e.state = st
	if st == waiting {
		s.fires.add(e)
		if s.fires.peek() == e {
			s.signal()
		}
	}
}

// popCompleted pops the entries that are no longer open from the front of
// the order, extending the fired prefix that range deletes may remove. It
// stops at the first open entry, and at a fired one past loadedUpTo: rows
// beyond loadedUpTo are not all in memory, so no delete may reach them.
// Called with mu held.
func (s *Shard) popCompleted() {
	for len(s.order) > 0 {
		e := s.order[0]
		if e.open() || (e.state == fired && e.pos.Compare(s.loadedUpTo) > 0) {
			return
		}
		heap.Pop(&s.order)
		if s.byUUID[e.t.UUID] == e {
			delete(s.byUUID, e.t.UUID)
		}
		if e.state == fired {
			s.deletableUpTo = e.pos
			s.pendingDeletes++
		}
	}
}

// horizon is the last position a new entry may take: rows up to it are, or
// are being, read into memory. Called with mu held.
func (s *Shard) horizon() timer.Position {
	if s.loadingUpTo.Compare(s.loadedUpTo) > 0 {
		return s.loadingUpTo
	}
	return s.loadedUpTo
}

func (s *Shard) backoff(failures int) time.Duration {
	d := s.cfg.StoreRetryMin << min(failures, 16)
	if d <= 0 || d > s.cfg.StoreRetryMax {
		d = s.cfg.StoreRetryMax
	}
	return d
}

// maybeLoad starts a window read when the loaded window runs short and the
// queue has room. Called with mu held.
func (s *Shard) maybeLoad(now time.Time) {
	if s.loading || now.Before(s.nextLoadAt) || s.openCount >= s.cfg.QueueSize {
		return
	}
	short := s.loadedUpTo.DueAt.Before(now.Add(s.cfg.MinLookAhead))
	more := s.lastLoadFull && s.loadedUpTo.DueAt.Before(now.Add(s.cfg.MaxLookAhead))
	if !short && !more {
		return
	}
	until := now.Add(s.cfg.MaxLookAhead).Truncate(time.Millisecond)
	after := s.loadedUpTo
	s.loading = true
	s.loadingUpTo = timer.Position{DueAt: until, UUID: timer.MaxUUID}
	s.mutated = make(map[uuid.UUID]struct{})
	s.loops.Add(1)
	go func() {
		defer s.loops.Done()
		rows, err := s.deps.Store.TimerGetWindow(s.ctx, store.TimerGetWindowParams{
			Shard: s.fence.Shard, After: after, DueUntil: until, Limit: s.cfg.BatchReadLimit,
		})
		s.finishLoad(rows, err)
	}()
}

func (s *Shard) finishLoad(rows []*timer.Timer, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.signal()
	s.deps.Metrics.WindowLoads.Inc()
	s.loading = false
	mutated := s.mutated
	s.mutated = nil
	if err != nil {
		s.loadingUpTo = s.loadedUpTo
		if s.ctx.Err() == nil {
			s.loadFailures++
			s.nextLoadAt = s.deps.Clock.Now().Add(s.backoff(s.loadFailures))
			s.log.Warn("window read failed; retrying", zap.Error(err), zap.Time("retryAt", s.nextLoadAt))
		}
		return
	}
	s.loadFailures = 0
	for _, t := range rows {
		if _, ok := mutated[t.UUID]; ok {
			continue // written during the read: memory already has its state
		}
		if p, ok := s.writing[t.UUID]; ok {
			// A write of this timer is in flight. A row at its new position
			// is the write's (its entry is added below or by settle); a row
			// elsewhere is the old one, which the write may yet fail to
			// replace: hold it, and settle decides.
			if p.old == nil && (p.next == nil || t.Position().Compare(p.next.Position()) != 0) {
				p.old = s.addEntry(t, held)
				p.prev, p.heldOld = p.old, true
			}
			continue
		}
		if e, ok := s.byUUID[t.UUID]; ok && e.pos.Compare(t.Position()) == 0 {
			continue // already known (added by a write, or fired ahead of the window)
		}
		s.addEntry(t, waiting)
	}
	s.lastLoadFull = len(rows) == s.cfg.BatchReadLimit
	if s.lastLoadFull {
		s.loadedUpTo = rows[len(rows)-1].Position()
	} else {
		s.loadedUpTo = s.loadingUpTo
	}
	s.loadingUpTo = s.loadedUpTo
	for _, p := range s.writing {
		if p.ne == nil && p.next != nil && p.next.Status == timer.StatusPending && p.next.Position().Compare(s.loadedUpTo) <= 0 {
			p.ne = s.addEntry(p.next, held)
		}
	}
}

// maybeDelete starts a range delete of the fired prefix when enough fired
// rows wait or the interval passed. Called with mu held.
func (s *Shard) maybeDelete(now time.Time) {
	if s.deleting || s.pendingDeletes == 0 || now.Before(s.nextDeleteAt) {
		return
	}
	if s.pendingDeletes < s.cfg.DeleteBatch && now.Sub(s.lastDeleteAt) < s.cfg.DeleteInterval {
		return
	}
	upTo, n := s.deletableUpTo, s.pendingDeletes
	s.pendingDeletes = 0
	s.deleting = true
	s.loops.Add(1)
	go func() {
		defer s.loops.Done()
		// Not cancelled by Stop (a finished delete saves the next owner
		// duplicate fires), but bounded so a hung store cannot stall it.
		ctx, cancel := context.WithTimeout(context.Background(), deleteTimeout)
		rows, err := s.deps.Store.TimerDeleteRange(ctx, s.fence, store.TimerDeleteRangeParams{UpTo: upTo})
		cancel()
		s.mu.Lock()
		defer s.mu.Unlock()
		defer s.signal()
		s.deleting = false
		s.lastDeleteAt = s.deps.Clock.Now()
		switch {
		case err == nil:
			s.deleteFailures = 0
			s.deps.Metrics.RangeDeletes.Inc()
			if rows > 0 {
				s.deps.Metrics.RangeDeletedRows.Add(float64(rows))
			}
		case errors.Is(err, store.ErrShardOwnershipLost):
			s.loseOwnership(err)
		default:
			s.pendingDeletes += n
			s.deleteFailures++
			s.nextDeleteAt = s.lastDeleteAt.Add(s.backoff(s.deleteFailures))
			s.log.Warn("range delete failed; retrying", zap.Error(err), zap.Time("retryAt", s.nextDeleteAt))
		}
	}()
}
