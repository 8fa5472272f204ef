package mysql_test

import (
	"database/sql"
	"fmt"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/store/mysql"
	"github.com/dtimer/dtimer/server/internal/timer"
)

// TestHotPathsAreKeyRanges checks the plans of the engine's two hot range
// operations, and of a write to a located timer: one range of the primary
// key, bounded on every key column, never the unique key plus a sort.
func TestHotPathsAreKeyRanges(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	s := newStore(t, dsn)
	ctx := t.Context()
	// Neighbours on every side of the range: the shard row, failed timers,
	// other shards; and enough rows that a scan would cost something.
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, key := range []store.ShardKey{{Namespace: "a", Shard: 0}, {Namespace: "a", Shard: 1}, {Namespace: "a", Shard: 2}} {
		sh, err := s.ShardClaim(ctx, store.ShardClaimParams{Shard: key, Owner: "n", Now: base})
		require.NoError(t, err)
		f := store.Fence{Shard: key, Version: sh.Version}
		for i := range 40 {
			tm := testTimer(key, fmt.Sprintf("t%d", i), base.Add(time.Duration(i%10)*time.Second))
			if i%7 == 0 {
				tm.Status = timer.StatusFailed
			}
			require.NoError(t, s.TimerCreate(ctx, f, tm))
		}
	}

	dc, err := gomysql.ParseDSN(dsn)
	require.NoError(t, err)
	dc.InterpolateParams = true
	db, err := sql.Open("mysql", dc.FormatDSN())
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	_, err = conn.ExecContext(ctx, `ANALYZE TABLE timers`)
	require.NoError(t, err)

	located := testTimer(store.ShardKey{Namespace: "a", Shard: 1}, "t3", base.Add(3*time.Second))
	_, err = conn.ExecContext(ctx, `SET @dtimer_fence = 1, @dtimer_type = 2, @dtimer_at = ?, @dtimer_uuid = ?`,
		"2030-01-01 00:00:03.000", located.UUID[:])
	require.NoError(t, err)
	at, until := "2030-01-01 00:00:02.000", "2030-01-01 00:00:05.000"
	// The key length a lookup of one whole primary key uses.
	full := explain(t, conn, `SELECT * FROM timers WHERE namespace = 'a' AND shard_id = 1 AND row_type = 1
		AND execute_at = '1970-01-01' AND timer_uuid = X'00000000000000000000000000000000'`)
	require.Equal(t, "PRIMARY", full["key"])
	for name, q := range map[string]struct {
		sql  string
		args []any
	}{
		"window":       {mysql.TimerGetWindowSQL, []any{[]byte("a"), 1, at, at, timer.MaxUUID[:], until, 100}},
		"range delete": {mysql.TimerDeleteRangeSQL, []any{[]byte("a"), 1, at, at, timer.MaxUUID[:]}},
		"by key":       {mysql.LocatedDeleteSQL, []any{[]byte("a"), 1}},
	} {
		plan := explain(t, conn, q.sql, q.args...)
		require.Contains(t, []string{"range", "const"}, plan["type"], "%s: %v", name, plan)
		require.Equal(t, "PRIMARY", plan["key"], "%s: %v", name, plan)
		require.Equal(t, full["key_len"], plan["key_len"], "%s: the range must bound every key column: %v", name, plan)
		require.NotContains(t, plan["Extra"], "filesort", "%s: %v", name, plan)
	}
}

// explain returns the one row of the tabular EXPLAIN of q by column name
// (MySQL and MariaDB name the columns alike, MySQL has a few more).
func explain(t *testing.T, conn *sql.Conn, q string, args ...any) map[string]string {
	t.Helper()
	rows, err := conn.QueryContext(t.Context(), `EXPLAIN `+q, args...)
	require.NoError(t, err)
	defer rows.Close()
	cols, err := rows.Columns()
	require.NoError(t, err)
	require.True(t, rows.Next(), "no plan for %s", q)
	vals := make([]sql.NullString, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	require.NoError(t, rows.Scan(ptrs...))
	require.False(t, rows.Next(), "one table access expected for %s", q)
	require.NoError(t, rows.Err())
	out := map[string]string{}
	for i, c := range cols {
		out[c] = vals[i].String
	}
	return out
}
