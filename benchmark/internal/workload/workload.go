// Package workload runs the benchmark's workloads (create, burst, steady,
// backlog, scale) against a system.System and measures them on the
// receiver's clock. Workloads never assert speed; they report it.
package workload

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dtimer/dtimer/benchmark/internal/procstat"
	"github.com/dtimer/dtimer/benchmark/internal/receiver"
	"github.com/dtimer/dtimer/benchmark/internal/stats"
	"github.com/dtimer/dtimer/benchmark/internal/system"
)

// Runner holds what every workload uses.
type Runner struct {
	Recv *receiver.Receiver
	P    *Progress
	// Clients is the number of concurrent creating clients.
	Clients int
	// Lead is the least time between a timer's create and its due time
	// (DefaultLead).
	Lead time.Duration
	// PayloadBytes is the approximate size of each timer's JSON payload.
	PayloadBytes int
	// DB reads the database server's processes, or is nil when they cannot
	// be told apart (then database CPU is not reported).
	DB func() (procstat.Sample, error)
}

// Point is one point of a lateness CDF.
type Point struct {
	Fraction float64 `json:"fraction"`
	Ms       float64 `json:"ms"`
}

// Costs are what a phase cost, per fired timer where it says so.
type Costs struct {
	ServerCPUSeconds float64 `json:"serverCpuSeconds"`
	ServerPeakRSSMB  float64 `json:"serverPeakRssMB"`
	DBCPUSeconds     float64 `json:"dbCpuSeconds,omitempty"`
	// Statements are the store operations by kind during the phase, and
	// ReadsPerFired/DeletesPerFired the window reads + gets and the range +
	// single deletes per fired timer (dtimer only).
	Statements      map[string]float64 `json:"statements,omitempty"`
	ReadsPerFired   *float64           `json:"readsPerFired,omitempty"`
	DeletesPerFired *float64           `json:"deletesPerFired,omitempty"`
	WritesPerFired  *float64           `json:"writesPerFired,omitempty"`
}

// Result is one workload run on one system.
type Result struct {
	System   string         `json:"system"`
	Workload string         `json:"workload"`
	Params   map[string]any `json:"params"`

	// Creates (create workload; others report their preparation here too).
	Creates        int           `json:"creates,omitempty"`
	CreateSeconds  float64       `json:"createSeconds,omitempty"`
	CreatesPerSec  float64       `json:"createsPerSec,omitempty"`
	CreateLatency  stats.Summary `json:"createLatency"`
	CreateFailures int           `json:"createFailures,omitempty"`

	// Firing.
	Expected    int            `json:"expected,omitempty"`
	Fired       int            `json:"fired,omitempty"`
	Missing     int            `json:"missing,omitempty"`
	Duplicates  int            `json:"duplicates,omitempty"`
	Early       int            `json:"early,omitempty"`
	DrainSecs   float64        `json:"drainSeconds,omitempty"`
	FiredPerSec float64        `json:"firedPerSec,omitempty"`
	Lateness    stats.Summary  `json:"lateness"`
	CDF         []Point        `json:"latenessCdf,omitempty"`
	Series      []stats.Second `json:"series,omitempty"`
	// SeriesStart is what second 0 of Series is: the due time of the burst,
	// the first due time of a steady run, the restart of a backlog run.
	SeriesStart time.Time `json:"seriesStart,omitempty"`

	Costs Costs              `json:"costs"`
	Extra map[string]float64 `json:"extra,omitempty"`
	Notes []string           `json:"notes,omitempty"`
	Error string             `json:"error,omitempty"`
}

func (r *Result) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// payload returns timer i's payload: a small JSON object padded to about n
// bytes, the same for every system.
func payload(i, n int) []byte {
	s := `{"i":` + strconv.Itoa(i) + `,"pad":"`
	pad := max(n-len(s)-2, 0)
	return []byte(s + strings.Repeat("x", pad) + `"}`)
}

// timers makes n timers named prefix-<i> due at due(i).
func (r *Runner) timers(prefix string, n int, due func(i int) time.Time) []system.Timer {
	ts := make([]system.Timer, n)
	for i := range ts {
		ts[i] = system.Timer{ID: prefix + "-" + strconv.Itoa(i), ExecuteAt: due(i).Truncate(time.Millisecond), Payload: payload(i, r.PayloadBytes)}
	}
	return ts
}

// createAll stores ts from r.Clients clients, one Create each, and returns
// each create's latency. With bulk set, a system.BulkCreator stores them in
// batches instead (preparation whose speed is not measured).
func (r *Runner) createAll(ctx context.Context, sys system.System, ts []system.Timer, bulk bool, desc string) ([]time.Duration, time.Duration, error) {
	bar := r.P.Start(desc, len(ts))
	defer bar.Done()
	start := time.Now()
	if bc, ok := sys.(system.BulkCreator); ok && bulk {
		const batch = 2000
		for i := 0; i < len(ts); i += batch {
			if err := bc.CreateMany(ctx, ts[i:min(i+batch, len(ts))]); err != nil {
				return nil, 0, err
			}
			bar.Add(min(batch, len(ts)-i))
		}
		return nil, time.Since(start), nil
	}
	lat := make([]time.Duration, len(ts))
	var (
		next   atomic.Int64
		failed atomic.Int64
		first  error
		mu     sync.Mutex
		wg     sync.WaitGroup
	)
	for range max(r.Clients, 1) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(ts) || ctx.Err() != nil {
					return
				}
				t0 := time.Now()
				err := sys.Create(ctx, ts[i])
				lat[i] = time.Since(t0)
				bar.Add(1)
				if err != nil {
					failed.Add(1)
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	if first != nil {
		return lat, took, fmt.Errorf("%d of %d creates failed, first: %w", failed.Load(), len(ts), first)
	}
	return lat, took, ctx.Err()
}

// estimateRate creates a few timers due an hour from now (they stay out of
// the way) to learn how fast this system takes creates, so that a workload
// can choose due times its (bulk, where the system has it) creates will not
// overrun.
func (r *Runner) estimateRate(ctx context.Context, sys system.System) (float64, error) {
	n := 400
	if _, ok := sys.(system.BulkCreator); ok {
		n = 4000
	}
	far := time.Now().Add(time.Hour)
	ts := r.timers("warmup-"+strconv.FormatInt(time.Now().UnixNano(), 36), n, func(int) time.Time { return far })
	_, took, err := r.createAll(ctx, sys, ts, true, "warm-up creates")
	if err != nil {
		return 0, err
	}
	return float64(n) / took.Seconds(), nil
}

// snapshot is a reading of the costs counters at one moment.
type snapshot struct {
	server   procstat.Sample
	db       procstat.Sample
	counters map[string]float64
}

func (r *Runner) snap(ctx context.Context, sys system.System) snapshot {
	s := snapshot{server: sys.Usage()}
	if r.DB != nil {
		s.db, _ = r.DB()
	}
	s.counters, _ = sys.Counters(ctx)
	return s
}

// costs is what happened between a and b, per fired timer where it applies.
func costs(a, b snapshot, fired int) Costs {
	c := Costs{
		ServerCPUSeconds: b.server.CPUSeconds - a.server.CPUSeconds,
		ServerPeakRSSMB:  float64(b.server.PeakRSSBytes) / (1 << 20),
		DBCPUSeconds:     b.db.CPUSeconds - a.db.CPUSeconds,
	}
	if b.counters == nil {
		return c
	}
	c.Statements = map[string]float64{}
	for k, v := range b.counters {
		if op, ok := strings.CutPrefix(k, "db:"); ok {
			if d := v - a.counters[k]; d != 0 {
				c.Statements[op] = d
			}
		}
	}
	if fired > 0 {
		per := func(ops ...string) *float64 {
			var sum float64
			for _, op := range ops {
				sum += c.Statements[op]
			}
			v := sum / float64(fired)
			return &v
		}
		c.ReadsPerFired = per("timer_get_window", "timer_get")
		c.DeletesPerFired = per("timer_delete_range", "timer_delete")
		c.WritesPerFired = per("timer_create", "timer_update")
	}
	return c
}

// waitFired waits until n different timers have called back since the
// receiver's last Reset, or until deadline; it shows progress meanwhile.
func (r *Runner) waitFired(ctx context.Context, desc string, n int, deadline time.Time) error {
	bar := r.P.Start(desc, n)
	defer bar.Done()
	reached := r.Recv.Expect(n)
	tick := time.NewTicker(200 * time.Millisecond) // the bar only
	defer tick.Stop()
	limit := time.NewTimer(time.Until(deadline))
	defer limit.Stop()
	for {
		select {
		case <-reached:
			bar.Set(n)
			return nil
		case <-tick.C:
			bar.Set(r.Recv.Distinct())
		case <-limit.C:
			return fmt.Errorf("only %d of %d timers fired by the deadline", r.Recv.Distinct(), n)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// settle waits, up to max, for the store counters to stop changing, so that
// the range delete that follows the last fire is counted.
func (r *Runner) settle(ctx context.Context, sys system.System, maxWait time.Duration) {
	prev, _ := sys.Counters(ctx)
	if prev == nil {
		return
	}
	deadline := time.Now().Add(maxWait)
	stable := 0
	for time.Now().Before(deadline) && stable < 3 {
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond): // a poll of /metrics, nothing to wait on
		}
		cur, _ := sys.Counters(ctx)
		if cur["db:timer_delete_range"] == prev["db:timer_delete_range"] {
			stable++
		} else {
			stable = 0
		}
		prev = cur
	}
}

// fireStats fills the firing fields of res from the receiver's arrivals of
// the timers whose id starts with prefix+"-".
func fireStats(res *Result, arrivals []receiver.Arrival, prefix string, expected int) (first, last time.Time, events []stats.Event) {
	seen := make(map[string]bool, expected)
	var lateness []time.Duration
	for _, a := range arrivals {
		if !strings.HasPrefix(a.ID, prefix+"-") {
			continue
		}
		if seen[a.ID] {
			res.Duplicates++
			continue
		}
		seen[a.ID] = true
		l := a.At.Sub(a.ExecuteAt)
		if l < 0 {
			res.Early++
		}
		lateness = append(lateness, l)
		events = append(events, stats.Event{At: a.At, Lateness: l})
		if first.IsZero() || a.At.Before(first) {
			first = a.At
		}
		if a.At.After(last) {
			last = a.At
		}
	}
	res.Expected, res.Fired = expected, len(seen)
	res.Missing = expected - len(seen)
	res.Lateness = stats.Summarize(lateness)
	res.CDF = cdf(lateness)
	return first, last, events
}

// cdf samples sorted lateness at 200 points, finer in the tail.
func cdf(sorted []time.Duration) []Point {
	if len(sorted) == 0 {
		return nil
	}
	var pts []Point
	add := func(f float64) {
		pts = append(pts, Point{Fraction: f, Ms: float64(stats.Percentile(sorted, f*100)) / float64(time.Millisecond)})
	}
	for i := 0; i <= 150; i++ {
		add(float64(i) / 150 * 0.99)
	}
	for i := 1; i <= 50; i++ {
		add(0.99 + 0.01*float64(i)/50)
	}
	return pts
}

func seconds(d time.Duration) float64 { return math.Round(d.Seconds()*1000) / 1000 }
