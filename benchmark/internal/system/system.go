// Package system is what the workloads drive: a timer service that takes
// timers and POSTs each to the receiver when it is due. dtimer (one or more
// dtimer-server processes) and the peer (River workers in a child process)
// both implement it, so every workload measures both the same way.
package system

import (
	"context"
	"encoding/json"
	"time"

	"github.com/dtimer/dtimer/benchmark/internal/procstat"
)

// Timer is one timer of a workload.
type Timer struct {
	ID        string
	ExecuteAt time.Time
	Payload   json.RawMessage
}

// System is a timer service under test.
type System interface {
	// Name labels the system in results ("dtimer/postgres", "river/tuned").
	Name() string
	// Start starts (or restarts, on the same store) what fires timers and
	// returns once it fires.
	Start(ctx context.Context) error
	// Stop stops firing, gracefully.
	Stop(ctx context.Context) error
	// Create stores one timer the way a client would: one API call (dtimer)
	// or one insert (the peer).
	Create(ctx context.Context, t Timer) error
	// Usage is the CPU time and memory of the system's processes (not its
	// database's) since they started.
	Usage() procstat.Sample
	// Counters are the system's own cumulative counters (dtimer: store
	// operations by kind, from /metrics); nil when it has none.
	Counters(ctx context.Context) (map[string]float64, error)
	// Close stops the system and removes its store.
	Close(ctx context.Context) error
}

// BulkCreator is a System that can store many timers faster than one
// Create each (the peer's multi-row insert); workloads use it to prepare
// timers whose creation is not what they measure.
type BulkCreator interface {
	CreateMany(ctx context.Context, ts []Timer) error
}

// Format is the time format of executeAt in API requests and callbacks.
const Format = "2006-01-02T15:04:05.000Z07:00"
