package e2e_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dtimer/dtimer/server/internal/store/storetest"
)

// driver is a store driver the server can run on.
type driver struct {
	name string
	// store returns the server environment of a fresh store that no other
	// test uses, and removes the store when the test ends. It skips the test
	// when the driver's database server is not configured.
	store func(t *testing.T) []string
	// maxPayload, when not 0, is about the largest payload one row of the
	// database holds, below the API's 1 MiB body limit: larger ones are
	// refused with 413 PAYLOAD_TOO_LARGE.
	maxPayload int
}

var drivers = []driver{
	{name: "sqlite", store: sqliteStore},
	{name: "postgres", store: postgresStore},
	{name: "mysql", store: mysqlStore},
	{name: "dynamodb", store: dynamodbStore, maxPayload: 190 << 10},
	{name: "cassandra", store: cassandraStore},
	{name: "mongodb", store: mongodbStore},
}

// forEachDriver runs fn as a subtest per driver, in parallel with other
// parallel tests when parallel is set.
func forEachDriver(t *testing.T, parallel bool, fn func(t *testing.T, d driver)) {
	t.Helper()
	for _, d := range drivers {
		t.Run(d.name, func(t *testing.T) {
			if parallel {
				t.Parallel()
			}
			fn(t, d)
		})
	}
}

// sqliteStore is a database file of its own; restarts reuse it.
func sqliteStore(t *testing.T) []string {
	return []string{
		"DTIMER_STORE_DRIVER=sqlite",
		"DTIMER_STORE_SQLITE_PATH=" + filepath.Join(t.TempDir(), "dtimer.db"),
	}
}

// postgresStore is a schema of its own in the database of
// DTIMER_TEST_POSTGRES_URL; the server creates it at migration, the cleanup
// drops it.
func postgresStore(t *testing.T) []string {
	url := storetest.EnvOrSkip(t, "DTIMER_TEST_POSTGRES_URL")
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "e2e_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return []string{
		"DTIMER_STORE_DRIVER=postgres",
		"DTIMER_STORE_POSTGRES_URL=" + url,
		"DTIMER_STORE_POSTGRES_SCHEMA=" + schema,
		// Many servers run at once against one test database; the load
		// tests, which run alone, go back to the default.
		"DTIMER_STORE_POSTGRES_MAX_CONNS=8",
	}
}
