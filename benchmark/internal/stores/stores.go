// Package stores gives each benchmark run a store of its own on the
// database servers it is pointed at (a fresh SQLite file, PostgreSQL schema,
// MySQL database, MongoDB database, DynamoDB table or Cassandra table) and
// removes it afterwards, so that no run measures what an earlier one left.
package stores

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	neturl "net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	gomysql "github.com/go-sql-driver/mysql"
	"github.com/gocql/gocql"
	"github.com/jackc/pgx/v5"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Servers says where each database server is; an empty field means that
// driver cannot run. Defaults come from the DTIMER_TEST_* variables that
// scripts/testdb/all.sh env prints.
type Servers struct {
	PostgresURL       string
	MySQLDSN          string
	MongoDBURI        string
	DynamoDBEndpoint  string
	CassandraHosts    string
	SQLiteDir         string // parent of the runs' SQLite files
	PostgresMaxConns  int
	SQLiteSynchronous string
}

// FromEnv fills Servers from DTIMER_TEST_POSTGRES_URL and its siblings.
func FromEnv() Servers {
	return Servers{
		PostgresURL:      os.Getenv("DTIMER_TEST_POSTGRES_URL"),
		MySQLDSN:         os.Getenv("DTIMER_TEST_MYSQL_DSN"),
		MongoDBURI:       os.Getenv("DTIMER_TEST_MONGODB_URI"),
		DynamoDBEndpoint: os.Getenv("DTIMER_TEST_DYNAMODB_ENDPOINT"),
		CassandraHosts:   os.Getenv("DTIMER_TEST_CASSANDRA_HOSTS"),
	}
}

// Drivers are every store driver, in the order results are shown.
var Drivers = []string{"sqlite", "postgres", "mysql", "mongodb", "dynamodb", "cassandra"}

// Available reports whether driver can run on these servers, and if not, why.
func (s Servers) Available(driver string) error {
	given := map[string]string{
		"postgres": s.PostgresURL, "mysql": s.MySQLDSN, "mongodb": s.MongoDBURI,
		"dynamodb": s.DynamoDBEndpoint, "cassandra": s.CassandraHosts,
	}
	flags := map[string]string{
		"postgres": "postgres-url (DTIMER_TEST_POSTGRES_URL)", "mysql": "mysql-dsn (DTIMER_TEST_MYSQL_DSN)",
		"mongodb": "mongodb-uri (DTIMER_TEST_MONGODB_URI)", "dynamodb": "dynamodb-endpoint (DTIMER_TEST_DYNAMODB_ENDPOINT)",
		"cassandra": "cassandra-hosts (DTIMER_TEST_CASSANDRA_HOSTS)",
	}
	v, ok := given[driver]
	switch {
	case driver == "sqlite":
		return nil
	case !ok:
		return fmt.Errorf("unknown driver %q (one of %s)", driver, strings.Join(Drivers, ", "))
	case v == "":
		return fmt.Errorf("driver %s: no server given: flag --%s; scripts/testdb/all.sh start starts one", driver, flags[driver])
	}
	return nil
}

// Store is one run's store: the server environment that selects it, and how
// to remove it.
type Store struct {
	Driver string
	Env    []string
	drop   func(context.Context) error
}

// Drop removes the store and everything in it.
func (st *Store) Drop(ctx context.Context) error {
	if st.drop == nil {
		return nil
	}
	return st.drop(ctx)
}

func name() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return "bench_" + hex.EncodeToString(b[:])
}

// Fresh creates (or names, where the server creates it at migration) a new
// store of driver.
func (s Servers) Fresh(ctx context.Context, driver string) (*Store, error) {
	if err := s.Available(driver); err != nil {
		return nil, err
	}
	n := name()
	st := &Store{Driver: driver, Env: []string{"DTIMER_STORE_DRIVER=" + driver}}
	switch driver {
	case "sqlite":
		dir := filepath.Join(s.SQLiteDir, n)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		st.Env = append(st.Env, "DTIMER_STORE_SQLITE_PATH="+filepath.Join(dir, "dtimer.db"))
		if s.SQLiteSynchronous != "" {
			st.Env = append(st.Env, "DTIMER_STORE_SQLITE_SYNCHRONOUS="+s.SQLiteSynchronous)
		}
		st.drop = func(context.Context) error { return os.RemoveAll(dir) }
	case "postgres":
		st.Env = append(st.Env, "DTIMER_STORE_POSTGRES_URL="+s.PostgresURL, "DTIMER_STORE_POSTGRES_SCHEMA="+n)
		if s.PostgresMaxConns > 0 {
			st.Env = append(st.Env, fmt.Sprintf("DTIMER_STORE_POSTGRES_MAX_CONNS=%d", s.PostgresMaxConns))
		}
		st.drop = func(ctx context.Context) error {
			conn, err := pgx.Connect(ctx, s.PostgresURL)
			if err != nil {
				return err
			}
			defer conn.Close(ctx)
			_, err = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{n}.Sanitize()+" CASCADE")
			return err
		}
	case "mysql":
		dc, err := gomysql.ParseDSN(s.MySQLDSN)
		if err != nil {
			return nil, fmt.Errorf("mysql dsn: %w", err)
		}
		dc.DBName = ""
		admin := func(ctx context.Context, stmt string) error {
			db, err := sql.Open("mysql", dc.FormatDSN())
			if err != nil {
				return err
			}
			defer db.Close()
			_, err = db.ExecContext(ctx, stmt)
			return err
		}
		if err := admin(ctx, "CREATE DATABASE `"+n+"`"); err != nil {
			return nil, fmt.Errorf("mysql: create database: %w", err)
		}
		withDB := *dc
		withDB.DBName = n
		st.Env = append(st.Env, "DTIMER_STORE_MYSQL_DSN="+withDB.FormatDSN())
		st.drop = func(ctx context.Context) error { return admin(ctx, "DROP DATABASE IF EXISTS `"+n+"`") }
	case "mongodb":
		st.Env = append(st.Env, "DTIMER_STORE_MONGODB_URI="+s.MongoDBURI, "DTIMER_STORE_MONGODB_DATABASE="+n)
		st.drop = func(ctx context.Context) error {
			c, err := mongo.Connect(options.Client().ApplyURI(s.MongoDBURI))
			if err != nil {
				return err
			}
			defer func() { _ = c.Disconnect(ctx) }()
			return c.Database(n).Drop(ctx)
		}
	case "dynamodb":
		const region, key, secret = "us-east-1", "dtimer", "dtimer" // DynamoDB Local takes any
		st.Env = append(st.Env, "DTIMER_STORE_DYNAMODB_ENDPOINT="+s.DynamoDBEndpoint,
			"DTIMER_STORE_DYNAMODB_REGION="+region, "DTIMER_STORE_DYNAMODB_TABLE="+n,
			"DTIMER_STORE_DYNAMODB_ACCESS_KEY_ID="+key, "DTIMER_STORE_DYNAMODB_SECRET_ACCESS_KEY="+secret)
		st.drop = func(ctx context.Context) error {
			tr := http.DefaultTransport.(*http.Transport).Clone()
			defer tr.CloseIdleConnections()
			c := dynamodb.New(dynamodb.Options{
				Region: region, BaseEndpoint: aws.String(s.DynamoDBEndpoint),
				Credentials: credentials.NewStaticCredentialsProvider(key, secret, ""),
				HTTPClient:  &http.Client{Transport: tr},
			})
			_, err := c.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(n)})
			var nf *types.ResourceNotFoundException
			if errors.As(err, &nf) {
				return nil
			}
			return err
		}
	case "cassandra":
		// A keyspace per run would be a slow schema change each time; runs
		// share one and get a table each, which the server creates.
		const keyspace = "dtimer_bench"
		admin := func(stmt string) error {
			cluster := gocql.NewCluster(strings.Split(s.CassandraHosts, ",")...)
			cluster.Timeout = time.Minute
			cluster.ConnectTimeout = 30 * time.Second
			session, err := cluster.CreateSession()
			if err != nil {
				return err
			}
			defer session.Close()
			return session.Query(stmt).Exec()
		}
		if err := admin("CREATE KEYSPACE IF NOT EXISTS " + keyspace +
			" WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}"); err != nil {
			return nil, fmt.Errorf("cassandra: create keyspace: %w", err)
		}
		st.Env = append(st.Env, "DTIMER_STORE_CASSANDRA_HOSTS="+s.CassandraHosts,
			"DTIMER_STORE_CASSANDRA_KEYSPACE="+keyspace, "DTIMER_STORE_CASSANDRA_TABLE="+n,
			"DTIMER_STORE_CASSANDRA_TIMEOUT=30s")
		st.drop = func(context.Context) error { return admin("DROP TABLE IF EXISTS " + keyspace + "." + n) }
	}
	return st, nil
}

// FreshPostgresDatabase creates a database of its own on the PostgreSQL
// server of url, for systems that keep their tables in a fixed schema (the
// peer, the ceilings), and returns its URL and how to drop it.
func FreshPostgresDatabase(ctx context.Context, url string) (string, func(context.Context) error, error) {
	n := name()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", nil, err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+n); err != nil {
		return "", nil, fmt.Errorf("create database %s: %w", n, err)
	}
	u, err := neturl.Parse(url)
	if err != nil || u.Scheme == "" {
		return "", nil, fmt.Errorf("postgres url must be a postgres:// URL to derive another database's URL from it")
	}
	u.Path = "/" + n
	newURL := u.String()
	drop := func(ctx context.Context) error {
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		_, err = c.Exec(ctx, "DROP DATABASE IF EXISTS "+n+" WITH (FORCE)")
		return err
	}
	return newURL, drop, nil
}
