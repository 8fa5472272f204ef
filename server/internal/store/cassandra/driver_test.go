package cassandra_test

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gocql/gocql"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/store/cassandra"
	"github.com/dtimer/dtimer/server/internal/store/storetest"
	"github.com/dtimer/dtimer/server/internal/timer"
)

// hostsEnv names the server the tests run against, as comma-separated
// host:port contact points; scripts/testdb/cassandra.sh starts one and prints
// them.
const hostsEnv = "DTIMER_TEST_CASSANDRA_HOSTS"

// Isolation: every store of this package gets a table of its own in one
// keyspace per test process, which TestMain drops at the end. Creating a table
// costs a schema change (~0.1 s); dropping one costs much more, because
// Cassandra flushes every table with data in the commit log on each drop, so
// tables are not dropped one by one.
var (
	keyspace = "dtimer_test_" + randomHex(6)
	tables   atomic.Int64
	// dropKeyspaces are the keyspaces TestMain drops.
	dropMu        sync.Mutex
	dropKeyspaces = map[string]bool{}
)

func TestMain(m *testing.M) {
	code := m.Run()
	if err := dropAll(); err != nil {
		fmt.Fprintln(os.Stderr, "drop test keyspaces:", err)
		if code == 0 {
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func TestDriver(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) store.Store {
		return newStore(t, newTable(t))
	})
}

// table names a table of its own in a keyspace.
type table struct{ keyspace, name string }

// newTable returns a fresh table name in the package's keyspace (neither is
// created yet: Migrate creates both).
func newTable(t *testing.T) table {
	t.Helper()
	storetest.EnvOrSkip(t, hostsEnv)
	dropAtEnd(keyspace)
	return table{keyspace: keyspace, name: fmt.Sprintf("t%d", tables.Add(1))}
}

func dropAtEnd(ks string) {
	dropMu.Lock()
	defer dropMu.Unlock()
	dropKeyspaces[ks] = true
}

func dropAll() error {
	dropMu.Lock()
	defer dropMu.Unlock()
	if len(dropKeyspaces) == 0 {
		return nil
	}
	cluster := gocql.NewCluster(hosts()...)
	cluster.Timeout = time.Minute
	session, err := cluster.CreateSession()
	if err != nil {
		return err
	}
	defer session.Close()
	for ks := range dropKeyspaces {
		if err := session.Query(`DROP KEYSPACE IF EXISTS "` + ks + `"`).Exec(); err != nil {
			return fmt.Errorf("%s: %w", ks, err)
		}
	}
	return nil
}

func hosts() []string { return strings.Split(os.Getenv(hostsEnv), ",") }

func config(tb table) cassandra.Config {
	return cassandra.Config{
		Hosts:    hosts(),
		Keyspace: tb.keyspace,
		Table:    tb.name,
		// A one-node test server: QUORUM and SERIAL are as cheap as the
		// local ones and exercise the non-default settings.
		Consistency:       "QUORUM",
		SerialConsistency: "SERIAL",
		Timeout:           30 * time.Second,
	}
}

// open returns a store on tb, closed when the test ends.
func open(t *testing.T, tb table) *cassandra.Store {
	t.Helper()
	s, err := cassandra.New(t.Context(), config(tb))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

// newStore returns a migrated store on tb.
func newStore(t *testing.T, tb table) *cassandra.Store {
	t.Helper()
	s := open(t, tb)
	require.NoError(t, s.Migrate(t.Context()))
	return s
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// TestMigrateTwoNodes creates one keyspace and table from several stores at
// once, as nodes starting together do.
func TestMigrateTwoNodes(t *testing.T) {
	t.Parallel()
	storetest.EnvOrSkip(t, hostsEnv)
	tb := table{keyspace: "dtimer_test_" + randomHex(6), name: "timers"}
	dropAtEnd(tb.keyspace)
	storetest.MigrateConcurrently(t, func() store.Store { return open(t, tb) })
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	good := cassandra.Config{Hosts: []string{"127.0.0.1:1"}}
	for name, mutate := range map[string]func(c *cassandra.Config){
		"no hosts":            func(c *cassandra.Config) { c.Hosts = nil },
		"empty host":          func(c *cassandra.Config) { c.Hosts = []string{""} },
		"hosts in one string": func(c *cassandra.Config) { c.Hosts = []string{"a,b"} },
		"port":                func(c *cassandra.Config) { c.Port = 70000 },
		"keyspace":            func(c *cassandra.Config) { c.Keyspace = "bad-name" },
		"keyspace case":       func(c *cassandra.Config) { c.Keyspace = "Dtimer" },
		"table":               func(c *cassandra.Config) { c.Table = "x; DROP TABLE y" },
		"consistency":         func(c *cassandra.Config) { c.Consistency = "ONE" },
		"serial consistency":  func(c *cassandra.Config) { c.SerialConsistency = "QUORUM" },
		"replication":         func(c *cassandra.Config) { c.Replication = "SimpleStrategy" },
		"password alone":      func(c *cassandra.Config) { c.Password = "secret" },
		"num conns":           func(c *cassandra.Config) { c.NumConns = -1 },
		"timeout":             func(c *cassandra.Config) { c.Timeout = -time.Second },
	} {
		c := good
		mutate(&c)
		_, err := cassandra.New(t.Context(), c)
		require.Error(t, err, name)
		require.NotContains(t, err.Error(), "secret", name)
	}

	// Valid, but nothing listens there.
	c := good
	c.Username, c.Password = "u", "secret"
	c.ConnectTimeout = 2 * time.Second
	_, err := cassandra.New(t.Context(), c)
	require.Error(t, err)
	require.NotContains(t, err.Error(), "secret")
}

// The suite drives each store from one process, whose writes to a shard the
// driver serialises. Two stores on one table are two processes: their writes
// meet in Paxos, and the driver's retries on a failed condition are what keep
// one timer per id.
func TestTwoStoresRaceOnSameIDs(t *testing.T) {
	t.Parallel()
	tb := newTable(t)
	a, b := newStore(t, tb), open(t, tb)
	ctx := t.Context()
	key := store.ShardKey{Namespace: "ns", Shard: 1}
	sh, err := a.ShardClaim(ctx, store.ShardClaimParams{Shard: key, Owner: "n", Now: time.Now()})
	require.NoError(t, err)
	fence := store.Fence{Shard: key, Version: sh.Version}
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

	const ids, rounds = 4, 6
	var wg sync.WaitGroup
	errs := make(chan error, 2*ids*rounds)
	last := make([][2]*timer.Timer, ids)
	for w, s := range []*cassandra.Store{a, b} {
		wg.Go(func() {
			for r := range rounds {
				for i := range ids {
					// Each writer moves each timer to a position of its own.
					tm := testTimer(key, fmt.Sprintf("id-%d", i), base.Add(time.Duration(w*1000+r)*time.Second))
					tm.Attempts = w
					err := s.TimerCreate(ctx, fence, tm)
					if err == nil && r%2 == 1 {
						tm = tm.Clone()
						tm.DueAt = tm.DueAt.Add(time.Hour)
						err = s.TimerUpdate(ctx, fence, store.TimerUpdateParams{Timer: tm})
					}
					errs <- err
					if r == rounds-1 {
						last[i][w] = tm
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	win, err := a.TimerGetWindow(ctx, store.TimerGetWindowParams{Shard: key, DueUntil: base.Add(1000 * time.Hour), Limit: 1000})
	require.NoError(t, err)
	require.Len(t, win, ids, "one timer per id")
	for _, got := range win {
		g, err := b.TimerGet(ctx, key, got.ID)
		require.NoError(t, err)
		require.Equal(t, got.DueAt, g.DueAt)
		var i int
		_, err = fmt.Sscanf(got.ID, "id-%d", &i)
		require.NoError(t, err)
		require.Equal(t, last[i][got.Attempts].DueAt, got.DueAt, "the timer is one writer's last version")
	}

	// A range delete from one store while the other moves timers out of it:
	// every timer ends either moved (and present) or deleted with its id.
	var moved atomic.Int64
	wg.Go(func() {
		for i := range ids {
			tm := testTimer(key, fmt.Sprintf("id-%d", i), base.Add(2000*time.Hour))
			if err := b.TimerCreate(ctx, fence, tm); err != nil {
				t.Errorf("move %s: %v", tm.ID, err)
				return
			}
			moved.Add(1)
		}
	})
	_, err = a.TimerDeleteRange(ctx, fence, store.TimerDeleteRangeParams{UpTo: timer.Position{DueAt: base.Add(1000 * time.Hour), UUID: timer.MaxUUID}})
	require.NoError(t, err)
	wg.Wait()
	win, err = a.TimerGetWindow(ctx, store.TimerGetWindowParams{Shard: key, DueUntil: base.Add(3000 * time.Hour), Limit: 1000})
	require.NoError(t, err)
	for _, tm := range win {
		require.Equal(t, base.Add(2000*time.Hour), tm.DueAt, "%s survived the range delete without moving", tm.ID)
	}
	for i := range ids {
		id := fmt.Sprintf("id-%d", i)
		got, err := a.TimerGet(ctx, key, id)
		if err != nil {
			require.ErrorIs(t, err, store.ErrTimerNotFound)
			continue
		}
		require.Equal(t, base.Add(2000*time.Hour), got.DueAt, id)
	}
}

// TestDanglingIDRow: an id row whose timer row is gone (left behind when a
// timer is created into a range another process deletes at that moment)
// reads as no timer, and the next write of the id repairs it.
func TestDanglingIDRow(t *testing.T) {
	t.Parallel()
	tb := newTable(t)
	s := newStore(t, tb)
	ctx := t.Context()
	key := store.ShardKey{Namespace: "ns", Shard: 1}
	sh, err := s.ShardClaim(ctx, store.ShardClaimParams{Shard: key, Owner: "n", Now: time.Now()})
	require.NoError(t, err)
	fence := store.Fence{Shard: key, Version: sh.Version}
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

	// The state a crash or a race leaves: an id row pointing at nothing.
	danglingID := func(id string) {
		t.Helper()
		u := timer.UUIDOf(key.Namespace, id)
		err := cassandra.SessionOf(s).Query(`INSERT INTO "`+tb.keyspace+`"."`+tb.name+`"
			(namespace, shard_id, row_type, execute_at, timer_uuid, timer_id, id_row_type, id_due_at, id_uuid, gen)
			VALUES (?, ?, 0, 0, 0x, ?, 2, ?, ?, uuid()) IF NOT EXISTS`,
			key.Namespace, key.Shard, id, base.UnixMilli(), u[:]).Exec()
		require.NoError(t, err)
	}

	danglingID("x")
	_, err = s.TimerGet(ctx, key, "x")
	require.ErrorIs(t, err, store.ErrTimerNotFound)
	due := base
	err = s.TimerUpdate(ctx, fence, store.TimerUpdateParams{Timer: testTimer(key, "x", base), IfDueAt: &due})
	require.ErrorIs(t, err, store.ErrTimerNotFound)
	danglingID("x") // the update removed it
	require.ErrorIs(t, s.TimerDelete(ctx, fence, "x"), store.ErrTimerNotFound)
	require.ErrorIs(t, s.TimerDelete(ctx, fence, "x"), store.ErrTimerNotFound)

	danglingID("y")
	tm := testTimer(key, "y", base.Add(time.Minute))
	require.NoError(t, s.TimerCreate(ctx, fence, tm))
	got, err := s.TimerGet(ctx, key, "y")
	require.NoError(t, err)
	require.Equal(t, tm.DueAt, got.DueAt)
	win, err := s.TimerGetWindow(ctx, store.TimerGetWindowParams{Shard: key, DueUntil: base.Add(time.Hour), Limit: 10})
	require.NoError(t, err)
	require.Len(t, win, 1)
	n, err := s.TimerDeleteRange(ctx, fence, store.TimerDeleteRangeParams{UpTo: timer.Position{DueAt: base.Add(time.Hour), UUID: timer.MaxUUID}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = s.TimerGet(ctx, key, "y")
	require.ErrorIs(t, err, store.ErrTimerNotFound)
}

// TestRangeDeleteIsOneTombstone: a range delete leaves one range tombstone in
// the pending slice, not one per timer, so the next window read scans over
// (about) one tombstone however many timers were deleted. The interface
// cannot show this; Cassandra's per-table histogram of tombstones scanned per
// read can, and each test's table is its own.
func TestRangeDeleteIsOneTombstone(t *testing.T) {
	t.Parallel()
	tb := newTable(t)
	s := newStore(t, tb)
	ctx := t.Context()
	key := store.ShardKey{Namespace: "ns", Shard: 1}
	sh, err := s.ShardClaim(ctx, store.ShardClaimParams{Shard: key, Owner: "n", Now: time.Now()})
	require.NoError(t, err)
	fence := store.Fence{Shard: key, Version: sh.Version}
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

	const n, deleted = 200, 150
	for i := range n {
		require.NoError(t, s.TimerCreate(ctx, fence, testTimer(key, fmt.Sprintf("id-%03d", i), base.Add(time.Duration(i)*time.Millisecond))))
	}
	got, err := s.TimerDeleteRange(ctx, fence, store.TimerDeleteRangeParams{
		UpTo: timer.Position{DueAt: base.Add((deleted - 1) * time.Millisecond), UUID: timer.MaxUUID},
	})
	require.NoError(t, err)
	require.Equal(t, deleted, got)
	win, err := s.TimerGetWindow(ctx, store.TimerGetWindowParams{Shard: key, DueUntil: base.Add(time.Hour), Limit: n})
	require.NoError(t, err)
	require.Len(t, win, n-deleted)

	var most float64
	require.NoError(t, cassandra.SessionOf(s).Query(
		`SELECT max FROM system_views.tombstones_per_read WHERE keyspace_name = ? AND table_name = ?`,
		tb.keyspace, tb.name).Scan(&most))
	// A range tombstone is two bounds; a memtable flush in between could
	// split it across sstables. One tombstone per timer would be 150.
	require.LessOrEqual(t, most, 4.0, "tombstones scanned by one read")
}

func testTimer(key store.ShardKey, id string, due time.Time) *timer.Timer {
	return &timer.Timer{
		Namespace: key.Namespace, ID: id, Shard: key.Shard, UUID: timer.UUIDOf(key.Namespace, id),
		ExecuteAt: due, DueAt: due, CallbackURL: "http://127.0.0.1/cb",
		RetryPolicy: timer.RetryPolicy{MaxAttempts: 1, InitialInterval: time.Second, BackoffMultiplier: 1, MaxInterval: time.Second},
		CreatedAt:   due, UpdatedAt: due, Status: timer.StatusPending,
	}
}
