package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dtimer/dtimer/server/internal/store"
)

// Group commit of creates. The engine creates timers one per API request,
// many at once. Each create as a statement of its own costs PostgreSQL a
// round trip, a transaction, an executor start and a share lock of the shard
// row (a new MultiXact while other writes hold it), and the driver a round
// trip through pgx: most of it the same for one row as for a hundred. So
// while a create statement is in flight, creates wait, and the next statement
// writes all that have arrived meanwhile, whatever their shards. At low load
// a create starts at once, alone; the busier the node, the bigger the
// batches. Batching across shards matters: clients spread their creates over
// every shard, so one shard alone would have little to batch.
//
// A batch is one statement (timerCreateBatch): its fence step share-locks the
// shard row of every fence in the batch, each only if it still has that
// fence's version, exactly as the fence step of a single write does, and its
// write step inserts only the rows whose fence's shard row the fence step
// locked. The rows of a stale fence are not written and their callers get
// ErrShardOwnershipLost; the other rows commit together. Each caller thus
// learns what a statement of its own would have told it, and the argument of
// the package comment holds row by row: a claim waits for the batch's share
// lock, and a batch that starts during a claim waits for it, then finds the
// new version and writes none of that shard's rows.

const (
	// maxCreatesInFlight bounds the create statements in flight at once. One
	// makes the biggest batches, and on a node whose CPU is the limit (the
	// database's share included) the most creates per second; while it is in
	// flight the next batch only gathers, so a create waits at most about one
	// statement longer than alone.
	maxCreatesInFlight = 1
	// maxCreateBatch bounds the rows of one statement.
	maxCreateBatch = 512
)

// createOp is one TimerCreate waiting for its batch.
type createOp struct {
	ctx   context.Context
	fence store.Fence
	row   timerRow
	done  chan error // buffered: answered once, whether or not anyone waits
}

// rowKey is what the unique id index keys a timer by: one statement may not
// upsert a row twice.
type rowKey struct {
	ns    string
	shard int
	id    string
}

func (op *createOp) key() rowKey {
	return rowKey{op.fence.Shard.Namespace, op.fence.Shard.Shard, op.row.id}
}

// creates is the group commit of a Store's TimerCreate calls.
type creates struct {
	mu       sync.Mutex
	waiting  []*createOp
	inFlight int
}

// create writes op, alone or in a batch, and returns its outcome, or op's
// context error if that comes first (the batch goes on; the create may or
// may not be applied, as with any statement whose caller gives up).
func (s *Store) create(op *createOp) error {
	c := &s.creates
	c.mu.Lock()
	c.waiting = append(c.waiting, op)
	var batch []*createOp
	if c.inFlight < maxCreatesInFlight {
		c.inFlight++
		batch = c.take()
	}
	c.mu.Unlock()
	if batch != nil {
		// This caller leads: it runs the batch (its own create in it,
		// unless the queue held more than a batch), and the creates that
		// queued up meanwhile go next, on a goroutine of their own.
		s.runCreates(batch)
		s.nextCreates()
	}
	select {
	case err := <-op.done:
		return err
	case <-op.ctx.Done():
		return op.ctx.Err()
	}
}

// take removes the next batch from the queue: up to maxCreateBatch creates
// in arrival order, at most one per timer (a later create of the same timer
// waits for the next batch), and none whose caller has given up. Called with
// mu held.
func (c *creates) take() []*createOp {
	batch := make([]*createOp, 0, min(len(c.waiting), maxCreateBatch))
	var keys map[rowKey]bool
	rest := c.waiting[:0]
	for i, op := range c.waiting {
		if len(batch) == maxCreateBatch {
			rest = append(rest, c.waiting[i:]...)
			break
		}
		if err := op.ctx.Err(); err != nil {
			op.done <- err // never sent: not applied
			continue
		}
		if keys == nil && len(batch) == 1 {
			keys = map[rowKey]bool{batch[0].key(): true}
		}
		if keys != nil {
			k := op.key()
			if keys[k] {
				rest = append(rest, op)
				continue
			}
			keys[k] = true
		}
		batch = append(batch, op)
	}
	clear(c.waiting[len(rest):])
	c.waiting = rest
	return batch
}

// nextCreates hands the creates that queued up meanwhile to a goroutine of
// their own, or ends this turn in flight.
func (s *Store) nextCreates() {
	c := &s.creates
	c.mu.Lock()
	defer c.mu.Unlock()
	if batch := c.take(); len(batch) > 0 {
		go func() {
			s.runCreates(batch)
			s.nextCreates()
		}()
		return
	}
	c.inFlight--
}

// runCreates writes a batch and answers each of its creates.
func (s *Store) runCreates(batch []*createOp) {
	switch len(batch) {
	case 0:
		return
	case 1:
		// Alone, a create takes the single-row statement: no arrays.
		op := batch[0]
		op.done <- s.createOne(op.ctx, op)
		return
	}
	ctx, cancel := batchContext(batch)
	defer cancel()
	held, err := s.createBatch(ctx, batch)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// The database refused the statement, so nothing of it was
		// written. It may be one create's row that it refused: write each
		// alone, so that only that one fails.
		for _, op := range batch {
			op.done <- s.createOne(op.ctx, op)
		}
		return
	}
	for _, op := range batch {
		switch {
		case err != nil:
			op.done <- err
		case !held[op.fence]:
			op.done <- fmt.Errorf("postgres: timer create: %w", store.ErrShardOwnershipLost)
		default:
			op.done <- nil
		}
	}
}

// createOne writes one create in a statement of its own.
func (s *Store) createOne(ctx context.Context, op *createOp) error {
	args := append([]any{op.fence.Shard.Namespace, op.fence.Shard.Shard, op.fence.Version}, op.row.args()...)
	return retryUpsert(func() error {
		return s.fenced(ctx, "timer create", s.q.timerCreate, nil, args...)
	})
}

// createBatch writes the creates of a batch in one statement and returns the
// fences whose shard row it found and locked: their creates were written,
// the others not.
func (s *Store) createBatch(ctx context.Context, batch []*createOp) (map[store.Fence]bool, error) {
	// The same order in every batch: two batches that upsert the same rows
	// lock them in the same order and cannot deadlock each other. (A batch
	// that re-creates fired timers while a range delete removes them may
	// still deadlock with it, each locking in its own order; PostgreSQL then
	// aborts one: the engine retries a failed range delete, and a refused
	// batch is written create by create below.)
	slices.SortFunc(batch, func(a, b *createOp) int {
		return cmp.Or(cmp.Compare(a.fence.Shard.Namespace, b.fence.Shard.Namespace),
			cmp.Compare(a.fence.Shard.Shard, b.fence.Shard.Shard), cmp.Compare(a.row.id, b.row.id))
	})
	var (
		fences          []store.Fence
		fns, rns        []string
		fshards, rshard []int32
		fvers, rvers    []int64
		rows            timerRows
	)
	for _, op := range batch {
		f := op.fence
		if !slices.Contains(fences, f) {
			fences = append(fences, f)
			fns, fshards, fvers = append(fns, f.Shard.Namespace), append(fshards, int32(f.Shard.Shard)), append(fvers, f.Version)
		}
		rns, rshard, rvers = append(rns, f.Shard.Namespace), append(rshard, int32(f.Shard.Shard)), append(rvers, f.Version)
		rows.add(&op.row)
	}
	args := append([]any{fns, fshards, fvers, rns, rshard, rvers}, rows.args()...)
	var held map[store.Fence]bool
	err := retryUpsert(func() error {
		held = make(map[store.Fence]bool, len(fences))
		rs, err := s.pool.Query(ctx, s.q.timerCreateBatch, args...)
		if err != nil {
			return err
		}
		var f store.Fence
		_, err = pgx.ForEachRow(rs, []any{&f.Shard.Namespace, &f.Shard.Shard, &f.Version}, func() error {
			held[f] = true
			return nil
		})
		return err
	})
	if err != nil {
		return nil, translate("timer create", err)
	}
	return held, nil
}

// retryUpsert runs a create statement again after a unique violation on the
// primary key (see TimerCreate), at most upsertRetries times.
func retryUpsert(run func() error) error {
	for attempt := 0; ; attempt++ {
		err := run()
		var pgErr *pgconn.PgError
		if attempt < upsertRetries && errors.As(err, &pgErr) &&
			pgErr.Code == uniqueViolation && pgErr.ConstraintName == pkeyConstraint {
			continue
		}
		return err
	}
}

// batchContext is cancelled once every create of the batch has been given up
// on by its caller: one caller going away must not fail the others' creates.
func batchContext(batch []*createOp) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(batch[0].ctx))
	left := atomic.Int32{}
	left.Store(int32(len(batch)))
	stops := make([]func() bool, len(batch))
	for i, op := range batch {
		stops[i] = context.AfterFunc(op.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}
