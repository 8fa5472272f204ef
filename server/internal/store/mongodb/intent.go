package mongodb

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/google/uuid"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/timer"
)

// This file is the fenced-write protocol of the package doc: prepare intents,
// check the version and insert the decision, apply, forget; and the settling
// of intents that their writers left behind.

// cleanupTimeout bounds the steps a write takes after its caller's context
// may be gone: removing its intents after a failed commit, applying them
// after a successful one. Those steps must not be skipped because the caller
// gave up.
const cleanupTimeout = 10 * time.Second

// write is one fenced write in flight.
type write struct {
	s     *Store
	key   store.ShardKey
	fence int64
	token string
}

// begin starts a fenced write; its end must be deferred.
func (s *Store) begin(f store.Fence) *write {
	w := &write{s: s, key: f.Shard, fence: f.Version, token: uuid.NewString()}
	s.inflight.Store(w.token, struct{}{})
	return w
}

func (w *write) end() { w.s.inflight.Delete(w.token) }

func (w *write) intent(next *timerState) intentDoc {
	return intentDoc{Token: w.token, Version: w.fence, Store: w.s.id, Delete: next == nil, Next: next}
}

// byToken selects the documents holding this write's intent.
func (w *write) byToken(id string) bson.D {
	return bson.D{{Key: "_id", Value: id}, {Key: "intent.token", Value: w.token}}
}

// commit is the write's decision. It first checks that the fence is still
// current: a claim inserts its version before it looks for intents, so a
// write that sees its own version here has its intents in place before any
// later claim looks, and that claim will try to abort it. Then it inserts the
// commit decision; a claim (or a settler) inserting an abort first makes it
// fail. ok is false when the write was not committed; err means the outcome
// is unknown.
func (w *write) commit(ctx context.Context) (ok bool, err error) {
	sh, err := w.s.ShardGet(ctx, w.key)
	switch {
	case errors.Is(err, store.ErrShardNotFound):
		return false, nil
	case err != nil:
		return false, err
	case sh.Version != w.fence:
		return false, nil
	}
	return w.s.decide(ctx, w.key, w.token, true)
}

// decide inserts the decision on token: commit (by its writer) or abort (by
// anyone else). It returns the decision that holds, whoever made it.
func (s *Store) decide(ctx context.Context, key store.ShardKey, token string, commit bool) (committed bool, err error) {
	d := decisionDoc{ID: decisionDocID(key, token), Namespace: key.Namespace, ShardID: int64(key.Shard), RowType: rowTypeDecision, Commit: commit}
	for {
		_, err = s.coll.InsertOne(ctx, d)
		if err == nil {
			return commit, nil
		}
		if !mongo.IsDuplicateKeyError(err) {
			return false, err
		}
		// Decided already: by the other side, or by this side's earlier
		// attempt.
		var got decisionDoc
		err = s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: d.ID}}).Decode(&got)
		if err == nil {
			return got.Commit, nil
		}
		if !errors.Is(err, mongo.ErrNoDocuments) {
			return false, err
		}
		// Decided, carried out and forgotten in between. Only the writer
		// forgets an abort, once it has given up, and a commit is forgotten
		// once applied, so: the writer meets its own commit (a retried
		// insert), and anyone else may decide again.
		if commit {
			return true, nil
		}
	}
}

// forget removes the write's decision once it is carried out: every intent
// applied, or (after an abort) the writer has given up, so that nothing can
// insert a commit for its token any more. If it fails, the decision stays: a
// decision without intents is harmless.
func (w *write) forget(ctx context.Context) {
	_, _ = w.s.coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: decisionDocID(w.key, w.token)}})
}

// finish commits a prepared write and applies it (apply), or removes its
// intents (abort) when the fence is stale. It returns ErrShardOwnershipLost
// in that case; any other error may or may not have been applied.
func (w *write) finish(ctx context.Context, op string, apply, abort func(ctx context.Context) error) error {
	ok, err := w.commit(ctx)
	if err != nil {
		// The intents stay; whoever meets them next settles them by the
		// decision (see settle), this write being no longer in flight.
		return translate(op, err)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if !ok {
		err := abort(cctx)
		w.forget(cctx)
		if err != nil {
			return fmt.Errorf("mongodb: %s: %w (and removing the write's intents failed: %v)", op, store.ErrShardOwnershipLost, err)
		}
		return fmt.Errorf("mongodb: %s: %w", op, store.ErrShardOwnershipLost)
	}
	if err := apply(cctx); err != nil {
		return fmt.Errorf("mongodb: %s: committed, but applying it failed (the next write of the timer or the next claim applies it): %w", op, err)
	}
	w.forget(cctx)
	return nil
}

// checkFence reads the shard's version when a write found nothing to do: a
// stale fence wins over "not found".
func (s *Store) checkFence(ctx context.Context, op string, f store.Fence, missing error) error {
	sh, err := s.ShardGet(ctx, f.Shard)
	switch {
	case errors.Is(err, store.ErrShardNotFound):
		return fmt.Errorf("mongodb: %s: %w", op, store.ErrShardOwnershipLost)
	case err != nil:
		return err
	case sh.Version != f.Version:
		return fmt.Errorf("mongodb: %s: %w", op, store.ErrShardOwnershipLost)
	}
	return fmt.Errorf("mongodb: %s: %w", op, missing)
}

// prepareOne puts the write's intent on timer id. cond restricts the committed
// state the write applies to (nil: any, and a missing timer gets a
// placeholder). It returns created when it made a placeholder, found=false
// when no committed timer matches cond.
func (w *write) prepareOne(ctx context.Context, id string, cond bson.D, in intentDoc) (created, found bool, err error) {
	docID := timerDocID(w.key, id)
	var wait backoff
	for {
		filter := append(bson.D{{Key: "_id", Value: docID}, {Key: "intent", Value: bson.D{{Key: "$exists", Value: false}}}}, cond...)
		res, err := w.s.coll.UpdateOne(ctx, filter, bson.D{{Key: "$set", Value: bson.D{{Key: "intent", Value: in}}}})
		if err != nil {
			return false, false, err
		}
		if res.MatchedCount == 1 {
			return false, true, nil
		}
		if cond == nil {
			ph := bson.D{
				{Key: "_id", Value: docID}, {Key: "namespace", Value: w.key.Namespace}, {Key: "shard_id", Value: int64(w.key.Shard)},
				{Key: "timer_id", Value: id}, {Key: "row_type", Value: rowTypePlaceholder}, {Key: "intent", Value: in},
			}
			_, err := w.s.coll.InsertOne(ctx, ph)
			if err == nil {
				return true, true, nil
			}
			if !mongo.IsDuplicateKeyError(err) {
				return false, false, err
			}
		}
		// The document exists but is held by another write, or does not
		// match cond.
		var d timerDoc
		err = w.s.coll.FindOne(ctx, append(bson.D{{Key: "_id", Value: docID}}, cond...)).Decode(&d)
		switch {
		case errors.Is(err, mongo.ErrNoDocuments) && cond != nil:
			return false, false, nil
		case errors.Is(err, mongo.ErrNoDocuments):
			// Removed since the insert failed: insert again.
		case err != nil:
			return false, false, err
		case d.Intent != nil:
			if err := w.s.settle(ctx, w.key, d.Intent, &wait); err != nil {
				return false, false, err
			}
		}
	}
}

// settle resolves an intent of another write that stands in the way. It
// may decide the write (abort it, unless it committed) when the write can no
// longer be running: its version is older than the shard's, or its writer, in
// this process, has returned. Then it applies or removes the intents, as
// decided. Otherwise it waits a little for the writer.
func (s *Store) settle(ctx context.Context, key store.ShardKey, in *intentDoc, wait *backoff) error {
	mine := in.Store == s.id
	// Checked before anything else: a writer that is not in flight now cannot
	// insert its decision later.
	if mine {
		if _, running := s.inflight.Load(in.Token); running {
			return wait.sleep(ctx)
		}
	}
	if !mine {
		sh, err := s.ShardGet(ctx, key)
		if err != nil && !errors.Is(err, store.ErrShardNotFound) {
			return err
		}
		if err != nil || sh.Version <= in.Version {
			return wait.sleep(ctx)
		}
	}
	return s.resolve(ctx, key, in.Version, in.Token)
}

// resolve decides the write of token (an abort, unless it committed) and
// carries the decision out.
func (s *Store) resolve(ctx context.Context, key store.ShardKey, v int64, token string) error {
	committed, err := s.decide(ctx, key, token, false)
	if err != nil {
		return err
	}
	if committed {
		if err := s.applyToken(ctx, key, v, token); err != nil {
			return err
		}
		// Applied: nobody needs the decision any more.
		_, err = s.coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: decisionDocID(key, token)}})
		return err
	}
	// An abort stays until the writer, if alive, fails its commit on it and
	// forgets it: removing it sooner would let a slow writer still commit.
	return s.abortToken(ctx, key, v, token)
}

// settleOlder resolves, for a claim of version v, every intent of an older
// version: a write that committed is applied, any other is aborted and its
// intents removed.
func (s *Store) settleOlder(ctx context.Context, key store.ShardKey, v int64) error {
	cur, err := s.coll.Find(ctx,
		append(partition(key), bson.E{Key: "intent.version", Value: bson.D{{Key: "$lt", Value: v}}}),
		options.Find().SetProjection(bson.D{{Key: "intent.token", Value: 1}, {Key: "intent.version", Value: 1}}))
	if err != nil {
		return err
	}
	var docs []struct {
		Intent intentDoc `bson:"intent"`
	}
	if err := cur.All(ctx, &docs); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, d := range docs {
		if seen[d.Intent.Token] {
			continue
		}
		seen[d.Intent.Token] = true
		if err := s.resolve(ctx, key, d.Intent.Version, d.Intent.Token); err != nil {
			return err
		}
	}
	return nil
}

// applyToken applies every intent of a committed write, as its writer would.
func (s *Store) applyToken(ctx context.Context, key store.ShardKey, v int64, token string) error {
	sel := with(partition(key), bson.E{Key: "intent.version", Value: v}, bson.E{Key: "intent.token", Value: token})
	if _, err := s.coll.DeleteMany(ctx, with(sel, bson.E{Key: "intent.delete", Value: true})); err != nil {
		return err
	}
	cur, err := s.coll.Find(ctx, sel)
	if err != nil {
		return err
	}
	var docs []timerDoc
	if err := cur.All(ctx, &docs); err != nil {
		return err
	}
	for _, d := range docs {
		if d.Intent == nil || d.Intent.Next == nil {
			continue
		}
		_, err := s.coll.ReplaceOne(ctx,
			bson.D{{Key: "_id", Value: d.ID}, {Key: "intent.token", Value: token}},
			committedDoc(key, d.TimerID, *d.Intent.Next))
		if err != nil {
			return err
		}
	}
	return nil
}

// abortToken removes every intent of a write that did not and cannot commit,
// with the placeholders it created.
func (s *Store) abortToken(ctx context.Context, key store.ShardKey, v int64, token string) error {
	sel := with(partition(key), bson.E{Key: "intent.version", Value: v}, bson.E{Key: "intent.token", Value: token})
	if _, err := s.coll.DeleteMany(ctx, with(sel, bson.E{Key: "row_type", Value: rowTypePlaceholder})); err != nil {
		return err
	}
	_, err := s.coll.UpdateMany(ctx, sel, bson.D{{Key: "$unset", Value: bson.D{{Key: "intent", Value: ""}}}})
	return err
}

// TimerCreate implements store.Store: an upsert whatever the stored timer's
// position or status.
func (s *Store) TimerCreate(ctx context.Context, f store.Fence, t *timer.Timer) error {
	const op = "timer create"
	if err := f.Covers(t); err != nil {
		return fmt.Errorf("mongodb: %s: %w", op, err)
	}
	st := stateOf(t)
	return s.writeOne(ctx, f, op, t.ID, nil, &st, nil)
}

// TimerUpdate implements store.Store.
func (s *Store) TimerUpdate(ctx context.Context, f store.Fence, p store.TimerUpdateParams) error {
	const op = "timer update"
	if p.Timer == nil {
		return fmt.Errorf("mongodb: %s: timer is nil", op)
	}
	if err := f.Covers(p.Timer); err != nil {
		return fmt.Errorf("mongodb: %s: %w", op, err)
	}
	cond := bson.D{{Key: "row_type", Value: bson.D{{Key: "$in", Value: bson.A{store.RowTypeTimerPending, store.RowTypeTimerFailed}}}}}
	if p.IfDueAt != nil {
		cond = bson.D{
			{Key: "row_type", Value: store.RowTypeTimerPending},
			{Key: "execute_at", Value: bson.NewDateTimeFromTime(*p.IfDueAt)},
		}
	}
	st := stateOf(p.Timer)
	return s.writeOne(ctx, f, op, p.Timer.ID, cond, &st, store.ErrTimerNotFound)
}

// TimerDelete implements store.Store.
func (s *Store) TimerDelete(ctx context.Context, f store.Fence, id string) error {
	cond := bson.D{{Key: "row_type", Value: bson.D{{Key: "$in", Value: bson.A{store.RowTypeTimerPending, store.RowTypeTimerFailed}}}}}
	return s.writeOne(ctx, f, "timer delete", id, cond, nil, store.ErrTimerNotFound)
}

// writeOne is a fenced write of one timer document: next is its new state, nil
// to delete it; cond, if not nil, is what its committed state must match, and
// missing the error when nothing does.
func (s *Store) writeOne(ctx context.Context, f store.Fence, op, id string, cond bson.D, next *timerState, missing error) error {
	w := s.begin(f)
	defer w.end()
	created, found, err := w.prepareOne(ctx, id, cond, w.intent(next))
	if err != nil {
		return translate(op, err)
	}
	if !found {
		return s.checkFence(ctx, op, f, missing)
	}
	docID := timerDocID(f.Shard, id)
	apply := func(ctx context.Context) error {
		var err error
		if next == nil {
			_, err = s.coll.DeleteOne(ctx, w.byToken(docID))
		} else {
			_, err = s.coll.ReplaceOne(ctx, w.byToken(docID), committedDoc(f.Shard, id, *next))
		}
		return err
	}
	abort := func(ctx context.Context) error {
		var err error
		if created {
			_, err = s.coll.DeleteOne(ctx, w.byToken(docID))
		} else {
			_, err = s.coll.UpdateOne(ctx, w.byToken(docID), bson.D{{Key: "$unset", Value: bson.D{{Key: "intent", Value: ""}}}})
		}
		return err
	}
	return w.finish(ctx, op, apply, abort)
}

// TimerDeleteRange implements store.Store. It marks the range's timers for
// deletion (one updateMany over the window index), makes sure no other write
// holds a timer in the range, commits, and deletes them (one deleteMany). It
// reports how many timers it marked, which is how many the write removed.
func (s *Store) TimerDeleteRange(ctx context.Context, f store.Fence, p store.TimerDeleteRangeParams) (int, error) {
	const op = "timer delete range"
	w := s.begin(f)
	defer w.end()
	rng := rangeFilter(f.Shard, p.UpTo)
	mine := with(rng, bson.E{Key: "intent.token", Value: w.token})
	abort := func(ctx context.Context) error {
		_, err := s.coll.UpdateMany(ctx, mine, bson.D{{Key: "$unset", Value: bson.D{{Key: "intent", Value: ""}}}})
		return err
	}
	marked, err := s.markRange(ctx, w, rng, abort)
	if err != nil {
		_ = abort(context.WithoutCancel(ctx))
		return 0, translate(op, err)
	}
	apply := func(ctx context.Context) error {
		_, err := s.coll.DeleteMany(ctx, mine)
		return err
	}
	if err := w.finish(ctx, op, apply, abort); err != nil {
		return 0, err
	}
	return int(marked), nil
}

// markRange puts the write's delete intent on every timer in rng and returns
// how many it marked. A timer held by another write is settled; if that write
// is still running, markRange lets go of its own marks before it waits, so
// that two range deletes cannot wait for each other. Timers that enter the
// range after the marking come from writes that overlap this delete, which
// may then be ordered after it.
func (s *Store) markRange(ctx context.Context, w *write, rng bson.D, abort func(context.Context) error) (int64, error) {
	var (
		marked int64
		wait   backoff
	)
	for {
		res, err := s.coll.UpdateMany(ctx,
			with(rng, bson.E{Key: "intent", Value: bson.D{{Key: "$exists", Value: false}}}),
			bson.D{{Key: "$set", Value: bson.D{{Key: "intent", Value: w.intent(nil)}}}})
		if err != nil {
			return 0, err
		}
		marked += res.ModifiedCount
		foreign, blocked, err := s.settleRange(ctx, w, rng)
		switch {
		case err != nil:
			return 0, err
		case foreign == 0:
			return marked, nil
		case blocked:
			if err := abort(ctx); err != nil {
				return 0, err
			}
			marked = 0
			if err := wait.sleep(ctx); err != nil {
				return 0, err
			}
		}
	}
}

// settleRange settles the intents of other writes on timers in rng; blocked
// reports one whose writer is still running.
func (s *Store) settleRange(ctx context.Context, w *write, rng bson.D) (foreign int, blocked bool, err error) {
	cur, err := s.coll.Find(ctx,
		with(rng, bson.E{Key: "intent.token", Value: bson.D{{Key: "$exists", Value: true}, {Key: "$ne", Value: w.token}}}),
		options.Find().SetProjection(bson.D{{Key: "intent.token", Value: 1}, {Key: "intent.version", Value: 1}, {Key: "intent.store", Value: 1}}))
	if err != nil {
		return 0, false, err
	}
	var docs []struct {
		Intent intentDoc `bson:"intent"`
	}
	if err := cur.All(ctx, &docs); err != nil {
		return 0, false, err
	}
	for _, d := range docs {
		once := backoff{noSleep: true}
		if err := s.settle(ctx, w.key, &d.Intent, &once); err != nil {
			return 0, false, err
		}
		blocked = blocked || once.wanted
	}
	return len(docs), blocked, nil
}

// with returns d and e in a new slice: filters derived from one base must not
// share its backing array.
func with(d bson.D, e ...bson.E) bson.D {
	return append(slices.Clip(d), e...)
}

// backoff waits for another write to finish: from 1 ms, doubling up to
// 32 ms, jittered, for as long as the context allows.
type backoff struct {
	n int
	// noSleep records that a wait was wanted (wanted) instead of waiting.
	noSleep, wanted bool
}

func (b *backoff) sleep(ctx context.Context) error {
	if b.noSleep {
		b.wanted = true
		return nil
	}
	d := time.Millisecond << min(b.n, 5)
	b.n++
	d = d/2 + rand.N(d/2+1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
