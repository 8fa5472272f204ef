package timer

import (
	"encoding/json"
	"time"
)

// Patch is a partial update: nil fields keep their value.
type Patch struct {
	ExecuteAt       *time.Time
	CallbackURL     *string
	Payload         *json.RawMessage
	RetryPolicy     *RetryPolicy
	CallbackTimeout *time.Duration
}

// Apply returns a copy of t with the patch applied at instant now. A new
// ExecuteAt reschedules the timer: it becomes pending again (this is how a
// failed timer is replayed) with its attempts starting over.
func (p Patch) Apply(t *Timer, now time.Time) *Timer {
	n := t.Clone()
	if p.ExecuteAt != nil {
		n.ExecuteAt = *p.ExecuteAt
		n.DueAt = *p.ExecuteAt
		n.Attempts = 0
		n.Status = StatusPending
		n.LastError = ""
	}
	if p.CallbackURL != nil {
		n.CallbackURL = *p.CallbackURL
	}
	if p.Payload != nil {
		n.Payload = *p.Payload
	}
	if p.RetryPolicy != nil {
		n.RetryPolicy = *p.RetryPolicy
	}
	if p.CallbackTimeout != nil {
		n.CallbackTimeout = *p.CallbackTimeout
	}
	n.UpdatedAt = now
	return n
}
