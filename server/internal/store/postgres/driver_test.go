package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/store/postgres"
	"github.com/dtimer/dtimer/server/internal/store/storetest"
	"github.com/dtimer/dtimer/server/internal/timer"
)

// urlEnv names the server the tests run against; scripts/testdb/postgres.sh
// starts one and prints its URL.
const urlEnv = "DTIMER_TEST_POSTGRES_URL"

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestDriver(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) store.Store {
		return newStore(t, newSchema(t))
	})
}

// TestMigrateTwoNodes migrates one schema from two stores at once, as nodes
// starting together do.
func TestMigrateTwoNodes(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	storetest.MigrateConcurrently(t, func() store.Store { return open(t, schema) })
}

// TestWindowIsIndexRange checks the plans of the engine's two hot range
// operations: a primary key range, not a scan of the partition.
func TestWindowIsIndexRange(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	newStore(t, schema)
	conn := connect(t)
	table := pgx.Identifier{schema, "timers"}.Sanitize()
	for _, q := range []string{
		`SELECT * FROM ` + table + ` WHERE namespace = 'a' AND shard_id = 1 AND row_type = 2
			AND (execute_at, timer_uuid) > ('2030-01-01Z', '00000000-0000-0000-0000-000000000000')
			AND execute_at <= '2030-01-02Z' ORDER BY execute_at, timer_uuid LIMIT 100`,
		`DELETE FROM ` + table + ` WHERE namespace = 'a' AND shard_id = 1 AND row_type = 2
			AND (execute_at, timer_uuid) <= ('2030-01-01Z', 'ffffffff-ffff-ffff-ffff-ffffffffffff')`,
	} {
		tx, err := conn.Begin(t.Context())
		require.NoError(t, err)
		// An empty table would be scanned sequentially; what matters is that
		// the index can serve both bounds.
		_, err = tx.Exec(t.Context(), `SET LOCAL enable_seqscan = off`)
		require.NoError(t, err)
		rows, err := tx.Query(t.Context(), `EXPLAIN (COSTS OFF) `+q)
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(t.Context()))
		all := ""
		for _, l := range lines {
			all += l + "\n"
		}
		require.Contains(t, all, "Index Cond:", all)
		require.Contains(t, all, "timers_pkey", all)
		require.Contains(t, all, "ROW(execute_at, timer_uuid)", all)
		require.NotContains(t, all, "Filter:", all)
	}
}

// TestGenericPlansStayOnTheKey checks the generic plan of every statement:
// the driver has PostgreSQL plan each statement once per connection
// (plan_cache_mode), and a connection may do so while the table is empty and
// never analysed, as it is when a deployment starts, or later on a full,
// analysed one. Either way: no scan of the table, and no index scan that
// reads a whole partition and filters it. Such a plan of the fence step once
// made every fenced write cost O(timers in the shard).
func TestGenericPlansStayOnTheKey(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	s := newStore(t, schema)
	conn := connect(t)
	ctx := t.Context()
	_, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	table := pgx.Identifier{schema, "timers"}.Sanitize()
	requireKeyPlans(t, conn, table, "empty table")

	// Two shards of timers, some failed, and an ANALYZE.
	now := time.Now()
	for i := range 2 {
		k := store.ShardKey{Namespace: "a", Shard: i}
		sh, err := s.ShardClaim(ctx, store.ShardClaimParams{Shard: k, Owner: "n", Now: now})
		require.NoError(t, err)
		f := store.Fence{Shard: k, Version: sh.Version}
		for j := range 1500 {
			tm := testTimer(k, fmt.Sprintf("t%d", j), now.Add(time.Duration(j)*time.Second))
			if j%10 == 0 {
				tm.Status = timer.StatusFailed
			}
			require.NoError(t, s.TimerCreate(ctx, f, tm))
		}
	}
	_, err = conn.Exec(ctx, `ANALYZE `+table)
	require.NoError(t, err)
	requireKeyPlans(t, conn, table, "analysed table")
}

func requireKeyPlans(t *testing.T, conn *pgx.Conn, table, when string) {
	t.Helper()
	ctx := t.Context()
	for name, q := range postgres.Statements(table) {
		name = when + ": " + name
		_, err := conn.Exec(ctx, `PREPARE p AS `+q)
		require.NoError(t, err, name)
		var params int
		require.NoError(t, conn.QueryRow(ctx, `SELECT cardinality(parameter_types) FROM pg_prepared_statements WHERE name = 'p'`).Scan(&params))
		args := strings.TrimSuffix(strings.Repeat("NULL, ", params), ", ")
		rows, err := conn.Query(ctx, `EXPLAIN (COSTS OFF) EXECUTE p(`+args+`)`)
		require.NoError(t, err, name)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err, name)
		_, err = conn.Exec(ctx, `DEALLOCATE p`)
		require.NoError(t, err)
		plan := strings.Join(lines, "\n")
		require.NotContains(t, plan, "Seq Scan", "%s:\n%s", name, plan)
		for i, l := range lines {
			if !strings.Contains(l, "Index Scan") {
				continue
			}
			require.Less(t, i+1, len(lines), "%s:\n%s", name, plan)
			cond := lines[i+1]
			require.Contains(t, cond, "Index Cond:", "%s:\n%s", name, plan)
			if strings.Contains(l, "timers_pkey") {
				require.Contains(t, cond, "(row_type = ", "%s: a primary key scan of the partition:\n%s", name, plan)
			} else {
				require.Regexp(t, `\(timer_id (= |IS NULL)`, cond, "%s: an id index scan of the partition:\n%s", name, plan)
			}
		}
	}
}

// TestCreatesShareAStatement makes creates of several shards, under current
// and stale fences, wait for one statement: a transaction holds shard 0's row
// so that a first create blocks in flight while the others queue up behind
// it. Each create must get its own fence's answer.
func TestCreatesShareAStatement(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	s := newStore(t, schema)
	ctx := t.Context()
	key := func(i int) store.ShardKey { return store.ShardKey{Namespace: "a", Shard: i} }
	fence := func(i int, prev int64) store.Fence {
		sh, err := s.ShardClaim(ctx, store.ShardClaimParams{Shard: key(i), Owner: "n", PrevVersion: prev, Now: time.Now()})
		require.NoError(t, err)
		return store.Fence{Shard: key(i), Version: sh.Version}
	}
	f0, f1 := fence(0, 0), fence(1, 0)
	stale := fence(2, 0)
	fence(2, stale.Version)                         // claimed again: stale is stale
	never := store.Fence{Shard: key(3), Version: 1} // never claimed

	release := holdShardRow(t, schema, key(0))
	type result struct {
		f   store.Fence
		id  string
		err error
	}
	results := make(chan result, 16)
	createAsync := func(f store.Fence, id string) {
		go func() {
			results <- result{f, id, s.TimerCreate(ctx, f, testTimer(f.Shard, id, time.Now()))}
		}()
	}
	createAsync(f0, "blocked")
	requireCreates(t, s, 0, 1)
	batch := map[store.Fence][]string{f0: {"x", "y"}, f1: {"p", "q", "r"}, stale: {"s1", "s2"}, never: {"n1"}}
	n := 0
	for f, ids := range batch {
		for _, id := range ids {
			createAsync(f, id)
			n++
		}
	}
	requireCreates(t, s, n, 1)
	release()

	for range n + 1 {
		r := <-results
		if r.f == stale || r.f == never {
			require.ErrorIs(t, r.err, store.ErrShardOwnershipLost, r.id)
		} else {
			require.NoError(t, r.err, r.id)
		}
	}
	ids := func(k store.ShardKey) []string {
		ts, err := s.TimerGetWindow(ctx, store.TimerGetWindowParams{Shard: k, DueUntil: time.Now().Add(time.Hour), Limit: 100})
		require.NoError(t, err)
		var out []string
		for _, tm := range ts {
			out = append(out, tm.ID)
		}
		slices.Sort(out)
		return out
	}
	require.Equal(t, []string{"blocked", "x", "y"}, ids(key(0)))
	require.Equal(t, []string{"p", "q", "r"}, ids(key(1)))
	require.Empty(t, ids(key(2)))
	require.Empty(t, ids(key(3)))
}

// TestClaimDuringBatch: a batch waiting for a shard row that a claim updates
// writes none of that shard's creates, and all of the other shard's.
func TestClaimDuringBatch(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	s := newStore(t, schema)
	ctx := t.Context()
	var fences []store.Fence
	for i := range 3 {
		k := store.ShardKey{Namespace: "a", Shard: i}
		sh, err := s.ShardClaim(ctx, store.ShardClaimParams{Shard: k, Owner: "n", Now: time.Now()})
		require.NoError(t, err)
		fences = append(fences, store.Fence{Shard: k, Version: sh.Version})
	}
	// A create of shard 2 blocks in flight while the batch queues up.
	release2 := holdShardRow(t, schema, fences[2].Shard)
	first := make(chan error, 1)
	go func() { first <- s.TimerCreate(ctx, fences[2], testTimer(fences[2].Shard, "first", time.Now())) }()
	requireCreates(t, s, 0, 1)
	results := make(map[string]chan error)
	for _, f := range fences[:2] {
		for _, id := range []string{"a", "b"} {
			id := fmt.Sprintf("%d-%s", f.Shard.Shard, id)
			ch := make(chan error, 1)
			results[id] = ch
			go func() { ch <- s.TimerCreate(ctx, f, testTimer(f.Shard, id, time.Now())) }()
		}
	}
	requireCreates(t, s, 4, 1)

	// The batch then waits for shard 0's row, which a claim updates.
	conn := connect(t)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	table := pgx.Identifier{schema, "timers"}.Sanitize()
	_, err = tx.Exec(ctx, `UPDATE `+table+` SET shard_version = shard_version + 1
		WHERE namespace = 'a' AND shard_id = 0 AND row_type = 1`)
	require.NoError(t, err)
	release2()
	require.NoError(t, <-first)
	watch := connect(t)
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, watch.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%unnest%' AND query LIKE '%'||$1||'%')`, schema).Scan(&waiting))
		return waiting
	}, 10*time.Second, 5*time.Millisecond, "the batch waits for shard 0's row")
	require.NoError(t, tx.Commit(ctx))

	require.ErrorIs(t, <-results["0-a"], store.ErrShardOwnershipLost)
	require.ErrorIs(t, <-results["0-b"], store.ErrShardOwnershipLost)
	require.NoError(t, <-results["1-a"])
	require.NoError(t, <-results["1-b"])
	for _, id := range []string{"0-a", "0-b"} {
		_, err := s.TimerGet(ctx, fences[0].Shard, id)
		require.ErrorIs(t, err, store.ErrTimerNotFound, id)
	}
	for _, id := range []string{"1-a", "1-b"} {
		_, err := s.TimerGet(ctx, fences[1].Shard, id)
		require.NoError(t, err, id)
	}
}

// TestRefusedRowFailsAlone: a row the database refuses fails its own create,
// not the others of its batch.
func TestRefusedRowFailsAlone(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	s := newStore(t, schema)
	ctx := t.Context()
	k := store.ShardKey{Namespace: "a", Shard: 0}
	sh, err := s.ShardClaim(ctx, store.ShardClaimParams{Shard: k, Owner: "n", Now: time.Now()})
	require.NoError(t, err)
	f := store.Fence{Shard: k, Version: sh.Version}

	release := holdShardRow(t, schema, k)
	errs := make(chan error, 1)
	go func() { errs <- s.TimerCreate(ctx, f, testTimer(k, "first", time.Now())) }()
	requireCreates(t, s, 0, 1)
	bad := testTimer(k, "bad", time.Now())
	bad.Payload = []byte("\"\xff\"") // not UTF-8: PostgreSQL refuses the text
	results := make(map[string]chan error)
	for _, tm := range []*timer.Timer{testTimer(k, "good-1", time.Now()), bad, testTimer(k, "good-2", time.Now())} {
		ch := make(chan error, 1)
		results[tm.ID] = ch
		go func() { ch <- s.TimerCreate(ctx, f, tm) }()
	}
	requireCreates(t, s, 3, 1)
	release()

	require.NoError(t, <-errs)
	require.NoError(t, <-results["good-1"])
	require.NoError(t, <-results["good-2"])
	err = <-results["bad"]
	require.Error(t, err)
	require.NotErrorIs(t, err, store.ErrShardOwnershipLost)
	for _, id := range []string{"first", "good-1", "good-2"} {
		_, err := s.TimerGet(ctx, k, id)
		require.NoError(t, err, id)
	}
	_, err = s.TimerGet(ctx, k, "bad")
	require.ErrorIs(t, err, store.ErrTimerNotFound)
}

// holdShardRow locks the shard row of key FOR UPDATE in a transaction of its
// own, which every fenced write of the shard waits for, until the returned
// function (also run at cleanup) rolls it back.
func holdShardRow(t *testing.T, schema string, key store.ShardKey) func() {
	t.Helper()
	tx, err := connect(t).Begin(t.Context())
	require.NoError(t, err)
	_, err = tx.Exec(t.Context(), `SELECT 1 FROM `+pgx.Identifier{schema, "timers"}.Sanitize()+
		` WHERE namespace = $1 AND shard_id = $2 AND row_type = 1 FOR UPDATE`, key.Namespace, key.Shard)
	require.NoError(t, err)
	var once sync.Once
	release := func() { once.Do(func() { _ = tx.Rollback(context.Background()) }) }
	t.Cleanup(release)
	return release
}

// requireCreates waits until the store's creates wait and run as expected.
func requireCreates(t *testing.T, s *postgres.Store, waiting, inFlight int) {
	t.Helper()
	require.Eventually(t, func() bool {
		w, f := s.CreatesWaiting()
		return w == waiting && f == inFlight
	}, 10*time.Second, time.Millisecond)
}

// testTimer is a pending timer of key due at due.
func testTimer(key store.ShardKey, id string, due time.Time) *timer.Timer {
	due = due.UTC().Truncate(time.Millisecond)
	return &timer.Timer{
		Namespace: key.Namespace, Shard: key.Shard, ID: id, UUID: timer.UUIDOf(key.Namespace, id),
		ExecuteAt: due, DueAt: due, CallbackURL: "http://127.0.0.1:1/cb", Payload: []byte(`{"id":"` + id + `"}`),
		RetryPolicy:     timer.RetryPolicy{MaxAttempts: 3, InitialInterval: time.Second, BackoffMultiplier: 2, MaxInterval: time.Minute},
		CallbackTimeout: time.Second, CreatedAt: due, UpdatedAt: due, Status: timer.StatusPending,
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	_, err := postgres.New(t.Context(), postgres.Config{})
	require.Error(t, err)
	_, err = postgres.New(t.Context(), postgres.Config{URL: "postgres://u:secret@127.0.0.1:1/x?sslmode=bogus"})
	require.Error(t, err)
	require.NotContains(t, err.Error(), "secret")
}

// newSchema returns a fresh schema name, dropped with everything in it when
// the test ends.
func newSchema(t *testing.T) string {
	t.Helper()
	storetest.EnvOrSkip(t, urlEnv)
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	schema := "t_" + hex.EncodeToString(b)
	// Registered before the stores' Close, so it runs after them.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, storetest.EnvOrSkip(t, urlEnv))
		if err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return schema
}

// open returns a store on schema, closed when the test ends.
func open(t *testing.T, schema string) *postgres.Store {
	t.Helper()
	s, err := postgres.New(t.Context(), postgres.Config{URL: storetest.EnvOrSkip(t, urlEnv), Schema: schema, MaxConns: 8})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

// newStore returns a migrated store on schema.
func newStore(t *testing.T, schema string) *postgres.Store {
	t.Helper()
	s := open(t, schema)
	require.NoError(t, s.Migrate(t.Context()))
	return s
}

func connect(t *testing.T) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), storetest.EnvOrSkip(t, urlEnv))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}
