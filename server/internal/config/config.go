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
}

// HTTP configures the API listener.
type HTTP struct {
	Address      string `mapstructure:"address"`
	MaxBodyBytes int64  `mapstructure:"max_body_bytes"`
}

// Store selects and configures the storage driver.
type Store struct {
	Driver   string   `mapstructure:"driver"`
	SQLite   SQLite   `mapstructure:"sqlite"`
	Postgres Postgres `mapstructure:"postgres"`
}

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
	default:
		bad("store.driver", "must be one of sqlite, postgres; got %q", c.Store.Driver)
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
