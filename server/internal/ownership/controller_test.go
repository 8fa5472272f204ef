package ownership_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/dtimer/dtimer/server/internal/callback"
	"github.com/dtimer/dtimer/server/internal/engine"
	"github.com/dtimer/dtimer/server/internal/metrics"
	"github.com/dtimer/dtimer/server/internal/ownership"
	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/store/sqlite"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

// assigner is a membership view a test can change.
type assigner struct {
	mu     sync.Mutex
	owners map[store.ShardKey]string
	def    string
}

func (a *assigner) Owner(k store.ShardKey) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if o, ok := a.owners[k]; ok {
		return o
	}
	return a.def
}

func (a *assigner) set(k store.ShardKey, node string) {
	a.mu.Lock()
	a.owners[k] = node
	a.mu.Unlock()
}

type bundle struct {
	st   store.Store
	ctrl *ownership.Controller
	as   *assigner
}

func setup(t *testing.T) *bundle {
	t.Helper()
	st, err := sqlite.Open(sqlite.Config{Path: filepath.Join(t.TempDir(), "own.db"), Synchronous: "NORMAL"})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	require.NoError(t, st.Migrate(context.Background()))
	log := zaptest.NewLogger(t)
	pool := callback.NewPool(8)
	t.Cleanup(pool.Close) // after the controller's stop, registered later
	deps := engine.Deps{
		Store: st, Clock: clockwork.NewRealClock(), Pool: pool, Logger: log,
		Metrics: metrics.New(prometheus.NewRegistry()), Firer: callback.NewClient(8),
	}
	as := &assigner{owners: map[store.ShardKey]string{}, def: "node-a"}
	ctrl := ownership.New(ownership.Config{
		Node:       "node-a",
		Namespaces: []ownership.Namespace{{Name: "n1", NumShards: 3}, {Name: "n2", NumShards: 2}},
		Engine: engine.Config{
			MinLookAhead: time.Second, MaxLookAhead: time.Minute, BatchReadLimit: 10, QueueSize: 100,
			DeleteBatch: 10, DeleteInterval: time.Second, StoreRetryMin: 10 * time.Millisecond, StoreRetryMax: 100 * time.Millisecond,
		},
		DrainTimeout: time.Second, ClaimRetryMin: 10 * time.Millisecond, ClaimRetryMax: 100 * time.Millisecond,
	}, deps, as, log)
	ctrl.Start()
	t.Cleanup(func() { ctrl.Stop(context.Background()) })
	return &bundle{st: st, ctrl: ctrl, as: as}
}

func (b *bundle) shard(t *testing.T, k store.ShardKey) *store.Shard {
	t.Helper()
	sh, err := b.st.ShardGet(context.Background(), k)
	require.NoError(t, err)
	return sh
}

func TestClaimsEveryAssignedShardAndReleasesOnStop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Eventually(t, func() bool { return b.ctrl.Ready() == nil }, 10*time.Second, 5*time.Millisecond)
	for _, k := range []store.ShardKey{{Namespace: "n1", Shard: 0}, {Namespace: "n1", Shard: 1}, {Namespace: "n1", Shard: 2}, {Namespace: "n2", Shard: 0}, {Namespace: "n2", Shard: 1}} {
		e, ok := b.ctrl.Engine(k)
		require.True(t, ok, k)
		sh := b.shard(t, k)
		require.Equal(t, "node-a", sh.Owner)
		require.Equal(t, sh.Version, e.Fence().Version)
	}
	_, ok := b.ctrl.Engine(store.ShardKey{Namespace: "n2", Shard: 2})
	require.False(t, ok, "no such shard")

	b.ctrl.Stop(context.Background())
	for _, k := range []store.ShardKey{{Namespace: "n1", Shard: 0}, {Namespace: "n2", Shard: 1}} {
		_, ok := b.ctrl.Engine(k)
		require.False(t, ok)
		sh := b.shard(t, k)
		require.Empty(t, sh.Owner, "released")
		require.Equal(t, int64(1), sh.Version, "release keeps the version")
	}
}

func TestReclaimsAShardItWasFencedOutOf(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := store.ShardKey{Namespace: "n1", Shard: 1}
	require.Eventually(t, func() bool { return b.ctrl.Ready() == nil }, 10*time.Second, 5*time.Millisecond)
	first, _ := b.ctrl.Engine(k)

	// Someone else claims it; the engine finds out at its next write.
	_, err := b.st.ShardClaim(context.Background(), store.ShardClaimParams{Shard: k, Owner: "intruder", PrevVersion: 1, Now: time.Now()})
	require.NoError(t, err)
	err = first.Delete(context.Background(), "any")
	require.ErrorIs(t, err, engine.ErrStopped)
	require.ErrorIs(t, err, store.ErrShardOwnershipLost)

	// Still assigned here, so the controller claims it back over the intruder.
	require.Eventually(t, func() bool {
		e, ok := b.ctrl.Engine(k)
		return ok && e != first && e.Fence().Version == 3
	}, 10*time.Second, 5*time.Millisecond)
	sh := b.shard(t, k)
	require.Equal(t, "node-a", sh.Owner)
	require.Equal(t, int64(3), sh.Version)
}

func TestReleasesAShardNoLongerAssigned(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := store.ShardKey{Namespace: "n2", Shard: 0}
	require.Eventually(t, func() bool { return b.ctrl.Ready() == nil }, 10*time.Second, 5*time.Millisecond)
	b.as.set(k, "node-b")
	b.ctrl.Reassign()
	require.Eventually(t, func() bool {
		_, ok := b.ctrl.Engine(k)
		return !ok && b.shard(t, k).Owner == ""
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, b.ctrl.Ready(), "ready means every shard assigned here is owned")

	b.as.set(k, "node-a")
	b.ctrl.Reassign()
	require.Eventually(t, func() bool {
		e, ok := b.ctrl.Engine(k)
		return ok && e.Fence().Version == 2
	}, 10*time.Second, 5*time.Millisecond)
}
