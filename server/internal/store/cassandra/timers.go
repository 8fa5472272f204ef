package cassandra

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gocql/gocql"
	"github.com/google/uuid"

	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/timer"
)

// casAttempts bounds the conditional batches of one write: a create of an
// existing id takes two (the first assumes a new id), and each concurrent
// change of the same timer one more (never a stale fence, which ends the write
// at once). Writes of one Store to a shard are serialised, so only another
// process's writes can cause those.
const casAttempts = 32

// key is a timer row's clustering key without its timer_id.
type key struct {
	rowType int8
	dueMS   int64
	uuid    []byte
}

func (k key) equal(o key) bool {
	return k.rowType == o.rowType && k.dueMS == o.dueMS && bytes.Equal(k.uuid, o.uuid)
}

func keyOf(t *timer.Timer) key {
	return key{rowType: int8(store.RowTypeOf(t.Status)), dueMS: ms(t.DueAt), uuid: bytes.Clone(t.UUID[:])}
}

// idRow is a timer's id row: where its timer row is, and its gen.
type idRow struct {
	at  key
	gen gocql.UUID
}

// updateArgs are the arguments of idUpdate, which points the id row at to
// with the new gen if it still is r.
func (r *idRow) updateArgs(sk store.ShardKey, id string, to key, gen gocql.UUID) []any {
	return []any{to.rowType, to.dueMS, to.uuid, gen, sk.Namespace, sk.Shard, id, r.gen, r.at.rowType, r.at.dueMS, r.at.uuid}
}

// probeResult is what probe read of a shard partition, or what a failed
// conditional batch returned of it (see casState).
type probeResult struct {
	shardFound   bool
	shardVersion int64
	id           *idRow // nil: no id row
	// target says whether the probed timer row exists, and its gen.
	targetFound bool
	targetGen   gocql.UUID
}

func (p probeResult) fenceOK(f store.Fence) bool {
	return p.shardFound && p.shardVersion == f.Version
}

// add records a row of a failed conditional batch's answer (see casState).
// A row of nulls (no conditioned row exists) has no row_type.
func (p *probeResult) add(row map[string]any, id string) {
	rowType, ok := row["row_type"].(int8)
	switch {
	case !ok:
	case rowType == store.RowTypeShard:
		p.shardFound = true
		p.shardVersion, _ = row["shard_version"].(int64)
	case rowType == rowTypeID && id != "" && row["timer_id"] == id:
		r := &idRow{}
		r.gen, _ = row["gen"].(gocql.UUID)
		r.at.rowType, _ = row["id_row_type"].(int8)
		due, _ := row["id_due_at"].(time.Time)
		r.at.dueMS = ms(due)
		r.at.uuid, _ = row["id_uuid"].([]byte)
		p.id = r
	}
}

// probe reads the shard row, the id row of id and, if target is not nil, the
// timer row of id at target, in one round trip. serial reads at the serial
// consistency, which sees the outcome of any Paxos round in progress.
func (s *Store) probe(ctx context.Context, sk store.ShardKey, id string, target *key, serial bool) (probeResult, error) {
	// Without a target the third tuple names the id row again.
	t := key{rowType: rowTypeID, uuid: []byte{}}
	if target != nil {
		t = *target
	}
	q := s.session.Query(s.q.probe, sk.Namespace, sk.Shard, id, t.rowType, t.dueMS, t.uuid, id).WithContext(ctx)
	if serial {
		q = q.Consistency(gocql.Consistency(s.serial))
	}
	var (
		res                  probeResult
		rowType, idRowType   int8
		timerID              string
		gen                  gocql.UUID
		idDueAt, shardVerion int64
		idUUID               []byte
	)
	iter := q.Iter()
	for iter.Scan(&rowType, &timerID, &gen, &idRowType, &idDueAt, &idUUID, &shardVerion) {
		switch {
		case rowType == store.RowTypeShard:
			res.shardFound, res.shardVersion = true, shardVerion
		case rowType == rowTypeID:
			res.id = &idRow{at: key{rowType: idRowType, dueMS: idDueAt, uuid: bytes.Clone(idUUID)}, gen: gen}
		default:
			res.targetFound, res.targetGen = true, gen
		}
	}
	return res, iter.Close()
}

// readID reads the id row of id at the read consistency; nil if none.
func (s *Store) readID(ctx context.Context, sk store.ShardKey, id string) (*idRow, error) {
	var r idRow
	err := s.session.Query(s.q.idGet, sk.Namespace, sk.Shard, id).WithContext(ctx).
		Scan(&r.at.rowType, &r.at.dueMS, &r.at.uuid, &r.gen)
	if errors.Is(err, gocql.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &r, nil
}

// TimerCreate implements store.Store. Its first batch assumes that the id
// is new and inserts the id row IF NOT EXISTS, which saves a read in the
// common case. A batch that does not apply reports the shard row and the id
// row as its Paxos round read them (see casState): a stale fence ends the
// create, and otherwise the next batch moves the timer from where the id row
// says it is.
func (s *Store) TimerCreate(ctx context.Context, f store.Fence, t *timer.Timer) error {
	if err := f.Covers(t); err != nil {
		return fmt.Errorf("cassandra: timer create: %w", err)
	}
	vals, err := timerValues(t)
	if err != nil {
		return fmt.Errorf("cassandra: timer create: %w", err)
	}
	defer s.lock(f.Shard)()
	to := keyOf(t)
	var cur *idRow
	for range casAttempts {
		gen, b := newGen(), s.newBatch(ctx, f)
		if cur == nil {
			b.Query(s.q.idInsert, f.Shard.Namespace, f.Shard.Shard, t.ID, to.rowType, to.dueMS, to.uuid, gen)
		} else {
			b.Query(s.q.idUpdate, cur.updateArgs(f.Shard, t.ID, to, gen)...)
			if !cur.at.equal(to) {
				// Unconditional: the old row may be gone already (a range
				// delete), which changes nothing here.
				b.Query(s.q.timerRemove, f.Shard.Namespace, f.Shard.Shard, cur.at.rowType, cur.at.dueMS, cur.at.uuid, t.ID)
			}
		}
		// At the same key this overwrites every column of the old row.
		b.Query(s.q.timerInsert, vals.insertArgs(gen)...)
		applied, st, err := s.casState(b, t.ID)
		if err != nil {
			return translate("timer create", err)
		}
		if applied {
			return nil
		}
		if !st.fenceOK(f) {
			return fmt.Errorf("cassandra: timer create: %w", store.ErrShardOwnershipLost)
		}
		cur = st.id
	}
	return fmt.Errorf("cassandra: timer create %q: still conflicting after %d attempts", t.ID, casAttempts)
}

// TimerUpdate implements store.Store.
func (s *Store) TimerUpdate(ctx context.Context, f store.Fence, p store.TimerUpdateParams) error {
	t := p.Timer
	if t == nil {
		return errors.New("cassandra: timer update: timer is nil")
	}
	if err := f.Covers(t); err != nil {
		return fmt.Errorf("cassandra: timer update: %w", err)
	}
	vals, err := timerValues(t)
	if err != nil {
		return fmt.Errorf("cassandra: timer update: %w", err)
	}
	defer s.lock(f.Shard)()
	st, err := s.probe(ctx, f.Shard, t.ID, nil, false)
	if err != nil {
		return translate("timer update", err)
	}
	to := keyOf(t)
	for range casAttempts {
		if !st.fenceOK(f) {
			return fmt.Errorf("cassandra: timer update: %w", store.ErrShardOwnershipLost)
		}
		cur := st.id
		if cur == nil || (p.IfDueAt != nil && (cur.at.rowType != store.RowTypeTimerPending || cur.at.dueMS != ms(*p.IfDueAt))) {
			return fmt.Errorf("cassandra: timer update: %w", store.ErrTimerNotFound)
		}
		gen, b := newGen(), s.newBatch(ctx, f)
		b.Query(s.q.idUpdate, cur.updateArgs(f.Shard, t.ID, to, gen)...)
		// The conditions on the old timer row make an id row whose timer row
		// is gone (see removeDangling) fail the batch.
		if cur.at.equal(to) {
			b.Query(s.q.timerUpdate, vals.updateArgs(gen, cur.gen)...)
		} else {
			b.Query(s.q.timerDelete, f.Shard.Namespace, f.Shard.Shard, cur.at.rowType, cur.at.dueMS, cur.at.uuid, t.ID, cur.gen)
			b.Query(s.q.timerInsert, vals.insertArgs(gen)...)
		}
		applied, err := s.cas(b)
		if err != nil {
			return translate("timer update", err)
		}
		if applied {
			return nil
		}
		if st, err = s.probe(ctx, f.Shard, t.ID, &cur.at, true); err != nil {
			return translate("timer update", err)
		}
		if st.fenceOK(f) && st.id != nil && st.id.gen == cur.gen && (!st.targetFound || st.targetGen != cur.gen) {
			return s.removeDangling(ctx, f, t.ID, cur.gen, "timer update")
		}
	}
	return fmt.Errorf("cassandra: timer update %q: still conflicting after %d attempts", t.ID, casAttempts)
}

// TimerDelete implements store.Store.
func (s *Store) TimerDelete(ctx context.Context, f store.Fence, id string) error {
	defer s.lock(f.Shard)()
	st, err := s.probe(ctx, f.Shard, id, nil, false)
	if err != nil {
		return translate("timer delete", err)
	}
	for range casAttempts {
		if !st.fenceOK(f) {
			return fmt.Errorf("cassandra: timer delete: %w", store.ErrShardOwnershipLost)
		}
		cur := st.id
		if cur == nil {
			return fmt.Errorf("cassandra: timer delete: %w", store.ErrTimerNotFound)
		}
		b := s.newBatch(ctx, f)
		b.Query(s.q.idDelete, f.Shard.Namespace, f.Shard.Shard, id, cur.gen)
		b.Query(s.q.timerDelete, f.Shard.Namespace, f.Shard.Shard, cur.at.rowType, cur.at.dueMS, cur.at.uuid, id, cur.gen)
		applied, err := s.cas(b)
		if err != nil {
			return translate("timer delete", err)
		}
		if applied {
			return nil
		}
		if st, err = s.probe(ctx, f.Shard, id, &cur.at, true); err != nil {
			return translate("timer delete", err)
		}
		if st.fenceOK(f) && st.id != nil && st.id.gen == cur.gen && (!st.targetFound || st.targetGen != cur.gen) {
			return s.removeDangling(ctx, f, id, cur.gen, "timer delete")
		}
	}
	return fmt.Errorf("cassandra: timer delete %q: still conflicting after %d attempts", id, casAttempts)
}

// removeDangling deletes an id row whose timer row is gone and reports the
// timer as not found. The fence guards it like any write; if the id row
// changed meanwhile it is left alone, and the timer is still reported not
// found: it was, when it was read.
func (s *Store) removeDangling(ctx context.Context, f store.Fence, id string, gen gocql.UUID, op string) error {
	b := s.newBatch(ctx, f)
	b.Query(s.q.idDelete, f.Shard.Namespace, f.Shard.Shard, id, gen)
	applied, err := s.cas(b)
	if err != nil {
		return translate(op, err)
	}
	if !applied {
		st, err := s.probe(ctx, f.Shard, id, nil, true)
		if err != nil {
			return translate(op, err)
		}
		if !st.fenceOK(f) {
			return fmt.Errorf("cassandra: %s: %w", op, store.ErrShardOwnershipLost)
		}
	}
	return fmt.Errorf("cassandra: %s: %w", op, store.ErrTimerNotFound)
}

// getAttempts bounds TimerGet's rereads when the timer moves between its two
// reads.
const getAttempts = 8

// TimerGet implements store.Store. It reads the id row, then the timer row it
// points at; a timer row with another gen, or none, means the timer moved
// between the two reads (read again) or the id row dangles (not found).
func (s *Store) TimerGet(ctx context.Context, sk store.ShardKey, id string) (*timer.Timer, error) {
	cur, err := s.readID(ctx, sk, id)
	for range getAttempts {
		if err != nil {
			return nil, translate("timer get", err)
		}
		if cur == nil {
			return nil, fmt.Errorf("cassandra: timer get: %w", store.ErrTimerNotFound)
		}
		iter := s.session.Query(s.q.timerGet, sk.Namespace, sk.Shard, cur.at.rowType, cur.at.dueMS, cur.at.uuid, id).
			WithContext(ctx).Iter()
		var found *timer.Timer
		var gen gocql.UUID
		for {
			t, g, ok, err := scanTimer(iter)
			if err != nil {
				_ = iter.Close()
				return nil, fmt.Errorf("cassandra: timer get: %w", err)
			}
			if !ok {
				break
			}
			found, gen = t, g
		}
		if err := iter.Close(); err != nil {
			return nil, translate("timer get", err)
		}
		if found != nil && gen == cur.gen {
			return found, nil
		}
		again, err := s.readID(ctx, sk, id)
		if err == nil && again != nil && again.gen == cur.gen {
			return nil, fmt.Errorf("cassandra: timer get: %w", store.ErrTimerNotFound)
		}
		cur = again
	}
	return nil, fmt.Errorf("cassandra: timer get %q: the timer kept moving while read", id)
}

// windowPage is the page size of window reads.
const windowPage = 1000

// TimerGetWindow implements store.Store: one clustering slice of the shard's
// partition.
func (s *Store) TimerGetWindow(ctx context.Context, p store.TimerGetWindowParams) ([]*timer.Timer, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	iter := s.session.Query(s.q.timerGetWindow, p.Shard.Namespace, p.Shard.Shard,
		ms(p.After.DueAt), bytes.Clone(p.After.UUID[:]), ms(p.DueUntil), p.Limit).
		PageSize(min(p.Limit, windowPage)).WithContext(ctx).Iter()
	var out []*timer.Timer
	for {
		t, _, ok, err := scanTimer(iter)
		if err != nil {
			_ = iter.Close()
			return nil, fmt.Errorf("cassandra: timer get window: %w", err)
		}
		if !ok {
			break
		}
		out = append(out, t)
	}
	if err := iter.Close(); err != nil {
		return nil, translate("timer get window", err)
	}
	return out, nil
}

// rangeEntry is a timer row a range delete removes, with what its id row
// must still hold for the batch to delete that too.
type rangeEntry struct {
	id  string
	gen gocql.UUID
}

// TimerDeleteRange implements store.Store. It reads the ids and gens of the
// timers in the range, then writes one conditional batch: the fence, one
// range tombstone over the slice, and the deletion of each timer's id row
// IF gen = the gen read. A timer changed in between fails the batch, which
// is then rebuilt from reads at the serial consistency. It reports the count
// of timer rows it read in the range, which is exact as long as writes under
// one fence come from one Store, as the engine makes them.
func (s *Store) TimerDeleteRange(ctx context.Context, f store.Fence, p store.TimerDeleteRangeParams) (int, error) {
	defer s.lock(f.Shard)()
	upTo, upToUUID := ms(p.UpTo.DueAt), bytes.Clone(p.UpTo.UUID[:])
	entries, err := s.rangeEntries(ctx, f.Shard, upTo, upToUUID, false)
	if err != nil {
		return 0, translate("timer delete range", err)
	}
	for range casAttempts {
		if len(entries) == 0 {
			// Nothing to delete: only the fence is to be checked, and a read
			// does that without writing a tombstone.
			st, err := s.probe(ctx, f.Shard, "", nil, false)
			if err != nil {
				return 0, translate("timer delete range", err)
			}
			if !st.fenceOK(f) {
				return 0, fmt.Errorf("cassandra: timer delete range: %w", store.ErrShardOwnershipLost)
			}
			return 0, nil
		}
		b := s.newBatch(ctx, f)
		b.Query(s.q.timerRangeDelete, f.Shard.Namespace, f.Shard.Shard, upTo, upToUUID)
		for _, e := range entries {
			b.Query(s.q.idDelete, f.Shard.Namespace, f.Shard.Shard, e.id, e.gen)
		}
		applied, err := s.cas(b)
		if err != nil {
			return 0, translate("timer delete range", err)
		}
		if applied {
			return len(entries), nil
		}
		st, err := s.probe(ctx, f.Shard, "", nil, true)
		if err != nil {
			return 0, translate("timer delete range", err)
		}
		if !st.fenceOK(f) {
			return 0, fmt.Errorf("cassandra: timer delete range: %w", store.ErrShardOwnershipLost)
		}
		if entries, err = s.rangeEntries(ctx, f.Shard, upTo, upToUUID, true); err != nil {
			return 0, translate("timer delete range", err)
		}
	}
	return 0, fmt.Errorf("cassandra: timer delete range: still conflicting after %d attempts", casAttempts)
}

// rangeEntries reads the timer rows of a range delete. With serial it reads
// at the serial consistency and keeps only entries whose id row still has the
// timer row's gen: a timer row without a matching id row (which no write of
// this driver leaves) must not block the range delete forever.
func (s *Store) rangeEntries(ctx context.Context, sk store.ShardKey, upTo int64, upToUUID []byte, serial bool) ([]rangeEntry, error) {
	q := s.session.Query(s.q.timerRangeIDs, sk.Namespace, sk.Shard, upTo, upToUUID).PageSize(windowPage).WithContext(ctx)
	if serial {
		q = q.Consistency(gocql.Consistency(s.serial))
	}
	var (
		out []rangeEntry
		e   rangeEntry
	)
	iter := q.Iter()
	for iter.Scan(&e.id, &e.gen) {
		out = append(out, e)
	}
	if err := iter.Close(); err != nil {
		return nil, err
	}
	if !serial || len(out) == 0 {
		return out, nil
	}
	ids := make([]string, len(out))
	for i, e := range out {
		ids[i] = e.id
	}
	gens := make(map[string]gocql.UUID, len(out))
	iter = s.session.Query(s.q.idGens, sk.Namespace, sk.Shard, ids).
		Consistency(gocql.Consistency(s.serial)).PageSize(windowPage).WithContext(ctx).Iter()
	for iter.Scan(&e.id, &e.gen) {
		gens[e.id] = e.gen
	}
	if err := iter.Close(); err != nil {
		return nil, err
	}
	kept := out[:0]
	for _, e := range out {
		if g, ok := gens[e.id]; ok && g == e.gen {
			kept = append(kept, e)
		}
	}
	return kept, nil
}

func newGen() gocql.UUID {
	return gocql.UUID(uuid.New())
}

// values are a timer's column values, shared by its inserts and updates.
type values struct {
	ns                   string
	shard                int
	at                   key
	id                   string
	executeAt            int64
	callbackURL          string
	payload              string
	policy               string
	timeoutMS            int64
	createdAt, updatedAt int64
	attempts             int
	lastError            string
}

func timerValues(t *timer.Timer) (values, error) {
	policy, err := json.Marshal(t.RetryPolicy)
	if err != nil {
		return values{}, fmt.Errorf("encode retry policy: %w", err)
	}
	v := values{
		ns: t.Namespace, shard: t.Shard, at: keyOf(t), id: t.ID,
		executeAt:   ms(t.ExecuteAt),
		callbackURL: t.CallbackURL,
		policy:      string(policy),
		timeoutMS:   t.CallbackTimeout.Milliseconds(),
		createdAt:   ms(t.CreatedAt), updatedAt: ms(t.UpdatedAt),
		attempts: t.Attempts, lastError: t.LastError,
	}
	// No payload, JSON null included, is the empty string: every column
	// gets a value, because a null written is a tombstone that every window
	// read would scan over.
	if p := strings.TrimSpace(string(t.Payload)); p != "null" {
		v.payload = p
	}
	return v, nil
}

// insertArgs are the arguments of timerInsert (the order of timerColumns).
func (v values) insertArgs(gen gocql.UUID) []any {
	return []any{v.ns, v.shard, v.at.rowType, v.at.dueMS, v.at.uuid, v.id, gen,
		v.executeAt, v.callbackURL, v.payload, v.policy, v.timeoutMS, v.createdAt, v.updatedAt, v.attempts, v.lastError}
}

// updateArgs are the arguments of timerUpdate: the new gen, the columns, the
// row's key and the gen the row must still have.
func (v values) updateArgs(gen, ifGen gocql.UUID) []any {
	return []any{gen, v.executeAt, v.callbackURL, v.payload, v.policy, v.timeoutMS, v.createdAt, v.updatedAt, v.attempts, v.lastError,
		v.ns, v.shard, v.at.rowType, v.at.dueMS, v.at.uuid, v.id, ifGen}
}

// scanTimer reads the next row of timerColumns; ok is false at the end.
func scanTimer(iter *gocql.Iter) (t *timer.Timer, gen gocql.UUID, ok bool, err error) {
	var (
		tm                              timer.Timer
		rowType                         int8
		dueAt, executeAt                int64
		createdAt, updatedAt, timeoutMS int64
		id                              []byte
		payload, policy, lastError      string
	)
	if !iter.Scan(&tm.Namespace, &tm.Shard, &rowType, &dueAt, &id, &tm.ID, &gen,
		&executeAt, &tm.CallbackURL, &payload, &policy, &timeoutMS, &createdAt, &updatedAt, &tm.Attempts, &lastError) {
		return nil, gen, false, nil
	}
	u, err := uuid.FromBytes(id)
	if err != nil {
		return nil, gen, false, fmt.Errorf("timer %q: uuid: %w", tm.ID, err)
	}
	tm.UUID = u
	tm.DueAt, tm.ExecuteAt = fromMS(dueAt), fromMS(executeAt)
	tm.CreatedAt, tm.UpdatedAt = fromMS(createdAt), fromMS(updatedAt)
	tm.Status = timer.StatusPending
	if rowType == store.RowTypeTimerFailed {
		tm.Status = timer.StatusFailed
	}
	if payload != "" {
		tm.Payload = json.RawMessage(payload)
	}
	if err := json.Unmarshal([]byte(policy), &tm.RetryPolicy); err != nil {
		return nil, gen, false, fmt.Errorf("decode retry policy of timer %q: %w", tm.ID, err)
	}
	tm.CallbackTimeout = time.Duration(timeoutMS) * time.Millisecond
	tm.LastError = lastError
	return &tm, gen, true, nil
}
