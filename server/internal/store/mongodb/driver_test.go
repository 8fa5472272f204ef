package mongodb_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.uber.org/goleak"

	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/store/mongodb"
	"github.com/dtimer/dtimer/server/internal/store/storetest"
)

// uriEnv names the server the tests run against; scripts/testdb/mongodb.sh
// starts one (FerretDB) and prints its URI.
const uriEnv = "DTIMER_TEST_MONGODB_URI"

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestDriver(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) store.Store {
		return newStore(t, newDatabase(t))
	})
}

// TestMigrateTwoNodes migrates one database from several stores at once, as
// nodes starting together do, the collection not existing yet.
func TestMigrateTwoNodes(t *testing.T) {
	t.Parallel()
	db := newDatabase(t)
	storetest.MigrateConcurrently(t, func() store.Store { return open(t, db) })
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const uri = "mongodb://u:secret@127.0.0.1:1/"
	for name, cfg := range map[string]mongodb.Config{
		"no uri":                {},
		"not a mongodb uri":     {URI: "postgres://u:secret@127.0.0.1:1/x"},
		"bad uri option":        {URI: uri + "?w=majority&readPreference=bogus"},
		"secondary reads":       {URI: uri + "?readPreference=secondary"},
		"unacknowledged writes": {URI: uri + "?w=0"},
		"bad database":          {URI: uri, Database: "a.b"},
		"bad collection":        {URI: uri, Collection: "system.x"},
		"bad write concern":     {URI: uri, WriteConcern: "0"},
		"bad read concern":      {URI: uri, ReadConcern: "snapshot"},
	} {
		_, err := mongodb.New(ctx, cfg)
		require.Error(t, err, name)
		require.NotContains(t, err.Error(), "secret", name)
	}
}

// newDatabase returns a fresh database name, dropped when the test ends, so
// that tests run in parallel and leave nothing behind.
func newDatabase(t *testing.T) string {
	t.Helper()
	uri := storetest.EnvOrSkip(t, uriEnv)
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	db := "t_" + hex.EncodeToString(b)
	// Registered before the stores' Close, so it runs after them.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		client, err := mongo.Connect(options.Client().ApplyURI(uri))
		if err != nil {
			t.Errorf("drop database %s: %v", db, err)
			return
		}
		defer func() { _ = client.Disconnect(ctx) }()
		if err := client.Database(db).Drop(ctx); err != nil {
			t.Errorf("drop database %s: %v", db, err)
		}
	})
	return db
}

// open returns a store on database db, closed when the test ends.
func open(t *testing.T, db string) *mongodb.Store {
	t.Helper()
	s, err := mongodb.New(t.Context(), mongodb.Config{URI: storetest.EnvOrSkip(t, uriEnv), Database: db, MaxPoolSize: 16})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

// newStore returns a migrated store on database db.
func newStore(t *testing.T, db string) *mongodb.Store {
	t.Helper()
	s := open(t, db)
	require.NoError(t, s.Migrate(t.Context()))
	return s
}
