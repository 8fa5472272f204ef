package mongodb

import (
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/timer"
)

// The collection's documents, all of one shard partition (namespace,
// shard_id); P is the partition's _id prefix "<len(ns)>:<ns>/<shard>":
//
//	shard:    {_id: "P#<version, 20 digits>", namespace, shard_id, row_type: 1,
//	           timer_id: 0, shard_version, shard_owner, shard_claimed_at}
//	timer:    {_id: "P/<id>", namespace, shard_id, timer_id,
//	           row_type: 2 (pending) or 3 (failed),
//	           execute_at (the due time, timer.DueAt), timer_uuid (binary
//	           subtype 4), timer_execute_at, callback_url, payload,
//	           retry_policy {...}, callback_timeout_ms, created_at,
//	           updated_at, attempts, last_error, [intent]}
//	placeholder of a timer being created:
//	          {_id: "P/<id>", namespace, shard_id, timer_id, row_type: 0, intent}
//	decision: {_id: "P!<token>", namespace, shard_id, row_type: 4, commit}
//
// A timer's _id is the contract's unique key (namespace, shard_id,
// timer_id), encoded so that it is injective: the namespace is
// length-prefixed and the character after the shard number tells the kinds
// apart. Being _id, it needs no second unique index, the primary index finds
// a timer by id, FerretDB pushes _id equality down to its backend, and on a
// sharded cluster (shard key {namespace, shard_id}) it is unique across the
// cluster because it determines the shard key. A shard document's timer_id
// is the number 0, a type no user id (a string) has, in case anyone adds a
// unique index on (namespace, shard_id, timer_id).
//
// Payloads are strings: the store never looks into them, and a string keeps
// the caller's JSON exactly, where a BSON document would lose big numbers,
// duplicate keys and key order. Times are BSON dates (milliseconds, UTC),
// durations whole milliseconds. UUIDs compare as 16 bytes, the order of
// timer.Position, because all are binary subtype 4 of one length.
//
// intent is the undecided part of a document (see the package doc):
// readers project it away.

// shardTimerID is a shard document's timer_id.
const shardTimerID = int32(0)

// rowTypePlaceholder marks a document that exists only to hold the intent of
// a create: the timer does not exist yet.
const rowTypePlaceholder = 0

// rowTypeDecision marks a decision document.
const rowTypeDecision = 4

// Index names: fixed, so that Migrate recognises its own indexes.
const (
	windowIndex = "window"
	intentIndex = "intent"
)

// indexes are the collection's indexes besides _id.
func indexes() []mongo.IndexModel {
	return []mongo.IndexModel{
		// The window read and the range delete: equality on the first three
		// fields, a range on the position.
		{
			Keys: bson.D{
				{Key: "namespace", Value: 1}, {Key: "shard_id", Value: 1}, {Key: "row_type", Value: 1},
				{Key: "execute_at", Value: 1}, {Key: "timer_uuid", Value: 1},
			},
			Options: options.Index().SetName(windowIndex),
		},
		// A claim finds the intents of older versions: a range over numbers,
		// which the documents without an intent (null) are outside of.
		{
			Keys:    bson.D{{Key: "namespace", Value: 1}, {Key: "shard_id", Value: 1}, {Key: "intent.version", Value: 1}},
			Options: options.Index().SetName(intentIndex),
		},
	}
}

// partitionID prefixes every _id of a shard partition. The namespace is
// length-prefixed, and the character after the shard number says what the
// document is, so that _ids are injective.
func partitionID(k store.ShardKey) string {
	return strconv.Itoa(len(k.Namespace)) + ":" + k.Namespace + "/" + strconv.Itoa(k.Shard)
}

// shardDocID is the _id of version v's shard document; zero-padded so that
// _ids sort as versions do.
func shardDocID(k store.ShardKey, v int64) string {
	return fmt.Sprintf("%s#%020d", partitionID(k), v)
}

func timerDocID(k store.ShardKey, id string) string {
	return partitionID(k) + "/" + id
}

func decisionDocID(k store.ShardKey, token string) string {
	return partitionID(k) + "!" + token
}

// shardDoc is a shard version document: one per claim, never changed but
// for its owner (cleared by a release).
type shardDoc struct {
	ID        string        `bson:"_id"`
	Namespace string        `bson:"namespace"`
	ShardID   int64         `bson:"shard_id"`
	RowType   int32         `bson:"row_type"`
	TimerID   int32         `bson:"timer_id"`
	Version   int64         `bson:"shard_version"`
	Owner     string        `bson:"shard_owner"`
	ClaimedAt bson.DateTime `bson:"shard_claimed_at"`
}

func (d *shardDoc) shard(key store.ShardKey) *store.Shard {
	return &store.Shard{Key: key, Version: d.Version, Owner: d.Owner, ClaimedAt: d.ClaimedAt.Time().UTC()}
}

// decisionDoc is the outcome of one fenced write: inserted with Commit true
// by the writer, or with Commit false by whoever aborts the write; the
// unique _id lets exactly one of them in.
type decisionDoc struct {
	ID        string `bson:"_id"`
	Namespace string `bson:"namespace"`
	ShardID   int64  `bson:"shard_id"`
	RowType   int32  `bson:"row_type"`
	Commit    bool   `bson:"commit"`
}

// timerState is a timer's stored fields besides its key: the committed state
// of a timer document, or the new state an intent carries.
type timerState struct {
	RowType           int32         `bson:"row_type"`
	DueAt             bson.DateTime `bson:"execute_at"`
	UUID              bson.Binary   `bson:"timer_uuid"`
	ExecuteAt         bson.DateTime `bson:"timer_execute_at"`
	CallbackURL       string        `bson:"callback_url"`
	Payload           *string       `bson:"payload,omitempty"`
	RetryPolicy       retryDoc      `bson:"retry_policy"`
	CallbackTimeoutMS int64         `bson:"callback_timeout_ms"`
	CreatedAt         bson.DateTime `bson:"created_at"`
	UpdatedAt         bson.DateTime `bson:"updated_at"`
	Attempts          int64         `bson:"attempts"`
	LastError         string        `bson:"last_error"`
}

type retryDoc struct {
	MaxAttempts           int64   `bson:"max_attempts"`
	MaxAttemptsDurationMS int64   `bson:"max_attempts_duration_ms"`
	InitialIntervalMS     int64   `bson:"initial_interval_ms"`
	BackoffMultiplier     float64 `bson:"backoff_multiplier"`
	MaxIntervalMS         int64   `bson:"max_interval_ms"`
}

// timerDoc is a timer document as stored and read.
type timerDoc struct {
	ID        string     `bson:"_id"`
	Namespace string     `bson:"namespace"`
	ShardID   int64      `bson:"shard_id"`
	TimerID   string     `bson:"timer_id"`
	State     timerState `bson:",inline"`
	Intent    *intentDoc `bson:"intent,omitempty"`
}

// intentDoc is an uncommitted write of one document.
type intentDoc struct {
	Token   string `bson:"token"`
	Version int64  `bson:"version"`
	// Store is the id of the Store that wrote it.
	Store string `bson:"store"`
	// Delete marks a delete; otherwise Next is the new state.
	Delete bool        `bson:"delete,omitempty"`
	Next   *timerState `bson:"next,omitempty"`
}

func stateOf(t *timer.Timer) timerState {
	st := timerState{
		RowType:   int32(store.RowTypeOf(t.Status)),
		DueAt:     bson.NewDateTimeFromTime(t.DueAt),
		UUID:      bson.Binary{Subtype: bson.TypeBinaryUUID, Data: append([]byte(nil), t.UUID[:]...)},
		ExecuteAt: bson.NewDateTimeFromTime(t.ExecuteAt),
		// Strings copy the caller's bytes: a caller reusing its buffers
		// cannot change an intent.
		CallbackURL: t.CallbackURL,
		RetryPolicy: retryDoc{
			MaxAttempts:           int64(t.RetryPolicy.MaxAttempts),
			MaxAttemptsDurationMS: t.RetryPolicy.MaxAttemptsDuration.Milliseconds(),
			InitialIntervalMS:     t.RetryPolicy.InitialInterval.Milliseconds(),
			BackoffMultiplier:     t.RetryPolicy.BackoffMultiplier,
			MaxIntervalMS:         t.RetryPolicy.MaxInterval.Milliseconds(),
		},
		CallbackTimeoutMS: t.CallbackTimeout.Milliseconds(),
		CreatedAt:         bson.NewDateTimeFromTime(t.CreatedAt),
		UpdatedAt:         bson.NewDateTimeFromTime(t.UpdatedAt),
		Attempts:          int64(t.Attempts),
		LastError:         t.LastError,
	}
	if len(t.Payload) > 0 {
		p := string(t.Payload)
		st.Payload = &p
	}
	return st
}

// committedDoc is the document a committed intent with state st leaves.
func committedDoc(key store.ShardKey, id string, st timerState) timerDoc {
	return timerDoc{ID: timerDocID(key, id), Namespace: key.Namespace, ShardID: int64(key.Shard), TimerID: id, State: st}
}

func (d *timerDoc) timer(key store.ShardKey) *timer.Timer {
	st := &d.State
	t := &timer.Timer{
		Namespace:   key.Namespace,
		ID:          d.TimerID,
		Shard:       key.Shard,
		ExecuteAt:   st.ExecuteAt.Time().UTC(),
		DueAt:       st.DueAt.Time().UTC(),
		CallbackURL: st.CallbackURL,
		RetryPolicy: timer.RetryPolicy{
			MaxAttempts:         int(st.RetryPolicy.MaxAttempts),
			MaxAttemptsDuration: ms(st.RetryPolicy.MaxAttemptsDurationMS),
			InitialInterval:     ms(st.RetryPolicy.InitialIntervalMS),
			BackoffMultiplier:   st.RetryPolicy.BackoffMultiplier,
			MaxInterval:         ms(st.RetryPolicy.MaxIntervalMS),
		},
		CallbackTimeout: ms(st.CallbackTimeoutMS),
		CreatedAt:       st.CreatedAt.Time().UTC(),
		UpdatedAt:       st.UpdatedAt.Time().UTC(),
		Attempts:        int(st.Attempts),
		LastError:       st.LastError,
		Status:          timer.StatusPending,
	}
	if st.RowType == store.RowTypeTimerFailed {
		t.Status = timer.StatusFailed
	}
	if u, err := uuid.FromBytes(st.UUID.Data); err == nil {
		t.UUID = u
	}
	if st.Payload != nil {
		t.Payload = []byte(*st.Payload)
	}
	return t
}

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

func uuidValue(u uuid.UUID) bson.Binary {
	return bson.Binary{Subtype: bson.TypeBinaryUUID, Data: append([]byte(nil), u[:]...)}
}

// partition selects the documents of a shard partition.
func partition(k store.ShardKey) bson.D {
	return bson.D{{Key: "namespace", Value: k.Namespace}, {Key: "shard_id", Value: int64(k.Shard)}}
}

// windowFilter selects the pending timers of k after position `after` and
// due at or before until. Its index bounds are execute_at in [after.DueAt,
// until]; the $nor removes the timers at after.DueAt up to after's UUID, a
// filter on the first instant of the range only.
func windowFilter(k store.ShardKey, after timer.Position, until time.Time) bson.D {
	at := bson.NewDateTimeFromTime(after.DueAt)
	return append(partition(k),
		bson.E{Key: "row_type", Value: store.RowTypeTimerPending},
		bson.E{Key: "execute_at", Value: bson.D{{Key: "$gte", Value: at}, {Key: "$lte", Value: bson.NewDateTimeFromTime(until)}}},
		bson.E{Key: "$nor", Value: bson.A{bson.D{
			{Key: "execute_at", Value: at},
			{Key: "timer_uuid", Value: bson.D{{Key: "$lte", Value: uuidValue(after.UUID)}}},
		}}},
	)
}

// rangeFilter selects the pending timers of k at or before upTo: index bounds
// execute_at <= upTo.DueAt, and a filter on the last instant.
func rangeFilter(k store.ShardKey, upTo timer.Position) bson.D {
	at := bson.NewDateTimeFromTime(upTo.DueAt)
	return append(partition(k),
		bson.E{Key: "row_type", Value: store.RowTypeTimerPending},
		bson.E{Key: "execute_at", Value: bson.D{{Key: "$lte", Value: at}}},
		bson.E{Key: "$nor", Value: bson.A{bson.D{
			{Key: "execute_at", Value: at},
			{Key: "timer_uuid", Value: bson.D{{Key: "$gt", Value: uuidValue(upTo.UUID)}}},
		}}},
	)
}
