package routing

import (
	"context"
	"errors"
	"fmt"

	"github.com/dtimer/dtimer/server/internal/engine"
	"github.com/dtimer/dtimer/server/internal/ownership"
	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/timer"
)

// Router serves timer operations on the engine of the timer's shard. Reads go
// to the store directly: any node can answer them.
type Router struct {
	shards map[string]int // namespace -> shard count
	owners *ownership.Controller
	store  store.Store
}

var _ Service = (*Router)(nil)

// New returns a router over the namespaces' shards.
func New(namespaces []ownership.Namespace, owners *ownership.Controller, st store.Store) *Router {
	r := &Router{shards: make(map[string]int, len(namespaces)), owners: owners, store: st}
	for _, ns := range namespaces {
		r.shards[ns.Name] = ns.NumShards
	}
	return r
}

func (r *Router) shardOf(k timer.Key) (store.ShardKey, error) {
	n, ok := r.shards[k.Namespace]
	if !ok {
		return store.ShardKey{}, fmt.Errorf("%w: %q", ErrNamespaceNotFound, k.Namespace)
	}
	return store.ShardKey{Namespace: k.Namespace, Shard: timer.ShardOf(k.ID, n)}, nil
}

func (r *Router) engine(k timer.Key) (*engine.Shard, error) {
	sk, err := r.shardOf(k)
	if err != nil {
		return nil, err
	}
	e, ok := r.owners.Engine(sk)
	if !ok {
		return nil, ErrShardUnavailable
	}
	return e, nil
}

// unavailable maps an engine that stopped under the call to a retryable error.
func unavailable(err error) error {
	if errors.Is(err, engine.ErrStopped) {
		return fmt.Errorf("%w: %w", ErrShardUnavailable, err)
	}
	return err
}

// Create implements Service.
func (r *Router) Create(ctx context.Context, t *timer.Timer) (*timer.Timer, error) {
	e, err := r.engine(t.Key())
	if err != nil {
		return nil, err
	}
	out, err := e.Create(ctx, t)
	return out, unavailable(err)
}

// Get implements Service.
func (r *Router) Get(ctx context.Context, k timer.Key) (*timer.Timer, error) {
	sk, err := r.shardOf(k)
	if err != nil {
		return nil, err
	}
	return r.store.TimerGet(ctx, sk, k.ID)
}

// Update implements Service.
func (r *Router) Update(ctx context.Context, k timer.Key, p timer.Patch) (*timer.Timer, error) {
	e, err := r.engine(k)
	if err != nil {
		return nil, err
	}
	out, err := e.Update(ctx, k.ID, p)
	return out, unavailable(err)
}

// Delete implements Service.
func (r *Router) Delete(ctx context.Context, k timer.Key) error {
	e, err := r.engine(k)
	if err != nil {
		return err
	}
	return unavailable(e.Delete(ctx, k.ID))
}

// Ready implements Service.
func (r *Router) Ready(ctx context.Context) error {
	if err := r.store.Ping(ctx); err != nil {
		return fmt.Errorf("store unreachable: %w", err)
	}
	return r.owners.Ready()
}
