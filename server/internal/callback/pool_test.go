package callback_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dtimer/dtimer/server/internal/callback"
)

func TestPoolBoundsConcurrency(t *testing.T) {
	t.Parallel()
	p := callback.NewPool(2)
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(2)
	for range 2 {
		require.NoError(t, p.Go(context.Background(), func() { started.Done(); <-release }))
	}
	started.Wait()
	require.Equal(t, 2, p.InUse())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, p.Go(ctx, func() { t.Error("ran past the bound") }), context.Canceled)
	close(release)
	done := make(chan struct{})
	require.NoError(t, p.Go(context.Background(), func() { close(done) }))
	<-done
}
