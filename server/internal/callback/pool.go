package callback

import "context"

// Pool bounds how many callbacks a node runs at once, across all its shards.
// A shard engine that finds it full waits, which is the back-pressure that
// keeps a burst from opening unbounded connections.
type Pool struct{ slots chan struct{} }

// NewPool returns a pool of n slots.
func NewPool(n int) *Pool { return &Pool{slots: make(chan struct{}, n)} }

// Go runs fn in a new goroutine once a slot is free, or returns ctx's error
// without running it.
func (p *Pool) Go(ctx context.Context, fn func()) error {
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	go func() {
		defer func() { <-p.slots }()
		fn()
	}()
	return nil
}

// InUse is the number of running callbacks.
func (p *Pool) InUse() int { return len(p.slots) }
