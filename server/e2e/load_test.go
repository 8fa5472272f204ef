package e2e_test

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The load tests measure and log; they assert behaviour only (every timer
// fires, none early), never speed. They are not parallel, so that they run
// alone, before the parallel tests start.

// TestBurst: 5,000 timers due at the same instant, created by 32 concurrent
// clients.
func TestBurst(t *testing.T) {
	forEachDriver(t, false, func(t *testing.T, d driver) {
		const (
			n       = 5000
			clients = 32
			warmup  = 320
		)
		// The load tests run alone: pools get their default sizes back.
		srv, rcv := setup(t, d, "DTIMER_STORE_POSTGRES_MAX_CONNS=32", "DTIMER_STORE_MYSQL_MAX_CONNS=16",
			"DTIMER_STORE_DYNAMODB_MAX_CONNS=64")

		// All timers are due at one instant, which must come after the last
		// create: estimate the create rate with timers far in the future
		// (they stay out of the way), then allow half as long again, and 2s.
		warm := make([]obj, warmup)
		for i := range warm {
			warm[i] = newTimer(rcv, "other", fmt.Sprintf("warm-%03d", i), at(time.Hour), nil)
		}
		warmTook := srv.createAll(t, warm, clients)
		estimate := time.Duration(1.5 * float64(n) * float64(warmTook) / warmup)
		due := at(estimate + 2*time.Second)

		reqs := make([]obj, n)
		for i := range reqs {
			reqs[i] = newTimer(rcv, "default", fmt.Sprintf("burst-%04d", i), due, obj{"payload": obj{"i": i}})
		}
		took := srv.createAll(t, reqs, clients)
		createdAt := time.Now()
		t.Logf("%s: created %d timers in %s with %d clients: %.0f creates/s (warm-up: %d in %s)",
			d.name, n, took.Round(time.Millisecond), clients, float64(n)/took.Seconds(), warmup, warmTook.Round(time.Millisecond))
		if createdAt.After(due) {
			t.Logf("%s: note: the creates ended %s after the timers were due; lateness includes that", d.name, createdAt.Sub(due).Round(time.Millisecond))
		}

		ok := rcv.wait(time.Until(due)+120*time.Second, func() bool { return len(rcv.byID) >= n })
		missing := []string{}
		if !ok {
			for i := range n {
				if id := fmt.Sprintf("burst-%04d", i); rcv.count(id) == 0 {
					missing = append(missing, id)
				}
			}
		}
		require.True(t, ok, "%d of %d timers did not fire within 120s of their due time, e.g. %v", len(missing), n, missing[:min(10, len(missing))])
		// Duplicates would follow at once; give them a second to show.
		rcv.wait(time.Second, func() bool { return len(rcv.calls) > n })

		stats := arrivals(t, rcv, "burst-")
		require.Len(t, stats.lateness, n)
		drain := stats.last.Sub(stats.first)
		t.Logf("%s: all %d fired; drain (first to last arrival) %s: %.0f fired/s; last arrival %s after the due time: %.0f fired/s from due time",
			d.name, n, drain.Round(time.Millisecond), float64(n)/drain.Seconds(), stats.last.Sub(due).Round(time.Millisecond), float64(n)/stats.last.Sub(due).Seconds())
		t.Logf("%s: lateness (arrival - executeAt): %s; duplicates: %d callbacks of %d timers (shards %v)",
			d.name, stats.summary(), stats.duplicates, stats.duplicated, shards)
	})
}

// TestLightLoad: 200 timers spread evenly over 10s.
func TestLightLoad(t *testing.T) {
	forEachDriver(t, false, func(t *testing.T, d driver) {
		const n = 200
		srv, rcv := setup(t, d)
		start := at(2 * time.Second)
		spread := 10 * time.Second
		reqs := make([]obj, n)
		for i := range reqs {
			executeAt := start.Add(time.Duration(i) * spread / n)
			reqs[i] = newTimer(rcv, []string{"default", "other"}[i%2], fmt.Sprintf("light-%03d", i), executeAt, nil)
		}
		took := srv.createAll(t, reqs, 8)
		if time.Now().After(start) {
			t.Logf("%s: note: the creates (%s) ended after the first timer was due", d.name, took)
		}
		ok := rcv.wait(time.Until(start.Add(spread))+callbackTimeout, func() bool { return len(rcv.byID) >= n })
		require.True(t, ok, "only %d of %d timers fired", rcv.total(), n)

		stats := arrivals(t, rcv, "light-")
		require.Len(t, stats.lateness, n)
		t.Logf("%s: %d timers over %s: lateness (arrival - executeAt): %s; duplicates: %d",
			d.name, n, spread, stats.summary(), stats.duplicates)
	})
}

// arrivalStats describes the first callbacks of a set of timers.
type arrivalStats struct {
	lateness    []time.Duration // of each timer's first callback, sorted
	first, last time.Time       // the earliest and latest first callbacks
	duplicates  int             // callbacks after a timer's first
	duplicated  int             // timers with more than one callback
}

// arrivals collects the stats of the timers whose id has the prefix and
// requires that none fired early.
func arrivals(t *testing.T, rcv *receiver, prefix string) arrivalStats {
	t.Helper()
	var s arrivalStats
	seen := map[string]bool{}
	for _, c := range rcv.all() {
		if !strings.HasPrefix(c.Body.TimerID, prefix) {
			continue
		}
		executeAt := parseTS(t, c.Body.ExecuteAt)
		require.False(t, c.Arrived.Before(executeAt), "timer %s fired %s early", c.Body.TimerID, executeAt.Sub(c.Arrived))
		if seen[c.Body.TimerID] {
			s.duplicates++
			continue
		}
		seen[c.Body.TimerID] = true
		s.lateness = append(s.lateness, c.Arrived.Sub(executeAt))
		if s.first.IsZero() || c.Arrived.Before(s.first) {
			s.first = c.Arrived
		}
		if c.Arrived.After(s.last) {
			s.last = c.Arrived
		}
	}
	for id := range seen {
		if rcv.count(id) > 1 {
			s.duplicated++
		}
	}
	slices.Sort(s.lateness)
	return s
}

func (s arrivalStats) summary() string {
	r := func(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
	return fmt.Sprintf("p50 %s, p90 %s, p99 %s, max %s",
		r(percentile(s.lateness, 0.50)), r(percentile(s.lateness, 0.90)), r(percentile(s.lateness, 0.99)), r(percentile(s.lateness, 1)))
}

// percentile is the nearest-rank q-quantile of sorted.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
