// Package e2e_test runs the real dtimer-server binary as a child process and
// talks HTTP to it, with a real callback receiver in the test process. Every
// test runs once per store driver: sqlite always, postgres when
// DTIMER_TEST_POSTGRES_URL names a server (scripts/testdb/postgres.sh starts
// one); DTIMER_TEST_REQUIRE_ALL_DRIVERS=1 turns that skip into a failure.
//
// Each test starts its own server on its own store, so tests run in
// parallel and leave nothing behind. Tests wait on conditions (a log line, a
// callback, an HTTP answer), never on sleeps; a test that asserts that
// something does NOT happen waits for it with a deadline that must expire.
package e2e_test

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// serverBin is the dtimer-server binary TestMain builds once for every test.
var serverBin string

// defaultParallel is how many tests run at once unless -parallel says
// otherwise. The tests spend their time waiting for timers to come due, not
// computing, so GOMAXPROCS (the testing default) would leave the machine
// idle and stretch the suite to the sum of its waits.
const defaultParallel = "8"

func TestMain(m *testing.M) {
	flag.Parse()
	parallelSet := false
	flag.Visit(func(f *flag.Flag) { parallelSet = parallelSet || f.Name == "test.parallel" })
	if !parallelSet {
		_ = flag.Set("test.parallel", defaultParallel)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "dtimer-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	serverBin = filepath.Join(dir, "dtimer-server")
	build := exec.Command("go", "build", "-o", serverBin, "../cmd/dtimer-server")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: building dtimer-server:", err)
		return 1
	}
	defer httpClient.CloseIdleConnections()
	return m.Run()
}
