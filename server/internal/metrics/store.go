package metrics

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/timer"
)

// InstrumentStore wraps s so that every operation is counted by kind and
// result and timed: the benchmark derives "statements per fired timer" from
// these counters.
func InstrumentStore(s store.Store, m *Metrics) store.Store {
	return &instrumented{Store: s, m: m}
}

type instrumented struct {
	store.Store
	m *Metrics
}

func (i *instrumented) observe(op string, start time.Time, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	i.m.DBOps.With(prometheus.Labels{"op": op, "result": result}).Inc()
	i.m.DBLatency.WithLabelValues(op).Observe(time.Since(start).Seconds())
}

func (i *instrumented) ShardGet(ctx context.Context, k store.ShardKey) (*store.Shard, error) {
	start := time.Now()
	s, err := i.Store.ShardGet(ctx, k)
	i.observe("shard_get", start, ignore(err, store.ErrShardNotFound))
	return s, err
}

func (i *instrumented) ShardClaim(ctx context.Context, p store.ShardClaimParams) (*store.Shard, error) {
	start := time.Now()
	s, err := i.Store.ShardClaim(ctx, p)
	i.observe("shard_claim", start, err)
	return s, err
}

func (i *instrumented) ShardRelease(ctx context.Context, f store.Fence) error {
	start := time.Now()
	err := i.Store.ShardRelease(ctx, f)
	i.observe("shard_release", start, err)
	return err
}

func (i *instrumented) TimerCreate(ctx context.Context, f store.Fence, t *timer.Timer) error {
	start := time.Now()
	err := i.Store.TimerCreate(ctx, f, t)
	i.observe("timer_create", start, err)
	return err
}

func (i *instrumented) TimerUpdate(ctx context.Context, f store.Fence, p store.TimerUpdateParams) error {
	start := time.Now()
	err := i.Store.TimerUpdate(ctx, f, p)
	i.observe("timer_update", start, ignore(err, store.ErrTimerNotFound))
	return err
}

func (i *instrumented) TimerGet(ctx context.Context, k store.ShardKey, id string) (*timer.Timer, error) {
	start := time.Now()
	t, err := i.Store.TimerGet(ctx, k, id)
	i.observe("timer_get", start, ignore(err, store.ErrTimerNotFound))
	return t, err
}

func (i *instrumented) TimerDelete(ctx context.Context, f store.Fence, id string) error {
	start := time.Now()
	err := i.Store.TimerDelete(ctx, f, id)
	i.observe("timer_delete", start, ignore(err, store.ErrTimerNotFound))
	return err
}

func (i *instrumented) TimerGetWindow(ctx context.Context, p store.TimerGetWindowParams) ([]*timer.Timer, error) {
	start := time.Now()
	ts, err := i.Store.TimerGetWindow(ctx, p)
	i.observe("timer_get_window", start, err)
	return ts, err
}

func (i *instrumented) TimerDeleteRange(ctx context.Context, f store.Fence, p store.TimerDeleteRangeParams) (int, error) {
	start := time.Now()
	n, err := i.Store.TimerDeleteRange(ctx, f, p)
	i.observe("timer_delete_range", start, err)
	return n, err
}

// ignore treats an expected answer as success.
func ignore(err, expected error) error {
	if errors.Is(err, expected) {
		return nil
	}
	return err
}
