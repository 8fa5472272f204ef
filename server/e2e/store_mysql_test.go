package e2e_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/dtimer/dtimer/server/internal/store/storetest"
)

// mysqlStore is a database of its own on the server of DTIMER_TEST_MYSQL_DSN
// (a user that may create databases): created here, since the driver
// migrates a table into an existing database, and dropped by the cleanup.
func mysqlStore(t *testing.T) []string {
	dc, err := gomysql.ParseDSN(storetest.EnvOrSkip(t, "DTIMER_TEST_MYSQL_DSN"))
	if err != nil {
		t.Fatalf("parse DTIMER_TEST_MYSQL_DSN: %v", err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	database := "e2e_" + hex.EncodeToString(b[:])
	dc.DBName = ""
	admin := func(stmt string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		db, err := sql.Open("mysql", dc.FormatDSN())
		if err != nil {
			return err
		}
		defer db.Close()
		_, err = db.ExecContext(ctx, stmt)
		return err
	}
	if err := admin("CREATE DATABASE `" + database + "`"); err != nil {
		t.Fatalf("create database %s: %v", database, err)
	}
	t.Cleanup(func() {
		if err := admin("DROP DATABASE IF EXISTS `" + database + "`"); err != nil {
			t.Errorf("drop database %s: %v", database, err)
		}
	})
	dc.DBName = database
	return []string{
		"DTIMER_STORE_DRIVER=mysql",
		"DTIMER_STORE_MYSQL_DSN=" + dc.FormatDSN(),
		// Many servers run at once against one test server. (The load tests,
		// which run alone, keep this size too unless setup overrides it.)
		"DTIMER_STORE_MYSQL_MAX_CONNS=8",
	}
}
