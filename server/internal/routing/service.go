// Package routing maps a timer to its shard and the shard to the engine that
// owns it, and serves the API's timer operations there.
package routing

import (
	"context"
	"errors"

	"github.com/dtimer/dtimer/server/internal/timer"
)

// Service is what the HTTP API calls. Errors are store.ErrTimerNotFound,
// ErrNamespaceNotFound, ErrShardUnavailable (retry later) or an internal
// error.
type Service interface {
	// Create stores t (upsert by namespace and id). The caller fills every
	// field but Shard, UUID, DueAt, CreatedAt, UpdatedAt, Attempts and Status.
	Create(ctx context.Context, t *timer.Timer) (*timer.Timer, error)
	Get(ctx context.Context, key timer.Key) (*timer.Timer, error)
	Update(ctx context.Context, key timer.Key, patch timer.Patch) (*timer.Timer, error)
	Delete(ctx context.Context, key timer.Key) error
	// Ready reports whether the node can serve: the store answers and the
	// node's shards are owned.
	Ready(ctx context.Context) error
}

var (
	// ErrNamespaceNotFound: the namespace is not configured.
	ErrNamespaceNotFound = errors.New("namespace not found")
	// ErrShardUnavailable: the shard has no owner able to serve right now
	// (being claimed, handed off, or its owner is unreachable).
	ErrShardUnavailable = errors.New("shard unavailable")
)
