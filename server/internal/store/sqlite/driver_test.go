package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/store/sqlite"
	"github.com/dtimer/dtimer/server/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		st, err := sqlite.Open(sqlite.Config{Path: filepath.Join(t.TempDir(), "dtimer.db")})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, st.Close()) })
		require.NoError(t, st.Migrate(context.Background()))
		return st
	})
}

func TestReopenKeepsData(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "dtimer.db")
	st, err := sqlite.Open(sqlite.Config{Path: path})
	require.NoError(t, err)
	require.NoError(t, st.Migrate(context.Background()))
	k := store.ShardKey{Namespace: "n", Shard: 1}
	_, err = st.ShardClaim(context.Background(), store.ShardClaimParams{Shard: k, Owner: "a"})
	require.NoError(t, err)
	require.NoError(t, st.Close())

	st, err = sqlite.Open(sqlite.Config{Path: path})
	require.NoError(t, err)
	defer st.Close()
	require.NoError(t, st.Migrate(context.Background()), "migrating an existing file is a no-op")
	sh, err := st.ShardGet(context.Background(), k)
	require.NoError(t, err)
	require.Equal(t, int64(1), sh.Version)
}

func TestOpenRejectsBadSynchronous(t *testing.T) {
	t.Parallel()
	_, err := sqlite.Open(sqlite.Config{Path: filepath.Join(t.TempDir(), "x.db"), Synchronous: "OFF"})
	require.ErrorContains(t, err, "synchronous")
}
