package callback

import (
	"context"
	"sync"
	"time"
)

// Pool bounds how many callbacks a node runs at once, across all its shards.
// A shard engine that finds it full waits, which is the back-pressure that
// keeps a burst from opening unbounded connections.
//
// Callbacks run on worker goroutines that stay for a while after their
// callback: a new goroutine per callback would grow its stack from scratch
// for every HTTP request, which showed as a few percent of a burst's CPU.
type Pool struct {
	slots   chan struct{} // one per running callback
	work    chan func()   // hands a callback to an idle worker
	quit    chan struct{}
	close   sync.Once
	workers sync.WaitGroup
}

// workerIdle is how long a worker waits for another callback before it
// exits.
const workerIdle = 10 * time.Second

// NewPool returns a pool of n slots.
func NewPool(n int) *Pool {
	return &Pool{slots: make(chan struct{}, n), work: make(chan func()), quit: make(chan struct{})}
}

// Go runs fn on a worker once a slot is free, or returns ctx's error without
// running it.
func (p *Pool) Go(ctx context.Context, fn func()) error {
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case p.work <- fn:
	default:
		// No worker is idle. Workers are bounded by the slots: one starts
		// only while its callback holds a slot.
		p.workers.Add(1)
		go p.worker(fn)
	}
	return nil
}

func (p *Pool) worker(fn func()) {
	defer p.workers.Done()
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		fn()
		<-p.slots
		idle.Reset(workerIdle)
		select {
		case fn = <-p.work:
		case <-idle.C:
			return
		case <-p.quit:
			return
		}
	}
}

// InUse is the number of running callbacks.
func (p *Pool) InUse() int { return len(p.slots) }

// Close waits for the running callbacks and stops the idle workers. Callbacks
// handed to Go after Close still run, each on a worker that then exits.
func (p *Pool) Close() {
	p.close.Do(func() { close(p.quit) })
	p.workers.Wait()
}
