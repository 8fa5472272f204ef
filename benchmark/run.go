package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dtimer/dtimer/benchmark/internal/ceiling"
	"github.com/dtimer/dtimer/benchmark/internal/procstat"
	"github.com/dtimer/dtimer/benchmark/internal/receiver"
	"github.com/dtimer/dtimer/benchmark/internal/report"
	"github.com/dtimer/dtimer/benchmark/internal/river"
	"github.com/dtimer/dtimer/benchmark/internal/stores"
	"github.com/dtimer/dtimer/benchmark/internal/system"
	"github.com/dtimer/dtimer/benchmark/internal/workload"
)

// factory makes a fresh system (with a store of its own) for one workload.
type factory struct {
	name string
	make func(ctx context.Context) (system.System, error)
	db   func() (procstat.Sample, error)
	// bulk: the system has a fast bulk insert (the peer); it may run the
	// backlog, which stops and starts it.
	canStop bool
}

func run(ctx context.Context, cfg *config) error {
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	out, err := filepath.Abs(cfg.out)
	if err != nil {
		return err
	}
	logs := filepath.Join(out, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return err
	}
	p := workload.NewProgress()
	rep := &report.Report{
		Command:  "go run ./benchmark " + strings.Join(os.Args[1:], " "),
		Started:  time.Now(),
		Machine:  machine(),
		Versions: versions(ctx, cfg),
		Peers:    map[string]string{},
	}

	bin := cfg.serverBin
	if bin == "" && cfg.target == "" {
		if bin, err = buildServer(ctx, out, p); err != nil {
			return err
		}
	}
	recv, err := receiver.Start(cfg.recvAddr)
	if err != nil {
		return err
	}
	defer recv.Close()
	callbackURL := recv.URL
	if cfg.recvURL != "" {
		callbackURL = cfg.recvURL
	}
	p.Logf("receiver at %s; results to %s", recv.URL, out)

	if cfg.ceilings {
		rep.Ceilings = ceilings(ctx, cfg, recv, p, rep)
	}

	runner := &workload.Runner{Recv: recv, P: p, Clients: cfg.clients, PayloadBytes: cfg.payloadBytes, Lead: cfg.lead}
	cfg.servers.SQLiteDir = filepath.Join(out, "sqlite")
	cfg.servers.PostgresMaxConns = cfg.clients
	dtimerAt := func(driver string, nodes int) factory {
		return factory{name: "dtimer/" + driver, canStop: true, db: dbProcesses(driver), make: func(ctx context.Context) (system.System, error) {
			st, err := cfg.servers.Fresh(ctx, driver)
			if err != nil {
				return nil, err
			}
			return system.NewDtimer(system.DtimerConfig{
				Bin: bin, Store: st, Nodes: nodes, Namespace: cfg.namespace, Shards: cfg.shards,
				CallbackURL: callbackURL, Env: cfg.serverEnv, LogDir: logs, Clients: cfg.clients,
			})
		}}
	}
	var systems []factory
	if cfg.target != "" {
		systems = append(systems, factory{name: "dtimer/target", make: func(context.Context) (system.System, error) {
			return system.NewRemote(cfg.target, system.DtimerConfig{Namespace: cfg.namespace, CallbackURL: callbackURL, Clients: cfg.clients}), nil
		}})
	}
	for _, d := range cfg.drivers {
		systems = append(systems, dtimerAt(d, 1))
	}
	for _, label := range cfg.peers {
		wc := river.WorkerConfig{Tuned: label == "tuned", PoolSize: int32(cfg.clients)}
		if wc.Tuned {
			wc.Workers = cfg.riverWorkers
			wc.FetchCooldown, wc.FetchPollInterval, wc.SchedulerInterval = time.Millisecond, time.Millisecond, 0
		}
		rep.Peers["river/"+label] = wc.Describe()
		systems = append(systems, factory{name: "river/" + label, canStop: true, db: dbProcesses("postgres"), make: func(ctx context.Context) (system.System, error) {
			url, drop, err := stores.FreshPostgresDatabase(ctx, cfg.servers.PostgresURL)
			if err != nil {
				return nil, err
			}
			wc := wc
			wc.PGURL = url
			sys, err := system.NewRiver(ctx, system.RiverConfig{Label: label, Worker: wc, Drop: drop, CallbackURL: callbackURL, LogDir: logs, Clients: cfg.clients})
			if err != nil {
				_ = drop(ctx)
			}
			return sys, err
		}})
	}
	if len(systems) == 0 {
		return errors.New("nothing to measure: no driver, peer or target")
	}

	// each runs fn on a fresh, started system made by f and records what it
	// returns; a failure is recorded, not fatal, so one broken system does
	// not cost the whole run.
	each := func(f factory, workloadName string, fn func(system.System) []*workload.Result) {
		if ctx.Err() != nil {
			return
		}
		runner.DB = f.db
		sys, err := f.make(ctx)
		if err == nil {
			err = sys.Start(ctx)
		}
		if err != nil {
			p.Logf("%s %s: %v", f.name, workloadName, err)
			rep.Results = append(rep.Results, &workload.Result{System: f.name, Workload: workloadName, Error: err.Error()})
			if sys != nil {
				_ = sys.Close(context.WithoutCancel(ctx))
			}
			return
		}
		results := fn(sys)
		if err := sys.Close(context.WithoutCancel(ctx)); err != nil {
			p.Logf("%s: close: %v", f.name, err)
		}
		for _, r := range results {
			if r.Error != "" {
				p.Logf("%s %s: %s", r.System, r.Workload, r.Error)
			}
			p.Logf("%s %s: %s", r.System, report.Key(r), summary(r))
		}
		rep.Results = append(rep.Results, results...)
	}
	one := func(r *workload.Result) []*workload.Result { return []*workload.Result{r} }

	if cfg.has("create") {
		for _, f := range systems {
			each(f, "create", func(s system.System) []*workload.Result { return one(runner.Create(ctx, s, cfg.createTimers)) })
		}
	}
	if cfg.has("burst") {
		for _, f := range systems {
			each(f, "burst", func(s system.System) []*workload.Result { return one(runner.Burst(ctx, s, cfg.burstTimers)) })
		}
	}
	if cfg.has("steady") {
		for _, rate := range cfg.steadyRates {
			for _, f := range systems {
				each(f, "steady", func(s system.System) []*workload.Result {
					return one(runner.Steady(ctx, s, rate, cfg.steadySeconds, cfg.steadyPre))
				})
			}
		}
	}
	if cfg.has("backlog") {
		for _, f := range systems {
			if !f.canStop {
				rep.Skipped = append(rep.Skipped, f.name+" backlog (cannot stop a --target)")
				continue
			}
			each(f, "backlog", func(s system.System) []*workload.Result {
				return one(runner.Backlog(ctx, s, cfg.backlogTimers, cfg.backlogSpread))
			})
		}
	}
	if cfg.has("scale") {
		for _, d := range cfg.scaleDrivers {
			if !slices.Contains(cfg.drivers, d) {
				rep.Skipped = append(rep.Skipped, "scale on "+d+" (driver not run)")
				continue
			}
			each(dtimerAt(d, 1), "scale", func(s system.System) []*workload.Result {
				return runner.Scale(ctx, s, cfg.scaleStored, cfg.scaleRate, cfg.steadySeconds, cfg.scaleBurst)
			})
		}
	}
	if cfg.has("cluster") {
		if slices.Contains(cfg.drivers, "postgres") {
			for _, n := range cfg.clusterNodes {
				each(dtimerAt("postgres", n), "cluster", func(s system.System) []*workload.Result {
					r := runner.Burst(ctx, s, cfg.clusterTimers)
					r.Workload = "cluster"
					r.System = fmt.Sprintf("dtimer/postgres x%d", n)
					r.Params["nodes"] = n
					return one(r)
				})
			}
		} else {
			rep.Skipped = append(rep.Skipped, "cluster scaling run (needs postgres)")
		}
	}
	rep.Finished = time.Now()
	if err := rep.Write(out); err != nil {
		return err
	}
	p.Logf("wrote %s", filepath.Join(out, "results.md"))
	if cfg.markdown != "" {
		mdDir, err := filepath.Abs(filepath.Dir(cfg.markdown))
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(mdDir, out)
		if err != nil {
			return err
		}
		if err := os.WriteFile(cfg.markdown, []byte(rep.MarkdownWithPlots(filepath.ToSlash(rel)+"/")), 0o644); err != nil {
			return err
		}
		p.Logf("wrote %s", cfg.markdown)
	}
	for _, t := range rep.Targets {
		p.Logf("target %-32s %-36s %-40s %s", t.Name, t.Goal, t.Measured, t.Met)
	}
	// A peer that cannot keep up is a finding, reported as such; dtimer
	// leaving a timer unfired, or any system failing to run, fails the run.
	for _, r := range rep.Results {
		if strings.HasPrefix(r.System, "river/") && r.Fired > 0 {
			continue
		}
		if r.Error != "" || r.Missing > 0 {
			return fmt.Errorf("%s %s did not complete (error %q, %d timers missing): see %s", r.System, r.Workload, r.Error, r.Missing, logs)
		}
	}
	return nil
}

func summary(r *workload.Result) string {
	switch {
	case r.Workload == "create" || r.Workload == "scale-load":
		return fmt.Sprintf("%.0f creates/s, p50 %.2f ms, p99 %.2f ms", r.CreatesPerSec, r.CreateLatency.P50, r.CreateLatency.P99)
	case r.Fired > 0:
		return fmt.Sprintf("fired %d/%d, %.0f/s, lateness p50 %.1f ms p99 %.1f ms max %.1f ms, dup %d", r.Fired, r.Expected, r.FiredPerSec,
			r.Lateness.P50, r.Lateness.P99, r.Lateness.Max, r.Duplicates)
	}
	return "no result"
}

// buildServer builds dtimer-server from this workspace into dir.
func buildServer(ctx context.Context, dir string, p *workload.Progress) (string, error) {
	gowork, err := exec.CommandContext(ctx, "go", "env", "GOWORK").Output()
	root := filepath.Dir(strings.TrimSpace(string(gowork)))
	if err != nil || strings.TrimSpace(string(gowork)) == "" {
		return "", errors.New("not in the dtimer workspace (go env GOWORK is empty): run from the repository or give --server-bin")
	}
	bin := filepath.Join(dir, "dtimer-server")
	p.Logf("building %s", bin)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./server/cmd/dtimer-server")
	cmd.Dir, cmd.Stdout, cmd.Stderr = root, os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build dtimer-server: %w", err)
	}
	return bin, nil
}

// ceilings measures the machine's own limits: a Go client POSTing to the
// receiver, and single-row inserts and deletes on the PostgreSQL server.
func ceilings(ctx context.Context, cfg *config, recv *receiver.Receiver, p *workload.Progress, rep *report.Report) []ceiling.Result {
	var out []ceiling.Result
	body := []byte(`{"namespace":"default","timerId":"ceiling","executeAt":"2026-01-01T00:00:00.000Z","payload":` +
		fmt.Sprintf(`{"pad":"%s"}`, strings.Repeat("x", max(cfg.payloadBytes-10, 0))) + `,"attempt":1}`)
	for _, c := range cfg.httpClients {
		p.Logf("ceiling: raw HTTP POST to the receiver, %d clients, %s", c, cfg.ceilingSeconds)
		recv.Reset()
		if r, err := ceiling.HTTPPost(ctx, recv.URL, body, c, cfg.ceilingSeconds); err == nil {
			out = append(out, r)
		} else {
			rep.Skipped = append(rep.Skipped, "HTTP ceiling: "+err.Error())
		}
	}
	recv.Reset()
	if cfg.servers.PostgresURL == "" {
		rep.Skipped = append(rep.Skipped, "PostgreSQL ceilings (no server)")
		return out
	}
	url, drop, err := stores.FreshPostgresDatabase(ctx, cfg.servers.PostgresURL)
	if err != nil {
		rep.Skipped = append(rep.Skipped, "PostgreSQL ceilings: "+err.Error())
		return out
	}
	defer func() { _ = drop(context.WithoutCancel(ctx)) }()
	p.Logf("ceiling: raw PostgreSQL single-row INSERT then DELETE, %d connections, %s each", cfg.clients, cfg.ceilingSeconds)
	ins, del, err := ceiling.PGInsertDelete(ctx, url, cfg.clients, cfg.ceilingSeconds)
	if err != nil {
		rep.Skipped = append(rep.Skipped, "PostgreSQL ceilings: "+err.Error())
		return out
	}
	return append(out, ins, del)
}

// dbProcesses reads the CPU of a driver's database server processes (those
// the test scripts start on this machine), or nil for the embedded SQLite.
func dbProcesses(driver string) func() (procstat.Sample, error) {
	match := map[string]func(comm, cmdline string) bool{
		"postgres": func(c, _ string) bool { return c == "postgres" },
		"mysql":    func(c, _ string) bool { return c == "mariadbd" || c == "mysqld" },
		// FerretDB keeps its data in PostgreSQL: both are the database.
		"mongodb":   func(c, _ string) bool { return c == "ferretdb" || c == "postgres" },
		"dynamodb":  func(c, cl string) bool { return c == "java" && strings.Contains(cl, "DynamoDBLocal") },
		"cassandra": func(c, cl string) bool { return c == "java" && strings.Contains(cl, "cassandra") },
	}[driver]
	if match == nil {
		return nil
	}
	return func() (procstat.Sample, error) { return procstat.Matching(match) }
}

func machine() map[string]string {
	m := map[string]string{"cores": fmt.Sprint(runtime.NumCPU()), "os": runtime.GOOS + "/" + runtime.GOARCH}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		for _, line := range strings.Split(string(b), "\n") {
			if _, err := fmt.Sscanf(line, "MemTotal: %d kB", &kb); err == nil {
				m["memory"] = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m["cpu"] = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m["kernel"] = strings.TrimSpace(string(b))
	}
	return m
}

func versions(ctx context.Context, cfg *config) map[string]string {
	v := map[string]string{"go": runtime.Version()}
	if b, err := exec.CommandContext(ctx, "git", "describe", "--always", "--dirty").Output(); err == nil {
		v["dtimer"] = strings.TrimSpace(string(b))
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/riverqueue/river" {
				v["river"] = d.Version
			}
		}
	}
	if cfg.servers.PostgresURL != "" {
		if c, err := pgx.Connect(ctx, cfg.servers.PostgresURL); err == nil {
			var s string
			if c.QueryRow(ctx, "SHOW server_version").Scan(&s) == nil {
				v["postgresql"] = s
			}
			_ = c.Close(ctx)
		}
	}
	return v
}
