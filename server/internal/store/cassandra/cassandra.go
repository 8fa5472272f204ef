// Package cassandra is the Apache Cassandra store driver (gocql).
//
// Schema. One table per deployment, partitioned by shard: (namespace,
// shard_id). A partition holds the shard row, the shard's timer rows
// clustered in firing order, and one id row per timer that maps the timer's
// id to its current clustering key (see schema.go). The window read is one
// clustering slice and the range delete one range tombstone over that slice,
// so the hot path never reads over a tombstone per fired timer.
//
// Fencing. Every write is a conditional batch (a lightweight transaction,
// Paxos) on the shard's partition, whose first statement is
//
//	UPDATE ... SET shard_version = v WHERE <shard row> IF shard_version = v
//
// A batch applies all its statements or none, and its conditions are checked
// by the same Paxos round that commits it, so a write made under a stale fence
// writes nothing. Claims are conditional updates of the shard row on the same
// partition, so claims and fenced writes are linearised: once a claim has
// returned, every write under an older fence fails. Because all statements of
// a conditional batch must be in one partition, everything a write touches
// (shard row, id row, timer rows) lives in the shard's partition.
//
// Upserts. A write of a timer moves it in one conditional batch: the id row
// "IF gen = <the gen known>" (or IF NOT EXISTS), the old timer row deleted and
// the new one written. A concurrent change of the same timer fails the
// condition, and the write is retried on the id row as it then is. The range
// delete removes, in the same batch, the id rows of the timers it removes
// (each IF gen = the gen of the timer row it read); readers treat an id row
// whose timer row is missing as "not found", so an id row that escaped (a
// timer created into the range by another process between the read and the
// batch) costs space, not correctness, and is removed by the next write of
// that id.
//
// Writes of one Store to one shard are serialised by a mutex: Paxos resolves
// contention on a partition by retrying with back-off, which is much slower
// than queueing in the client. Different processes still only rely on Paxos.
//
// Consistency. Conditional batches use the serial consistency (LOCAL_SERIAL
// by default) for Paxos and the consistency (LOCAL_QUORUM by default) for
// their commit; reads use the consistency, and so see every write that has
// returned. When a conditional batch fails, the driver learns why (a stale
// fence or a concurrent change) from the rows the batch's Paxos round read,
// which Cassandra returns with the failure, or by reading at the serial
// consistency, which also sees a Paxos round in progress.
//
// Times are Cassandra timestamps: milliseconds.
package cassandra

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gocql/gocql"

	"github.com/dtimer/dtimer/server/internal/store"
)

// Defaults of Config's fields.
const (
	DefaultPort              = 9042
	DefaultKeyspace          = "dtimer"
	DefaultTable             = "timers"
	DefaultConsistency       = "LOCAL_QUORUM"
	DefaultSerialConsistency = "LOCAL_SERIAL"
	// DefaultReplication suits a single-node development cluster only.
	DefaultReplication = "{'class': 'SimpleStrategy', 'replication_factor': 1}"
	DefaultTimeout     = 10 * time.Second
	DefaultNumConns    = 2
)

// Config configures the driver. Zero fields take the defaults above.
type Config struct {
	// Hosts are contact points, "host" or "host:port"; the driver discovers
	// the rest of the cluster from them.
	Hosts []string
	// Port is the native protocol port of hosts given without one.
	Port int
	// Keyspace holds the table. Migrate creates it, with Replication, if it
	// does not exist.
	Keyspace string
	// Table is the table's name in Keyspace.
	Table string
	// Username and Password, when set, authenticate with
	// PasswordAuthenticator.
	Username string
	Password string
	// Consistency is the consistency of reads and of the commit of writes:
	// QUORUM, LOCAL_QUORUM, EACH_QUORUM or ALL. Anything weaker could miss a
	// fenced write that has returned.
	Consistency string
	// SerialConsistency is the consistency of the Paxos phase of every
	// write: SERIAL or LOCAL_SERIAL. LOCAL_SERIAL is correct as long as each
	// shard is only written from one datacenter at a time.
	SerialConsistency string
	// LocalDC, when set, routes requests to that datacenter's nodes first.
	LocalDC string
	// Replication is the replication map Migrate gives the keyspace when it
	// creates it, e.g. {'class': 'NetworkTopologyStrategy', 'dc1': 3}. An
	// existing keyspace is never altered.
	Replication string
	// Timeout bounds each request on the client side.
	Timeout time.Duration
	// ConnectTimeout bounds connecting to a host; default Timeout.
	ConnectTimeout time.Duration
	// NumConns is the number of connections per host.
	NumConns int
}

// identRE is what Keyspace and Table may be: Cassandra's unquoted identifiers,
// lower case (Cassandra folds unquoted names to lower case, so an upper-case
// name would name another table in a hand-written query).
var identRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,47}$`)

// withDefaults fills in zero fields.
func (c Config) withDefaults() Config {
	if c.Port == 0 {
		c.Port = DefaultPort
	}
	if c.Keyspace == "" {
		c.Keyspace = DefaultKeyspace
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.Consistency == "" {
		c.Consistency = DefaultConsistency
	}
	if c.SerialConsistency == "" {
		c.SerialConsistency = DefaultSerialConsistency
	}
	if c.Replication == "" {
		c.Replication = DefaultReplication
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = c.Timeout
	}
	if c.NumConns == 0 {
		c.NumConns = DefaultNumConns
	}
	return c
}

// Validate checks a Config after defaults; errors name the field and never
// contain the password.
func (c Config) validate() (gocql.Consistency, gocql.SerialConsistency, error) {
	bad := func(format string, args ...any) (gocql.Consistency, gocql.SerialConsistency, error) {
		return 0, 0, fmt.Errorf("cassandra: "+format, args...)
	}
	if len(c.Hosts) == 0 {
		return bad("hosts is empty")
	}
	for _, h := range c.Hosts {
		if strings.TrimSpace(h) == "" || strings.ContainsAny(h, " \t,") {
			return bad("hosts: %q is not a host or host:port", h)
		}
	}
	if c.Port < 1 || c.Port > 65535 {
		return bad("port must be between 1 and 65535, got %d", c.Port)
	}
	if !identRE.MatchString(c.Keyspace) {
		return bad("keyspace %q must be 1-48 lower-case letters, digits or '_', starting with a letter", c.Keyspace)
	}
	if !identRE.MatchString(c.Table) {
		return bad("table %q must be 1-48 lower-case letters, digits or '_', starting with a letter", c.Table)
	}
	if c.Password != "" && c.Username == "" {
		return bad("password is set but username is not")
	}
	var cons gocql.Consistency
	switch strings.ToUpper(c.Consistency) {
	case "QUORUM":
		cons = gocql.Quorum
	case "LOCAL_QUORUM":
		cons = gocql.LocalQuorum
	case "EACH_QUORUM":
		cons = gocql.EachQuorum
	case "ALL":
		cons = gocql.All
	default:
		return bad("consistency must be QUORUM, LOCAL_QUORUM, EACH_QUORUM or ALL, got %q", c.Consistency)
	}
	var serial gocql.SerialConsistency
	switch strings.ToUpper(c.SerialConsistency) {
	case "SERIAL":
		serial = gocql.Serial
	case "LOCAL_SERIAL":
		serial = gocql.LocalSerial
	default:
		return bad("serial consistency must be SERIAL or LOCAL_SERIAL, got %q", c.SerialConsistency)
	}
	if r := strings.TrimSpace(c.Replication); !strings.HasPrefix(r, "{") || !strings.HasSuffix(r, "}") || strings.Contains(r, ";") {
		return bad("replication must be a CQL map such as %s, got %q", DefaultReplication, c.Replication)
	}
	if c.Timeout < 0 || c.ConnectTimeout < 0 {
		return bad("timeouts must not be negative")
	}
	if c.NumConns < 1 {
		return bad("num conns must be at least 1, got %d", c.NumConns)
	}
	return cons, serial, nil
}

// lockStripes is the number of shard write locks of a Store; shards share
// them by hash.
const lockStripes = 256

// Store implements store.Store on Cassandra.
type Store struct {
	session     *gocql.Session
	keyspace    string
	table       string
	replication string
	cons        gocql.Consistency
	serial      gocql.SerialConsistency
	q           queries

	migrateMu sync.Mutex
	locks     [lockStripes]sync.Mutex
}

var _ store.Store = (*Store)(nil)

// precision is Cassandra's timestamp type's: milliseconds.
const precision = time.Millisecond

// New connects to the cluster and checks that it answers. It does not
// migrate, and needs neither the keyspace nor the table to exist.
func New(ctx context.Context, cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	cons, serial, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	cluster := gocql.NewCluster(cfg.Hosts...)
	cluster.Port = cfg.Port
	// Cassandra 4 and 5 speak v4 (v5 needs a newer gocql); naming it saves
	// the negotiation round at every connection.
	cluster.ProtoVersion = 4
	cluster.Consistency = cons
	cluster.SerialConsistency = serial
	cluster.Timeout = cfg.Timeout
	cluster.ConnectTimeout = cfg.ConnectTimeout
	cluster.NumConns = cfg.NumConns
	if cfg.Username != "" {
		cluster.Authenticator = gocql.PasswordAuthenticator{Username: cfg.Username, Password: cfg.Password}
	}
	if cfg.LocalDC != "" {
		cluster.PoolConfig.HostSelectionPolicy = gocql.TokenAwareHostPolicy(gocql.DCAwareRoundRobinPolicy(cfg.LocalDC))
	} else {
		cluster.PoolConfig.HostSelectionPolicy = gocql.TokenAwareHostPolicy(gocql.RoundRobinHostPolicy())
	}
	// gocql logs reconnection attempts on its own; the driver reports what
	// matters through its errors.
	cluster.Logger = log.New(io.Discard, "", 0)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("cassandra: connect: %w", err)
	}
	session, err := cluster.CreateSession()
	if err != nil {
		return nil, fmt.Errorf("cassandra: connect: %w", err)
	}
	table := strconv.Quote(cfg.Keyspace) + "." + strconv.Quote(cfg.Table)
	s := &Store{
		session:     session,
		keyspace:    cfg.Keyspace,
		table:       cfg.Table,
		replication: cfg.Replication,
		cons:        cons,
		serial:      serial,
		q:           newQueries(table),
	}
	if err := s.Ping(ctx); err != nil {
		session.Close()
		return nil, err
	}
	return s, nil
}

// Precision implements store.Store.
func (s *Store) Precision() time.Duration { return precision }

// Migrate implements store.Store. It creates the keyspace (with the
// configured replication) and the table if they are missing, after checking
// the schema tables first, so that a role without CREATE permission can run
// it against an existing schema. Migrations of one Store are serialised; see
// docs/drivers/cassandra.md for several nodes creating the table at once.
func (s *Store) Migrate(ctx context.Context) error {
	s.migrateMu.Lock()
	defer s.migrateMu.Unlock()

	exists := func(q string, args ...any) (bool, error) {
		var name string
		err := s.session.Query(q, args...).Consistency(gocql.One).WithContext(ctx).Scan(&name)
		if errors.Is(err, gocql.ErrNotFound) {
			return false, nil
		}
		return err == nil, err
	}
	ok, err := exists(`SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = ?`, s.keyspace)
	if err != nil {
		return translate("migrate", err)
	}
	if !ok {
		ddl := "CREATE KEYSPACE IF NOT EXISTS " + strconv.Quote(s.keyspace) + " WITH replication = " + s.replication
		if err := s.session.Query(ddl).WithContext(ctx).Exec(); err != nil {
			return translate("migrate: create keyspace", err)
		}
	}
	ok, err = exists(`SELECT table_name FROM system_schema.tables WHERE keyspace_name = ? AND table_name = ?`, s.keyspace, s.table)
	if err != nil {
		return translate("migrate", err)
	}
	if !ok {
		ddl := tableDDL(strconv.Quote(s.keyspace) + "." + strconv.Quote(s.table))
		if err := s.session.Query(ddl).WithContext(ctx).Exec(); err != nil {
			return translate("migrate: create table", err)
		}
	}
	// gocql waits for schema agreement after each DDL statement; this also
	// covers a table another node has just created.
	return translate("migrate", s.session.AwaitSchemaAgreement(ctx))
}

// Ping implements store.Store.
func (s *Store) Ping(ctx context.Context) error {
	var v string
	err := s.session.Query(`SELECT release_version FROM system.local`).Consistency(gocql.One).WithContext(ctx).Scan(&v)
	return translate("ping", err)
}

// Close implements store.Store.
func (s *Store) Close() error {
	s.session.Close()
	return nil
}

// lock takes the write lock of a shard and returns its release.
func (s *Store) lock(key store.ShardKey) func() {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key.Namespace))
	_, _ = h.Write([]byte{0, byte(key.Shard >> 24), byte(key.Shard >> 16), byte(key.Shard >> 8), byte(key.Shard)})
	m := &s.locks[h.Sum32()%lockStripes]
	m.Lock()
	return m.Unlock
}

// ShardGet implements store.Store.
func (s *Store) ShardGet(ctx context.Context, key store.ShardKey) (*store.Shard, error) {
	var (
		version   int64
		owner     string
		claimedAt int64
	)
	err := s.session.Query(s.q.shardGet, key.Namespace, key.Shard).WithContext(ctx).Scan(&version, &owner, &claimedAt)
	if errors.Is(err, gocql.ErrNotFound) {
		return nil, fmt.Errorf("cassandra: shard get: %w", store.ErrShardNotFound)
	}
	if err != nil {
		return nil, translate("shard get", err)
	}
	return &store.Shard{Key: key, Version: version, Owner: owner, ClaimedAt: fromMS(claimedAt)}, nil
}

// ShardClaim implements store.Store.
func (s *Store) ShardClaim(ctx context.Context, p store.ShardClaimParams) (*store.Shard, error) {
	if p.PrevVersion < 0 {
		return nil, fmt.Errorf("cassandra: shard claim: %w: negative previous version %d", store.ErrShardVersionConflict, p.PrevVersion)
	}
	defer s.lock(p.Shard)()
	now := ms(p.Now)
	var q *gocql.Query
	if p.PrevVersion == 0 {
		q = s.session.Query(s.q.shardInsert, p.Shard.Namespace, p.Shard.Shard, p.Owner, now)
	} else {
		q = s.session.Query(s.q.shardClaim, p.PrevVersion+1, p.Owner, now, p.Shard.Namespace, p.Shard.Shard, p.PrevVersion)
	}
	applied, err := s.casQuery(ctx, q)
	if err != nil {
		return nil, translate("shard claim", err)
	}
	if !applied {
		return nil, fmt.Errorf("cassandra: shard claim: %w", store.ErrShardVersionConflict)
	}
	return &store.Shard{Key: p.Shard, Version: p.PrevVersion + 1, Owner: p.Owner, ClaimedAt: fromMS(now)}, nil
}

// ShardRelease implements store.Store.
func (s *Store) ShardRelease(ctx context.Context, f store.Fence) error {
	defer s.lock(f.Shard)()
	applied, err := s.casQuery(ctx, s.session.Query(s.q.shardRelease, f.Shard.Namespace, f.Shard.Shard, f.Version))
	if err != nil {
		return translate("shard release", err)
	}
	if !applied {
		return fmt.Errorf("cassandra: shard release: %w", store.ErrShardOwnershipLost)
	}
	return nil
}

// casQuery runs one conditional statement and says whether it applied.
func (s *Store) casQuery(ctx context.Context, q *gocql.Query) (bool, error) {
	return q.SerialConsistency(s.serial).WithContext(ctx).MapScanCAS(map[string]any{})
}

// newBatch starts a fenced conditional batch: its first statement checks
// (and rewrites) the shard row's version.
func (s *Store) newBatch(ctx context.Context, f store.Fence) *gocql.Batch {
	b := s.session.NewBatch(gocql.UnloggedBatch).WithContext(ctx)
	b.SerialConsistency(s.serial)
	b.Query(s.q.fence, f.Version, f.Shard.Namespace, f.Shard.Shard, f.Version)
	return b
}

// cas runs a conditional batch and says whether it applied.
func (s *Store) cas(b *gocql.Batch) (bool, error) {
	applied, _, err := s.casState(b, "")
	return applied, err
}

// casState runs a conditional batch and says whether it applied. When it
// did not, Cassandra's answer holds the rows the batch has conditions on, as
// the batch's own Paxos round read them (those that exist; all their columns
// if a statement is IF NOT EXISTS, else the key and the conditioned
// columns): casState returns the shard row's version and, if id is not
// empty, the id row of id.
func (s *Store) casState(b *gocql.Batch, id string) (bool, probeResult, error) {
	var res probeResult
	row := map[string]any{}
	applied, iter, err := s.session.MapExecuteBatchCAS(b, row)
	if err != nil {
		if iter != nil {
			_ = iter.Close()
		}
		return false, res, err
	}
	for !applied {
		res.add(row, id)
		// MapScan scans into the values a map already holds: a new map.
		row = map[string]any{}
		if !iter.MapScan(row) {
			break
		}
	}
	return applied, res, iter.Close()
}

// translate wraps a native error for op: the one place where gocql's errors
// meet the store's. Nothing gocql reports is certainly-not-applied in the
// store's sense (a write timeout of a Paxos round may or may not have
// committed), so no native error maps to a sentinel; the sentinels come from
// conditions that did not apply. Context errors stay matchable through the
// wrap.
func translate(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("cassandra: %s: %w", op, err)
}

// ms is a time as Cassandra stores it: Unix milliseconds.
func ms(t time.Time) int64 { return t.UnixMilli() }

// fromMS is the inverse of ms, in UTC.
func fromMS(v int64) time.Time { return time.UnixMilli(v).UTC() }
