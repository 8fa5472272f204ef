package routing

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/dtimer/dtimer/server/internal/engine"
	"github.com/dtimer/dtimer/server/internal/membership"
	"github.com/dtimer/dtimer/server/internal/metrics"
	"github.com/dtimer/dtimer/server/internal/ownership"
	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/timer"
)

// Router serves timer writes on the engine of the timer's shard when this
// node owns it, and otherwise names the owner to forward to. Reads go to the
// store directly: any node can answer them.
type Router struct {
	namespaces []ownership.Namespace
	shards     map[string]int // namespace -> shard count
	owners     *ownership.Controller
	assigner   ownership.Assigner
	members    membership.Membership
	store      store.Store
	metrics    *metrics.Metrics
	client     *http.Client
}

var _ Service = (*Router)(nil)

// forwardTimeout bounds one forwarded call.
const forwardTimeout = 30 * time.Second

// forwardTransport keeps enough idle connections per peer that a burst of
// forwarded calls reuses them instead of opening (and leaving in TIME_WAIT)
// one connection per call.
func forwardTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 1024
	t.MaxIdleConnsPerHost = 256
	return t
}

// New returns a router over the namespaces' shards.
func New(namespaces []ownership.Namespace, owners *ownership.Controller, assigner ownership.Assigner,
	members membership.Membership, st store.Store, m *metrics.Metrics) *Router {
	r := &Router{
		namespaces: namespaces, shards: make(map[string]int, len(namespaces)),
		owners: owners, assigner: assigner, members: members, store: st, metrics: m,
		client: &http.Client{Timeout: forwardTimeout, Transport: forwardTransport()},
	}
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

// engine finds where a write of k is served: here, at another node
// (*NotLocalError), or nowhere right now (ErrShardUnavailable).
func (r *Router) engine(ctx context.Context, k timer.Key) (*engine.Shard, error) {
	sk, err := r.shardOf(k)
	if err != nil {
		return nil, err
	}
	if e, ok := r.owners.Engine(sk); ok {
		return e, nil
	}
	if IsForwarded(ctx) {
		return nil, ErrShardUnavailable // one hop at most
	}
	owner := r.assigner.Owner(sk)
	if owner == "" || owner == r.members.Local().Name {
		return nil, ErrShardUnavailable // being claimed here
	}
	for _, m := range r.members.Members() {
		if m.Name == owner && m.Live() && m.HTTPAddress != "" {
			return nil, &NotLocalError{Node: owner, HTTPAddress: m.HTTPAddress}
		}
	}
	return nil, ErrShardUnavailable
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
	e, err := r.engine(ctx, t.Key())
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
	e, err := r.engine(ctx, k)
	if err != nil {
		return nil, err
	}
	out, err := e.Update(ctx, k.ID, p)
	return out, unavailable(err)
}

// Delete implements Service.
func (r *Router) Delete(ctx context.Context, k timer.Key) error {
	e, err := r.engine(ctx, k)
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

// maxRelayed bounds the answer read from an owner.
const maxRelayed = 4 << 20

// Forward implements Service.
func (r *Router) Forward(ctx context.Context, to *NotLocalError, path string, body []byte) (*Relayed, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+to.HTTPAddress+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(ForwardedHeader, r.members.Local().Name)
	resp, err := r.client.Do(req)
	if err != nil {
		r.metrics.Forwarded.WithLabelValues("unavailable").Inc()
		return nil, fmt.Errorf("%w: forwarding to %s: %w", ErrShardUnavailable, to.Node, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxRelayed))
	if err != nil {
		r.metrics.Forwarded.WithLabelValues("unavailable").Inc()
		return nil, fmt.Errorf("%w: reading the answer of %s: %w", ErrShardUnavailable, to.Node, err)
	}
	r.metrics.Forwarded.WithLabelValues("ok").Inc()
	return &Relayed{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

// Cluster implements Service.
func (r *Router) Cluster(ctx context.Context) (*ClusterView, error) {
	v := &ClusterView{Node: r.members.Local().Name, Members: r.members.Members()}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for _, ns := range r.namespaces {
		nv := NamespaceView{Name: ns.Name, NumShards: ns.NumShards, Shards: make([]ShardView, ns.NumShards)}
		for i := range ns.NumShards {
			k := store.ShardKey{Namespace: ns.Name, Shard: i}
			g.Go(func() error {
				sv := ShardView{Shard: i, AssignedTo: r.assigner.Owner(k)}
				sh, err := r.store.ShardGet(gctx, k)
				switch {
				case err == nil:
					sv.Owner, sv.Version, sv.ClaimedAt = sh.Owner, sh.Version, sh.ClaimedAt
				case !errors.Is(err, store.ErrShardNotFound):
					return err
				}
				nv.Shards[i] = sv // each goroutine its own element
				return nil
			})
		}
		v.Namespaces = append(v.Namespaces, nv)
	}
	if err := g.Wait(); err != nil {
		return nil, fmt.Errorf("reading shard claims: %w", err)
	}
	return v, nil
}
