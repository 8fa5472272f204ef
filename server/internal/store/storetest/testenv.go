package storetest

import (
	"os"
	"testing"
)

// RequireAllDriversEnv, set to 1 (as CI does), turns the skip of a driver
// test whose server address is missing into a failure, so that a driver
// cannot silently go untested.
const RequireAllDriversEnv = "DTIMER_TEST_REQUIRE_ALL_DRIVERS"

// EnvOrSkip returns the value of the environment variable key, which names
// the database server a driver test runs against (for example
// DTIMER_TEST_POSTGRES_URL). When it is unset the test is skipped with the
// reason, or fails if RequireAllDriversEnv is 1.
func EnvOrSkip(t testing.TB, key string) string {
	t.Helper()
	v := os.Getenv(key)
	if v != "" {
		return v
	}
	msg := key + " is not set: no database server to test against (scripts/testdb/ starts one)"
	if os.Getenv(RequireAllDriversEnv) == "1" {
		t.Fatalf("%s, and %s=1 requires every driver to be tested", msg, RequireAllDriversEnv)
	}
	t.Skip(msg)
	return ""
}
