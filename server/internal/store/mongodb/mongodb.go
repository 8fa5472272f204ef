// Package mongodb is the MongoDB store driver (go.mongodb.org/mongo-driver/v2).
// It runs on MongoDB 4.2 or later, standalone, replica set or sharded, and on
// FerretDB v1, which the tests use. It needs no multi-document transactions.
//
// # Schema
//
// One collection holds every document of a deployment (see schema.go): per
// shard partition (namespace, shard_id) one shard document and one document
// per timer. The _id encodes (namespace, shard_id, timer_id) for a timer and
// (namespace, shard_id) for a shard, so the unique key of the store contract
// is the primary index: upserts and lookups by id are _id lookups, and two
// racing first inserts of one id collide on it. An index on (namespace,
// shard_id, row_type, execute_at, timer_uuid) serves the engine's window read
// and range delete as one index range each: row_type 2 (pending) keeps shard
// documents (1) and failed timers (3) out of that range.
//
// # Fencing without transactions
//
// MongoDB updates one document atomically, and a fenced write must be decided
// atomically with the shard document's version, so every fenced write is
// decided on the shard document itself, in four steps:
//
//  1. Prepare: the write is recorded as an intent in each document it touches
//     (an "intent" field holding a random token, the fence's version and the
//     new state or a delete mark); a new timer gets a placeholder document
//     (row_type 0) that holds only the intent. A document holds at most one
//     intent. Readers never look at intents: they read the committed fields,
//     and the window's index range never contains a placeholder.
//  2. Commit: one update of the shard document, matching only if it still has
//     the fence's version, pushes the token onto its "commits" list. This is
//     the write's single decision point. If it does not match, the intents are
//     removed and the write returns store.ErrShardOwnershipLost: nothing was
//     ever visible.
//  3. Apply: the committed intents replace (or delete) their documents,
//     matching the token, so applying twice is harmless.
//  4. The token is pulled from "commits".
//
// A claim is a compare-and-set of the shard document's version; the commits
// list it atomically sees holds exactly the writes that committed under an
// older version and may not be applied yet. Before ShardClaim returns, it
// applies their intents and removes every other intent of an older version.
// That is what makes a stale owner harmless:
//
//   - a write that returned success committed before the claim's
//     compare-and-set (both are updates of the shard document, so they are
//     ordered), and its intents were in place before it committed, so the
//     claim found and applied any that were not applied yet: the new owner's
//     window read, after the claim, sees every acknowledged write;
//   - a write whose commit comes after the claim does not match the version
//     and fails; its intents were never visible, whether the claim removed
//     them or the writer did, so the new owner can load nothing that later
//     disappears, and a range delete is all or nothing.
//
// A writer that finds another intent on a document it wants either waits for
// its writer (same fence, still running) or settles it: applies it if its
// token is in commits, removes it if its version is older than the shard's
// (it can never commit) or if its writer, in this process, has returned. So
// an intent left behind by an error is settled by the next writer of the
// document, or by the next claim, and never blocks the shard.
//
// The cost is four round trips per fenced write instead of one, and all
// fenced writes of a shard serialise briefly on its shard document. Where
// multi-document transactions exist they would not remove that: the
// transaction would still have to write the shard document to conflict with
// a claim. This driver does not use them.
//
// Reads and writes go to the primary with write concern "majority" and read
// concern "majority" by default, so that an acknowledged commit and the
// claim's compare-and-set survive a failover.
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

// Migrate implements store.Store. createIndexes is idempotent for identical
// specifications, so nodes starting together may all run it; the collection
// is created by the first of them.
func (s *Store) Migrate(ctx context.Context) error {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		if _, err = s.coll.Indexes().CreateMany(ctx, indexes()); err == nil {
			return nil
		}
		// Two nodes creating the collection at once: one may be told it
		// exists (code 48, NamespaceExists). The next attempt finds it.
		var ce mongo.CommandError
		if !errors.As(err, &ce) || ce.Code != 48 {
			break
		}
	}
	return translate("migrate", err)
}

// ShardGet implements store.Store.
func (s *Store) ShardGet(ctx context.Context, key store.ShardKey) (*store.Shard, error) {
	var d shardDoc
	err := s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: shardDocID(key)}}).Decode(&d)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, fmt.Errorf("mongodb: shard get: %w", store.ErrShardNotFound)
	}
	if err != nil {
		return nil, translate("shard get", err)
	}
	return d.shard(key), nil
}

// ShardClaim implements store.Store. After the compare-and-set it settles the
// intents of older fences (see the package doc); if that fails the claim has
// happened but its error says so, and the caller's retry, a new claim,
// settles them again.
func (s *Store) ShardClaim(ctx context.Context, p store.ShardClaimParams) (*store.Shard, error) {
	var d shardDoc
	switch {
	case p.PrevVersion == 0:
		d = shardDoc{
			ID: shardDocID(p.Shard), Namespace: p.Shard.Namespace, ShardID: int64(p.Shard.Shard),
			RowType: store.RowTypeShard, TimerID: shardTimerID,
			Version: 1, Owner: p.Owner, ClaimedAt: bson.NewDateTimeFromTime(p.Now), Commits: []string{},
		}
		if _, err := s.coll.InsertOne(ctx, d); err != nil {
			if mongo.IsDuplicateKeyError(err) {
				return nil, fmt.Errorf("mongodb: shard claim: %w", store.ErrShardVersionConflict)
			}
			return nil, translate("shard claim", err)
		}
	case p.PrevVersion > 0:
		err := s.coll.FindOneAndUpdate(ctx,
			bson.D{{Key: "_id", Value: shardDocID(p.Shard)}, {Key: "shard_version", Value: p.PrevVersion}},
			bson.D{{Key: "$set", Value: bson.D{
				{Key: "shard_version", Value: p.PrevVersion + 1},
				{Key: "shard_owner", Value: p.Owner},
				{Key: "shard_claimed_at", Value: bson.NewDateTimeFromTime(p.Now)},
			}}},
			options.FindOneAndUpdate().SetReturnDocument(options.After),
		).Decode(&d)
		if errors.Is(err, mongo.ErrNoDocuments) {
			return nil, fmt.Errorf("mongodb: shard claim: %w", store.ErrShardVersionConflict)
		}
		if err != nil {
			return nil, translate("shard claim", err)
		}
	default:
		return nil, fmt.Errorf("mongodb: shard claim: %w: negative previous version %d", store.ErrShardVersionConflict, p.PrevVersion)
	}
	if err := s.settleOlder(ctx, p.Shard, d.Version, d.Commits); err != nil {
		return nil, fmt.Errorf("mongodb: shard claim: claimed version %d but could not settle the writes of older versions: %w", d.Version, err)
	}
	return d.shard(p.Shard), nil
}

// ShardRelease implements store.Store. It touches only the shard document, so
// it needs no intent.
func (s *Store) ShardRelease(ctx context.Context, f store.Fence) error {
	res, err := s.coll.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: shardDocID(f.Shard)}, {Key: "shard_version", Value: f.Version}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "shard_owner", Value: ""}}}})
	if err != nil {
		return translate("shard release", err)
	}
	if res.MatchedCount == 0 {
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
