package timer

import (
	"encoding/json"
	"fmt"
	"math"
	"time"
)

// RetryPolicy says how often and how long a failing callback is retried.
type RetryPolicy struct {
	// MaxAttempts is the most callback attempts, the first included.
	MaxAttempts int
	// MaxAttemptsDuration bounds how long after ExecuteAt a retry may still be
	// scheduled; zero means no bound beyond MaxAttempts.
	MaxAttemptsDuration time.Duration
	InitialInterval     time.Duration
	BackoffMultiplier   float64
	MaxInterval         time.Duration
}

// Validate reports the first field that is out of range, naming it as the API
// does.
func (p RetryPolicy) Validate() error {
	switch {
	case p.MaxAttempts < 1 || p.MaxAttempts > 1000:
		return fmt.Errorf("retryPolicy.maxAttempts must be between 1 and 1000, got %d", p.MaxAttempts)
	case p.MaxAttemptsDuration < 0:
		return fmt.Errorf("retryPolicy.maxAttemptsDuration must not be negative, got %s", p.MaxAttemptsDuration)
	case p.InitialInterval <= 0:
		return fmt.Errorf("retryPolicy.initialInterval must be positive, got %s", p.InitialInterval)
	case math.IsNaN(p.BackoffMultiplier) || p.BackoffMultiplier < 1 || p.BackoffMultiplier > 100:
		return fmt.Errorf("retryPolicy.backoffMultiplier must be between 1 and 100, got %v", p.BackoffMultiplier)
	case p.MaxInterval < p.InitialInterval:
		return fmt.Errorf("retryPolicy.maxInterval (%s) must not be less than retryPolicy.initialInterval (%s)", p.MaxInterval, p.InitialInterval)
	}
	return nil
}

// Backoff returns the wait before the next attempt after `attempts` attempts
// have failed: InitialInterval * BackoffMultiplier^(attempts-1), capped at
// MaxInterval.
func (p RetryPolicy) Backoff(attempts int) time.Duration {
	if attempts < 1 {
		attempts = 1
	}
	d := float64(p.InitialInterval) * math.Pow(p.BackoffMultiplier, float64(attempts-1))
	if d >= float64(p.MaxInterval) || math.IsInf(d, 0) || math.IsNaN(d) {
		return p.MaxInterval
	}
	return time.Duration(d)
}

// NextAttempt decides what follows a failed attempt: the time of the next
// attempt, or ok=false when the policy is exhausted. attempts counts the
// attempts made so far, the failed one included.
func (p RetryPolicy) NextAttempt(attempts int, executeAt, now time.Time) (next time.Time, ok bool) {
	if attempts >= p.MaxAttempts {
		return time.Time{}, false
	}
	next = now.Add(p.Backoff(attempts))
	if p.MaxAttemptsDuration > 0 && next.Sub(executeAt) > p.MaxAttemptsDuration {
		return time.Time{}, false
	}
	return next, true
}

// retryPolicyJSON is the wire and storage form: durations as Go duration
// strings ("1s", "1m30s").
type retryPolicyJSON struct {
	MaxAttempts         int     `json:"maxAttempts"`
	MaxAttemptsDuration string  `json:"maxAttemptsDuration"`
	InitialInterval     string  `json:"initialInterval"`
	BackoffMultiplier   float64 `json:"backoffMultiplier"`
	MaxInterval         string  `json:"maxInterval"`
}

// MarshalJSON writes durations as Go duration strings.
func (p RetryPolicy) MarshalJSON() ([]byte, error) {
	return json.Marshal(retryPolicyJSON{
		MaxAttempts:         p.MaxAttempts,
		MaxAttemptsDuration: p.MaxAttemptsDuration.String(),
		InitialInterval:     p.InitialInterval.String(),
		BackoffMultiplier:   p.BackoffMultiplier,
		MaxInterval:         p.MaxInterval.String(),
	})
}

// UnmarshalJSON reads the form MarshalJSON writes; every field is required.
func (p *RetryPolicy) UnmarshalJSON(b []byte) error {
	var j retryPolicyJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	var err error
	parse := func(name, s string) time.Duration {
		d, e := time.ParseDuration(s)
		if e != nil && err == nil {
			err = fmt.Errorf("retryPolicy.%s: %w", name, e)
		}
		return d
	}
	*p = RetryPolicy{
		MaxAttempts:         j.MaxAttempts,
		MaxAttemptsDuration: parse("maxAttemptsDuration", j.MaxAttemptsDuration),
		InitialInterval:     parse("initialInterval", j.InitialInterval),
		BackoffMultiplier:   j.BackoffMultiplier,
		MaxInterval:         parse("maxInterval", j.MaxInterval),
	}
	return err
}
