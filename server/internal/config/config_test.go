package config_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dtimer/dtimer/server/internal/config"
)

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "dtimer.yaml")
	require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
	return p
}

// These tests set environment variables, so they do not run in parallel.

func TestDefaults(t *testing.T) {
	c, err := config.Load("")
	require.NoError(t, err)
	require.Equal(t, ":8080", c.HTTP.Address)
	require.Equal(t, int64(1<<20), c.HTTP.MaxBodyBytes)
	require.Equal(t, "sqlite", c.Store.Driver)
	require.Equal(t, "./data/dtimer.db", c.Store.SQLite.Path)
	require.Equal(t, []config.Namespace{{Name: "default", NumShards: 16}}, c.Namespaces)
	require.Equal(t, time.Second, c.Engine.MinLookAhead)
	require.Equal(t, 5*time.Minute, c.Engine.MaxLookAhead)
	require.Equal(t, 1000, c.Engine.BatchReadLimit)
	require.Equal(t, 1000, c.Callback.Concurrency)
	require.Equal(t, 10*time.Second, c.Callback.DefaultTimeout)
	require.NotEmpty(t, c.Cluster.NodeName, "defaults to the hostname")
	require.Empty(t, c.Debug.PprofAddress, "pprof is off unless asked for")
	require.NoError(t, c.RetryPolicy().Validate())
}

func TestFileAndEnvironment(t *testing.T) {
	path := writeFile(t, `
http:
  address: 127.0.0.1:9000
store:
  driver: postgres
  postgres:
    url: postgres://u@localhost/db
namespaces:
  - name: default
    num_shards: 8
  - name: orders
    num_shards: 64
engine:
  max_look_ahead: 2m
`)
	t.Setenv("DTIMER_ENGINE_MAX_LOOK_AHEAD", "3m")
	t.Setenv("DTIMER_CALLBACK_RETRY_MAX_ATTEMPTS", "9")
	c, err := config.Load(path)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:9000", c.HTTP.Address)
	require.Equal(t, "postgres", c.Store.Driver)
	require.Equal(t, []config.Namespace{{Name: "default", NumShards: 8}, {Name: "orders", NumShards: 64}}, c.Namespaces)
	require.Equal(t, 3*time.Minute, c.Engine.MaxLookAhead, "the environment overrides the file")
	require.Equal(t, 9, c.Callback.Retry.MaxAttempts)
}

func TestNamespacesFromEnvironment(t *testing.T) {
	t.Setenv("DTIMER_NAMESPACES", "default:4, orders:32")
	c, err := config.Load("")
	require.NoError(t, err)
	require.Equal(t, []config.Namespace{{Name: "default", NumShards: 4}, {Name: "orders", NumShards: 32}}, c.Namespaces)
}

func TestCassandraHostsFromEnvironment(t *testing.T) {
	t.Setenv("DTIMER_STORE_DRIVER", "cassandra")
	t.Setenv("DTIMER_STORE_CASSANDRA_HOSTS", "cass-0.cass, cass-1.cass:9142")
	c, err := config.Load("")
	require.NoError(t, err)
	require.Equal(t, []string{"cass-0.cass", "cass-1.cass:9142"}, c.Store.Cassandra.Hosts)
}

func TestInvalidConfigNamesTheKey(t *testing.T) {
	for _, tc := range []struct {
		env map[string]string
		key string
	}{
		{map[string]string{"DTIMER_STORE_DRIVER": "oracle"}, "store.driver"},
		{map[string]string{"DTIMER_STORE_DRIVER": "postgres"}, "store.postgres.url"},
		{map[string]string{"DTIMER_STORE_DRIVER": "mysql"}, "store.mysql.dsn"},
		{map[string]string{"DTIMER_STORE_DRIVER": "mongodb", "DTIMER_STORE_MONGODB_URI": "http://db:27017"}, "store.mongodb.uri"},
		{map[string]string{"DTIMER_STORE_DRIVER": "mongodb", "DTIMER_STORE_MONGODB_URI": "mongodb://db", "DTIMER_STORE_MONGODB_READ_CONCERN": "snapshot"}, "store.mongodb.read_concern"},
		{map[string]string{"DTIMER_STORE_DRIVER": "dynamodb", "DTIMER_STORE_DYNAMODB_ACCESS_KEY_ID": "AKIA"}, "store.dynamodb.access_key_id"},
		{map[string]string{"DTIMER_STORE_DRIVER": "dynamodb", "DTIMER_STORE_DYNAMODB_BILLING_MODE": "provisioned"}, "store.dynamodb.billing_mode"},
		{map[string]string{"DTIMER_STORE_DRIVER": "cassandra"}, "store.cassandra.hosts"},
		{map[string]string{"DTIMER_STORE_DRIVER": "cassandra", "DTIMER_STORE_CASSANDRA_HOSTS": "db", "DTIMER_STORE_CASSANDRA_PORT": "0"}, "store.cassandra.port"},
		{map[string]string{"DTIMER_HTTP_ADDRESS": "8080"}, "http.address"},
		{map[string]string{"DTIMER_NAMESPACES": "default:0"}, "namespaces[0].num_shards"},
		{map[string]string{"DTIMER_NAMESPACES": "a:1,a:2"}, "namespaces[1].name"},
		{map[string]string{"DTIMER_NAMESPACES": "default"}, "namespaces"},
		{map[string]string{"DTIMER_ENGINE_MAX_LOOK_AHEAD": "500ms"}, "engine.max_look_ahead"},
		{map[string]string{"DTIMER_ENGINE_QUEUE_SIZE": "ten"}, "engine.queue_size"},
		{map[string]string{"DTIMER_CALLBACK_DEFAULT_TIMEOUT": "90s"}, "callback.default_timeout"},
		{map[string]string{"DTIMER_CALLBACK_RETRY_BACKOFF_MULTIPLIER": "0.5"}, "callback.retry"},
		{map[string]string{"DTIMER_LOG_LEVEL": "loud"}, "log.level"},
		{map[string]string{"DTIMER_DEBUG_PPROF_ADDRESS": "6060"}, "debug.pprof_address"},
		{map[string]string{"DTIMER_DEBUG_PPROF_ADDRESS": ":8080"}, "debug.pprof_address"},
	} {
		t.Run(tc.key, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			_, err := config.Load("")
			require.ErrorContains(t, err, tc.key)
		})
	}
}

func TestUnknownFileKeyIsRejected(t *testing.T) {
	_, err := config.Load(writeFile(t, "engine:\n  max_lookahead: 1m\n"))
	require.ErrorContains(t, err, `"engine.max_lookahead"`)
}

func TestMissingFile(t *testing.T) {
	_, err := config.Load(filepath.Join(t.TempDir(), "nope.yaml"))
	require.ErrorContains(t, err, "nope.yaml")
}

// TestEveryKeyIsDocumented keeps docs/configuration.md true: each key has a
// row there.
func TestEveryKeyIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/configuration.md")
	require.NoError(t, err)
	for _, k := range config.Keys() {
		require.Contains(t, string(doc), "| `"+k+"` |", "docs/configuration.md has no row for %s", k)
	}
}
