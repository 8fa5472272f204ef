package e2e_test

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocql/gocql"

	"github.com/dtimer/dtimer/server/internal/store/storetest"
)

// cassandraKeyspace holds every e2e test's table. Creating a keyspace is a
// slow schema change on a loaded node and every server of a test would race
// to do it, so it is created once here; each test gets a table of its own,
// which its servers create at migration.
const cassandraKeyspace = "dtimer_e2e"

var cassandraKeyspaceOnce = sync.OnceValue(func() error {
	return cassandraAdmin(`CREATE KEYSPACE IF NOT EXISTS ` + cassandraKeyspace +
		` WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}`)
})

// cassandraAdmin runs one schema statement on the node of
// DTIMER_TEST_CASSANDRA_HOSTS, with timeouts for a loaded machine.
func cassandraAdmin(stmt string) error {
	cluster := gocql.NewCluster(strings.Split(os.Getenv("DTIMER_TEST_CASSANDRA_HOSTS"), ",")...)
	cluster.Timeout = time.Minute
	cluster.ConnectTimeout = 30 * time.Second
	session, err := cluster.CreateSession()
	if err != nil {
		return err
	}
	defer session.Close()
	return session.Query(stmt).Exec()
}

// cassandraStore is a table of its own in the keyspace cassandraKeyspace on
// the node of DTIMER_TEST_CASSANDRA_HOSTS; the server creates the table at
// migration, the cleanup drops it. The keyspace stays, empty.
func cassandraStore(t *testing.T) []string {
	hosts := storetest.EnvOrSkip(t, "DTIMER_TEST_CASSANDRA_HOSTS")
	if err := cassandraKeyspaceOnce(); err != nil {
		t.Fatalf("create keyspace %s: %v", cassandraKeyspace, err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	table := "e2e_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		if err := cassandraAdmin(fmt.Sprintf("DROP TABLE IF EXISTS %s.%s", cassandraKeyspace, table)); err != nil {
			t.Errorf("drop table %s.%s: %v", cassandraKeyspace, table, err)
		}
	})
	return []string{
		"DTIMER_STORE_DRIVER=cassandra",
		"DTIMER_STORE_CASSANDRA_HOSTS=" + hosts,
		"DTIMER_STORE_CASSANDRA_KEYSPACE=" + cassandraKeyspace,
		"DTIMER_STORE_CASSANDRA_TABLE=" + table,
		// Many servers share one node on a loaded 2-core machine: time out
		// late rather than flake.
		"DTIMER_STORE_CASSANDRA_TIMEOUT=30s",
		"DTIMER_STORE_CASSANDRA_CONNECT_TIMEOUT=30s",
	}
}
