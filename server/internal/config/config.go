// Package config is the only reader of configuration: a YAML file (optional)
// and DTIMER_* environment variables, through viper. Every key has a default
// here and a line in docs/configuration.md; everything else in the server
// receives the typed Config.
package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/viper"

	"github.com/dtimer/dtimer/server/internal/timer"
)

// Config is the server's whole configuration.
type Config struct {
	HTTP       HTTP        `mapstructure:"http"`
	Store      Store       `mapstructure:"store"`
	Namespaces []Namespace `mapstructure:"namespaces"`
	Engine     Engine      `mapstructure:"engine"`
	Callback   Callback    `mapstructure:"callback"`
	Cluster    Cluster     `mapstructure:"cluster"`
	Shutdown   Shutdown    `mapstructure:"shutdown"`
	Log        Log         `mapstructure:"log"`
	Debug      Debug       `mapstructure:"debug"`
}

// HTTP configures the API listener.
type HTTP struct {
	Address      string `mapstructure:"address"`
	MaxBodyBytes int64  `mapstructure:"max_body_bytes"`
}

// Store selects and configures the storage driver.
type Store struct {
	Driver    string    `mapstructure:"driver"`
	SQLite    SQLite    `mapstructure:"sqlite"`
	Postgres  Postgres  `mapstructure:"postgres"`
	MySQL     MySQL     `mapstructure:"mysql"`
	MongoDB   MongoDB   `mapstructure:"mongodb"`
	DynamoDB  DynamoDB  `mapstructure:"dynamodb"`
	Cassandra Cassandra `mapstructure:"cassandra"`
}

// Drivers lists the values of store.driver.
var Drivers = []string{"sqlite", "postgres", "mysql", "mongodb", "dynamodb", "cassandra"}

// SQLite configures the embedded driver.
type SQLite struct {
	Path        string `mapstructure:"path"`
	Synchronous string `mapstructure:"synchronous"`
}

// Postgres configures the PostgreSQL driver.
type Postgres struct {
	URL      string `mapstructure:"url"`
	Schema   string `mapstructure:"schema"`
	MaxConns int32  `mapstructure:"max_conns"`
}

// MySQL configures the MySQL/MariaDB driver.
type MySQL struct {
	DSN      string `mapstructure:"dsn"`
	MaxConns int    `mapstructure:"max_conns"`
}

// MongoDB configures the MongoDB driver.
type MongoDB struct {
	URI          string `mapstructure:"uri"`
	Database     string `mapstructure:"database"`
	Collection   string `mapstructure:"collection"`
	MaxPoolSize  uint64 `mapstructure:"max_pool_size"`
	WriteConcern string `mapstructure:"write_concern"`
	ReadConcern  string `mapstructure:"read_concern"`
}

// DynamoDB configures the DynamoDB driver.
type DynamoDB struct {
	Region          string `mapstructure:"region"`
	Endpoint        string `mapstructure:"endpoint"`
	Table           string `mapstructure:"table"`
	AccessKeyID     string `mapstructure:"access_key_id"`
	SecretAccessKey string `mapstructure:"secret_access_key"`
	BillingMode     string `mapstructure:"billing_mode"`
	ReadCapacity    int64  `mapstructure:"read_capacity"`
	WriteCapacity   int64  `mapstructure:"write_capacity"`
	MaxConns        int    `mapstructure:"max_conns"`
}

// Cassandra configures the Cassandra driver.
type Cassandra struct {
	Hosts             []string      `mapstructure:"hosts"`
	Port              int           `mapstructure:"port"`
	Keyspace          string        `mapstructure:"keyspace"`
	Table             string        `mapstructure:"table"`
	Username          string        `mapstructure:"username"`
	Password          string        `mapstructure:"password"`
	Consistency       string        `mapstructure:"consistency"`
	SerialConsistency string        `mapstructure:"serial_consistency"`
	LocalDC           string        `mapstructure:"local_dc"`
	Replication       string        `mapstructure:"replication"`
	Timeout           time.Duration `mapstructure:"timeout"`
	ConnectTimeout    time.Duration `mapstructure:"connect_timeout"`
	NumConns          int           `mapstructure:"num_conns"`
}

// Namespace is a namespace and its fixed shard count.
type Namespace struct {
	Name      string `mapstructure:"name"`
	NumShards int    `mapstructure:"num_shards"`
}

// Engine tunes the per-shard engines.
type Engine struct {
	MinLookAhead   time.Duration `mapstructure:"min_look_ahead"`
	MaxLookAhead   time.Duration `mapstructure:"max_look_ahead"`
	BatchReadLimit int           `mapstructure:"batch_read_limit"`
	QueueSize      int           `mapstructure:"queue_size"`
	DeleteBatch    int           `mapstructure:"delete_batch"`
	DeleteInterval time.Duration `mapstructure:"delete_interval"`
	StoreRetryMin  time.Duration `mapstructure:"store_retry_min"`
	StoreRetryMax  time.Duration `mapstructure:"store_retry_max"`
}

// Callback configures callback delivery and the default retry policy.
type Callback struct {
	Concurrency    int           `mapstructure:"concurrency"`
	DefaultTimeout time.Duration `mapstructure:"default_timeout"`
	MaxTimeout     time.Duration `mapstructure:"max_timeout"`
	Retry          Retry         `mapstructure:"retry"`
}

// Retry is the default retry policy of timers created without one.
type Retry struct {
	MaxAttempts         int           `mapstructure:"max_attempts"`
	MaxAttemptsDuration time.Duration `mapstructure:"max_attempts_duration"`
	InitialInterval     time.Duration `mapstructure:"initial_interval"`
	BackoffMultiplier   float64       `mapstructure:"backoff_multiplier"`
	MaxInterval         time.Duration `mapstructure:"max_interval"`
}

// Cluster configures this node's identity and gossip membership. Without
// seeds the node runs alone (a static membership of one).
type Cluster struct {
	NodeName             string        `mapstructure:"node_name"`
	BindAddress          string        `mapstructure:"bind_address"`
	AdvertiseAddress     string        `mapstructure:"advertise_address"`
	HTTPAdvertiseAddress string        `mapstructure:"http_advertise_address"`
	Seeds                []string      `mapstructure:"seeds"`
	ProbeInterval        time.Duration `mapstructure:"probe_interval"`
	ProbeTimeout         time.Duration `mapstructure:"probe_timeout"`
	SuspicionMult        int           `mapstructure:"suspicion_mult"`
	SuspicionMaxMult     int           `mapstructure:"suspicion_max_timeout_mult"`
	GossipInterval       time.Duration `mapstructure:"gossip_interval"`
	PushPullInterval     time.Duration `mapstructure:"push_pull_interval"`
	HandoffTimeout       time.Duration `mapstructure:"handoff_timeout"`
}

// Shutdown bounds a graceful stop.
type Shutdown struct {
	// Timeout bounds the whole stop: HTTP drain, engines, release.
	Timeout time.Duration `mapstructure:"timeout"`
	// DrainTimeout bounds how long an engine that stops (shutdown or
	// handoff) waits for its callbacks in flight.
	DrainTimeout time.Duration `mapstructure:"drain_timeout"`
}

// Log configures zap.
type Log struct {
	Level  string `mapstructure:"level"`
	Format string `mapstructure:"format"`
}

// Debug configures diagnostics that are off unless asked for.
type Debug struct {
	// PprofAddress, when set, serves net/http/pprof on its own listener,
	// apart from the API, so that it can be bound to loopback only.
	PprofAddress string `mapstructure:"pprof_address"`
}

// defaults holds every key's default; docs/configuration.md repeats them.
var defaults = map[string]any{
	"http.address":                         ":8080",
	"http.max_body_bytes":                  1 << 20,
	"store.driver":                         "sqlite",
	"store.sqlite.path":                    "./data/dtimer.db",
	"store.sqlite.synchronous":             "FULL",
	"store.postgres.url":                   "",
	"store.postgres.schema":                "public",
	"store.postgres.max_conns":             32,
	"store.mysql.dsn":                      "",
	"store.mysql.max_conns":                16,
	"store.mongodb.uri":                    "",
	"store.mongodb.database":               "dtimer",
	"store.mongodb.collection":             "timers",
	"store.mongodb.max_pool_size":          100,
	"store.mongodb.write_concern":          "majority",
	"store.mongodb.read_concern":           "majority",
	"store.dynamodb.region":                "",
	"store.dynamodb.endpoint":              "",
	"store.dynamodb.table":                 "dtimer",
	"store.dynamodb.access_key_id":         "",
	"store.dynamodb.secret_access_key":     "",
	"store.dynamodb.billing_mode":          "on_demand",
	"store.dynamodb.read_capacity":         0,
	"store.dynamodb.write_capacity":        0,
	"store.dynamodb.max_conns":             64,
	"store.cassandra.hosts":                "",
	"store.cassandra.port":                 9042,
	"store.cassandra.keyspace":             "dtimer",
	"store.cassandra.table":                "timers",
	"store.cassandra.username":             "",
	"store.cassandra.password":             "",
	"store.cassandra.consistency":          "LOCAL_QUORUM",
	"store.cassandra.serial_consistency":   "LOCAL_SERIAL",
	"store.cassandra.local_dc":             "",
	"store.cassandra.replication":          "{'class': 'SimpleStrategy', 'replication_factor': 1}",
	"store.cassandra.timeout":              "10s",
	"store.cassandra.connect_timeout":      "10s",
	"store.cassandra.num_conns":            2,
	"namespaces":                           "default:16",
	"engine.min_look_ahead":                "1s",
	"engine.max_look_ahead":                "5m",
	"engine.batch_read_limit":              1000,
	"engine.queue_size":                    3000,
	"engine.delete_batch":                  500,
	"engine.delete_interval":               "1s",
	"engine.store_retry_min":               "100ms",
	"engine.store_retry_max":               "10s",
	"callback.concurrency":                 1000,
	"callback.default_timeout":             "10s",
	"callback.max_timeout":                 "60s",
	"callback.retry.max_attempts":          5,
	"callback.retry.max_attempts_duration": "24h",
	"callback.retry.initial_interval":      "1s",
	"callback.retry.backoff_multiplier":    2.0,
	"callback.retry.max_interval":          "60s",
	"cluster.node_name":                    "",
	"cluster.bind_address":                 "0.0.0.0:7946",
	"cluster.advertise_address":            "",
	"cluster.http_advertise_address":       "",
	"cluster.seeds":                        "",
	"cluster.probe_interval":               "500ms",
	"cluster.probe_timeout":                "250ms",
	"cluster.suspicion_mult":               3,
	"cluster.suspicion_max_timeout_mult":   2,
	"cluster.gossip_interval":              "100ms",
	"cluster.push_pull_interval":           "15s",
	"cluster.handoff_timeout":              "5s",
	"shutdown.timeout":                     "30s",
	"shutdown.drain_timeout":               "10s",
	"log.level":                            "info",
	"log.format":                           "json",
	"debug.pprof_address":                  "",
}

// Keys lists every configuration key, sorted as in the docs.
func Keys() []string {
	keys := make([]string, 0, len(defaults))
	for k := range defaults {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Load reads the file at path (if not empty) and the environment, applies
// defaults and validates. Errors name the offending key.
func Load(path string) (*Config, error) {
	v := viper.New()
	for k, d := range defaults {
		v.SetDefault(k, d)
	}
	v.SetEnvPrefix("DTIMER")
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	v.AutomaticEnv()
	if path != "" {
		v.SetConfigFile(path)
		if err := v.ReadInConfig(); err != nil {
			return nil, fmt.Errorf("config file %s: %w", path, err)
		}
		for _, k := range v.AllKeys() {
			if _, ok := defaults[k]; !ok && !strings.HasPrefix(k, "namespaces") {
				return nil, fmt.Errorf("config file %s: unknown key %q", path, k)
			}
		}
	}
	var c Config
	err := v.Unmarshal(&c, viper.DecodeHook(mapstructure.ComposeDecodeHookFunc(
		namespacesHook, mapstructure.StringToTimeDurationHookFunc(), mapstructure.StringToSliceHookFunc(","),
	)))
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	// "a, b" from an environment variable means "a" and "b".
	for _, list := range [][]string{c.Cluster.Seeds, c.Store.Cassandra.Hosts} {
		for i := range list {
			list[i] = strings.TrimSpace(list[i])
		}
	}
	if c.Cluster.NodeName == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "dtimer"
		}
		c.Cluster.NodeName = host
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// namespacesHook accepts namespaces as "name:shards,name:shards" (the form an
// environment variable can carry) as well as a YAML list.
func namespacesHook(from, to reflect.Type, data any) (any, error) {
	s, ok := data.(string)
	if !ok || to != reflect.TypeOf([]Namespace(nil)) {
		return data, nil
	}
	var out []Namespace
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, shards, found := strings.Cut(part, ":")
		n, err := strconv.Atoi(shards)
		if !found || err != nil {
			return nil, fmt.Errorf("namespaces: %q is not name:num_shards", part)
		}
		out = append(out, Namespace{Name: name, NumShards: n})
	}
	return out, nil
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// MaxShards bounds a namespace's shard count.
const MaxShards = 65536

// Validate checks every key and names the first bad one.
func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("config key %s: %s", key, fmt.Sprintf(format, args...)))
	}
	if _, _, err := net.SplitHostPort(c.HTTP.Address); err != nil {
		bad("http.address", "%q is not host:port", c.HTTP.Address)
	}
	if c.HTTP.MaxBodyBytes < 1024 {
		bad("http.max_body_bytes", "must be at least 1024, got %d", c.HTTP.MaxBodyBytes)
	}
	switch c.Store.Driver {
	case "sqlite":
		if c.Store.SQLite.Path == "" {
			bad("store.sqlite.path", "must be set")
		}
		switch strings.ToUpper(c.Store.SQLite.Synchronous) {
		case "FULL", "NORMAL", "EXTRA":
		default:
			bad("store.sqlite.synchronous", "must be FULL, NORMAL or EXTRA, got %q", c.Store.SQLite.Synchronous)
		}
	case "postgres":
		if u, err := url.Parse(c.Store.Postgres.URL); c.Store.Postgres.URL == "" || err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
			bad("store.postgres.url", "must be a postgres:// URL")
		}
		if c.Store.Postgres.MaxConns < 1 {
			bad("store.postgres.max_conns", "must be at least 1, got %d", c.Store.Postgres.MaxConns)
		}
	case "mysql":
		if c.Store.MySQL.DSN == "" {
			bad("store.mysql.dsn", "must be set, e.g. user:password@tcp(host:3306)/dtimer")
		}
		if c.Store.MySQL.MaxConns < 1 {
			bad("store.mysql.max_conns", "must be at least 1, got %d", c.Store.MySQL.MaxConns)
		}
	case "mongodb":
		m := c.Store.MongoDB
		if u, err := url.Parse(m.URI); m.URI == "" || err != nil || (u.Scheme != "mongodb" && u.Scheme != "mongodb+srv") {
			bad("store.mongodb.uri", "must be a mongodb:// or mongodb+srv:// URI")
		}
		if m.Database == "" {
			bad("store.mongodb.database", "must be set")
		}
		if m.Collection == "" {
			bad("store.mongodb.collection", "must be set")
		}
		if m.MaxPoolSize < 1 {
			bad("store.mongodb.max_pool_size", "must be at least 1, got %d", m.MaxPoolSize)
		}
		if _, err := strconv.Atoi(m.WriteConcern); err != nil && m.WriteConcern != "majority" {
			bad("store.mongodb.write_concern", "must be majority or a number of members, got %q", m.WriteConcern)
		}
		switch m.ReadConcern {
		case "majority", "local", "linearizable":
		default:
			bad("store.mongodb.read_concern", "must be majority, local or linearizable, got %q", m.ReadConcern)
		}
	case "dynamodb":
		d := c.Store.DynamoDB
		if d.Table == "" {
			bad("store.dynamodb.table", "must be set")
		}
		if d.Endpoint != "" {
			if u, err := url.Parse(d.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				bad("store.dynamodb.endpoint", "%q must be an http:// or https:// URL", d.Endpoint)
			}
		}
		if (d.AccessKeyID == "") != (d.SecretAccessKey == "") {
			bad("store.dynamodb.access_key_id", "and store.dynamodb.secret_access_key must be set together")
		}
		switch d.BillingMode {
		case "on_demand":
		case "provisioned":
			if d.ReadCapacity < 1 || d.WriteCapacity < 1 {
				bad("store.dynamodb.billing_mode", "provisioned needs read_capacity and write_capacity of at least 1")
			}
		default:
			bad("store.dynamodb.billing_mode", "must be on_demand or provisioned, got %q", d.BillingMode)
		}
		if d.MaxConns < 1 {
			bad("store.dynamodb.max_conns", "must be at least 1, got %d", d.MaxConns)
		}
	case "cassandra":
		cs := c.Store.Cassandra
		if len(cs.Hosts) == 0 {
			bad("store.cassandra.hosts", "must list at least one contact point")
		}
		if cs.Port < 1 || cs.Port > 65535 {
			bad("store.cassandra.port", "must be between 1 and 65535, got %d", cs.Port)
		}
		if cs.Keyspace == "" {
			bad("store.cassandra.keyspace", "must be set")
		}
		if cs.Table == "" {
			bad("store.cassandra.table", "must be set")
		}
		if cs.Timeout <= 0 {
			bad("store.cassandra.timeout", "must be positive, got %s", cs.Timeout)
		}
		if cs.ConnectTimeout <= 0 {
			bad("store.cassandra.connect_timeout", "must be positive, got %s", cs.ConnectTimeout)
		}
		if cs.NumConns < 1 {
			bad("store.cassandra.num_conns", "must be at least 1, got %d", cs.NumConns)
		}
	default:
		bad("store.driver", "must be one of %s; got %q", strings.Join(Drivers, ", "), c.Store.Driver)
	}
	if len(c.Namespaces) == 0 {
		bad("namespaces", "at least one namespace is required")
	}
	seen := map[string]bool{}
	for i, ns := range c.Namespaces {
		key := fmt.Sprintf("namespaces[%d]", i)
		if !nameRE.MatchString(ns.Name) {
			bad(key+".name", "%q must be 1-128 letters, digits, '_', '.' or '-'", ns.Name)
		}
		if seen[ns.Name] {
			bad(key+".name", "namespace %q is listed twice", ns.Name)
		}
		seen[ns.Name] = true
		if ns.NumShards < 1 || ns.NumShards > MaxShards {
			bad(key+".num_shards", "must be between 1 and %d, got %d", MaxShards, ns.NumShards)
		}
	}
	e := c.Engine
	positive := func(key string, d time.Duration) {
		if d <= 0 {
			bad(key, "must be positive, got %s", d)
		}
	}
	positive("engine.min_look_ahead", e.MinLookAhead)
	positive("engine.delete_interval", e.DeleteInterval)
	positive("engine.store_retry_min", e.StoreRetryMin)
	if e.MaxLookAhead <= e.MinLookAhead {
		bad("engine.max_look_ahead", "must be greater than engine.min_look_ahead (%s), got %s", e.MinLookAhead, e.MaxLookAhead)
	}
	if e.StoreRetryMax < e.StoreRetryMin {
		bad("engine.store_retry_max", "must not be less than engine.store_retry_min")
	}
	if e.BatchReadLimit < 1 {
		bad("engine.batch_read_limit", "must be at least 1, got %d", e.BatchReadLimit)
	}
	if e.QueueSize < e.BatchReadLimit {
		bad("engine.queue_size", "must be at least engine.batch_read_limit (%d), got %d", e.BatchReadLimit, e.QueueSize)
	}
	if e.DeleteBatch < 1 {
		bad("engine.delete_batch", "must be at least 1, got %d", e.DeleteBatch)
	}
	cb := c.Callback
	if cb.Concurrency < 1 {
		bad("callback.concurrency", "must be at least 1, got %d", cb.Concurrency)
	}
	if cb.MaxTimeout < time.Second {
		bad("callback.max_timeout", "must be at least 1s, got %s", cb.MaxTimeout)
	}
	if cb.DefaultTimeout < time.Second || cb.DefaultTimeout > cb.MaxTimeout || cb.DefaultTimeout%time.Second != 0 {
		bad("callback.default_timeout", "must be whole seconds between 1s and callback.max_timeout (%s), got %s", cb.MaxTimeout, cb.DefaultTimeout)
	}
	if err := c.RetryPolicy().Validate(); err != nil {
		bad("callback.retry", "%v", err)
	}
	cl := c.Cluster
	if cl.NodeName == "" || len(cl.NodeName) > 128 {
		bad("cluster.node_name", "must be 1-128 characters, got %q", cl.NodeName)
	}
	hostPort := func(key, v string, optional bool) {
		if v == "" && optional {
			return
		}
		if _, p, err := net.SplitHostPort(v); err != nil || p == "" {
			bad(key, "%q is not host:port", v)
		}
	}
	hostPort("cluster.bind_address", cl.BindAddress, false)
	hostPort("cluster.advertise_address", cl.AdvertiseAddress, true)
	hostPort("cluster.http_advertise_address", cl.HTTPAdvertiseAddress, true)
	for _, s := range cl.Seeds {
		if strings.TrimSpace(s) == "" {
			bad("cluster.seeds", "has an empty entry")
		}
	}
	positive("cluster.probe_interval", cl.ProbeInterval)
	positive("cluster.probe_timeout", cl.ProbeTimeout)
	positive("cluster.gossip_interval", cl.GossipInterval)
	positive("cluster.push_pull_interval", cl.PushPullInterval)
	positive("cluster.handoff_timeout", cl.HandoffTimeout)
	if cl.ProbeTimeout >= cl.ProbeInterval {
		bad("cluster.probe_timeout", "must be less than cluster.probe_interval (%s), got %s", cl.ProbeInterval, cl.ProbeTimeout)
	}
	if cl.SuspicionMaxMult < 1 {
		bad("cluster.suspicion_max_timeout_mult", "must be at least 1, got %d", cl.SuspicionMaxMult)
	}
	if cl.SuspicionMult < 1 {
		bad("cluster.suspicion_mult", "must be at least 1, got %d", cl.SuspicionMult)
	}
	positive("shutdown.timeout", c.Shutdown.Timeout)
	positive("shutdown.drain_timeout", c.Shutdown.DrainTimeout)
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		bad("log.level", "must be debug, info, warn or error, got %q", c.Log.Level)
	}
	switch c.Log.Format {
	case "json", "console":
	default:
		bad("log.format", "must be json or console, got %q", c.Log.Format)
	}
	if c.Debug.PprofAddress != "" {
		if _, p, err := net.SplitHostPort(c.Debug.PprofAddress); err != nil || p == "" {
			bad("debug.pprof_address", "%q is not host:port", c.Debug.PprofAddress)
		} else if c.Debug.PprofAddress == c.HTTP.Address {
			bad("debug.pprof_address", "must differ from http.address (%s)", c.HTTP.Address)
		}
	}
	return errors.Join(errs...)
}

// RetryPolicy is the default retry policy as the domain type.
func (c *Config) RetryPolicy() timer.RetryPolicy {
	r := c.Callback.Retry
	return timer.RetryPolicy{
		MaxAttempts:         r.MaxAttempts,
		MaxAttemptsDuration: r.MaxAttemptsDuration,
		InitialInterval:     r.InitialInterval,
		BackoffMultiplier:   r.BackoffMultiplier,
		MaxInterval:         r.MaxInterval,
	}
}
