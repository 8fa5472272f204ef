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
// commit on the shard document, apply, forget; and the settling of intents
// that their writers left behind.

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

// commit is the write's decision: it records the token on the shard
// document if the shard still has the fence's version. ok is false when it
// has not; err means the outcome is unknown.
func (w *write) commit(ctx context.Context) (ok bool, err error) {
	res, err := w.s.coll.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: shardDocID(w.key)}, {Key: "shard_version", Value: w.fence}},
		bson.D{{Key: "$push", Value: bson.D{{Key: "commits", Value: w.token}}}})
	if err != nil {
		return false, err
	}
	return res.MatchedCount == 1, nil
}

// forget removes the token from the shard's commits once every intent of the
// write is applied. If it fails, the token stays until the next claim: a
// token without intents is harmless.
func (w *write) forget(ctx context.Context) {
	_, _ = w.s.coll.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: shardDocID(w.key)}},
		bson.D{{Key: "$pull", Value: bson.D{{Key: "commits", Value: w.token}}}})
}

// finish commits a prepared write and applies it (apply), or removes its
// intents (abort) when the fence is stale. It returns ErrShardOwnershipLost
// in that case; any other error may or may not have been applied.
func (w *write) finish(ctx context.Context, op string, apply, abort func(ctx context.Context) error) error {
	ok, err := w.commit(ctx)
	if err != nil {
		// The intents stay; whoever meets them next settles them by the
		// commits list (see settle), this write being no longer in flight.
		return translate(op, err)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if !ok {
		if err := abort(cctx); err != nil {
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

// settle resolves an intent of another write that stands in the way: applies
// it if it committed, removes it if it never can commit or its writer, in this
// process, has returned; otherwise waits a little for its writer.
func (s *Store) settle(ctx context.Context, key store.ShardKey, in *intentDoc, wait *backoff) error {
	// Checked before the commits are read: a writer that is not in flight
	// now cannot commit after we read them.
	if in.Store == s.id {
		if _, running := s.inflight.Load(in.Token); running {
			return wait.sleep(ctx)
		}
	}
	var sh shardDoc
	err := s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: shardDocID(key)}}).Decode(&sh)
	if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
		return err
	}
	switch {
	case slices.Contains(sh.Commits, in.Token):
		return s.applyToken(ctx, key, in.Version, in.Token)
	case in.Version < sh.Version || in.Store == s.id:
		return s.abortToken(ctx, key, in.Version, in.Token)
	}
	return wait.sleep(ctx)
}

// settleOlder settles, for a claim of version v, every intent of an older
// version: those whose token is in commits (read atomically with the claim)
// are applied, the others removed; then those tokens are forgotten.
func (s *Store) settleOlder(ctx context.Context, key store.ShardKey, v int64, commits []string) error {
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
		if slices.Contains(commits, d.Intent.Token) {
			err = s.applyToken(ctx, key, d.Intent.Version, d.Intent.Token)
		} else {
			err = s.abortToken(ctx, key, d.Intent.Version, d.Intent.Token)
		}
		if err != nil {
			return err
		}
	}
	if len(commits) > 0 {
		_, err = s.coll.UpdateOne(ctx,
			bson.D{{Key: "_id", Value: shardDocID(key)}},
			bson.D{{Key: "$pullAll", Value: bson.D{{Key: "commits", Value: commits}}}})
	}
	return err
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
	if err := checkTimer(f, t); err != nil {
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
	if err := checkTimer(f, p.Timer); err != nil {
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
	marked, err := s.markRange(ctx, w, rng, mine, abort)
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
// that two range deletes cannot wait for each other.
func (s *Store) markRange(ctx context.Context, w *write, rng, mine bson.D, abort func(context.Context) error) (int64, error) {
	var (
		marked int64
		wait   backoff
	)
	for rounds := 0; ; rounds++ {
		res, err := s.coll.UpdateMany(ctx,
			with(rng, bson.E{Key: "intent", Value: bson.D{{Key: "$exists", Value: false}}}),
			bson.D{{Key: "$set", Value: bson.D{{Key: "intent", Value: w.intent(nil)}}}})
		if err != nil {
			return 0, err
		}
		marked += res.ModifiedCount
		n, err := s.coll.CountDocuments(ctx, rng)
		if err != nil {
			return 0, err
		}
		if n == marked {
			return marked, nil
		}
		foreign, blocked, err := s.settleRange(ctx, w, rng)
		switch {
		case err != nil:
			return 0, err
		case blocked:
			if err := abort(ctx); err != nil {
				return 0, err
			}
			marked = 0
			if err := wait.sleep(ctx); err != nil {
				return 0, err
			}
		case foreign == 0:
			// Only timers nobody holds came into the range (creates of
			// timers already due), or a claim removed our marks. Recount
			// ours and mark the newcomers, a few times; creates that keep
			// coming after that are ordered after this delete.
			if marked, err = s.coll.CountDocuments(ctx, mine); err != nil || rounds >= 3 {
				return marked, err
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

// checkTimer rejects a timer written under the fence of another shard.
func checkTimer(f store.Fence, t *timer.Timer) error {
	if t.Namespace != f.Shard.Namespace || t.Shard != f.Shard.Shard {
		return fmt.Errorf("timer %q of shard (%q, %d) written under the fence of shard (%q, %d)",
			t.ID, t.Namespace, t.Shard, f.Shard.Namespace, f.Shard.Shard)
	}
	return nil
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
