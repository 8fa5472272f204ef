// Package mongodb is the MongoDB store driver (go.mongodb.org/mongo-driver/v2).
// It runs on MongoDB 4.2 or later, standalone, replica set or sharded, and on
// FerretDB v1, which the tests use. It uses no multi-document transactions.
//
// # Schema
//
// One collection holds every document of a deployment (see schema.go): per
// shard partition (namespace, shard_id) one shard document per claimed
// version, one document per timer, and the decisions of fenced writes in
// flight. A timer's _id encodes (namespace, shard_id, timer_id), so the
// unique key of the store contract is the primary index: upserts and lookups
// by id are _id lookups, and two racing first inserts of one id collide on
// it. An index on (namespace, shard_id, row_type, execute_at, timer_uuid)
// serves the engine's window read and range delete as one index range each:
// row_type 2 (pending) keeps every other document out of that range.
//
// # Atomicity it relies on
//
// Only two operations are taken to be atomic: an insert that a unique _id
// refuses, and a delete by _id. FerretDB v1 runs every update, findAndModify
// included, as a read followed by an unconditional write by _id, so two
// conditional updates of one document can both match (two claims of one
// version both won, in this package's tests, before claims became inserts).
// Hence claims and the decision of every fenced write are inserts.
//
// # Claims
//
// A claim of version v inserts the shard document of v, whose _id holds v:
// of racing claims exactly one gets in, and none does once v exists.
// Versions are never removed, so PrevVersion is current exactly when its
// document exists and PrevVersion+1's does not. The shard is the highest
// version's document; a release clears its owner.
//
// # Fenced writes
//
// A fenced write (token T, fence v) goes in four steps:
//
//  1. Prepare: it records itself as an intent in each document it touches
//     (a field holding T, v and the new state or a delete mark); a new timer
//     gets a placeholder document (row_type 0) holding only the intent. A
//     document holds at most one intent. Readers never look at intents.
//  2. Check and commit: it reads the shard's version; if it is not v, the
//     write removes its intents and returns store.ErrShardOwnershipLost.
//     Otherwise it inserts the decision document of T with commit=true.
//  3. Apply: the intents replace (or delete) their documents, matching T,
//     so applying twice is harmless.
//  4. Forget: the decision document is deleted.
//
// A claim of version V, after inserting its shard document, looks for every
// intent of a version below V and resolves its write: it inserts the decision
// of its token with commit=false; if a commit was there first it applies the
// intents, otherwise it removes them. Exactly one of the writer's commit and
// the claim's abort gets in. That makes a stale owner harmless:
//
//   - a write that returned success read version v before the claim
//     inserted V (versions only grow), so its intents were in place before
//     the claim looked for them: the claim either aborted it first (then the
//     writer's commit fails and it returns ErrShardOwnershipLost) or found
//     its commit and applied it before returning. The new owner's window
//     read, after the claim, sees every acknowledged write;
//   - a write whose check comes after the claim's insert sees V and fails;
//     one whose abort won fails. Their intents were never visible, so the
//     new owner can load nothing that later disappears, and a range delete
//     (all its intents decided by one token) is all or nothing.
//
// A writer that finds another write's intent on a document waits for it
// while that write may still commit, or resolves it like a claim once it
// cannot: its version is older than the shard's, or its writer, in this
// process, has returned (the Store keeps its writes in flight). An intent
// left behind by an error is resolved by the next writer of the document or
// by the next claim, and never blocks the shard. An abort decision stays
// until its writer, failing to commit on it, deletes it: removing it earlier
// would let a slow writer still commit.
//
// Why not less: a fenced write that is a single update, checked against the
// shard document before or after, cannot be fenced. Checked before, a claim
// can come between check and write, and the stale write lands after the new
// owner read its window. Checked after, the write is visible before it is
// decided, the new owner may load it, and undoing it needs the state it
// overwrote. Stamping timer documents with the version they were written
// under stops a stale write from overwriting a newer owner's document, but
// not a stale insert, and not the visibility of an undecided write. A
// pending state decided atomically against the claim is the least that
// works; the decision document is that, on one _id.
//
// Multi-document transactions would make each write one round trip on a
// replica set, but FerretDB has none and a transaction would still have to
// conflict with claims on a document both write; this driver does not use
// them, even where the server supports them, so that one protocol is tested.
//
// The cost is five round trips per fenced write (six for a new timer):
// prepare, version read, decision insert, apply, decision delete.
//
// On FerretDB v1 the steps that are conditional updates (setting an intent
// only where there is none, applying or removing an intent only where it is
// the write's) are not atomic either: the server matches on one read and
// writes by _id. Two concurrent writes of one timer by one owner may then
// both hold it, and both apply, in some order. And a writer's apply whose
// match was read before a claim applied the same write could, in the instant
// between its read and its write, overwrite a new owner's first write of
// that timer. On MongoDB both are single atomic updates.
//
// Reads and writes go to the primary with write concern "majority" and read
// concern "majority" by default, so that a decision and a claim survive a
// failover and the version read sees every acknowledged claim.
package mongodb

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"

	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/timer"
)

// Config configures the driver.
type Config struct {
	// URI is a mongodb:// or mongodb+srv:// connection string; credentials,
	// TLS and replica set options go here.
	URI string
	// Database holds the collection; default "dtimer".
	Database string
	// Collection holds every shard and timer document; default "timers".
	Collection string
	// MaxPoolSize caps the connections per server; 0 keeps the driver's
	// default (100).
	MaxPoolSize uint64
	// WriteConcern is "majority" (the default) or the number of members that
	// must acknowledge a write. A write concern set in URI wins.
	WriteConcern string
	// ReadConcern is "majority" (the default), "local" or "linearizable". A
	// readConcernLevel set in URI wins.
	ReadConcern string
}

// Defaults of Config.
const (
	DefaultDatabase     = "dtimer"
	DefaultCollection   = "timers"
	DefaultWriteConcern = "majority"
	DefaultReadConcern  = "majority"
)

// Store implements store.Store on MongoDB.
type Store struct {
	client *mongo.Client
	coll   *mongo.Collection
	// id names this Store in the intents it writes, so that it can tell its
	// own abandoned intents (not in inflight) from running ones.
	id string
	// inflight holds the tokens of this Store's fenced writes that have not
	// returned yet.
	inflight sync.Map
}

var _ store.Store = (*Store)(nil)

// precision is BSON's date: milliseconds.
const precision = time.Millisecond

// New connects to the server and checks that it answers. It does not migrate.
func New(ctx context.Context, cfg Config) (*Store, error) {
	opts, err := clientOptions(&cfg)
	if err != nil {
		return nil, err
	}
	client, err := mongo.Connect(opts)
	if err != nil {
		return nil, fmt.Errorf("mongodb: connect: %w", err)
	}
	s := &Store{
		client: client,
		coll:   client.Database(cfg.Database).Collection(cfg.Collection),
		id:     uuid.NewString(),
	}
	if err := s.Ping(ctx); err != nil {
		_ = client.Disconnect(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("mongodb: connect: %w", err)
	}
	return s, nil
}

// clientOptions validates cfg, fills in its defaults and builds the client
// options. Its errors never contain the URI, which may hold a password.
func clientOptions(cfg *Config) (*options.ClientOptions, error) {
	if cfg.URI == "" {
		return nil, errors.New("mongodb: uri is empty")
	}
	if !strings.HasPrefix(cfg.URI, "mongodb://") && !strings.HasPrefix(cfg.URI, "mongodb+srv://") {
		return nil, errors.New("mongodb: uri must start with mongodb:// or mongodb+srv://")
	}
	if cfg.Database == "" {
		cfg.Database = DefaultDatabase
	}
	if cfg.Collection == "" {
		cfg.Collection = DefaultCollection
	}
	if cfg.WriteConcern == "" {
		cfg.WriteConcern = DefaultWriteConcern
	}
	if cfg.ReadConcern == "" {
		cfg.ReadConcern = DefaultReadConcern
	}
	if strings.ContainsAny(cfg.Database, "/\\. \"$\x00") || len(cfg.Database) > 63 {
		return nil, fmt.Errorf("mongodb: database %q: at most 63 characters, none of /\\. \"$", cfg.Database)
	}
	if strings.ContainsAny(cfg.Collection, "$\x00") || strings.HasPrefix(cfg.Collection, "system.") || len(cfg.Collection) > 200 {
		return nil, fmt.Errorf("mongodb: collection %q: at most 200 characters, no $, not system.*", cfg.Collection)
	}
	var wc *writeconcern.WriteConcern
	if cfg.WriteConcern == "majority" {
		wc = writeconcern.Majority()
	} else if n, err := strconv.Atoi(cfg.WriteConcern); err == nil && n >= 1 {
		wc = &writeconcern.WriteConcern{W: n}
	} else {
		return nil, fmt.Errorf("mongodb: write concern must be \"majority\" or a number of at least 1, got %q", cfg.WriteConcern)
	}
	var rc *readconcern.ReadConcern
	switch cfg.ReadConcern {
	case "majority":
		rc = readconcern.Majority()
	case "local":
		rc = readconcern.Local()
	case "linearizable":
		rc = readconcern.Linearizable()
	default:
		return nil, fmt.Errorf("mongodb: read concern must be majority, local or linearizable, got %q", cfg.ReadConcern)
	}

	opts := options.Client().SetWriteConcern(wc).SetReadConcern(rc).ApplyURI(cfg.URI)
	if err := opts.Validate(); err != nil {
		// The error may quote the URI; do not echo it.
		return nil, errors.New("mongodb: invalid uri or options in it")
	}
	if opts.ReadPreference != nil && opts.ReadPreference.Mode() != readpref.PrimaryMode {
		return nil, errors.New("mongodb: uri: readPreference must be primary: fencing reads the shard document where it was written")
	}
	if !opts.WriteConcern.Acknowledged() {
		return nil, errors.New("mongodb: uri: unacknowledged writes (w=0) cannot be fenced")
	}
	if cfg.MaxPoolSize > 0 {
		opts.SetMaxPoolSize(cfg.MaxPoolSize)
	}
	return opts, nil
}

// Precision implements store.Store.
func (s *Store) Precision() time.Duration { return precision }

// Ping implements store.Store.
func (s *Store) Ping(ctx context.Context) error {
	return translate("ping", s.client.Ping(ctx, readpref.Primary()))
}

// Close implements store.Store.
func (s *Store) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return translate("close", s.client.Disconnect(ctx))
}

// Migrate implements store.Store. It creates the indexes unless they exist;
// createIndexes is idempotent for identical specifications, so nodes starting
// together may all run it. FerretDB v1 can fail (even panic on the
// connection) when createIndexes runs concurrently on a new collection, so a
// failed attempt is retried after checking what exists.
func (s *Store) Migrate(ctx context.Context) error {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		var have bool
		if have, err = s.haveIndexes(ctx); err == nil && have {
			return nil
		}
		if _, err = s.coll.Indexes().CreateMany(ctx, indexes()); err == nil {
			return nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	return translate("migrate", err)
}

// haveIndexes reports whether every index of indexes() exists by name.
func (s *Store) haveIndexes(ctx context.Context) (bool, error) {
	specs, err := s.coll.Indexes().ListSpecifications(ctx)
	if err != nil {
		// A collection that does not exist yet has no indexes.
		return false, nil
	}
	names := map[string]bool{}
	for _, sp := range specs {
		names[sp.Name] = true
	}
	return names[windowIndex] && names[intentIndex], nil
}

// ShardGet implements store.Store: the shard document of the highest version.
func (s *Store) ShardGet(ctx context.Context, key store.ShardKey) (*store.Shard, error) {
	var d shardDoc
	err := s.coll.FindOne(ctx,
		with(partition(key), bson.E{Key: "row_type", Value: store.RowTypeShard}),
		options.FindOne().SetSort(bson.D{{Key: "shard_version", Value: -1}}),
	).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, fmt.Errorf("mongodb: shard get: %w", store.ErrShardNotFound)
	}
	if err != nil {
		return nil, translate("shard get", err)
	}
	return d.shard(key), nil
}

// ShardClaim implements store.Store. A claim inserts the shard document of
// version PrevVersion+1, whose _id is unique: of racing claims exactly one
// gets in, and none does once a later version exists, since documents of
// versions are never removed. Then it decides every write of an older
// version still in flight (see the package doc); if that fails the claim has
// happened but its error says so, and the caller's retry, a new claim,
// decides them again.
func (s *Store) ShardClaim(ctx context.Context, p store.ShardClaimParams) (*store.Shard, error) {
	if p.PrevVersion < 0 {
		return nil, fmt.Errorf("mongodb: shard claim: %w: negative previous version %d", store.ErrShardVersionConflict, p.PrevVersion)
	}
	if p.PrevVersion > 0 {
		err := s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: shardDocID(p.Shard, p.PrevVersion)}}).Err()
		if errors.Is(err, mongo.ErrNoDocuments) {
			return nil, fmt.Errorf("mongodb: shard claim: %w: version %d was never claimed", store.ErrShardVersionConflict, p.PrevVersion)
		}
		if err != nil {
			return nil, translate("shard claim", err)
		}
	}
	v := p.PrevVersion + 1
	d := shardDoc{
		ID: shardDocID(p.Shard, v), Namespace: p.Shard.Namespace, ShardID: int64(p.Shard.Shard),
		RowType: store.RowTypeShard, TimerID: shardTimerID,
		Version: v, Owner: p.Owner, ClaimedAt: bson.NewDateTimeFromTime(p.Now),
	}
	if _, err := s.coll.InsertOne(ctx, d); err != nil {
		if mongo.IsDuplicateKeyError(err) {
			return nil, fmt.Errorf("mongodb: shard claim: %w", store.ErrShardVersionConflict)
		}
		return nil, translate("shard claim", err)
	}
	if err := s.settleOlder(ctx, p.Shard, v); err != nil {
		return nil, fmt.Errorf("mongodb: shard claim: claimed version %d but could not decide the writes of older versions: %w", v, err)
	}
	return d.shard(p.Shard), nil
}

// ShardRelease implements store.Store. Only releases change a shard
// document, so a plain update suffices; the version read after it decides
// whether the release happened while the fence was current.
func (s *Store) ShardRelease(ctx context.Context, f store.Fence) error {
	res, err := s.coll.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: shardDocID(f.Shard, f.Version)}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "shard_owner", Value: ""}}}})
	if err != nil {
		return translate("shard release", err)
	}
	if res.MatchedCount == 0 {
		return fmt.Errorf("mongodb: shard release: %w", store.ErrShardOwnershipLost)
	}
	sh, err := s.ShardGet(ctx, f.Shard)
	if err != nil {
		return err
	}
	if sh.Version != f.Version {
		return fmt.Errorf("mongodb: shard release: %w", store.ErrShardOwnershipLost)
	}
	return nil
}

// TimerGet implements store.Store. It reads the committed fields only.
func (s *Store) TimerGet(ctx context.Context, key store.ShardKey, id string) (*timer.Timer, error) {
	var d timerDoc
	err := s.coll.FindOne(ctx,
		bson.D{{Key: "_id", Value: timerDocID(key, id)}, {Key: "row_type", Value: bson.D{{Key: "$in", Value: bson.A{store.RowTypeTimerPending, store.RowTypeTimerFailed}}}}},
		options.FindOne().SetProjection(bson.D{{Key: "intent", Value: 0}}),
	).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, fmt.Errorf("mongodb: timer get: %w", store.ErrTimerNotFound)
	}
	if err != nil {
		return nil, translate("timer get", err)
	}
	return d.timer(key), nil
}

// TimerGetWindow implements store.Store: one range of the window index.
func (s *Store) TimerGetWindow(ctx context.Context, p store.TimerGetWindowParams) ([]*timer.Timer, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	cur, err := s.coll.Find(ctx, windowFilter(p.Shard, p.After, p.DueUntil),
		options.Find().
			SetSort(bson.D{{Key: "execute_at", Value: 1}, {Key: "timer_uuid", Value: 1}}).
			SetLimit(int64(p.Limit)).
			SetProjection(bson.D{{Key: "intent", Value: 0}}))
	if err != nil {
		return nil, translate("timer get window", err)
	}
	var docs []timerDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, translate("timer get window", err)
	}
	out := make([]*timer.Timer, len(docs))
	for i := range docs {
		out[i] = docs[i].timer(p.Shard)
	}
	return out, nil
}

// translate is the one place native errors become store errors. The store's
// sentinels are decided by the operations themselves (a matched count, a
// missing document); what reaches translate is an error that may or may not
// have been applied, which keeps its cause.
func translate(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("mongodb: %s: %w", op, err)
}
