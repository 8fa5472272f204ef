package e2e_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dtimer/dtimer/server/internal/timer"
)

// httpClient is shared by every test, with room for the load tests' many
// concurrent connections to one server.
var httpClient = &http.Client{
	Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 128,
		IdleConnTimeout:     30 * time.Second,
	},
	Timeout: 30 * time.Second,
}

// obj is a JSON object of a request, free-form so that tests can send what
// the typed API would not let them.
type obj = map[string]any

// timerJSON is the API's Timer.
type timerJSON struct {
	Namespace              string          `json:"namespace"`
	ID                     string          `json:"id"`
	ExecuteAt              string          `json:"executeAt"`
	CallbackURL            string          `json:"callbackUrl"`
	Payload                json.RawMessage `json:"payload"`
	RetryPolicy            retryPolicyJSON `json:"retryPolicy"`
	CallbackTimeoutSeconds int             `json:"callbackTimeoutSeconds"`
	CreatedAt              string          `json:"createdAt"`
	UpdatedAt              string          `json:"updatedAt"`
	Attempts               int             `json:"attempts"`
	Status                 string          `json:"status"`
	LastError              string          `json:"lastError"`
}

type retryPolicyJSON struct {
	MaxAttempts         int     `json:"maxAttempts"`
	MaxAttemptsDuration string  `json:"maxAttemptsDuration"`
	InitialInterval     string  `json:"initialInterval"`
	BackoffMultiplier   float64 `json:"backoffMultiplier"`
	MaxInterval         string  `json:"maxInterval"`
}

// errorJSON is the API's Error.
type errorJSON struct {
	Error     string `json:"error"`
	Message   string `json:"message"`
	Timestamp string `json:"timestamp"`
}

// timestampRE is the API's Timestamp: UTC, exactly three fractional digits.
var timestampRE = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z$`)

// ts formats t as the API writes times.
func ts(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// at is the instant d from now at millisecond precision, without a monotonic
// reading, so that it compares by the wall clock as the server's times do.
func at(d time.Duration) time.Time { return time.Now().Add(d).UTC().Truncate(time.Millisecond) }

func parseTS(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	require.NoError(t, err, "time %q", s)
	return v
}

// response is an API answer.
type response struct {
	status int
	header http.Header
	body   []byte
}

// do sends an API request and returns the answer; body is sent as is if it
// is a []byte or a string, else marshalled. It reports transport errors
// instead of failing, so that goroutines other than the test's can use it.
func (s *server) do(method, path, contentType string, body any) (response, error) {
	return request(s.URL, method, path, contentType, body)
}

// request is do on the server at base URL.
func request(base, method, path, contentType string, body any) (response, error) {
	var raw []byte
	switch b := body.(type) {
	case nil:
	case []byte:
		raw = b
	case string:
		raw = []byte(b)
	default:
		var err error
		if raw, err = json.Marshal(b); err != nil {
			return response{}, err
		}
	}
	req, err := http.NewRequest(method, base+path, bytes.NewReader(raw))
	if err != nil {
		return response{}, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, err
	}
	return response{status: resp.StatusCode, header: resp.Header, body: out}, nil
}

// post sends a JSON API request.
func (s *server) post(t *testing.T, path string, body any) response {
	t.Helper()
	r, err := s.do(http.MethodPost, path, "application/json", body)
	require.NoError(t, err, "POST %s", path)
	return r
}

const (
	pathCreate = "/api/v1/timers/create"
	pathGet    = "/api/v1/timers/get"
	pathUpdate = "/api/v1/timers/update"
	pathDelete = "/api/v1/timers/delete"
)

// create creates a timer and requires 200.
func (s *server) create(t *testing.T, req obj) timerJSON {
	t.Helper()
	return s.timerOK(t, pathCreate, req)
}

// update updates a timer and requires 200.
func (s *server) update(t *testing.T, req obj) timerJSON {
	t.Helper()
	return s.timerOK(t, pathUpdate, req)
}

func (s *server) timerOK(t *testing.T, path string, req obj) timerJSON {
	t.Helper()
	r := s.post(t, path, req)
	require.Equal(t, http.StatusOK, r.status, "POST %s %v: %s", path, req, r.body)
	var tm timerJSON
	require.NoError(t, json.Unmarshal(r.body, &tm), "%s", r.body)
	return tm
}

// get reads a timer; ok is false if the server answered 404 TIMER_NOT_FOUND.
func (s *server) get(t *testing.T, ns, id string) (tm timerJSON, ok bool) {
	t.Helper()
	r := s.post(t, pathGet, obj{"namespace": ns, "timerId": id})
	if r.status == http.StatusNotFound {
		requireError(t, r, http.StatusNotFound, "TIMER_NOT_FOUND")
		return tm, false
	}
	require.Equal(t, http.StatusOK, r.status, "get %s/%s: %s", ns, id, r.body)
	require.NoError(t, json.Unmarshal(r.body, &tm), "%s", r.body)
	return tm, true
}

// mustGet reads a timer that must exist.
func (s *server) mustGet(t *testing.T, ns, id string) timerJSON {
	t.Helper()
	tm, ok := s.get(t, ns, id)
	require.True(t, ok, "timer %s/%s not found", ns, id)
	return tm
}

// requireError checks an error answer: the status, the Error body with the
// code, a message and a timestamp.
func requireError(t *testing.T, r response, status int, code string) errorJSON {
	t.Helper()
	require.Equal(t, status, r.status, "body: %s", r.body)
	require.Equal(t, "application/json", mediaType(r.header), "body: %s", r.body)
	var e errorJSON
	require.NoError(t, json.Unmarshal(r.body, &e), "%s", r.body)
	require.Equal(t, code, e.Error, "body: %s", r.body)
	require.NotEmpty(t, e.Message)
	require.Regexp(t, timestampRE, e.Timestamp)
	return e
}

// mediaType is the Content-Type without its parameters.
func mediaType(h http.Header) string {
	mt, _, _ := strings.Cut(h.Get("Content-Type"), ";")
	return strings.TrimSpace(mt)
}

// createAll creates the timers with `clients` concurrent clients and returns
// the time it took. Every create must answer 200: the server is ready, so
// even a 503 SHARD_UNAVAILABLE would be a fault.
func (s *server) createAll(t *testing.T, reqs []obj, clients int) time.Duration {
	t.Helper()
	work := make(chan obj)
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	start := time.Now()
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for req := range work {
				if err := s.createOne(req); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	for _, r := range reqs {
		work <- r
	}
	close(work)
	wg.Wait()
	took := time.Since(start)
	require.Empty(t, errs, "%d of %d creates failed", len(errs), len(reqs))
	return took
}

func (s *server) createOne(req obj) error {
	r, err := s.do(http.MethodPost, pathCreate, "application/json", req)
	switch {
	case err != nil:
		return fmt.Errorf("create %v: %w", req["id"], err)
	case r.status != http.StatusOK:
		return fmt.Errorf("create %v: HTTP %d: %s", req["id"], r.status, r.body)
	}
	return nil
}

// setup starts a callback receiver and a server on a fresh store of driver
// d, env added to the server's configuration.
func setup(t *testing.T, d driver, env ...string) (*server, *receiver) {
	t.Helper()
	rcv := newReceiver(t) // first, so that its cleanup runs after the server's
	return startServer(t, d, env...), rcv
}

// newTimer is a create request for a timer in namespace ns calling rcv;
// extra adds or replaces fields.
func newTimer(rcv *receiver, ns, id string, executeAt time.Time, extra obj) obj {
	req := obj{"namespace": ns, "id": id, "executeAt": ts(executeAt), "callbackUrl": rcv.URL}
	for k, v := range extra {
		req[k] = v
	}
	return req
}

// pollInterval is how often a test re-reads state it waits on through the
// API, which has no way to notify.
const pollInterval = 20 * time.Millisecond

// poll reports whether cond came to hold within timeout, checking it every
// pollInterval on the caller's goroutine.
func poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if !time.Now().Before(deadline) {
			return false
		}
		<-time.After(pollInterval)
	}
	return true
}

// awaitTimer waits until the stored timer satisfies cond and returns it.
func (s *server) awaitTimer(t *testing.T, ns, id string, cond func(timerJSON) bool) timerJSON {
	t.Helper()
	var (
		tm    timerJSON
		found bool
	)
	ok := poll(15*time.Second, func() bool {
		tm, found = s.get(t, ns, id)
		return found && cond(tm)
	})
	require.True(t, ok, "timer %s/%s did not reach the expected state (found %v, last %+v)", ns, id, found, tm)
	return tm
}

// requireGone waits until get answers 404 for the timer: a completed timer
// leaves the store with the next range delete of its shard.
func (s *server) requireGone(t *testing.T, ns, id string) {
	t.Helper()
	ok := poll(15*time.Second, func() bool {
		_, found := s.get(t, ns, id)
		return !found
	})
	require.True(t, ok, "timer %s/%s is still stored", ns, id)
}

// sentinelIDs returns, for every shard of every namespace, an id with the
// prefix that falls into that shard. A timer fires after every timer of its
// shard due before it, so once sentinels created after a restart have fired,
// whatever the restart fired again has been sent.
func sentinelIDs(prefix string) map[string][]string {
	out := map[string][]string{}
	for ns, n := range shards {
		ids := make([]string, n)
		for found, i := 0, 0; found < n; i++ {
			id := fmt.Sprintf("%s-%d", prefix, i)
			if sh := timer.ShardOf(id, n); ids[sh] == "" {
				ids[sh] = id
				found++
			}
		}
		out[ns] = ids
	}
	return out
}
