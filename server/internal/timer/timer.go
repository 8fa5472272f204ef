// Package timer holds dtimer's domain model: a timer, its retry policy, where
// it lives (its shard and stable UUID) and its position in a shard's firing
// order. Every other package speaks these types; this package imports none of
// them.
package timer

import (
	"bytes"
	"encoding/json"
	"hash/fnv"
	"time"

	"github.com/google/uuid"
)

// Status is the life-cycle state of a stored timer.
type Status string

const (
	// StatusPending timers are waiting to fire or retrying.
	StatusPending Status = "PENDING"
	// StatusFailed timers exhausted their retries or got a 4xx answer. They
	// stay stored (readable, deletable) but never fire again unless an update
	// gives them a new executeAt.
	StatusFailed Status = "FAILED"
)

// Timer is one scheduled HTTP callback.
type Timer struct {
	Namespace string
	ID        string
	// Shard and UUID are derived from Namespace and ID (see ShardOf, UUIDOf).
	Shard int
	UUID  uuid.UUID
	// ExecuteAt is the time the user scheduled; it is what the API shows and
	// what the callback receives.
	ExecuteAt time.Time
	// DueAt is when the engine fires the timer next: ExecuteAt, or the time of
	// the next retry. It orders the shard's timers in the store.
	DueAt           time.Time
	CallbackURL     string
	Payload         json.RawMessage
	RetryPolicy     RetryPolicy
	CallbackTimeout time.Duration
	CreatedAt       time.Time
	UpdatedAt       time.Time
	// Attempts counts callback attempts since the timer was last (re)scheduled.
	Attempts  int
	Status    Status
	LastError string
}

// Key names a timer: unique per namespace.
type Key struct {
	Namespace string
	ID        string
}

// Key returns the timer's identity.
func (t *Timer) Key() Key { return Key{Namespace: t.Namespace, ID: t.ID} }

// Position is the timer's place in its shard's firing order.
func (t *Timer) Position() Position { return Position{DueAt: t.DueAt, UUID: t.UUID} }

// Clone returns a deep copy, so that a caller can change it without touching
// a copy held elsewhere (the engine's queue, a test's expectation).
func (t *Timer) Clone() *Timer {
	c := *t
	if t.Payload != nil {
		c.Payload = bytes.Clone(t.Payload)
	}
	return &c
}

// Position orders timers within a shard: by due time, then by UUID so that
// timers due at the same instant still have a total order. The store clusters
// timer rows by exactly this pair, which is what lets the engine read a window
// and delete a completed prefix as index range operations.
type Position struct {
	DueAt time.Time
	UUID  uuid.UUID
}

// Compare returns -1, 0 or +1 as p is before, equal to or after o.
func (p Position) Compare(o Position) int {
	if c := p.DueAt.Compare(o.DueAt); c != 0 {
		return c
	}
	return bytes.Compare(p.UUID[:], o.UUID[:])
}

// MaxUUID sorts after every other UUID; Position{DueAt: t, UUID: MaxUUID} is
// the last position at instant t.
var MaxUUID = uuid.UUID{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// uuidSpace is the name space of timer UUIDs (RFC 4122 version 5). Changing it
// would change every timer's UUID and break upserts of stored timers.
var uuidSpace = uuid.MustParse("6f1e0c1e-6a43-4d1b-9a49-1d2f0c6b7a10")

// UUIDOf derives the timer's stable UUID from its namespace and id, so that a
// second create of the same (namespace, id) addresses the same row on every
// store.
func UUIDOf(namespace, id string) uuid.UUID {
	name := make([]byte, 0, len(namespace)+1+len(id))
	name = append(name, namespace...)
	name = append(name, 0)
	name = append(name, id...)
	return uuid.NewSHA1(uuidSpace, name)
}

// ShardOf returns the shard of a timer id: FNV-1a (32 bit) of the id's bytes,
// modulo the namespace's shard count. It is part of the storage format: a
// namespace's shard count and this function must never change while it has
// stored timers.
func ShardOf(id string, numShards int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum32() % uint32(numShards))
}

// TruncateTime returns t in UTC at the millisecond precision the API promises,
// rounding up so that a timer never fires before the instant it was given.
func TruncateTime(t time.Time) time.Time {
	t = t.UTC()
	r := t.Truncate(time.Millisecond)
	if r.Before(t) {
		r = r.Add(time.Millisecond)
	}
	return r
}
