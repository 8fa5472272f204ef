package workload

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dtimer/dtimer/benchmark/internal/stats"
	"github.com/dtimer/dtimer/benchmark/internal/system"
)

// DefaultLead is the least time between creating a timer and its due time.
// River (v0.51) moves scheduled jobs to "available" in a pass every 5 s that
// takes those due within the next 5 s; a job created closer to its due time
// than that waits for the next pass. Every system gets the same lead, long
// enough that the peer's scheduler is not what is measured.
const DefaultLead = 6 * time.Second

// firstDue is a due time that the creates of n timers, started now, will
// not overrun: it learns the system's create rate from a warm-up, allows half
// as long again, plus the lead.
func (r *Runner) firstDue(ctx context.Context, sys system.System, n int) (time.Time, error) {
	rate, err := r.estimateRate(ctx, sys)
	if err != nil {
		return time.Time{}, err
	}
	return time.Now().Add(time.Duration(1.5*float64(n)/rate*float64(time.Second)) + r.Lead).Truncate(time.Millisecond), nil
}

// stop stops sys gracefully, bounded by a minute.
func stop(ctx context.Context, sys system.System) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return sys.Stop(ctx)
}

// Create: n timers through the system's create call from r.Clients clients,
// due an hour from now (they never fire during the run).
func (r *Runner) Create(ctx context.Context, sys system.System, n int) *Result {
	res := &Result{System: sys.Name(), Workload: "create", Params: map[string]any{"timers": n, "clients": r.Clients}}
	r.Recv.Reset()
	far := time.Now().Add(time.Hour)
	ts := r.timers("create", n, func(i int) time.Time { return far.Add(time.Duration(i) * time.Millisecond) })
	a := r.snap(ctx, sys)
	lat, took, err := r.createAll(ctx, sys, ts, false, sys.Name()+": create")
	b := r.snap(ctx, sys)
	if err != nil {
		res.Error = err.Error()
	}
	res.Creates, res.CreateSeconds = n, seconds(took)
	res.CreatesPerSec = float64(n) / took.Seconds()
	res.CreateLatency = stats.Summarize(lat)
	res.Costs = costs(a, b, 0)
	return res
}

// Burst: n timers due at one instant, after every create has returned.
func (r *Runner) Burst(ctx context.Context, sys system.System, n int) *Result {
	res := &Result{System: sys.Name(), Workload: "burst", Params: map[string]any{"timers": n}}
	r.Recv.Reset()
	due, err := r.firstDue(ctx, sys, n)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	ts := r.timers("burst", n, func(int) time.Time { return due })
	_, took, err := r.createAll(ctx, sys, ts, true, sys.Name()+": prepare burst")
	res.Creates, res.CreateSeconds = n, seconds(took)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	if time.Now().After(due) {
		res.note("the creates ended %s after the due time; lateness includes that", time.Since(due).Round(time.Millisecond))
	}
	r.P.Logf("%s: %d timers due at %s (in %s)", sys.Name(), n, due.Format("15:04:05.000"), time.Until(due).Round(time.Millisecond))
	a := r.snap(ctx, sys)
	if err := r.waitFired(ctx, sys.Name()+": burst firing", n, due.Add(time.Minute+time.Duration(n)*time.Millisecond)); err != nil {
		res.Error = err.Error()
	}
	r.settle(ctx, sys, 5*time.Second)
	b := r.snap(ctx, sys)
	_, last, events := fireStats(res, r.Recv.Arrivals(), "burst", n)
	if res.Fired > 0 {
		drain := last.Sub(due)
		res.DrainSecs = seconds(drain)
		res.FiredPerSec = float64(res.Fired) / drain.Seconds()
		res.SeriesStart = due
		res.Series = stats.PerSecond(events, due, int(drain/time.Second)+2)
	}
	res.Costs = costs(a, b, res.Fired)
	return res
}

// Steady: rate timers per second due continuously for dur. The first
// preFraction of them is created before the first is due, the rest while
// the run goes on, each lead before its due time.
func (r *Runner) Steady(ctx context.Context, sys system.System, rate int, dur time.Duration, preFraction float64) *Result {
	return r.steady(ctx, sys, "steady", rate, dur, preFraction)
}

func (r *Runner) steady(ctx context.Context, sys system.System, name string, rate int, dur time.Duration, preFraction float64) *Result {
	n := int(float64(rate) * dur.Seconds())
	pre := int(float64(n) * preFraction)
	res := &Result{System: sys.Name(), Workload: name, Params: map[string]any{
		"rate": rate, "seconds": dur.Seconds(), "timers": n, "precreated": pre, "leadSeconds": r.Lead.Seconds()}}
	r.Recv.Reset()
	start, err := r.firstDue(ctx, sys, pre)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	prefix := fmt.Sprintf("%s%d", name, rate)
	interval := time.Second / time.Duration(rate)
	dueOf := func(i int) time.Time { return start.Add(time.Duration(i) * interval) }
	ts := r.timers(prefix, n, dueOf)
	_, took, err := r.createAll(ctx, sys, ts[:pre], true, fmt.Sprintf("%s: prepare %d/s", sys.Name(), rate))
	res.CreateSeconds = seconds(took)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	if time.Now().After(start.Add(-time.Second)) {
		res.note("pre-creation ended %s before the first due time", time.Until(start).Round(time.Millisecond))
	}
	a := r.snap(ctx, sys)

	// Live creates: timer i is created once now >= due(i) - r.Lead, from
	// r.Clients clients; a create that starts after its timer's due time is
	// counted as late (the system cannot fire what it has not got yet).
	var (
		next     atomic.Int64
		late     atomic.Int64
		failed   atomic.Int64
		wg       sync.WaitGroup
		firstErr atomic.Value
	)
	next.Store(int64(pre))
	liveLat := make([]time.Duration, n)
	for range max(r.Clients, 1) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if wait := time.Until(ts[i].ExecuteAt.Add(-r.Lead)); wait > 0 {
					select {
					case <-time.After(wait): // pacing: the create is scheduled for then
					case <-ctx.Done():
						return
					}
				}
				t0 := time.Now()
				if t0.After(ts[i].ExecuteAt) {
					late.Add(1)
				}
				if err := sys.Create(ctx, ts[i]); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
				liveLat[i] = time.Since(t0)
			}
		})
	}
	werr := r.waitFired(ctx, fmt.Sprintf("%s: steady %d/s", sys.Name(), rate), n, start.Add(dur+time.Minute))
	wg.Wait()
	if werr != nil {
		res.Error = werr.Error()
	}
	if f := failed.Load(); f > 0 {
		res.CreateFailures = int(f)
		res.note("%d live creates failed, first: %v", f, firstErr.Load())
	}
	if l := late.Load(); l > 0 {
		res.note("%d of %d live creates started after their timer was due (creates could not keep up); lateness includes that", l, n-pre)
	}
	res.Creates = n
	res.CreateLatency = stats.Summarize(liveLat[pre:])
	r.settle(ctx, sys, 5*time.Second)
	b := r.snap(ctx, sys)
	_, last, events := fireStats(res, r.Recv.Arrivals(), prefix, n)
	if res.Fired > 0 {
		res.DrainSecs = seconds(last.Sub(start))
		res.FiredPerSec = float64(res.Fired) / last.Sub(start).Seconds()
		res.SeriesStart = start
		res.Series = stats.PerSecond(events, start, int(last.Sub(start)/time.Second)+1)
	}
	res.Costs = costs(a, b, res.Fired)
	return res
}

// Backlog: the system is stopped while n timers come due over spread, then
// started: how fast it catches up, and how late the last one fires.
func (r *Runner) Backlog(ctx context.Context, sys system.System, n int, spread time.Duration) *Result {
	res := &Result{System: sys.Name(), Workload: "backlog", Params: map[string]any{"timers": n, "spreadSeconds": spread.Seconds()}}
	r.Recv.Reset()
	first, err := r.firstDue(ctx, sys, n)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	ts := r.timers("backlog", n, func(i int) time.Time { return first.Add(time.Duration(i) * spread / time.Duration(n)) })
	_, took, err := r.createAll(ctx, sys, ts, true, sys.Name()+": prepare backlog")
	res.Creates, res.CreateSeconds = n, seconds(took)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	if err := stop(ctx, sys); err != nil {
		res.Error = err.Error()
		return res
	}
	if fired := r.Recv.Distinct(); fired > 0 {
		// The creates overran the planned due times: what fires after the
		// restart is not a backlog, and a catch-up rate would be made up.
		res.Error = fmt.Sprintf("%d of %d timers fired before the system was stopped (the creates took longer than planned): no backlog to measure", fired, n)
		return res
	}
	if time.Now().After(first) {
		res.note("the system stopped %s after the first timer was due", time.Since(first).Round(time.Millisecond))
	}
	allDue := first.Add(spread)
	r.P.Logf("%s: stopped; %d timers come due until %s", sys.Name(), n, allDue.Format("15:04:05.000"))
	select {
	case <-time.After(time.Until(allDue) + time.Second): // the system is down for this long by design
	case <-ctx.Done():
		return res
	}
	restart := time.Now()
	if err := sys.Start(ctx); err != nil {
		res.Error = err.Error()
		return res
	}
	ready := time.Since(restart)
	a := r.snap(ctx, sys)
	if err := r.waitFired(ctx, sys.Name()+": catching up", n, time.Now().Add(time.Minute+time.Duration(n)*time.Millisecond)); err != nil {
		res.Error = err.Error()
	}
	r.settle(ctx, sys, 5*time.Second)
	b := r.snap(ctx, sys)
	_, last, events := fireStats(res, r.Recv.Arrivals(), "backlog", n)
	if res.Fired > 0 {
		catch := last.Sub(restart)
		res.DrainSecs = seconds(catch)
		res.FiredPerSec = float64(res.Fired) / catch.Seconds()
		res.SeriesStart = restart
		res.Series = stats.PerSecond(events, restart, int(catch/time.Second)+2)
		res.Extra = map[string]float64{
			"restartToReadySeconds": seconds(ready),
			"downSeconds":           seconds(restart.Sub(first)),
			"lastLatenessMs":        float64(last.Sub(ts[n-1].ExecuteAt)) / float64(time.Millisecond),
		}
	}
	res.Costs = costs(a, b, res.Fired)
	return res
}

// Scale: stored future timers (due a day or more ahead, never loaded) are
// created first; then, after a restart so that the memory reading is of
// serving, not of loading, a steady run and a burst show whether they cost
// firing speed or memory.
func (r *Runner) Scale(ctx context.Context, sys system.System, stored, rate int, dur time.Duration, burst int) []*Result {
	load := &Result{System: sys.Name(), Workload: "scale-load", Params: map[string]any{"stored": stored, "clients": r.Clients}}
	r.Recv.Reset()
	day := time.Now().Add(24 * time.Hour)
	ts := r.timers("stored", stored, func(i int) time.Time { return day.Add(time.Duration(i) * time.Millisecond) })
	a := r.snap(ctx, sys)
	lat, took, err := r.createAll(ctx, sys, ts, false, fmt.Sprintf("%s: store %d future timers", sys.Name(), stored))
	load.Costs = costs(a, r.snap(ctx, sys), 0)
	ts = nil
	load.Creates, load.CreateSeconds = stored, seconds(took)
	load.CreatesPerSec = float64(stored) / took.Seconds()
	load.CreateLatency = stats.Summarize(lat)
	if err != nil {
		load.Error = err.Error()
		return []*Result{load}
	}
	err = stop(ctx, sys)
	if err == nil {
		err = sys.Start(ctx)
	}
	if err != nil {
		load.Error = err.Error()
		return []*Result{load}
	}
	st := r.steady(ctx, sys, "scale-steady", rate, dur, 0.5)
	st.Params["stored"] = stored
	bu := r.Burst(ctx, sys, burst)
	bu.Workload = "scale-burst"
	bu.Params["stored"] = stored
	return []*Result{load, st, bu}
}
