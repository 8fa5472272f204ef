package ownership

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"

	"github.com/dtimer/dtimer/server/internal/engine"
	"github.com/dtimer/dtimer/server/internal/metrics"
	"github.com/dtimer/dtimer/server/internal/store"
)

// Namespace is a namespace and its fixed shard count.
type Namespace struct {
	Name      string
	NumShards int
}

// Assigner names the node that should own a shard.
type Assigner interface {
	Owner(shard store.ShardKey) string
}

// Everything assigns every shard to one node: a cluster of one.
type Everything string

// Owner implements Assigner.
func (e Everything) Owner(store.ShardKey) string { return string(e) }

// Config configures a Controller.
type Config struct {
	Node       string
	Namespaces []Namespace
	Engine     engine.Config
	// DrainTimeout bounds how long a stopping engine waits for its callbacks.
	DrainTimeout time.Duration
	// ClaimRetryMin and ClaimRetryMax bound the backoff of a failing claim.
	ClaimRetryMin time.Duration
	ClaimRetryMax time.Duration
	// IsLive reports whether a node is still a member. A shard whose owner is
	// live is claimed only once that owner released it, or after
	// HandoffTimeout: the owner's callbacks in flight then finish and persist
	// their outcomes under its claim. Nil: every other owner is taken over
	// at once, unless it just fenced this node out (see claim).
	IsLive         func(node string) bool
	HandoffTimeout time.Duration
}

// handoffPoll is how often a claimer re-reads a shard its live owner has not
// released yet.
const handoffPoll = 50 * time.Millisecond

// Controller runs the shard workers of a node.
type Controller struct {
	cfg      Config
	deps     engine.Deps
	assigner Assigner
	log      *zap.Logger
	m        *metrics.Metrics
	clock    clockwork.Clock

	mu      sync.RWMutex
	engines map[store.ShardKey]*engine.Shard
	changed chan struct{}   // closed and replaced when the assignment may have changed
	stopCtx context.Context // set by Stop: bounds the drain of every engine

	ctx    context.Context // ends with Stop
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New returns a controller that runs engines with deps; Start runs it.
func New(cfg Config, deps engine.Deps, assigner Assigner, log *zap.Logger) *Controller {
	return &Controller{
		cfg: cfg, deps: deps, assigner: assigner,
		log: log, m: deps.Metrics, clock: deps.Clock,
		engines: make(map[store.ShardKey]*engine.Shard),
		changed: make(chan struct{}),
	}
}

// Start starts one worker per shard of every namespace.
func (c *Controller) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	c.ctx, c.cancel = ctx, cancel
	for _, ns := range c.cfg.Namespaces {
		for i := 0; i < ns.NumShards; i++ {
			k := store.ShardKey{Namespace: ns.Name, Shard: i}
			c.wg.Add(1)
			go func() {
				defer c.wg.Done()
				c.work(ctx, k)
			}()
		}
	}
}

// Reassign tells the workers that the Assigner's answers may have changed.
func (c *Controller) Reassign() {
	c.mu.Lock()
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

// Stop stops every engine (each draining its callbacks within ctx) and
// releases the shards.
func (c *Controller) Stop(ctx context.Context) {
	if c.cancel == nil {
		return
	}
	c.mu.Lock()
	c.stopCtx = ctx
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
}

// WaitReleased waits until this node runs no engine (after a drain made it
// want none), or ctx ends.
func (c *Controller) WaitReleased(ctx context.Context) {
	for {
		c.mu.RLock()
		n := len(c.engines)
		c.mu.RUnlock()
		if n == 0 {
			return
		}
		select {
		case <-c.clock.After(20 * time.Millisecond):
		case <-ctx.Done():
			return
		}
	}
}

// Engine returns the running engine of a shard this node owns.
func (c *Controller) Engine(k store.ShardKey) (*engine.Shard, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	e, ok := c.engines[k]
	return e, ok
}

// Ready reports whether every shard assigned to this node is owned.
func (c *Controller) Ready() error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	missing := 0
	for _, ns := range c.cfg.Namespaces {
		for i := 0; i < ns.NumShards; i++ {
			k := store.ShardKey{Namespace: ns.Name, Shard: i}
			if c.assigner.Owner(k) == c.cfg.Node {
				if _, ok := c.engines[k]; !ok {
					missing++
				}
			}
		}
	}
	if missing > 0 {
		return fmt.Errorf("%d assigned shards not yet owned", missing)
	}
	return nil
}

func (c *Controller) wanted(k store.ShardKey) (bool, <-chan struct{}) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.assigner.Owner(k) == c.cfg.Node, c.changed
}

// work is the state machine of one shard (doc.go).
func (c *Controller) work(ctx context.Context, k store.ShardKey) {
	log := c.log.With(zap.String("namespace", k.Namespace), zap.Int("shard", k.Shard))
	fencedOut := false // the last engine was stopped by a newer claim
	for {
		want, changed := c.wanted(k)
		if !want {
			select {
			case <-changed:
				continue
			case <-ctx.Done():
				return
			}
		}
		wantedAt := c.clock.Now()
		fence, ok := c.claim(ctx, k, fencedOut, log)
		if !ok {
			if ctx.Err() != nil {
				return
			}
			continue // no longer wanted
		}
		eng := engine.Start(fence, c.cfg.Engine, c.deps)
		c.publish(k, eng)
		c.m.OwnershipGained.Inc()
		c.m.ShardsOwned.Inc()
		c.m.Handoff.Observe(c.clock.Since(wantedAt).Seconds())
		log.Info("shard owned", zap.Int64("version", fence.Version))

		lost := false
	owned:
		for {
			want, changed := c.wanted(k)
			if !want {
				break
			}
			select {
			case <-changed:
			case <-eng.Lost():
				lost = true
				break owned
			case <-ctx.Done():
				break owned
			}
		}
		c.unpublish(k)
		c.release(eng, lost, log)
		fencedOut = lost
		if ctx.Err() != nil {
			return
		}
	}
}

// claim takes the shard at the version after the one it reads, retrying
// with backoff, for as long as the shard is wanted. Another node's claim is
// respected for up to HandoffTimeout when that node is live, or when it has
// just fenced this one out: a node it cannot see (a partition, or views not
// yet converged) would otherwise be fenced back at once, and the two would
// take the shard from each other at the rate of their writes.
func (c *Controller) claim(ctx context.Context, k store.ShardKey, fencedOut bool, log *zap.Logger) (store.Fence, bool) {
	var waitingSince time.Time
	for failures := 0; ; failures++ {
		if want, _ := c.wanted(k); !want || ctx.Err() != nil {
			return store.Fence{}, false
		}
		var prev int64
		sh, err := c.deps.Store.ShardGet(ctx, k)
		switch {
		case err == nil:
			prev = sh.Version
			if sh.Owner != "" && sh.Owner != c.cfg.Node && (fencedOut || c.cfg.IsLive != nil && c.cfg.IsLive(sh.Owner)) {
				if waitingSince.IsZero() {
					waitingSince = c.clock.Now()
				}
				if c.clock.Since(waitingSince) < c.cfg.HandoffTimeout {
					failures = -1 // waiting for a release is no failure
					if !c.pause(ctx, handoffPoll) {
						return store.Fence{}, false
					}
					continue
				}
				log.Warn("owner did not release the shard in time; taking it over",
					zap.String("owner", sh.Owner), zap.Bool("fencedOut", fencedOut), zap.Duration("waited", c.clock.Since(waitingSince)))
			}
		case errors.Is(err, store.ErrShardNotFound):
		default:
			log.Warn("reading shard for a claim failed; retrying", zap.Error(err))
			if !c.sleep(ctx, failures) {
				return store.Fence{}, false
			}
			continue
		}
		claimed, err := c.deps.Store.ShardClaim(ctx, store.ShardClaimParams{Shard: k, Owner: c.cfg.Node, PrevVersion: prev, Now: c.clock.Now()})
		if err == nil {
			return store.Fence{Shard: k, Version: claimed.Version}, true
		}
		if errors.Is(err, store.ErrShardVersionConflict) {
			c.m.ClaimConflicts.Inc()
			log.Info("shard claim lost to a concurrent claim; retrying", zap.Int64("prevVersion", prev))
		} else {
			log.Warn("shard claim failed; retrying", zap.Error(err))
		}
		if !c.sleep(ctx, failures) {
			return store.Fence{}, false
		}
	}
}

func (c *Controller) sleep(ctx context.Context, failures int) bool {
	d := c.cfg.ClaimRetryMin << min(failures, 16)
	if d <= 0 || d > c.cfg.ClaimRetryMax {
		d = c.cfg.ClaimRetryMax
	}
	return c.pause(ctx, d)
}

// pause waits d, or less if the assignment may have changed.
func (c *Controller) pause(ctx context.Context, d time.Duration) bool {
	_, changed := c.wanted(store.ShardKey{})
	select {
	case <-c.clock.After(d):
		return true
	case <-changed:
		return true
	case <-ctx.Done():
		return false
	}
}

func (c *Controller) publish(k store.ShardKey, e *engine.Shard) {
	c.mu.Lock()
	c.engines[k] = e
	c.mu.Unlock()
}

func (c *Controller) unpublish(k store.ShardKey) {
	c.mu.Lock()
	delete(c.engines, k)
	c.mu.Unlock()
}

// release stops the engine and, unless it was fenced out, gives up the claim.
func (c *Controller) release(eng *engine.Shard, lost bool, log *zap.Logger) {
	c.mu.RLock()
	ctx := c.stopCtx
	c.mu.RUnlock()
	if ctx == nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), c.cfg.DrainTimeout)
		defer cancel()
	}
	eng.Stop(ctx)
	c.m.ShardsOwned.Dec()
	c.m.OwnershipLost.Inc()
	if lost {
		log.Warn("shard lost to a newer claim")
		return
	}
	// Release even if draining used up ctx: it is one short write.
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.deps.Store.ShardRelease(rctx, eng.Fence()); err != nil && !errors.Is(err, store.ErrShardOwnershipLost) {
		log.Warn("releasing shard failed; the next owner claims it anyway", zap.Error(err))
		return
	}
	log.Info("shard released", zap.Int64("version", eng.Fence().Version))
}
