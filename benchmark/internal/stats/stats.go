// Package stats turns raw samples (latencies, arrival times) into the
// figures the benchmark reports: exact percentiles and per-second series.
package stats

import (
	"math"
	"slices"
	"time"
)

// Summary describes a set of durations in milliseconds.
type Summary struct {
	Count int     `json:"count"`
	Min   float64 `json:"minMs"`
	P50   float64 `json:"p50Ms"`
	P90   float64 `json:"p90Ms"`
	P99   float64 `json:"p99Ms"`
	P999  float64 `json:"p999Ms"`
	Max   float64 `json:"maxMs"`
	Mean  float64 `json:"meanMs"`
}

// Summarize sorts ds in place and returns its summary. Percentiles are exact
// (nearest rank), not estimated from buckets.
func Summarize(ds []time.Duration) Summary {
	if len(ds) == 0 {
		return Summary{}
	}
	slices.Sort(ds)
	var sum float64
	for _, d := range ds {
		sum += ms(d)
	}
	return Summary{
		Count: len(ds),
		Min:   ms(ds[0]),
		P50:   ms(Percentile(ds, 50)),
		P90:   ms(Percentile(ds, 90)),
		P99:   ms(Percentile(ds, 99)),
		P999:  ms(Percentile(ds, 99.9)),
		Max:   ms(ds[len(ds)-1]),
		Mean:  sum / float64(len(ds)),
	}
}

// Percentile is the nearest-rank percentile p (0-100] of sorted.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Second is one second of a run: how many events fell into it and the
// lateness percentiles of those events.
type Second struct {
	At    int     `json:"at"` // seconds since the start of the series
	Count int     `json:"count"`
	P50   float64 `json:"p50Ms"`
	P99   float64 `json:"p99Ms"`
	Max   float64 `json:"maxMs"`
}

// Event is one thing that happened at At with a lateness.
type Event struct {
	At       time.Time
	Lateness time.Duration
}

// PerSecond buckets events by whole seconds since start, over n seconds
// (events outside are dropped), keeping empty seconds so that a stall shows.
func PerSecond(events []Event, start time.Time, n int) []Second {
	buckets := make([][]time.Duration, n)
	for _, e := range events {
		i := int(e.At.Sub(start) / time.Second)
		if i >= 0 && i < n {
			buckets[i] = append(buckets[i], e.Lateness)
		}
	}
	out := make([]Second, n)
	for i, b := range buckets {
		s := Summarize(b)
		out[i] = Second{At: i, Count: s.Count, P50: s.P50, P99: s.P99, Max: s.Max}
	}
	return out
}
