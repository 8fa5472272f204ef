// Package routing maps a timer to its shard and the shard to the engine that
// owns it, and serves the API's timer operations there.
package routing

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/dtimer/dtimer/server/internal/membership"

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
	// Cluster is this node's view of the members and of every shard's owner.
	Cluster(ctx context.Context) (*ClusterView, error)
	// Forward relays an API call to the node that owns its shard; Create,
	// Update and Delete ask for it with a *NotLocalError.
	Forward(ctx context.Context, to *NotLocalError, path string, body []byte) (*Relayed, error)
}

// NotLocalError: another node owns the timer's shard; the call must be
// forwarded to it (once: a forwarded call is never forwarded again).
type NotLocalError struct {
	Node        string
	HTTPAddress string
}

func (e *NotLocalError) Error() string {
	return "shard owned by " + e.Node + " at " + e.HTTPAddress
}

// Relayed is the owner's answer to a forwarded call, to be passed on
// unchanged.
type Relayed struct {
	Status int
	Header http.Header
	Body   []byte
}

// ForwardedHeader marks a forwarded API call and names the node that
// forwarded it.
const ForwardedHeader = "X-Dtimer-Forwarded-By"

type forwardedKey struct{}

// WithForwarded marks ctx as serving a call another node forwarded: it is
// served here or answered ErrShardUnavailable, never forwarded again.
func WithForwarded(ctx context.Context) context.Context {
	return context.WithValue(ctx, forwardedKey{}, true)
}

// IsForwarded reports whether ctx serves a forwarded call.
func IsForwarded(ctx context.Context) bool {
	v, _ := ctx.Value(forwardedKey{}).(bool)
	return v
}

// ClusterView is what GET /api/v1/cluster shows.
type ClusterView struct {
	Node       string
	Members    []membership.Member
	Namespaces []NamespaceView
}

// NamespaceView lists a namespace's shards.
type NamespaceView struct {
	Name      string
	NumShards int
	Shards    []ShardView
}

// ShardView is one shard: its claim as stored, and where this node's view
// of the membership assigns it.
type ShardView struct {
	Shard      int
	Owner      string // "" when never claimed or released
	Version    int64
	ClaimedAt  time.Time
	AssignedTo string
}

var (
	// ErrNamespaceNotFound: the namespace is not configured.
	ErrNamespaceNotFound = errors.New("namespace not found")
	// ErrShardUnavailable: the shard has no owner able to serve right now
	// (being claimed, handed off, or its owner is unreachable).
	ErrShardUnavailable = errors.New("shard unavailable")
)
