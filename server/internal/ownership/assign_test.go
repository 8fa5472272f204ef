package ownership_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dtimer/dtimer/server/internal/membership"
	"github.com/dtimer/dtimer/server/internal/ownership"
	"github.com/dtimer/dtimer/server/internal/store"
)

func keys(n int) []store.ShardKey {
	var ks []store.ShardKey
	for _, ns := range []string{"default", "orders"} {
		for i := range n {
			ks = append(ks, store.ShardKey{Namespace: ns, Shard: i})
		}
	}
	return ks
}

func TestRendezvousNodesWithTheSameViewAgree(t *testing.T) {
	t.Parallel()
	a := ownership.NewRendezvous("n1", "n2", "n3")
	b := ownership.NewRendezvous("n3", "n1", "n2", "n1")
	for _, k := range keys(512) {
		require.Equal(t, a.Owner(k), b.Owner(k), k)
	}
	require.Equal(t, "", ownership.NewRendezvous().Owner(store.ShardKey{Namespace: "x"}), "no eligible node")
}

func TestRendezvousSpreadsAndMovesAboutOneNth(t *testing.T) {
	t.Parallel()
	ks := keys(1024)
	r := ownership.NewRendezvous("n1", "n2", "n3")
	before := map[store.ShardKey]string{}
	count := map[string]int{}
	for _, k := range ks {
		before[k] = r.Owner(k)
		count[before[k]]++
	}
	for n, c := range count {
		share := float64(c) / float64(len(ks))
		require.InDelta(t, 1.0/3, share, 0.05, "%s owns %.1f%%", n, 100*share)
	}

	// A fourth node takes about a quarter, every moved shard to it.
	require.True(t, r.Set([]string{"n1", "n2", "n3", "n4"}))
	mid := map[store.ShardKey]string{}
	moved := 0
	for _, k := range ks {
		mid[k] = r.Owner(k)
		if mid[k] != before[k] {
			require.Equal(t, "n4", mid[k], "a join moves shards only to the new node")
			moved++
		}
	}
	require.InDelta(t, 0.25, float64(moved)/float64(len(ks)), 0.05)

	// Removing n2 moves only n2's shards.
	require.True(t, r.Set([]string{"n1", "n3", "n4"}))
	for _, k := range ks {
		if mid[k] != "n2" {
			require.Equal(t, mid[k], r.Owner(k), "only shards of the departed node move")
		} else {
			require.NotEqual(t, "n2", r.Owner(k))
		}
	}
	require.False(t, r.Set([]string{"n4", "n3", "n1"}), "same set, no change")
}

func TestEligibleSkipsDrainingAndDeparted(t *testing.T) {
	t.Parallel()
	got := ownership.Eligible([]membership.Member{
		{Name: "a", State: membership.StateAlive},
		{Name: "b", State: membership.StateSuspect},
		{Name: "c", State: membership.StateAlive, Draining: true},
		{Name: "d", State: membership.StateDead},
		{Name: "e", State: membership.StateLeft},
	})
	require.Equal(t, []string{"a", "b"}, got)
}
