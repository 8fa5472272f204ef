package e2e_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Bounds of waits on the server process; generous, since they only matter
// when something is broken.
const (
	startTimeout = 30 * time.Second
	stopTimeout  = 45 * time.Second
)

// watch is state that tests wait on: changed() is called with mu held after
// every change and wakes every waiter.
type watch struct {
	mu sync.Mutex
	ch chan struct{}
}

// changed wakes the waiters. Called with mu held.
func (w *watch) changed() {
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
}

// wait calls cond with mu held, on every change, until it returns true
// (wait returns true) or timeout passes (false).
func (w *watch) wait(timeout time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		w.mu.Lock()
		if cond() {
			w.mu.Unlock()
			return true
		}
		if w.ch == nil {
			w.ch = make(chan struct{})
		}
		ch := w.ch
		w.mu.Unlock()
		select {
		case <-ch:
		case <-deadline.C:
			w.mu.Lock()
			defer w.mu.Unlock()
			return cond()
		}
	}
}

// logLine is one line a server process wrote.
type logLine struct {
	run    int    // which start of the server, from 1
	stream string // stdout or stderr
	text   string
	fields map[string]any // the line's JSON fields; nil if it is not JSON
}

// logSink collects the lines of every run of a server.
type logSink struct {
	watch
	lines []logLine
}

func (s *logSink) add(run int, stream, text string) {
	l := logLine{run: run, stream: stream, text: text}
	if err := json.Unmarshal([]byte(text), &l.fields); err != nil {
		l.fields = nil
	}
	s.mu.Lock()
	s.lines = append(s.lines, l)
	s.changed()
	s.mu.Unlock()
}

// find returns the first line of run for which match is true. Called with mu
// held.
func (s *logSink) find(run int, match func(logLine) bool) (logLine, bool) {
	for _, l := range s.lines {
		if l.run == run && match(l) {
			return l, true
		}
	}
	return logLine{}, false
}

// dump returns the last max lines, for a failing test's output.
func (s *logSink) dump(max int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	lines := s.lines
	if len(lines) > max {
		fmt.Fprintf(&b, "... %d earlier lines left out\n", len(lines)-max)
		lines = lines[len(lines)-max:]
	}
	for _, l := range lines {
		fmt.Fprintf(&b, "[run %d %s] %s\n", l.run, l.stream, l.text)
	}
	return b.String()
}

// lineWriter splits a process's output into lines for the sink. exec writes
// each stream from one goroutine, so it needs no lock of its own.
type lineWriter struct {
	sink   *logSink
	run    int
	stream string
	buf    []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.sink.add(w.run, w.stream, string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
}

func (w *lineWriter) flush() {
	if len(w.buf) > 0 {
		w.sink.add(w.run, w.stream, string(w.buf))
		w.buf = nil
	}
}

// server is a dtimer-server process, restartable on the same store.
type server struct {
	t    *testing.T
	env  []string
	dir  string
	logs *logSink

	run    int
	cmd    *exec.Cmd
	exited chan struct{} // closed when the current process has exited
	state  *os.ProcessState

	// URL is the base URL of the API of the current run.
	URL string
}

// serverEnv is the configuration every test server starts with; a test's
// own settings come after it and win.
func serverEnv(t *testing.T) []string {
	return []string{
		"DTIMER_HTTP_ADDRESS=127.0.0.1:0",
		"DTIMER_NAMESPACES=default:" + strconv.Itoa(shards["default"]) + ",other:" + strconv.Itoa(shards["other"]),
		"DTIMER_LOG_LEVEL=info",
		"DTIMER_LOG_FORMAT=json",
		"DTIMER_CLUSTER_NODE_NAME=" + nodeName(t),
		// Completed timers leave the store sooner, so that a test that waits
		// for get to answer 404 waits less.
		"DTIMER_ENGINE_DELETE_INTERVAL=200ms",
	}
}

// shards are the test servers' namespaces and their shard counts.
var shards = map[string]int{"default": 4, "other": 2}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

func nodeName(t *testing.T) string {
	n := "e2e-" + unsafeName.ReplaceAllString(t.Name(), "-")
	if len(n) > 100 {
		n = n[:100]
	}
	return n
}

// startServer starts a server on a fresh store of driver d, with env added to
// (and overriding) serverEnv, and waits until it is ready. The server is
// stopped gracefully when the test ends; its log is printed if the test
// failed.
func startServer(t *testing.T, d driver, env ...string) *server {
	t.Helper()
	return startNode(t, d.store(t), env...)
}

// startNode starts a server on the store that storeEnv configures (several
// nodes of a cluster share one), with env added to serverEnv after it.
func startNode(t *testing.T, storeEnv []string, env ...string) *server {
	t.Helper()
	s := &server{t: t, dir: t.TempDir(), logs: &logSink{}}
	// Inherit the environment but none of the caller's DTIMER_ settings: the
	// test decides the whole configuration.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DTIMER_") {
			s.env = append(s.env, kv)
		}
	}
	s.env = append(s.env, serverEnv(t)...)
	s.env = append(s.env, storeEnv...)
	s.env = append(s.env, env...)
	// Registered before the stop below, so that it runs after it and the
	// dump includes the shutdown.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("dtimer-server log (%s):\n%s", t.Name(), s.logs.dump(400))
		}
	})
	t.Cleanup(func() {
		if s.running() {
			if err := s.stopErr(); err != nil {
				t.Errorf("stopping the server at the end of the test: %v", err)
			}
		}
	})
	s.start()
	return s
}

func (s *server) running() bool {
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// start starts a new process on the same store and waits until it serves
// and is ready.
func (s *server) start() {
	t := s.t
	t.Helper()
	require.False(t, s.running(), "start: the server is still running")
	s.run++
	run := s.run
	stdout := &lineWriter{sink: s.logs, run: run, stream: "stdout"}
	stderr := &lineWriter{sink: s.logs, run: run, stream: "stderr"}
	cmd := exec.Command(serverBin)
	cmd.Env, cmd.Dir = s.env, s.dir
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.WaitDelay = 5 * time.Second
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	s.cmd, s.exited = cmd, exited
	go func() {
		_ = cmd.Wait()
		stdout.flush()
		stderr.flush()
		s.logs.mu.Lock()
		s.state = cmd.ProcessState
		close(exited)
		s.logs.changed()
		s.logs.mu.Unlock()
	}()

	var serving logLine
	found := s.logs.wait(startTimeout, func() bool {
		var ok bool
		serving, ok = s.logs.find(run, func(l logLine) bool { return l.fields["msg"] == "dtimer serving" })
		return ok || isClosed(exited)
	})
	require.True(t, found, "no \"dtimer serving\" log line within %s", startTimeout)
	require.NotNil(t, serving.fields, "the server exited before it served: %v", s.state)
	addr, _ := serving.fields["address"].(string)
	require.NotEmpty(t, addr, "\"dtimer serving\" has no address: %s", serving.text)
	s.URL = "http://" + addr

	// Ready means every shard is claimed: poll, since readiness is not
	// logged as one line.
	deadline := time.Now().Add(startTimeout)
	for {
		require.False(t, isClosed(exited), "the server exited before it was ready: %v", s.state)
		resp, err := httpClient.Get(s.URL + "/ready")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		require.True(t, time.Now().Before(deadline), "not ready within %s (last: %v %v)", startTimeout, resp, err)
		select {
		case <-time.After(20 * time.Millisecond):
		case <-exited:
		}
	}
}

// stop stops the server with SIGTERM and requires a clean exit (code 0).
func (s *server) stop() {
	s.t.Helper()
	require.NoError(s.t, s.stopErr())
}

// stopErr is stop that reports instead of failing now (for cleanups).
func (s *server) stopErr() error {
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("SIGTERM: %w", err)
	}
	select {
	case <-s.exited:
	case <-time.After(stopTimeout):
		_ = s.cmd.Process.Kill()
		<-s.exited
		return fmt.Errorf("the server did not exit within %s of SIGTERM; killed", stopTimeout)
	}
	if code := s.state.ExitCode(); code != 0 {
		return fmt.Errorf("the server exited with %v after SIGTERM, want exit code 0", s.state)
	}
	return nil
}

// kill kills the server with SIGKILL: a crash, nothing gets to clean up.
func (s *server) kill() {
	s.t.Helper()
	require.NoError(s.t, s.cmd.Process.Signal(syscall.SIGKILL))
	<-s.exited
}

// restart starts the server again on the same store; it must be stopped or
// killed.
func (s *server) restart() {
	s.t.Helper()
	s.start()
}

// hasLogged reports whether run of the server logged a line with message msg.
func (s *server) hasLogged(run int, msg string) bool {
	s.logs.mu.Lock()
	defer s.logs.mu.Unlock()
	_, ok := s.logs.find(run, func(l logLine) bool { return l.fields["msg"] == msg })
	return ok
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
