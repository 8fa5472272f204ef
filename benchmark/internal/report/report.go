// Package report writes a benchmark run's results: results.json (all of
// it), results.md (tables, the targets and whether each is met, the plots)
// and PNG plots. Every number in them comes from the run.
package report

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/dtimer/dtimer/benchmark/internal/ceiling"
	"github.com/dtimer/dtimer/benchmark/internal/stores"
	"github.com/dtimer/dtimer/benchmark/internal/workload"
)

// Report is one run.
type Report struct {
	Command  string            `json:"command"`
	Started  time.Time         `json:"started"`
	Finished time.Time         `json:"finished"`
	Machine  map[string]string `json:"machine"`
	Versions map[string]string `json:"versions"`
	// Peers describes each peer configuration (River defaults, tuned).
	Peers    map[string]string   `json:"peers,omitempty"`
	Ceilings []ceiling.Result    `json:"ceilings"`
	Results  []*workload.Result  `json:"results"`
	Targets  []Target            `json:"targets"`
	Skipped  []string            `json:"skipped,omitempty"`
	Plots    map[string][]string `json:"plots,omitempty"`
}

// Key groups results that are compared in one table row set and one plot.
func Key(r *workload.Result) string {
	switch r.Workload {
	case "steady", "scale-steady":
		return fmt.Sprintf("%s %v/s", r.Workload, r.Params["rate"])
	default:
		return r.Workload
	}
}

// order sorts systems: dtimer by driver, then the peer, then clusters.
func order(system string) string {
	for i, d := range stores.Drivers {
		if system == "dtimer/"+d {
			return fmt.Sprintf("0%d", i)
		}
	}
	switch {
	case strings.HasPrefix(system, "river/defaults"):
		return "1a"
	case strings.HasPrefix(system, "river/"):
		return "1b"
	}
	return "2" + system
}

// Write writes results.json, results.md and the plots into dir.
func (r *Report) Write(dir string) error {
	plots, err := Plots(dir, r.Results)
	if err != nil {
		return fmt.Errorf("plots: %w", err)
	}
	r.Plots = plots
	r.Targets = Evaluate(r)
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), b, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "results.md"), []byte(r.Markdown()), 0o644)
}

func ms(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v < 10:
		return fmt.Sprintf("%.2f ms", v)
	case v < 1000:
		return fmt.Sprintf("%.0f ms", v)
	default:
		return fmt.Sprintf("%.2f s", v/1000)
	}
}

func rate(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f/s", v)
}

func pct(a, b float64) string {
	if a == 0 || b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*a/b)
}

func opt(p *float64) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%.4f", *p)
}

// Markdown renders the report.
func (r *Report) Markdown() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# dtimer benchmark results\n\n")
	w("Command: `%s`  \n", r.Command)
	w("Run: %s to %s (%s)  \n", r.Started.UTC().Format(time.RFC3339), r.Finished.UTC().Format(time.RFC3339), r.Finished.Sub(r.Started).Round(time.Second))
	keys := func(m map[string]string) []string {
		ks := make([]string, 0, len(m))
		for k := range m {
			ks = append(ks, k)
		}
		sort.Strings(ks)
		return ks
	}
	w("Machine: ")
	for i, k := range keys(r.Machine) {
		if i > 0 {
			w(", ")
		}
		w("%s %s", k, r.Machine[k])
	}
	w("  \nVersions: ")
	for i, k := range keys(r.Versions) {
		if i > 0 {
			w(", ")
		}
		w("%s %s", k, r.Versions[k])
	}
	w("\n\n")
	for _, k := range keys(r.Peers) {
		w("- `%s`: %s\n", k, r.Peers[k])
	}
	if len(r.Skipped) > 0 {
		w("\nNot run: %s\n", strings.Join(r.Skipped, "; "))
	}

	w("\n## Targets\n\n| target | goal | measured | met |\n|---|---|---|---|\n")
	for _, t := range r.Targets {
		w("| %s | %s | %s | %s |\n", t.Name, t.Goal, t.Measured, t.Met)
	}

	if len(r.Ceilings) > 0 {
		w("\n## Ceilings of this machine\n\nFractions of a ceiling elsewhere in this report are of its highest rate, at whichever concurrency.\n\n| ceiling | concurrency | ops | rate | p50 | p99 |\n|---|---|---|---|---|---|\n")
		for _, c := range r.Ceilings {
			w("| %s | %d | %d | %s | %s | %s |\n", c.Name, c.Concurrency, c.Ops, rate(c.PerSecond), ms(c.P50Ms), ms(c.P99Ms))
		}
	}

	by := map[string][]*workload.Result{}
	var groups []string
	for _, res := range r.Results {
		k := Key(res)
		if _, ok := by[k]; !ok {
			groups = append(groups, k)
		}
		by[k] = append(by[k], res)
	}
	slices.SortStableFunc(groups, func(a, b string) int { return strings.Compare(groupOrder(a), groupOrder(b)) })
	insert := r.ceiling("pg-insert")
	httpc := r.ceiling("http-post")
	for _, g := range groups {
		rs := by[g]
		sort.SliceStable(rs, func(i, j int) bool { return order(rs[i].System) < order(rs[j].System) })
		w("\n## %s\n\n", g)
		if len(rs) > 0 && len(rs[0].Params) > 0 {
			w("Parameters: %s\n\n", params(rs[0].Params))
		}
		switch rs[0].Workload {
		case "create", "scale-load":
			w("| system | creates | time | creates/s | latency p50 | p99 | max | of raw PG insert |\n|---|---|---|---|---|---|---|---|\n")
			for _, x := range rs {
				w("| %s | %d | %.2f s | %s | %s | %s | %s | %s |\n", x.System, x.Creates, x.CreateSeconds, rate(x.CreatesPerSec),
					ms(x.CreateLatency.P50), ms(x.CreateLatency.P99), ms(x.CreateLatency.Max), pct(x.CreatesPerSec, insert))
			}
		default:
			w("| system | fired | missing | dup | early | %s | fired/s | lateness p50 | p99 | p99.9 | max | of raw HTTP |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
				map[bool]string{true: "catch-up", false: "last - first due"}[rs[0].Workload == "backlog"])
			for _, x := range rs {
				w("| %s | %d/%d | %d | %d | %d | %.2f s | %s | %s | %s | %s | %s | %s |\n", x.System, x.Fired, x.Expected, x.Missing, x.Duplicates, x.Early,
					x.DrainSecs, rate(x.FiredPerSec), ms(x.Lateness.P50), ms(x.Lateness.P99), ms(x.Lateness.P999), ms(x.Lateness.Max), pct(x.FiredPerSec, httpc))
			}
		}
		w("\n| system | server CPU | server peak RSS | DB CPU | reads/fired | deletes/fired | writes/fired | statements |\n|---|---|---|---|---|---|---|---|\n")
		for _, x := range rs {
			db := "-"
			if x.Costs.DBCPUSeconds > 0 {
				db = fmt.Sprintf("%.1f s", x.Costs.DBCPUSeconds)
			}
			w("| %s | %.1f s | %.0f MB | %s | %s | %s | %s | %s |\n", x.System, x.Costs.ServerCPUSeconds, x.Costs.ServerPeakRSSMB, db,
				opt(x.Costs.ReadsPerFired), opt(x.Costs.DeletesPerFired), opt(x.Costs.WritesPerFired), statements(x.Costs.Statements))
		}
		for _, x := range rs {
			for _, n := range x.Notes {
				w("\n- %s: %s", x.System, n)
			}
			if x.Error != "" {
				w("\n- %s: **error**: %s", x.System, x.Error)
			}
			for _, k := range keysF(x.Extra) {
				w("\n- %s: %s = %.3f", x.System, k, x.Extra[k])
			}
		}
		w("\n")
		for _, f := range r.Plots[g] {
			w("\n![%s](%s)\n", f, f)
		}
	}
	return b.String()
}

func groupOrder(g string) string {
	for i, p := range []string{"create", "burst", "steady", "backlog", "scale", "cluster"} {
		if strings.HasPrefix(g, p) {
			// Steady rates sort numerically.
			var n int
			fmt.Sscanf(strings.TrimPrefix(strings.TrimPrefix(g, "scale-"), "steady "), "%d", &n)
			return fmt.Sprintf("%d %s %09d", i, strings.Fields(g)[0], n)
		}
	}
	return "9" + g
}

func keysF(m map[string]float64) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func params(p map[string]any) string {
	ks := make([]string, 0, len(p))
	for k := range p {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	parts := make([]string, len(ks))
	for i, k := range ks {
		parts[i] = fmt.Sprintf("%s=%v", k, p[k])
	}
	return strings.Join(parts, ", ")
}

func statements(m map[string]float64) string {
	if len(m) == 0 {
		return "-"
	}
	parts := make([]string, 0, len(m))
	for _, k := range keysF(m) {
		parts = append(parts, fmt.Sprintf("%s %.0f", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// ceiling is the highest rate measured for the named ceiling (at any
// concurrency): the strictest yardstick.
func (r *Report) ceiling(name string) float64 {
	var best float64
	for _, c := range r.Ceilings {
		if c.Name == name {
			best = max(best, c.PerSecond)
		}
	}
	return best
}

// MarkdownWithPlots renders the report with plot links prefixed by prefix
// (the plots' directory relative to where the Markdown file goes).
func (r *Report) MarkdownWithPlots(prefix string) string {
	saved := r.Plots
	r.Plots = map[string][]string{}
	for k, fs := range saved {
		for _, f := range fs {
			r.Plots[k] = append(r.Plots[k], prefix+f)
		}
	}
	defer func() { r.Plots = saved }()
	return r.Markdown()
}
