package storetest

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dtimer/dtimer/server/internal/store"
)

// MigrateConcurrently migrates one new location (schema, table, database)
// from several stores at once, as nodes starting together do, and then uses
// every store. open opens another store on that same, not yet migrated,
// location each time it is called.
func MigrateConcurrently(t *testing.T, open func() store.Store) {
	t.Helper()
	stores := []store.Store{open(), open(), open()}
	var wg sync.WaitGroup
	errs := make([]error, len(stores))
	for i, s := range stores {
		wg.Go(func() { errs[i] = s.Migrate(t.Context()) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	for i, s := range stores {
		_, err := s.ShardClaim(t.Context(), store.ShardClaimParams{
			Shard: store.ShardKey{Namespace: "ns", Shard: i}, Owner: "n", Now: time.Now(),
		})
		require.NoError(t, err)
	}
	_, err := stores[1].ShardGet(t.Context(), store.ShardKey{Namespace: "ns", Shard: 0})
	require.NoError(t, err)
}
