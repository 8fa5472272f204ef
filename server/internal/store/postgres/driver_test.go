package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/store/postgres"
	"github.com/dtimer/dtimer/server/internal/store/storetest"
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
