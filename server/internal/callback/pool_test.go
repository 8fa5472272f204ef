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

// Workers are reused, and Close leaves none behind (the packages that use a
// pool check for leaked goroutines).
func TestPoolCloseWaitsForCallbacks(t *testing.T) {
	t.Parallel()
	p := callback.NewPool(4)
	var ran sync.WaitGroup
	release := make(chan struct{})
	ran.Add(8)
	for i := range 8 {
		require.NoError(t, p.Go(context.Background(), func() { <-release; ran.Done() }))
		if i == 3 {
			require.Equal(t, 4, p.InUse())
			close(release) // the next four wait for these to finish
		}
	}
	ran.Wait()
	p.Close()
	require.Equal(t, 0, p.InUse())
}
