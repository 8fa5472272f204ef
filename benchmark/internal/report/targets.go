package report

import (
	"fmt"

	"github.com/dtimer/dtimer/benchmark/internal/workload"
)

// Target is one of the benchmark issue's targets, evaluated on this run.
type Target struct {
	Name     string `json:"name"`
	Goal     string `json:"goal"`
	Measured string `json:"measured"`
	Met      string `json:"met"` // yes, NO, or "not measured"
}

// The targets are for a single dtimer node on PostgreSQL against the peer
// tuned for the workload.
const (
	subject = "dtimer/postgres"
	peer    = "river/tuned"
)

func (r *Report) find(system, key string) *workload.Result {
	for _, x := range r.Results {
		if x.System == system && Key(x) == key && x.Error == "" {
			return x
		}
	}
	return nil
}

func verdict(ok bool) string {
	if ok {
		return "yes"
	}
	return "NO"
}

// Evaluate checks the run against every target; a target whose inputs were
// not measured says so.
func Evaluate(r *Report) []Target {
	var ts []Target
	add := func(name, goal string, measured string, ok *bool) {
		t := Target{Name: name, Goal: goal, Measured: measured, Met: "not measured"}
		if ok != nil {
			t.Met = verdict(*ok)
		}
		ts = append(ts, t)
	}
	b := func(v bool) *bool { return &v }
	none := "-"

	burst, rburst := r.find(subject, "burst"), r.find(peer, "burst")
	if burst != nil && rburst != nil {
		add("burst drain vs peer", ">= 2x river tuned", fmt.Sprintf("%s vs %s: %.2fx", rate(burst.FiredPerSec), rate(rburst.FiredPerSec), burst.FiredPerSec/rburst.FiredPerSec),
			b(burst.FiredPerSec >= 2*rburst.FiredPerSec))
		add("burst lateness p99 vs peer", "<= 1/2 of river tuned", fmt.Sprintf("%s vs %s", ms(burst.Lateness.P99), ms(rburst.Lateness.P99)),
			b(burst.Lateness.P99 <= rburst.Lateness.P99/2))
	} else {
		add("burst drain vs peer", ">= 2x river tuned", none, nil)
		add("burst lateness p99 vs peer", "<= 1/2 of river tuned", none, nil)
	}
	if h := r.ceiling("http-post"); burst != nil && h > 0 {
		add("burst drain vs raw HTTP", ">= 60% of raw HTTP POST (its best concurrency)", fmt.Sprintf("%s of %s: %s", rate(burst.FiredPerSec), rate(h), pct(burst.FiredPerSec, h)),
			b(burst.FiredPerSec >= 0.6*h))
	} else {
		add("burst drain vs raw HTTP", ">= 60% of raw HTTP POST", none, nil)
	}
	if s := r.find(subject, "steady 5000/s"); s != nil {
		add("steady 5,000/s lateness", "p50 <= 5 ms, p99 <= 20 ms", fmt.Sprintf("p50 %s, p99 %s", ms(s.Lateness.P50), ms(s.Lateness.P99)),
			b(s.Lateness.P50 <= 5 && s.Lateness.P99 <= 20 && s.Missing == 0))
	} else {
		add("steady 5,000/s lateness", "p50 <= 5 ms, p99 <= 20 ms", none, nil)
	}
	s8, r8 := r.find(subject, "steady 8000/s"), r.find(peer, "steady 8000/s")
	if s8 != nil && r8 != nil {
		add("steady 8,000/s p99 vs peer", "<= 1/4 of river tuned", fmt.Sprintf("%s vs %s", ms(s8.Lateness.P99), ms(r8.Lateness.P99)),
			b(s8.Lateness.P99 <= r8.Lateness.P99/4 && s8.Missing == 0))
	} else {
		add("steady 8,000/s p99 vs peer", "<= 1/4 of river tuned", none, nil)
	}
	if c, ins := r.find(subject, "create"), r.ceiling("pg-insert"); c != nil && ins > 0 {
		add("creates vs raw insert", ">= 50% of raw single-row INSERT", fmt.Sprintf("%s of %s: %s", rate(c.CreatesPerSec), rate(ins), pct(c.CreatesPerSec, ins)),
			b(c.CreatesPerSec >= 0.5*ins))
	} else {
		add("creates vs raw insert", ">= 50% of raw single-row INSERT", none, nil)
	}
	// Statements per fired timer: the worst of the subject's firing runs.
	var worstR, worstD float64
	found := false
	for _, x := range r.Results {
		if x.System != subject || x.Costs.ReadsPerFired == nil || x.Fired < 1000 {
			continue
		}
		found = true
		worstR = max(worstR, *x.Costs.ReadsPerFired)
		worstD = max(worstD, *x.Costs.DeletesPerFired)
	}
	if found {
		add("DB reads per fired timer", "<= 0.01", fmt.Sprintf("%.4f (worst run)", worstR), b(worstR <= 0.01))
		add("DB deletes per fired timer", "<= 0.01", fmt.Sprintf("%.4f (worst run)", worstD), b(worstD <= 0.01))
	} else {
		add("DB reads per fired timer", "<= 0.01", none, nil)
		add("DB deletes per fired timer", "<= 0.01", none, nil)
	}
	var scaleSteady, scaleBurst *workload.Result
	for _, x := range r.Results {
		if x.System == subject && x.Error == "" {
			switch x.Workload {
			case "scale-steady":
				scaleSteady = x
			case "scale-burst":
				scaleBurst = x
			}
		}
	}
	if scaleSteady != nil {
		add("server RSS with stored timers", "<= 300 MB with 1M stored", fmt.Sprintf("%.0f MB with %v stored", scaleSteady.Costs.ServerPeakRSSMB, scaleSteady.Params["stored"]),
			b(scaleSteady.Costs.ServerPeakRSSMB <= 300 && toInt(scaleSteady.Params["stored"]) >= 1_000_000))
	} else {
		add("server RSS with stored timers", "<= 300 MB with 1M stored", none, nil)
	}
	if scaleBurst != nil && burst != nil {
		ratio := scaleBurst.FiredPerSec / burst.FiredPerSec
		add("fired/s with stored timers", "within 10% of none, with 10M stored", fmt.Sprintf("burst %s with %v stored vs %s with none: %.0f%%",
			rate(scaleBurst.FiredPerSec), scaleBurst.Params["stored"], rate(burst.FiredPerSec), 100*ratio),
			b(ratio >= 0.9 && toInt(scaleBurst.Params["stored"]) >= 10_000_000))
	} else {
		add("fired/s with stored timers", "within 10% of none, with 10M stored", none, nil)
	}
	return ts
}

func toInt(v any) int {
	switch n := v.(type) {
	case int:
		return n
	case float64:
		return int(n)
	}
	return 0
}
