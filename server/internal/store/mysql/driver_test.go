package mysql_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/store/mysql"
	"github.com/dtimer/dtimer/server/internal/store/storetest"
	"github.com/dtimer/dtimer/server/internal/timer"
)

// dsnEnv names the server the tests run against: the DSN of a user that may
// create and drop databases. scripts/testdb/mysql.sh starts one and prints it.
const dsnEnv = "DTIMER_TEST_MYSQL_DSN"

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestDriver(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) store.Store {
		return newStore(t, newDatabase(t))
	})
}

// TestMigrateSeveralNodes migrates one database from several stores at once,
// as nodes starting together do.
func TestMigrateSeveralNodes(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	storetest.MigrateConcurrently(t, func() store.Store { return open(t, dsn) })
}

func TestNotMigrated(t *testing.T) {
	t.Parallel()
	s := open(t, newDatabase(t))
	_, err := s.ShardGet(t.Context(), store.ShardKey{Namespace: "ns"})
	require.ErrorContains(t, err, "migrated")
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]mysql.Config{
		"empty":            {},
		"unparsable":       {DSN: "u:secret@tcp(127.0.0.1:1"},
		"bad param":        {DSN: "u:secret@tcp(127.0.0.1:1)/db?parseTime=maybe"},
		"no database":      {DSN: "u:secret@tcp(127.0.0.1:1)/"},
		"negative":         {DSN: "u:secret@tcp(127.0.0.1:1)/db", MaxConns: -1},
		"unsafe collation": {DSN: "u:secret@tcp(127.0.0.1:1)/db?collation=gbk_chinese_ci"},
		"unreachable":      {DSN: "u:secret@tcp(127.0.0.1:1)/db"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := mysql.New(t.Context(), cfg)
			require.Error(t, err)
			require.NotContains(t, err.Error(), "secret")
		})
	}
}

// TestDSNParamsOverridden opens a store with a DSN whose parameters would
// break the driver, were they applied, and checks that its writes commit and
// read back.
func TestDSNParamsOverridden(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	newStore(t, dsn)
	dc, err := gomysql.ParseDSN(dsn)
	require.NoError(t, err)
	dc.Params = map[string]string{"autocommit": "0", "sql_mode": "'ANSI_QUOTES,NO_BACKSLASH_ESCAPES'"}
	dc.MultiStatements, dc.InterpolateParams, dc.ParseTime, dc.ClientFoundRows = false, false, false, false
	s := open(t, dc.FormatDSN())
	ctx := t.Context()
	key := store.ShardKey{Namespace: "ns", Shard: 1}
	sh, err := s.ShardClaim(ctx, store.ShardClaimParams{Shard: key, Owner: "a", Now: time.Now()})
	require.NoError(t, err)
	f := store.Fence{Shard: key, Version: sh.Version}
	require.NoError(t, s.TimerCreate(ctx, f, testTimer(key, `it's "quoted" \ here`, time.Now())))
	// The same release twice: the second changes no row but matches one.
	require.NoError(t, s.ShardRelease(ctx, f))
	require.NoError(t, s.ShardRelease(ctx, f))

	other := open(t, dsn)
	got, err := other.ShardGet(ctx, key)
	require.NoError(t, err)
	require.Equal(t, f.Version, got.Version)
	_, err = other.TimerGet(ctx, key, `it's "quoted" \ here`)
	require.NoError(t, err)
}

// TestWrongPassword checks that a server that refuses the login fails New,
// without the password in the error.
func TestWrongPassword(t *testing.T) {
	t.Parallel()
	dc, err := gomysql.ParseDSN(storetest.EnvOrSkip(t, dsnEnv))
	require.NoError(t, err)
	dc.Passwd = "wrong-" + randomName(t)
	_, err = mysql.New(t.Context(), mysql.Config{DSN: dc.FormatDSN()})
	require.Error(t, err)
	require.NotContains(t, err.Error(), dc.Passwd)
}

func randomName(t *testing.T) string {
	t.Helper()
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newDatabase creates a database of its own for a test and returns its DSN.
// The database is dropped when the test ends.
func newDatabase(t *testing.T) string {
	t.Helper()
	dc, err := gomysql.ParseDSN(storetest.EnvOrSkip(t, dsnEnv))
	require.NoError(t, err, "parse %s", dsnEnv)
	dc.DBName = "t_" + randomName(t)
	admin := adminDB(t)
	_, err = admin.ExecContext(t.Context(), "CREATE DATABASE `"+dc.DBName+"`")
	require.NoError(t, err)
	// Registered before the stores' Close, so it runs after them.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+dc.DBName+"`"); err != nil {
			t.Errorf("drop database %s: %v", dc.DBName, err)
		}
	})
	return dc.FormatDSN()
}

// adminDB is a connection without a database, closed after the test's other
// cleanups.
func adminDB(t *testing.T) *sql.DB {
	t.Helper()
	dc, err := gomysql.ParseDSN(storetest.EnvOrSkip(t, dsnEnv))
	require.NoError(t, err)
	dc.DBName = ""
	db, err := sql.Open("mysql", dc.FormatDSN())
	require.NoError(t, err)
	db.SetMaxIdleConns(1)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// open returns a store on the database of dsn, closed when the test ends.
func open(t *testing.T, dsn string) *mysql.Store {
	t.Helper()
	s, err := mysql.New(t.Context(), mysql.Config{DSN: dsn, MaxConns: 8})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

// newStore returns a migrated store on the database of dsn.
func newStore(t *testing.T, dsn string) *mysql.Store {
	t.Helper()
	s := open(t, dsn)
	require.NoError(t, s.Migrate(t.Context()))
	return s
}

// TestFailedBatchRollsBack makes a fenced write fail after it has taken its
// locks, on a store with one connection, and checks that the connection does
// not go on inside the failed write's transaction: the next write commits
// and holds no lock, so another connection sees it and can claim the shard.
func TestFailedBatchRollsBack(t *testing.T) {
	t.Parallel()
	dsn := newDatabase(t)
	newStore(t, dsn)
	one, err := mysql.New(t.Context(), mysql.Config{DSN: dsn, MaxConns: 1})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, one.Close()) })
	other := open(t, dsn)
	ctx := t.Context()

	key := store.ShardKey{Namespace: "ns", Shard: 3}
	sh, err := one.ShardClaim(ctx, store.ShardClaimParams{Shard: key, Owner: "a", Now: time.Now()})
	require.NoError(t, err)
	f := store.Fence{Shard: key, Version: sh.Version}
	// Longer than the column: an error in strict mode, where a lax server
	// would have cut the id short.
	tooLong := testTimer(key, strings.Repeat("x", 256), time.Now())
	err = one.TimerCreate(ctx, f, tooLong)
	require.Error(t, err)
	require.NotErrorIs(t, err, store.ErrShardOwnershipLost)

	tm := testTimer(key, "after", time.Now())
	require.NoError(t, one.TimerCreate(ctx, f, tm))
	_, err = other.TimerGet(ctx, key, "after")
	require.NoError(t, err, "the write after a failed one must commit")
	_, err = other.ShardClaim(ctx, store.ShardClaimParams{Shard: key, Owner: "b", PrevVersion: f.Version, Now: time.Now()})
	require.NoError(t, err, "no lock of the failed write may remain")
}

func TestRetry(t *testing.T) {
	t.Parallel()
	deadlock := &gomysql.MySQLError{Number: 1213, Message: "deadlock"}
	duplicate := &gomysql.MySQLError{Number: 1062, Message: "duplicate"}
	other := errors.New("connection reset")
	for _, tc := range []struct {
		name      string
		errs      []error
		duplicate bool
		calls     int
		err       error
	}{
		{"deadlocks then success", []error{deadlock, deadlock, nil}, false, 3, nil},
		{"deadlocks until the bound", repeat(deadlock, 20), false, 8, deadlock},
		{"duplicate not retried", []error{duplicate, nil}, false, 1, duplicate},
		{"duplicate retried", []error{duplicate, nil}, true, 2, nil},
		{"other error not retried", []error{other, nil}, true, 1, other},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			calls := 0
			err := mysql.Retry(t.Context(), tc.duplicate, func() error {
				calls++
				return tc.errs[calls-1]
			})
			require.Equal(t, tc.calls, calls)
			require.Equal(t, tc.err, err)
		})
	}
}

func repeat(err error, n int) []error {
	out := make([]error, n)
	for i := range out {
		out[i] = err
	}
	return out
}

func testTimer(key store.ShardKey, id string, due time.Time) *timer.Timer {
	return &timer.Timer{
		Namespace: key.Namespace, ID: id, Shard: key.Shard, UUID: timer.UUIDOf(key.Namespace, id),
		ExecuteAt: due, DueAt: due, CallbackURL: "http://127.0.0.1/cb", CreatedAt: due, UpdatedAt: due,
		RetryPolicy: timer.RetryPolicy{MaxAttempts: 1, InitialInterval: time.Second, BackoffMultiplier: 1, MaxInterval: time.Second},
		Status:      timer.StatusPending,
	}
}
