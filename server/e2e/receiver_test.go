package e2e_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// callbackBody is the API's CallbackRequest.
type callbackBody struct {
	Namespace string          `json:"namespace"`
	TimerID   string          `json:"timerId"`
	ExecuteAt string          `json:"executeAt"`
	Payload   json.RawMessage `json:"payload"`
	Attempt   int             `json:"attempt"`
}

// call is one callback request the receiver got.
type call struct {
	N           int // the how-manieth request for this timer id, from 1
	Method      string
	ContentType string
	Raw         []byte
	Body        callbackBody
	DecodeErr   error
	Arrived     time.Time // when the handler began
	Answer      answer
	// Set when the handler is done: Finished is zero before. Canceled is
	// true if the server gave up on the request (its timeout, or it closed
	// the connection) before the answer was written; WriteErr is the error
	// of writing the answer.
	Finished time.Time
	Canceled bool
	WriteErr error
}

// answer is how the receiver answers a callback.
type answer struct {
	Status      int // 0 means 200
	Body        string
	ContentType string
	// Delay, then Hold (if not nil) until it is closed, delay the answer;
	// the server's giving up on the request ends either.
	Delay time.Duration
	Hold  <-chan struct{}
}

// receiver is an HTTP callback receiver on 127.0.0.1 that records every
// request and answers by a script per timer id.
type receiver struct {
	watch
	srv     *httptest.Server
	closing chan struct{}
	calls   []*call
	byID    map[string][]*call
	scripts map[string][]answer
	// URL is the callback URL to give timers.
	URL string
}

// newReceiver starts a receiver that answers 200 with an empty body unless
// told otherwise; it closes when the test ends (after the server, whose
// cleanup is registered later).
func newReceiver(t *testing.T) *receiver {
	r := &receiver{
		closing: make(chan struct{}),
		byID:    make(map[string][]*call),
		scripts: make(map[string][]answer),
	}
	r.srv = httptest.NewServer(r) // binds 127.0.0.1:0
	r.URL = r.srv.URL + "/callback"
	t.Cleanup(func() {
		close(r.closing) // ends answers still waiting
		r.srv.Close()
	})
	return r
}

// script sets how the n-th callback of the timer id is answered: answers[n-1],
// the last one for every callback after.
func (r *receiver) script(id string, answers ...answer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.scripts[id] = answers
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	arrived := time.Now()
	c := &call{Method: req.Method, ContentType: req.Header.Get("Content-Type"), Arrived: arrived}
	c.Raw, _ = io.ReadAll(req.Body)
	c.DecodeErr = json.Unmarshal(c.Raw, &c.Body)

	r.mu.Lock()
	id := c.Body.TimerID
	r.byID[id] = append(r.byID[id], c)
	c.N = len(r.byID[id])
	r.calls = append(r.calls, c)
	if s := r.scripts[id]; len(s) > 0 {
		c.Answer = s[min(c.N, len(s))-1]
	}
	a := c.Answer
	r.changed()
	r.mu.Unlock()

	canceled := false
	if a.Delay > 0 {
		select {
		case <-time.After(a.Delay):
		case <-req.Context().Done():
			canceled = true
		case <-r.closing:
		}
	}
	if a.Hold != nil && !canceled {
		select {
		case <-a.Hold:
		case <-req.Context().Done():
			canceled = true
		case <-r.closing:
		}
	}
	var werr error
	if !canceled {
		if a.ContentType != "" {
			w.Header().Set("Content-Type", a.ContentType)
		}
		w.WriteHeader(orDefault(a.Status, http.StatusOK))
		_, werr = io.WriteString(w, a.Body)
		if werr == nil {
			werr = http.NewResponseController(w).Flush()
		}
	}

	r.mu.Lock()
	c.Finished, c.Canceled, c.WriteErr = time.Now(), canceled, werr
	r.changed()
	r.mu.Unlock()
}

func orDefault(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// of returns copies of the timer's calls so far.
func (r *receiver) of(id string) []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]call, len(r.byID[id]))
	for i, c := range r.byID[id] {
		out[i] = *c
	}
	return out
}

// all returns copies of every call so far.
func (r *receiver) all() []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]call, len(r.calls))
	for i, c := range r.calls {
		out[i] = *c
	}
	return out
}

// count is the number of callbacks of the timer so far.
func (r *receiver) count(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byID[id])
}

// total is the number of callbacks so far.
func (r *receiver) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

// await waits for the n-th callback of the timer and returns it; it fails
// the test if none arrives within timeout.
func (r *receiver) await(t *testing.T, id string, n int, timeout time.Duration) call {
	t.Helper()
	ok := r.wait(timeout, func() bool { return len(r.byID[id]) >= n })
	require.True(t, ok, "callback %d of timer %q did not arrive within %s (got %d)", n, id, timeout, r.count(id))
	return r.of(id)[n-1]
}

// awaitFinished waits until the handler of the n-th callback of the timer
// has answered (or given up) and returns the call.
func (r *receiver) awaitFinished(t *testing.T, id string, n int, timeout time.Duration) call {
	t.Helper()
	ok := r.wait(timeout, func() bool { return len(r.byID[id]) >= n && !r.byID[id][n-1].Finished.IsZero() })
	require.True(t, ok, "callback %d of timer %q did not finish within %s", n, id, timeout)
	return r.of(id)[n-1]
}

// never requires that the timer gets no n-th callback before until: it waits
// for one, and the wait must run out.
func (r *receiver) never(t *testing.T, id string, n int, until time.Time) {
	t.Helper()
	got := r.wait(time.Until(until), func() bool { return len(r.byID[id]) >= n })
	if got {
		c := r.of(id)[n-1]
		require.Failf(t, "unexpected callback", "timer %q got callback %d at %s: %s", id, n, c.Arrived.UTC().Format(time.RFC3339Nano), c.Raw)
	}
}

// requireCallback checks what every callback must be: a POST of JSON with
// exactly the CallbackRequest fields, not before the timer's executeAt.
func requireCallback(t *testing.T, c call) {
	t.Helper()
	require.Equal(t, http.MethodPost, c.Method)
	require.Equal(t, "application/json", c.ContentType)
	require.NoError(t, c.DecodeErr, "callback body %s", c.Raw)
	var fields map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(c.Raw, &fields))
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	require.ElementsMatch(t, []string{"namespace", "timerId", "executeAt", "payload", "attempt"}, keys, "callback body %s", c.Raw)
	require.Regexp(t, timestampRE, c.Body.ExecuteAt)
	executeAt := parseTS(t, c.Body.ExecuteAt)
	require.False(t, c.Arrived.Before(executeAt), "callback arrived at %s, before executeAt %s", c.Arrived.UTC().Format(time.RFC3339Nano), c.Body.ExecuteAt)
}
