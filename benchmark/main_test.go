package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/dtimer/dtimer/benchmark/internal/report"
)

// TestMain lets the test binary stand in for the harness binary when the
// River system re-executes itself as its worker process.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "river-worker" {
		os.Exit(riverWorker(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// TestSmoke runs the whole harness in its seconds-long smoke mode on every
// database server the environment names (SQLite always; River, the
// PostgreSQL ceilings and the cluster run when DTIMER_TEST_POSTGRES_URL is
// set): every workload must complete with every timer fired, and the report
// must hold every result and its plots. It measures nothing; speed is never
// asserted.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("smoke run starts servers")
	}
	out := t.TempDir()
	md := filepath.Join(out, "RESULTS.md")
	cfg, err := parseFlags([]string{"--smoke", "--out", filepath.Join(out, "results"), "--markdown", md, "--scale-drivers", "sqlite"})
	if err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), cfg); err != nil {
		t.Fatalf("smoke run: %v", err)
	}

	b, err := os.ReadFile(filepath.Join(out, "results", "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep report.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("results.json: %v", err)
	}
	got := map[string][]string{}
	for _, r := range rep.Results {
		got[r.System] = append(got[r.System], r.Workload)
		if r.Error != "" || r.Missing != 0 || r.Duplicates < 0 {
			t.Errorf("%s %s: error %q, missing %d", r.System, r.Workload, r.Error, r.Missing)
		}
		if r.Expected > 0 && r.Early > 0 {
			t.Errorf("%s %s: %d timers fired before their executeAt", r.System, r.Workload, r.Early)
		}
	}
	want := map[string][]string{"dtimer/sqlite": {"create", "burst", "steady", "backlog", "scale-load", "scale-steady", "scale-burst"}}
	for _, d := range cfg.drivers {
		if d != "sqlite" {
			want["dtimer/"+d] = []string{"create", "burst", "steady", "backlog"}
		}
	}
	if cfg.servers.PostgresURL != "" {
		for _, p := range []string{"river/defaults", "river/tuned"} {
			want[p] = []string{"create", "burst", "steady", "backlog"}
		}
		want["dtimer/postgres x1"] = []string{"cluster"}
		want["dtimer/postgres x2"] = []string{"cluster"}
		var names []string
		for _, c := range rep.Ceilings {
			names = append(names, c.Name)
			if c.Ops <= 0 || c.PerSecond <= 0 {
				t.Errorf("ceiling %s at %d: %d ops, %.0f/s", c.Name, c.Concurrency, c.Ops, c.PerSecond)
			}
		}
		for _, n := range []string{"http-post", "pg-insert", "pg-delete"} {
			if !slices.Contains(names, n) {
				t.Errorf("no %s ceiling (got %v)", n, names)
			}
		}
	}
	for sys, ws := range want {
		for _, w := range ws {
			if !slices.Contains(got[sys], w) {
				t.Errorf("no %s result for %s (got %v)", w, sys, got[sys])
			}
		}
	}
	if len(rep.Targets) == 0 {
		t.Error("no targets evaluated")
	}
	for _, files := range rep.Plots {
		for _, f := range files {
			if st, err := os.Stat(filepath.Join(out, "results", f)); err != nil || st.Size() == 0 {
				t.Errorf("plot %s: %v", f, err)
			}
		}
	}
	if len(rep.Plots) == 0 {
		t.Error("no plots")
	}
	if st, err := os.Stat(md); err != nil || st.Size() == 0 {
		t.Errorf("markdown report: %v", err)
	}
}
