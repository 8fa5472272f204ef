package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dtimer/dtimer/benchmark/internal/stores"
	"github.com/dtimer/dtimer/benchmark/internal/workload"
)

// config is a run's settings, from flags.
type config struct {
	smoke     bool
	out       string
	markdown  string
	serverBin string
	target    string
	namespace string
	recvAddr  string
	recvURL   string

	drivers   []string
	workloads []string
	peers     []string // river configurations: defaults, tuned
	ceilings  bool
	servers   stores.Servers

	clients      int
	payloadBytes int
	shards       int
	serverEnv    []string

	createTimers   int
	burstTimers    int
	steadyRates    []int
	steadySeconds  time.Duration
	steadyPre      float64
	backlogTimers  int
	backlogSpread  time.Duration
	scaleStored    int
	scaleRate      int
	scaleBurst     int
	scaleDrivers   []string
	clusterNodes   []int
	clusterTimers  int
	ceilingSeconds time.Duration
	httpClients    []int
	riverWorkers   int
	lead           time.Duration
}

var allWorkloads = []string{"create", "burst", "steady", "backlog", "scale", "cluster"}

func parseFlags(args []string) (*config, error) {
	c := &config{servers: stores.FromEnv()}
	fs := flag.NewFlagSet("benchmark", flag.ContinueOnError)
	var drivers, workloads, peers, rates, scaleDrivers, nodes, env, httpClients string
	fs.BoolVar(&c.smoke, "smoke", false, "tiny sizes: a run of seconds that proves the harness works (CI); sizes given as flags still win")
	fs.StringVar(&c.out, "out", "benchmark/results", "directory for results.json, results.md, the plots and server logs")
	fs.StringVar(&c.markdown, "markdown", "", "also write the Markdown report here (e.g. benchmark/RESULTS.md), with plot links relative to it")
	fs.StringVar(&c.serverBin, "server-bin", "", "dtimer-server binary (default: built from this workspace into --out)")
	fs.StringVar(&c.target, "target", "", "base URL of a running dtimer cluster to measure instead of starting servers (create, burst, steady only)")
	fs.StringVar(&c.namespace, "namespace", "default", "namespace the timers go to (a --target cluster must have it)")
	fs.StringVar(&c.recvAddr, "receiver-address", "127.0.0.1:0", "where the callback receiver listens")
	fs.StringVar(&c.recvURL, "receiver-url", "", "callback URL the system under test posts to (default: the receiver's own address; set it when a --target cannot reach 127.0.0.1)")
	fs.StringVar(&drivers, "drivers", "", "store drivers to run, comma-separated (default: sqlite and every driver whose server is given)")
	fs.StringVar(&workloads, "workloads", strings.Join(allWorkloads, ","), "workloads to run: "+strings.Join(allWorkloads, ","))
	fs.StringVar(&peers, "river", "defaults,tuned", "River configurations to run on the PostgreSQL server (empty: none)")
	fs.BoolVar(&c.ceilings, "ceilings", true, "measure the raw HTTP POST and PostgreSQL insert/delete ceilings")
	fs.StringVar(&c.servers.PostgresURL, "postgres-url", c.servers.PostgresURL, "PostgreSQL server (default $DTIMER_TEST_POSTGRES_URL)")
	fs.StringVar(&c.servers.MySQLDSN, "mysql-dsn", c.servers.MySQLDSN, "MySQL/MariaDB server (default $DTIMER_TEST_MYSQL_DSN)")
	fs.StringVar(&c.servers.MongoDBURI, "mongodb-uri", c.servers.MongoDBURI, "MongoDB server (default $DTIMER_TEST_MONGODB_URI)")
	fs.StringVar(&c.servers.DynamoDBEndpoint, "dynamodb-endpoint", c.servers.DynamoDBEndpoint, "DynamoDB endpoint (default $DTIMER_TEST_DYNAMODB_ENDPOINT)")
	fs.StringVar(&c.servers.CassandraHosts, "cassandra-hosts", c.servers.CassandraHosts, "Cassandra hosts (default $DTIMER_TEST_CASSANDRA_HOSTS)")
	fs.IntVar(&c.clients, "clients", 32, "concurrent creating clients; also the PostgreSQL pool size of dtimer, River's inserter and the insert ceiling")
	fs.IntVar(&c.payloadBytes, "payload-bytes", 100, "size of each timer's JSON payload")
	fs.IntVar(&c.shards, "shards", 16, "shards of the benchmark namespace")
	fs.StringVar(&env, "server-env", "", "extra dtimer-server settings, comma-separated KEY=VALUE (e.g. DTIMER_ENGINE_BATCH_READ_LIMIT=2000)")
	fs.IntVar(&c.createTimers, "create-timers", 20000, "create: timers created")
	fs.IntVar(&c.burstTimers, "burst-timers", 20000, "burst: timers due at one instant")
	fs.StringVar(&rates, "steady-rates", "2000,5000,8000", "steady: timers due per second, one run each")
	fs.DurationVar(&c.steadySeconds, "steady-duration", 20*time.Second, "steady: how long timers come due")
	fs.Float64Var(&c.steadyPre, "steady-precreate", 0.5, "steady: fraction of the timers created before the first is due (the rest while running)")
	fs.IntVar(&c.backlogTimers, "backlog-timers", 20000, "backlog: timers that come due while the system is down")
	fs.DurationVar(&c.backlogSpread, "backlog-spread", 10*time.Second, "backlog: how long the system is down while they come due")
	fs.IntVar(&c.scaleStored, "scale-stored", 1_000_000, "scale: future timers stored before the run (10000000 for the 10M target)")
	fs.IntVar(&c.scaleRate, "scale-rate", 2000, "scale: steady rate run with the stored timers")
	fs.IntVar(&c.scaleBurst, "scale-burst", 20000, "scale: burst run with the stored timers")
	fs.StringVar(&scaleDrivers, "scale-drivers", "postgres", "scale: drivers it runs on (it stores --scale-stored timers through the API)")
	fs.StringVar(&nodes, "cluster-nodes", "1,2,3", "cluster: node counts of the scaling run (bursts on one PostgreSQL)")
	fs.IntVar(&c.clusterTimers, "cluster-timers", 40000, "cluster: burst size per node count")
	fs.DurationVar(&c.ceilingSeconds, "ceiling-duration", 5*time.Second, "how long each ceiling is measured")
	fs.StringVar(&httpClients, "http-clients", "100,1000", "concurrencies of the raw HTTP POST ceiling, one measurement each (1000 is dtimer's default callback.concurrency)")
	fs.IntVar(&c.riverWorkers, "river-workers", 1000, "River tuned: workers")
	fs.DurationVar(&c.lead, "lead", workload.DefaultLead, "least time between creating a timer and its due time (River's scheduler needs more than 5s)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if c.smoke {
		small := map[string]func(){
			"create-timers":    func() { c.createTimers = 300 },
			"burst-timers":     func() { c.burstTimers = 500 },
			"steady-rates":     func() { rates = "300" },
			"steady-duration":  func() { c.steadySeconds = 3 * time.Second },
			"backlog-timers":   func() { c.backlogTimers = 300 },
			"backlog-spread":   func() { c.backlogSpread = time.Second },
			"scale-stored":     func() { c.scaleStored = 1000 },
			"scale-rate":       func() { c.scaleRate = 200 },
			"scale-burst":      func() { c.scaleBurst = 300 },
			"cluster-nodes":    func() { nodes = "1,2" },
			"cluster-timers":   func() { c.clusterTimers = 500 },
			"ceiling-duration": func() { c.ceilingSeconds = time.Second },
			"river-workers":    func() { c.riverWorkers = 100 },
			"clients":          func() { c.clients = 8 },
			"lead":             func() { c.lead = time.Second },
		}
		for name, f := range small {
			if !set[name] {
				f()
			}
		}
	}
	split := func(s string) []string {
		var out []string
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
		return out
	}
	ints := func(flagName, s string) ([]int, error) {
		var out []int
		for _, p := range split(s) {
			n, err := strconv.Atoi(p)
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("--%s: %q is not a positive number", flagName, p)
			}
			out = append(out, n)
		}
		return out, nil
	}
	var err error
	if c.steadyRates, err = ints("steady-rates", rates); err != nil {
		return nil, err
	}
	if c.clusterNodes, err = ints("cluster-nodes", nodes); err != nil {
		return nil, err
	}
	if c.httpClients, err = ints("http-clients", httpClients); err != nil {
		return nil, err
	}
	c.workloads = split(workloads)
	for _, w := range c.workloads {
		if !slices.Contains(allWorkloads, w) {
			return nil, fmt.Errorf("--workloads: unknown workload %q (one of %s)", w, strings.Join(allWorkloads, ", "))
		}
	}
	c.peers = split(peers)
	for _, p := range c.peers {
		if p != "defaults" && p != "tuned" {
			return nil, fmt.Errorf("--river: unknown configuration %q (defaults, tuned)", p)
		}
	}
	if len(c.peers) > 0 && c.servers.PostgresURL == "" {
		fmt.Fprintln(os.Stderr, "benchmark: no PostgreSQL server given: River and the PostgreSQL ceilings are skipped")
		c.peers = nil
	}
	if drivers == "" {
		for _, d := range stores.Drivers {
			if c.servers.Available(d) == nil {
				c.drivers = append(c.drivers, d)
			}
		}
	} else {
		c.drivers = split(drivers)
		for _, d := range c.drivers {
			if err := c.servers.Available(d); err != nil {
				return nil, fmt.Errorf("--drivers: %w", err)
			}
		}
	}
	c.scaleDrivers = split(scaleDrivers)
	for _, kv := range split(env) {
		if !strings.HasPrefix(kv, "DTIMER_") || !strings.Contains(kv, "=") {
			return nil, fmt.Errorf("--server-env: %q is not DTIMER_KEY=VALUE", kv)
		}
		c.serverEnv = append(c.serverEnv, kv)
	}
	if c.clients < 1 || c.shards < 1 || c.payloadBytes < 0 || c.steadyPre < 0 || c.steadyPre > 1 {
		return nil, fmt.Errorf("--clients and --shards must be positive, --payload-bytes not negative, --steady-precreate in [0, 1]")
	}
	if c.target != "" {
		c.drivers = nil
	}
	return c, nil
}

func (c *config) has(workload string) bool { return slices.Contains(c.workloads, workload) }
