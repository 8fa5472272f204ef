package timer_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dtimer/dtimer/server/internal/timer"
)

// The shard function and the UUID derivation are part of the storage format:
// these vectors (computed independently with Python's uuid5 and an FNV-1a
// written from its definition) must never change.
func TestShardOfIsStable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		id     string
		shards int
		want   int
	}{
		{"user-reminder-123", 16, 10},
		{"user-reminder-123", 1024, 650},
		{"a", 16, 12},
		{"", 16, 5},
		{"order/42", 7, 4},
	} {
		require.Equal(t, tc.want, timer.ShardOf(tc.id, tc.shards), "%q mod %d", tc.id, tc.shards)
	}
}

func TestUUIDOfIsStableAndScopedByNamespace(t *testing.T) {
	t.Parallel()
	require.Equal(t, "2cafdc75-31f1-5cd1-8035-d65da1839daa", timer.UUIDOf("default", "user-reminder-123").String())
	require.Equal(t, timer.UUIDOf("a", "b"), timer.UUIDOf("a", "b"))
	require.NotEqual(t, timer.UUIDOf("a", "bc"), timer.UUIDOf("ab", "c"))
	require.NotEqual(t, timer.UUIDOf("x", "id"), timer.UUIDOf("y", "id"))
}

func TestPositionOrder(t *testing.T) {
	t.Parallel()
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	a := timer.Position{DueAt: at, UUID: timer.UUIDOf("n", "a")}
	b := timer.Position{DueAt: at, UUID: timer.MaxUUID}
	c := timer.Position{DueAt: at.Add(time.Millisecond)}
	require.Equal(t, -1, a.Compare(b))
	require.Equal(t, -1, b.Compare(c))
	require.Equal(t, 1, c.Compare(a))
	require.Equal(t, 0, a.Compare(a))
}

func TestTruncateTimeRoundsUpToMillisecond(t *testing.T) {
	t.Parallel()
	in := time.Date(2030, 1, 1, 0, 0, 0, 1_000_001, time.FixedZone("x", 3600))
	out := timer.TruncateTime(in)
	require.Equal(t, time.UTC, out.Location())
	require.Equal(t, time.Date(2029, 12, 31, 23, 0, 0, 2_000_000, time.UTC), out)
	exact := time.Date(2030, 1, 1, 0, 0, 0, 5_000_000, time.UTC)
	require.Equal(t, exact, timer.TruncateTime(exact))
}

func TestRetryPolicyBackoffAndExhaustion(t *testing.T) {
	t.Parallel()
	p := timer.RetryPolicy{MaxAttempts: 5, MaxAttemptsDuration: time.Minute, InitialInterval: time.Second, BackoffMultiplier: 3, MaxInterval: 20 * time.Second}
	require.NoError(t, p.Validate())
	require.Equal(t, time.Second, p.Backoff(1))
	require.Equal(t, 3*time.Second, p.Backoff(2))
	require.Equal(t, 9*time.Second, p.Backoff(3))
	require.Equal(t, 20*time.Second, p.Backoff(4), "capped at maxInterval")
	require.Equal(t, 20*time.Second, p.Backoff(1000), "no overflow")

	exec := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	next, ok := p.NextAttempt(1, exec, exec)
	require.True(t, ok)
	require.Equal(t, exec.Add(time.Second), next)
	_, ok = p.NextAttempt(5, exec, exec)
	require.False(t, ok, "maxAttempts reached")
	_, ok = p.NextAttempt(2, exec, exec.Add(58*time.Second))
	require.False(t, ok, "the next attempt would start past maxAttemptsDuration")
}

func TestRetryPolicyValidateNamesField(t *testing.T) {
	t.Parallel()
	ok := timer.RetryPolicy{MaxAttempts: 1, InitialInterval: time.Second, BackoffMultiplier: 1, MaxInterval: time.Second}
	for field, mutate := range map[string]func(*timer.RetryPolicy){
		"maxAttempts":         func(p *timer.RetryPolicy) { p.MaxAttempts = 0 },
		"maxAttemptsDuration": func(p *timer.RetryPolicy) { p.MaxAttemptsDuration = -1 },
		"initialInterval":     func(p *timer.RetryPolicy) { p.InitialInterval = 0 },
		"backoffMultiplier":   func(p *timer.RetryPolicy) { p.BackoffMultiplier = 0.5 },
		"maxInterval":         func(p *timer.RetryPolicy) { p.MaxInterval = time.Millisecond },
	} {
		p := ok
		mutate(&p)
		require.ErrorContains(t, p.Validate(), "retryPolicy."+field)
	}
}

func TestRetryPolicyJSONRoundTrip(t *testing.T) {
	t.Parallel()
	p := timer.RetryPolicy{MaxAttempts: 4, MaxAttemptsDuration: 90 * time.Minute, InitialInterval: 1500 * time.Millisecond, BackoffMultiplier: 1.5, MaxInterval: time.Minute}
	b, err := json.Marshal(p)
	require.NoError(t, err)
	require.JSONEq(t, `{"maxAttempts":4,"maxAttemptsDuration":"1h30m0s","initialInterval":"1.5s","backoffMultiplier":1.5,"maxInterval":"1m0s"}`, string(b))
	var back timer.RetryPolicy
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, p, back)
	require.ErrorContains(t, json.Unmarshal([]byte(`{"maxAttempts":1,"maxAttemptsDuration":"0s","initialInterval":"soon","backoffMultiplier":1,"maxInterval":"1s"}`), &back), "retryPolicy.initialInterval")
}

func TestPatchApply(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	failed := &timer.Timer{ID: "x", ExecuteAt: now, DueAt: now, Status: timer.StatusFailed, Attempts: 3, LastError: "HTTP 500", CallbackURL: "http://a", Payload: json.RawMessage(`1`)}
	url := "http://b"
	onlyURL := timer.Patch{CallbackURL: &url}.Apply(failed, now.Add(time.Second))
	require.Equal(t, timer.StatusFailed, onlyURL.Status, "no new executeAt: still failed")
	require.Equal(t, "http://b", onlyURL.CallbackURL)
	require.Equal(t, json.RawMessage(`1`), onlyURL.Payload)
	require.Equal(t, now.Add(time.Second), onlyURL.UpdatedAt)

	at := now.Add(time.Hour)
	replay := timer.Patch{ExecuteAt: &at}.Apply(failed, now)
	require.Equal(t, timer.StatusPending, replay.Status)
	require.Equal(t, 0, replay.Attempts)
	require.Empty(t, replay.LastError)
	require.Equal(t, at, replay.DueAt)
	require.Equal(t, timer.StatusFailed, failed.Status, "the original is not modified")
}
