package e2e_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dtimer/dtimer/server/internal/timer"
)

// callbackTimeout bounds the wait for a callback that is due now or soon.
const callbackTimeout = 15 * time.Second

// TestFire: a timer fires once, not before its executeAt, with exactly the
// CallbackRequest body, and leaves the store once completed.
func TestFire(t *testing.T) {
	t.Parallel()
	forEachDriver(t, true, func(t *testing.T, d driver) {
		srv, rcv := setup(t, d)
		payload := json.RawMessage(`{"order":{"id":"A-1","lines":[1,2.5,"x",null,true,{"deep":[]}]},"note":"h\u00e9llo \u2603","n":-0.125e3}`)
		executeAt := at(time.Second)
		created := srv.create(t, newTimer(rcv, "default", "fire", executeAt, obj{"payload": payload}))
		require.Equal(t, ts(executeAt), created.ExecuteAt)
		// Without a payload, in the other namespace, due in the past: it fires
		// at once, with payload null.
		past := at(-time.Hour)
		srv.create(t, newTimer(rcv, "other", "fire-past", past, nil))

		c := rcv.await(t, "fire", 1, callbackTimeout)
		requireCallback(t, c)
		require.Equal(t, callbackBody{Namespace: "default", TimerID: "fire", ExecuteAt: ts(executeAt), Payload: c.Body.Payload, Attempt: 1}, c.Body)
		require.JSONEq(t, string(payload), string(c.Body.Payload))

		p := rcv.await(t, "fire-past", 1, callbackTimeout)
		requireCallback(t, p)
		require.Equal(t, callbackBody{Namespace: "other", TimerID: "fire-past", ExecuteAt: ts(past), Payload: json.RawMessage("null"), Attempt: 1}, p.Body)

		srv.requireGone(t, "default", "fire")
		srv.requireGone(t, "other", "fire-past")
		until := time.Now().Add(time.Second)
		rcv.never(t, "fire", 2, until)
		rcv.never(t, "fire-past", 2, until)
	})
}

// TestLargePayload: a payload near the API's 1 MiB body limit is stored and
// delivered byte for byte, or, on a database whose rows cannot hold it,
// refused with 413 and not stored.
func TestLargePayload(t *testing.T) {
	t.Parallel()
	forEachDriver(t, true, func(t *testing.T, d driver) {
		srv, rcv := setup(t, d)
		// A JSON string of 900 KiB: the body stays under 1 MiB.
		big := json.RawMessage(`"` + strings.Repeat("p", 900<<10) + `"`)
		req := newTimer(rcv, "default", "big", at(0), obj{"payload": big})
		if d.maxPayload > 0 {
			r, err := srv.do(http.MethodPost, pathCreate, "application/json", req)
			require.NoError(t, err)
			e := requireError(t, r, http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE")
			require.Contains(t, e.Message, `"big"`)
			_, found := srv.get(t, "default", "big")
			require.False(t, found, "the refused timer was stored")
			// One that fits is taken.
			big = json.RawMessage(`"` + strings.Repeat("p", d.maxPayload-4<<10) + `"`)
			req["payload"] = big
		}
		// Compared as bool: a diff of two near-megabyte strings is unreadable.
		created := srv.create(t, req)
		require.True(t, string(big) == string(created.Payload), "created payload: %d bytes, sent %d", len(created.Payload), len(big))
		c := rcv.await(t, "big", 1, callbackTimeout)
		requireCallback(t, c)
		require.True(t, string(big) == string(c.Body.Payload), "delivered payload: %d bytes, sent %d", len(c.Body.Payload), len(big))
		srv.requireGone(t, "default", "big")
	})
}

// TestResponseShape: create answers the whole Timer, defaults filled in and
// times normalised; get answers the same.
func TestResponseShape(t *testing.T) {
	t.Parallel()
	forEachDriver(t, true, func(t *testing.T, d driver) {
		srv, rcv := setup(t, d)

		before := time.Now().UTC().Truncate(time.Millisecond)
		r := srv.post(t, pathCreate, obj{
			"namespace": "default", "id": "shape", "callbackUrl": rcv.URL,
			// Any offset, finer than milliseconds: kept in UTC, rounded up.
			"executeAt": "2030-01-02T05:04:05.1231+02:00",
		})
		after := time.Now().UTC()
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		require.Equal(t, "application/json", mediaType(r.header))
		var fields map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(r.body, &fields))
		keys := make([]string, 0, len(fields))
		for k := range fields {
			keys = append(keys, k)
		}
		require.ElementsMatch(t, []string{
			"namespace", "id", "executeAt", "callbackUrl", "payload", "retryPolicy",
			"callbackTimeoutSeconds", "createdAt", "updatedAt", "attempts", "status",
		}, keys, "no lastError before an attempt failed: %s", r.body)
		var tm timerJSON
		require.NoError(t, json.Unmarshal(r.body, &tm))
		require.Regexp(t, timestampRE, tm.CreatedAt)
		require.Equal(t, tm.CreatedAt, tm.UpdatedAt)
		createdAt := parseTS(t, tm.CreatedAt)
		require.False(t, createdAt.Before(before), "createdAt %s before the request (%s)", tm.CreatedAt, ts(before))
		require.False(t, createdAt.After(after.Add(time.Millisecond)), "createdAt %s after the answer (%s)", tm.CreatedAt, ts(after))
		require.Equal(t, timerJSON{
			Namespace: "default", ID: "shape",
			ExecuteAt:   "2030-01-02T03:04:05.124Z",
			CallbackURL: rcv.URL,
			Payload:     json.RawMessage("null"),
			// The shipped defaults.
			RetryPolicy:            retryPolicyJSON{MaxAttempts: 5, MaxAttemptsDuration: "24h0m0s", InitialInterval: "1s", BackoffMultiplier: 2, MaxInterval: "1m0s"},
			CallbackTimeoutSeconds: 10,
			CreatedAt:              tm.CreatedAt, UpdatedAt: tm.CreatedAt,
			Attempts: 0, Status: "PENDING",
		}, tm)

		g := srv.post(t, pathGet, obj{"namespace": "default", "timerId": "shape"})
		require.Equal(t, http.StatusOK, g.status, "%s", g.body)
		require.Equal(t, "application/json", mediaType(g.header))
		require.JSONEq(t, string(r.body), string(g.body))

		// Every field given; a partial retry policy takes the rest from the
		// defaults and durations come back in Go's canonical form.
		full := srv.create(t, newTimer(rcv, "other", "shape-full", at(time.Hour), obj{
			"payload":                obj{"k": []any{"v", 1.5}},
			"retryPolicy":            obj{"maxAttempts": 7, "initialInterval": "500ms", "maxInterval": "90s"},
			"callbackTimeoutSeconds": 30,
		}))
		require.Equal(t, retryPolicyJSON{MaxAttempts: 7, MaxAttemptsDuration: "24h0m0s", InitialInterval: "500ms", BackoffMultiplier: 2, MaxInterval: "1m30s"}, full.RetryPolicy)
		require.Equal(t, 30, full.CallbackTimeoutSeconds)
		require.JSONEq(t, `{"k":["v",1.5]}`, string(full.Payload))
		require.Equal(t, "other", full.Namespace)
		require.Equal(t, full, srv.mustGet(t, "other", "shape-full"))
	})
}

// TestUpsert: a create of an existing id replaces the timer; only the
// replacement fires.
func TestUpsert(t *testing.T) {
	t.Parallel()
	forEachDriver(t, true, func(t *testing.T, d driver) {
		srv, rcv := setup(t, d)
		late, early := at(5*time.Second), at(time.Second)
		srv.create(t, newTimer(rcv, "default", "upsert", late, obj{"payload": obj{"v": 1}}))
		second := srv.create(t, newTimer(rcv, "default", "upsert", early, obj{"payload": obj{"v": 2}}))
		require.Equal(t, ts(early), second.ExecuteAt)
		require.JSONEq(t, `{"v":2}`, string(second.Payload))
		require.Equal(t, second, srv.mustGet(t, "default", "upsert"))

		c := rcv.await(t, "upsert", 1, callbackTimeout)
		requireCallback(t, c)
		require.Equal(t, ts(early), c.Body.ExecuteAt)
		require.JSONEq(t, `{"v":2}`, string(c.Body.Payload))
		require.Equal(t, 1, c.Body.Attempt)
		// The replaced timer's time passes without a callback.
		rcv.never(t, "upsert", 2, late.Add(1500*time.Millisecond))
	})
}

// TestUpdate: an update changes only the fields given; a new executeAt
// moves the timer; an unknown id is 404.
func TestUpdate(t *testing.T) {
	t.Parallel()
	forEachDriver(t, true, func(t *testing.T, d driver) {
		srv, rcv := setup(t, d)
		first, moved := at(1500*time.Millisecond), at(3*time.Second)
		payload := obj{"keep": "me"}
		orig := srv.create(t, newTimer(rcv, "default", "move", first, obj{"payload": payload, "callbackTimeoutSeconds": 7}))
		srv.create(t, newTimer(rcv, "default", "repay", first, obj{"payload": payload}))
		srv.create(t, newTimer(rcv, "other", "nullpay", first, obj{"payload": payload}))

		u := srv.update(t, obj{"namespace": "default", "timerId": "move", "executeAt": ts(moved)})
		require.Equal(t, ts(moved), u.ExecuteAt)
		require.JSONEq(t, `{"keep":"me"}`, string(u.Payload))
		require.Equal(t, rcv.URL, u.CallbackURL)
		require.Equal(t, 7, u.CallbackTimeoutSeconds)
		require.Equal(t, orig.RetryPolicy, u.RetryPolicy)
		require.Equal(t, orig.CreatedAt, u.CreatedAt)
		require.Equal(t, "PENDING", u.Status)
		require.Zero(t, u.Attempts)
		require.Equal(t, u, srv.mustGet(t, "default", "move"))

		p := srv.update(t, obj{"namespace": "default", "timerId": "repay", "payload": obj{"new": true}})
		require.Equal(t, ts(first), p.ExecuteAt, "a payload update keeps executeAt")
		require.JSONEq(t, `{"new":true}`, string(p.Payload))
		n := srv.update(t, obj{"namespace": "other", "timerId": "nullpay", "payload": nil})
		require.Equal(t, "null", string(n.Payload))

		r := srv.post(t, pathUpdate, obj{"namespace": "default", "timerId": "nope", "executeAt": ts(moved)})
		requireError(t, r, http.StatusNotFound, "TIMER_NOT_FOUND")
		_, found := srv.get(t, "default", "nope")
		require.False(t, found, "an update of an unknown id must not create it")

		c := rcv.await(t, "repay", 1, callbackTimeout)
		requireCallback(t, c)
		require.Equal(t, ts(first), c.Body.ExecuteAt)
		require.JSONEq(t, `{"new":true}`, string(c.Body.Payload))
		c = rcv.await(t, "nullpay", 1, callbackTimeout)
		requireCallback(t, c)
		require.Equal(t, "null", string(c.Body.Payload))

		c = rcv.await(t, "move", 1, callbackTimeout)
		requireCallback(t, c)
		require.Equal(t, ts(moved), c.Body.ExecuteAt, "the moved timer fires at its new time only")
		require.JSONEq(t, `{"keep":"me"}`, string(c.Body.Payload))
		require.Equal(t, 1, c.Body.Attempt)
		rcv.never(t, "move", 2, time.Now().Add(time.Second))
	})
}

// TestDelete: a deleted timer never fires; a second delete is 404.
func TestDelete(t *testing.T) {
	t.Parallel()
	forEachDriver(t, true, func(t *testing.T, d driver) {
		srv, rcv := setup(t, d)
		due := at(1500 * time.Millisecond)
		srv.create(t, newTimer(rcv, "default", "doomed", due, nil))
		// A timer due at the same time shows that the server does fire.
		srv.create(t, newTimer(rcv, "default", "control", due, nil))

		r := srv.post(t, pathDelete, obj{"namespace": "default", "timerId": "doomed"})
		require.Equal(t, http.StatusNoContent, r.status, "%s", r.body)
		require.Empty(t, r.body)
		_, found := srv.get(t, "default", "doomed")
		require.False(t, found)
		r = srv.post(t, pathDelete, obj{"namespace": "default", "timerId": "doomed"})
		requireError(t, r, http.StatusNotFound, "TIMER_NOT_FOUND")

		requireCallback(t, rcv.await(t, "control", 1, callbackTimeout))
		rcv.never(t, "doomed", 1, due.Add(time.Second))
	})
}

// TestRetryBackoff: failed attempts are retried with the policy's backoff,
// counting attempts from 1, until one succeeds.
func TestRetryBackoff(t *testing.T) {
	t.Parallel()
	forEachDriver(t, true, func(t *testing.T, d driver) {
		srv, rcv := setup(t, d)
		release := make(chan struct{})
		rcv.script("retry", answer{Status: 500}, answer{Status: 500}, answer{Status: 200, Hold: release})
		created := srv.create(t, newTimer(rcv, "default", "retry", at(0), obj{
			"retryPolicy": obj{"maxAttempts": 5, "initialInterval": "200ms", "backoffMultiplier": 2, "maxInterval": "1s"},
		}))

		rcv.await(t, "retry", 3, callbackTimeout)
		// While the third attempt is held, the store shows the two failures.
		tm := srv.mustGet(t, "default", "retry")
		require.Equal(t, "PENDING", tm.Status)
		require.Equal(t, 2, tm.Attempts)
		require.Contains(t, tm.LastError, "500")
		require.Equal(t, created.ExecuteAt, tm.ExecuteAt, "executeAt stays the scheduled time")
		close(release)

		calls := rcv.of("retry")
		for i, c := range calls {
			requireCallback(t, c)
			require.Equal(t, i+1, c.Body.Attempt)
			require.Equal(t, created.ExecuteAt, c.Body.ExecuteAt)
		}
		gap1, gap2 := calls[1].Arrived.Sub(calls[0].Arrived), calls[2].Arrived.Sub(calls[1].Arrived)
		t.Logf("gaps between attempts: %s, %s", gap1, gap2)
		require.GreaterOrEqual(t, gap1, 200*time.Millisecond)
		require.GreaterOrEqual(t, gap2, 400*time.Millisecond)

		srv.requireGone(t, "default", "retry")
		rcv.never(t, "retry", 4, time.Now().Add(time.Second))
	})
}

// TestRetryExhaustion: a timer whose attempts all fail becomes FAILED and
// stays quiet; an update with a new executeAt replays it; delete removes it.
func TestRetryExhaustion(t *testing.T) {
	t.Parallel()
	forEachDriver(t, true, func(t *testing.T, d driver) {
		srv, rcv := setup(t, d)
		rcv.script("exhaust", answer{Status: 500, Body: "boom"})
		created := srv.create(t, newTimer(rcv, "default", "exhaust", at(0), obj{
			"retryPolicy": obj{"maxAttempts": 2, "initialInterval": "200ms"},
		}))

		rcv.await(t, "exhaust", 2, callbackTimeout)
		tm := srv.awaitTimer(t, "default", "exhaust", func(tm timerJSON) bool { return tm.Status == "FAILED" })
		require.Equal(t, 2, tm.Attempts)
		require.Contains(t, tm.LastError, "500")
		require.Equal(t, created.ExecuteAt, tm.ExecuteAt)
		// A third attempt would come 400ms after the second.
		rcv.never(t, "exhaust", 3, time.Now().Add(time.Second))
		require.Equal(t, tm, srv.mustGet(t, "default", "exhaust"), "a FAILED timer stays as it is")

		replay := at(300 * time.Millisecond)
		u := srv.update(t, obj{"namespace": "default", "timerId": "exhaust", "executeAt": ts(replay)})
		require.Equal(t, "PENDING", u.Status)
		require.Zero(t, u.Attempts)
		require.Empty(t, u.LastError)
		require.Equal(t, ts(replay), u.ExecuteAt)

		c := rcv.await(t, "exhaust", 3, callbackTimeout)
		requireCallback(t, c)
		require.Equal(t, 1, c.Body.Attempt, "attempts start again after a replay")
		require.Equal(t, ts(replay), c.Body.ExecuteAt)
		c = rcv.await(t, "exhaust", 4, callbackTimeout)
		require.Equal(t, 2, c.Body.Attempt)
		tm = srv.awaitTimer(t, "default", "exhaust", func(tm timerJSON) bool { return tm.Status == "FAILED" })
		require.Equal(t, 2, tm.Attempts)

		r := srv.post(t, pathDelete, obj{"namespace": "default", "timerId": "exhaust"})
		require.Equal(t, http.StatusNoContent, r.status, "%s", r.body)
		_, found := srv.get(t, "default", "exhaust")
		require.False(t, found)
		rcv.never(t, "exhaust", 5, time.Now().Add(700*time.Millisecond))
	})
}

// TestCallback4xx: a 4xx answer fails the timer at once, without retries.
func TestCallback4xx(t *testing.T) {
	t.Parallel()
	forEachDriver(t, true, func(t *testing.T, d driver) {
		srv, rcv := setup(t, d)
		policy := obj{"retryPolicy": obj{"maxAttempts": 5, "initialInterval": "200ms"}}
		for _, status := range []int{400, 404} {
			id := fmt.Sprintf("reject-%d", status)
			rcv.script(id, answer{Status: status, Body: "no such order"})
			srv.create(t, newTimer(rcv, "default", id, at(0), policy))
		}
		for _, status := range []int{400, 404} {
			id := fmt.Sprintf("reject-%d", status)
			requireCallback(t, rcv.await(t, id, 1, callbackTimeout))
			tm := srv.awaitTimer(t, "default", id, func(tm timerJSON) bool { return tm.Status == "FAILED" })
			require.Equal(t, 1, tm.Attempts)
			require.Contains(t, tm.LastError, fmt.Sprint(status))
		}
		until := time.Now().Add(time.Second)
		rcv.never(t, "reject-400", 2, until)
		rcv.never(t, "reject-404", 2, until)
	})
}

// TestCallbackAnswers: what a 2xx answer's body means (the callback
// contract's table).
func TestCallbackAnswers(t *testing.T) {
	t.Parallel()
	forEachDriver(t, true, func(t *testing.T, d driver) {
		// The default retry policy comes from the configuration.
		srv, rcv := setup(t, d, "DTIMER_CALLBACK_RETRY_INITIAL_INTERVAL=200ms", "DTIMER_CALLBACK_RETRY_MAX_ATTEMPTS=3")
		const ct = "application/json"
		next := at(2500 * time.Millisecond)
		// nextExecuteAt with an offset: the callback gets it in UTC.
		nextCET := next.In(time.FixedZone("CET", 3600)).Format(time.RFC3339Nano)
		hold := make(chan struct{})
		rcv.script("ok-false", answer{Body: `{"ok": false}`, ContentType: ct}, answer{Body: `{"ok": true}`, ContentType: ct})
		rcv.script("bad-next", answer{Body: `{"ok": false, "nextExecuteAt": "soon"}`, ContentType: ct}, answer{})
		rcv.script("resched", answer{Body: `{"ok": false, "nextExecuteAt": "` + nextCET + `"}`, ContentType: ct}, answer{Hold: hold})
		rcv.script("ok-true", answer{Body: `{"ok": true}`, ContentType: ct})
		rcv.script("empty", answer{})
		rcv.script("no-content", answer{Status: http.StatusNoContent})
		rcv.script("not-json", answer{Body: "<html>thanks</html>", ContentType: "text/html"})
		rcv.script("no-ok", answer{Body: `{"nextExecuteAt": "` + nextCET + `"}`, ContentType: ct})
		// want is how many callbacks each timer gets.
		want := map[string]int{"ok-false": 2, "bad-next": 2, "resched": 2, "ok-true": 1, "empty": 1, "no-content": 1, "not-json": 1, "no-ok": 1}
		executeAt := at(0)
		for id := range want {
			created := srv.create(t, newTimer(rcv, "default", id, executeAt, nil))
			require.Equal(t, retryPolicyJSON{MaxAttempts: 3, MaxAttemptsDuration: "24h0m0s", InitialInterval: "200ms", BackoffMultiplier: 2, MaxInterval: "1m0s"}, created.RetryPolicy)
		}

		// {"ok": false}, also with an invalid nextExecuteAt: retried.
		for _, id := range []string{"ok-false", "bad-next"} {
			c1, c2 := rcv.await(t, id, 1, callbackTimeout), rcv.await(t, id, 2, callbackTimeout)
			requireCallback(t, c2)
			require.Equal(t, 1, c1.Body.Attempt)
			require.Equal(t, 2, c2.Body.Attempt, "%s is retried", id)
			require.Equal(t, ts(executeAt), c2.Body.ExecuteAt)
			require.GreaterOrEqual(t, c2.Arrived.Sub(c1.Arrived), 200*time.Millisecond)
		}

		// {"ok": false, "nextExecuteAt": T}: fires again at T as attempt 1.
		c := rcv.await(t, "resched", 2, callbackTimeout)
		requireCallback(t, c)
		require.Equal(t, callbackBody{Namespace: "default", TimerID: "resched", ExecuteAt: ts(next), Payload: json.RawMessage("null"), Attempt: 1}, c.Body)
		tm := srv.mustGet(t, "default", "resched")
		require.Equal(t, ts(next), tm.ExecuteAt)
		require.Equal(t, "PENDING", tm.Status)
		require.Zero(t, tm.Attempts)
		require.Empty(t, tm.LastError)
		close(hold)

		for id, n := range want {
			requireCallback(t, rcv.await(t, id, n, callbackTimeout))
			srv.requireGone(t, "default", id)
		}
		until := time.Now().Add(time.Second)
		for id, n := range want {
			rcv.never(t, id, n+1, until)
		}
	})
}

// TestCallbackTimeout: an attempt that outlasts callbackTimeoutSeconds is
// abandoned and retried.
func TestCallbackTimeout(t *testing.T) {
	t.Parallel()
	forEachDriver(t, true, func(t *testing.T, d driver) {
		srv, rcv := setup(t, d)
		release := make(chan struct{})
		rcv.script("slow", answer{Delay: 3 * time.Second}, answer{Hold: release})
		srv.create(t, newTimer(rcv, "default", "slow", at(0), obj{
			"callbackTimeoutSeconds": 1,
			"retryPolicy":            obj{"initialInterval": "1s"},
		}))

		c1 := rcv.awaitFinished(t, "slow", 1, callbackTimeout)
		require.True(t, c1.Canceled, "the server should have given up on the first attempt after 1s, not waited for the answer")
		c2 := rcv.await(t, "slow", 2, callbackTimeout)
		requireCallback(t, c2)
		require.Equal(t, 2, c2.Body.Attempt)
		gap := c2.Arrived.Sub(c1.Arrived)
		t.Logf("first attempt abandoned after %s; second attempt %s after the first", c1.Finished.Sub(c1.Arrived), gap)
		// Expected: the 1 s timeout plus the 1 s backoff, 2 s. The receiver's
		// stamps lag the server's clocks by transit, which a loaded machine
		// stretches (1.148 s against 1.2 s was seen with a 200 ms backoff), so
		// the bounds sit halfway to the failures they catch: a retry without
		// the backoff (~1 s) or one that waited for the answer (3 s + 1 s).
		require.GreaterOrEqual(t, gap, 1500*time.Millisecond, "timeout 1s plus the 1s backoff")
		require.Less(t, gap, 3*time.Second, "the first attempt was abandoned at its timeout, not at its answer")

		tm := srv.mustGet(t, "default", "slow")
		require.Equal(t, 1, tm.Attempts)
		require.Contains(t, tm.LastError, "timed out")
		close(release)
		c2 = rcv.awaitFinished(t, "slow", 2, callbackTimeout)
		require.False(t, c2.Canceled, "the second attempt answered within its timeout")
		require.NoError(t, c2.WriteErr)

		srv.requireGone(t, "default", "slow")
		rcv.never(t, "slow", 3, time.Now().Add(time.Second))
	})
}

// TestBadInput: malformed requests are refused with a 4xx and the right
// error code, and change nothing.
func TestBadInput(t *testing.T) {
	t.Parallel()
	forEachDriver(t, true, func(t *testing.T, d driver) {
		srv, rcv := setup(t, d)
		future := ts(at(time.Hour))
		// An existing timer, which bad updates and deletes must leave alone.
		existing := srv.create(t, newTimer(rcv, "default", "existing", at(time.Hour), obj{"payload": obj{"p": 1}}))

		// valid is a good create request for id, changed by mod.
		valid := func(id string, mod func(obj)) obj {
			req := obj{"namespace": "default", "id": id, "executeAt": future, "callbackUrl": rcv.URL}
			if mod != nil {
				mod(req)
			}
			return req
		}
		set := func(k string, v any) func(obj) { return func(o obj) { o[k] = v } }
		del := func(k string) func(obj) { return func(o obj) { delete(o, k) } }
		rp := func(p obj) func(obj) { return set("retryPolicy", p) }
		key := func(ns, id string, extra obj) obj {
			o := obj{"namespace": ns, "timerId": id}
			for k, v := range extra {
				o[k] = v
			}
			return o
		}
		huge := strings.Repeat("x", 1<<20)
		const (
			invalid = "INVALID_INPUT"
			badNS   = "NAMESPACE_NOT_FOUND"
		)
		cases := []struct {
			name   string
			method string // POST unless set
			path   string
			ct     string // application/json unless set
			body   any
			status int
			code   string
			// id is a timer in namespace default that must not exist after.
			id string
		}{
			{name: "malformed JSON", path: pathCreate, body: `{"namespace": "default", "id": "bad-json", "executeAt": "` + future + `",`, status: 400, code: invalid, id: "bad-json"},
			{name: "trailing data", path: pathCreate, body: mustJSON(valid("bad-trailing", nil)) + ` {}`, status: 400, code: invalid, id: "bad-trailing"},
			{name: "array body", path: pathCreate, body: `[1, 2]`, status: 400, code: invalid},
			{name: "empty body", path: pathCreate, body: ``, status: 400, code: invalid},
			{name: "id is a number", path: pathCreate, body: valid("", set("id", 123)), status: 400, code: invalid, id: "123"},
			{name: "executeAt is a number", path: pathCreate, body: valid("bad-at-num", set("executeAt", 1767225600)), status: 400, code: invalid, id: "bad-at-num"},
			{name: "timeout is a string", path: pathCreate, body: valid("bad-to-str", set("callbackTimeoutSeconds", "10")), status: 400, code: invalid, id: "bad-to-str"},
			{name: "timeout is fractional", path: pathCreate, body: valid("bad-to-frac", set("callbackTimeoutSeconds", 1.5)), status: 400, code: invalid, id: "bad-to-frac"},
			{name: "retryPolicy is a string", path: pathCreate, body: valid("bad-rp-str", set("retryPolicy", "fast")), status: 400, code: invalid, id: "bad-rp-str"},
			{name: "missing namespace", path: pathCreate, body: valid("bad-no-ns", del("namespace")), status: 400, code: invalid, id: "bad-no-ns"},
			{name: "missing id", path: pathCreate, body: valid("", del("id")), status: 400, code: invalid},
			{name: "missing executeAt", path: pathCreate, body: valid("bad-no-at", del("executeAt")), status: 400, code: invalid, id: "bad-no-at"},
			{name: "missing callbackUrl", path: pathCreate, body: valid("bad-no-url", del("callbackUrl")), status: 400, code: invalid, id: "bad-no-url"},
			{name: "null id", path: pathCreate, body: valid("", set("id", nil)), status: 400, code: invalid},
			{name: "empty id", path: pathCreate, body: valid("", nil), status: 400, code: invalid},
			{name: "unknown field", path: pathCreate, body: valid("bad-field", set("color", "red")), status: 400, code: invalid, id: "bad-field"},
			{name: "field name in the wrong case", path: pathCreate, body: valid("bad-case", set("ExecuteAt", future)), status: 400, code: invalid, id: "bad-case"},
			{name: "duplicate field", path: pathCreate, body: `{"namespace": "default", "id": "bad-dup", "id": "bad-dup2", "executeAt": "` + future + `", "callbackUrl": "` + rcv.URL + `"}`, status: 400, code: invalid, id: "bad-dup"},
			{name: "callbackUrl ftp", path: pathCreate, body: valid("bad-url-ftp", set("callbackUrl", "ftp://example.com/x")), status: 400, code: invalid, id: "bad-url-ftp"},
			{name: "callbackUrl not a URL", path: pathCreate, body: valid("bad-url-text", set("callbackUrl", "not a url")), status: 400, code: invalid, id: "bad-url-text"},
			{name: "callbackUrl relative", path: pathCreate, body: valid("bad-url-rel", set("callbackUrl", "/hooks/x")), status: 400, code: invalid, id: "bad-url-rel"},
			{name: "callbackUrl without host", path: pathCreate, body: valid("bad-url-nohost", set("callbackUrl", "http:///hooks")), status: 400, code: invalid, id: "bad-url-nohost"},
			{name: "callbackUrl too long", path: pathCreate, body: valid("bad-url-long", set("callbackUrl", rcv.URL+"?q="+strings.Repeat("a", 2048))), status: 400, code: invalid, id: "bad-url-long"},
			{name: "id of 256 bytes", path: pathCreate, body: valid(strings.Repeat("i", 256), nil), status: 400, code: invalid, id: strings.Repeat("i", 255)},
			{name: "id with a control character", path: pathCreate, body: valid("bad\u0001ctl", nil), status: 400, code: invalid},
			{name: "namespace of 256 bytes", path: pathCreate, body: valid("bad-ns-long", set("namespace", strings.Repeat("n", 256))), status: 400, code: invalid, id: "bad-ns-long"},
			{name: "executeAt not a time", path: pathCreate, body: valid("bad-at-text", set("executeAt", "tomorrow")), status: 400, code: invalid, id: "bad-at-text"},
			{name: "executeAt without offset", path: pathCreate, body: valid("bad-at-local", set("executeAt", "2030-01-02T03:04:05")), status: 400, code: invalid, id: "bad-at-local"},
			{name: "executeAt before 1970", path: pathCreate, body: valid("bad-at-1969", set("executeAt", "1969-12-31T23:59:59Z")), status: 400, code: invalid, id: "bad-at-1969"},
			{name: "negative timeout", path: pathCreate, body: valid("bad-to-neg", set("callbackTimeoutSeconds", -1)), status: 400, code: invalid, id: "bad-to-neg"},
			{name: "zero timeout", path: pathCreate, body: valid("bad-to-zero", set("callbackTimeoutSeconds", 0)), status: 400, code: invalid, id: "bad-to-zero"},
			{name: "timeout above the maximum", path: pathCreate, body: valid("bad-to-big", set("callbackTimeoutSeconds", 61)), status: 400, code: invalid, id: "bad-to-big"},
			{name: "maxAttempts 0", path: pathCreate, body: valid("bad-rp-max0", rp(obj{"maxAttempts": 0})), status: 400, code: invalid, id: "bad-rp-max0"},
			{name: "maxAttempts 1001", path: pathCreate, body: valid("bad-rp-max", rp(obj{"maxAttempts": 1001})), status: 400, code: invalid, id: "bad-rp-max"},
			{name: "negative initialInterval", path: pathCreate, body: valid("bad-rp-neg", rp(obj{"initialInterval": "-1s"})), status: 400, code: invalid, id: "bad-rp-neg"},
			{name: "zero initialInterval", path: pathCreate, body: valid("bad-rp-zero", rp(obj{"initialInterval": "0s"})), status: 400, code: invalid, id: "bad-rp-zero"},
			{name: "initialInterval not a duration", path: pathCreate, body: valid("bad-rp-dur", rp(obj{"initialInterval": "soon"})), status: 400, code: invalid, id: "bad-rp-dur"},
			{name: "backoffMultiplier below 1", path: pathCreate, body: valid("bad-rp-mult", rp(obj{"backoffMultiplier": 0.5})), status: 400, code: invalid, id: "bad-rp-mult"},
			{name: "backoffMultiplier above 100", path: pathCreate, body: valid("bad-rp-mult-big", rp(obj{"backoffMultiplier": 101})), status: 400, code: invalid, id: "bad-rp-mult-big"},
			{name: "maxInterval below initialInterval", path: pathCreate, body: valid("bad-rp-maxint", rp(obj{"initialInterval": "2s", "maxInterval": "1s"})), status: 400, code: invalid, id: "bad-rp-maxint"},
			{name: "negative maxAttemptsDuration", path: pathCreate, body: valid("bad-rp-mad", rp(obj{"maxAttemptsDuration": "-1h"})), status: 400, code: invalid, id: "bad-rp-mad"},
			{name: "unknown retryPolicy field", path: pathCreate, body: valid("bad-rp-field", rp(obj{"jitter": true})), status: 400, code: invalid, id: "bad-rp-field"},
			{name: "null retryPolicy", path: pathCreate, body: valid("bad-rp-null", set("retryPolicy", nil)), status: 400, code: invalid, id: "bad-rp-null"},
			{name: "unknown namespace", path: pathCreate, body: valid("bad-ns", set("namespace", "nope")), status: 400, code: badNS, id: "bad-ns"},
			{name: "body over 1 MiB", path: pathCreate, body: valid("bad-huge", set("payload", huge)), status: 413, code: "PAYLOAD_TOO_LARGE", id: "bad-huge"},
			{name: "Content-Type text/plain", path: pathCreate, ct: "text/plain", body: valid("bad-ct", nil), status: 415, code: "UNSUPPORTED_MEDIA_TYPE", id: "bad-ct"},

			{name: "update without changes", path: pathUpdate, body: key("default", "existing", nil), status: 400, code: invalid},
			{name: "update with a bad executeAt", path: pathUpdate, body: key("default", "existing", obj{"executeAt": "now"}), status: 400, code: invalid},
			{name: "update with a bad callbackUrl", path: pathUpdate, body: key("default", "existing", obj{"callbackUrl": "mailto:x@example.com"}), status: 400, code: invalid},
			{name: "update with a null callbackUrl", path: pathUpdate, body: key("default", "existing", obj{"callbackUrl": nil}), status: 400, code: invalid},
			{name: "update with a bad retryPolicy", path: pathUpdate, body: key("default", "existing", obj{"retryPolicy": obj{"maxAttempts": -1}}), status: 400, code: invalid},
			{name: "update with id instead of timerId", path: pathUpdate, body: obj{"namespace": "default", "id": "existing", "payload": 1}, status: 400, code: invalid},
			{name: "update of an unknown namespace", path: pathUpdate, body: key("nope", "existing", obj{"payload": 1}), status: 400, code: badNS},
			{name: "update over 1 MiB", path: pathUpdate, body: key("default", "existing", obj{"payload": huge}), status: 413, code: "PAYLOAD_TOO_LARGE"},
			{name: "get without namespace", path: pathGet, body: obj{"timerId": "existing"}, status: 400, code: invalid},
			{name: "get with an extra field", path: pathGet, body: key("default", "existing", obj{"executeAt": future}), status: 400, code: invalid},
			{name: "get of an unknown namespace", path: pathGet, body: key("nope", "existing", nil), status: 400, code: badNS},
			{name: "delete with a numeric timerId", path: pathDelete, body: obj{"namespace": "default", "timerId": 7}, status: 400, code: invalid},
			{name: "delete of an unknown namespace", path: pathDelete, body: key("nope", "existing", nil), status: 400, code: badNS},
			{name: "delete with a long timerId", path: pathDelete, body: key("default", strings.Repeat("i", 256), nil), status: 400, code: invalid},
			{name: "GET of an operation", method: http.MethodGet, path: pathCreate, status: 405, code: "METHOD_NOT_ALLOWED"},
			{name: "unknown route", path: "/api/v1/timers/list", body: obj{}, status: 404, code: "NOT_FOUND"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				method, ct := http.MethodPost, "application/json"
				if tc.method != "" {
					method = tc.method
				}
				if tc.ct != "" {
					ct = tc.ct
				}
				r, err := srv.do(method, tc.path, ct, tc.body)
				require.NoError(t, err)
				require.Less(t, r.status, 500, "bad input must never be a server error: %s", r.body)
				e := requireError(t, r, tc.status, tc.code)
				t.Logf("%d %s: %s", r.status, e.Error, e.Message)
				if tc.id != "" {
					_, found := srv.get(t, "default", tc.id)
					require.False(t, found, "the refused request stored timer %q", tc.id)
				}
			})
		}
		require.Equal(t, existing, srv.mustGet(t, "default", "existing"), "refused updates changed the timer")
		_, found := srv.get(t, "other", "bad-ns")
		require.False(t, found)
	})
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// TestDurability: timers survive kill -9. Nothing that was not yet due at
// the kill fires twice; what fired shortly before a kill fires at least
// once (possibly again: at-least-once).
func TestDurability(t *testing.T) {
	t.Parallel()
	forEachDriver(t, true, func(t *testing.T, d driver) {
		srv, rcv := setup(t, d)
		const n = 200
		first := at(3 * time.Second)
		reqs := make([]obj, n)
		due := map[string]string{}
		for i := range reqs {
			id := fmt.Sprintf("dur-%03d", i)
			executeAt := first.Add(time.Duration(i) * 3 * time.Second / n).Truncate(time.Millisecond)
			ns := []string{"default", "other"}[i%2]
			reqs[i] = newTimer(rcv, ns, id, executeAt, obj{"payload": obj{"i": i}})
			due[id] = ts(executeAt)
		}
		took := srv.createAll(t, reqs, 16)
		srv.kill()
		killedAt := time.Now()
		t.Logf("created %d timers in %s, then killed the server", n, took)
		require.True(t, killedAt.Before(first), "precondition: the kill at %s came after the first timer was due (%s); creating %d timers took %s",
			ts(killedAt), ts(first), n, took)
		require.Zero(t, rcv.total(), "nothing was due before the kill")

		srv.restart()
		last := first.Add(3 * time.Second)
		ok := rcv.wait(time.Until(last)+callbackTimeout, func() bool { return len(rcv.byID) >= n })
		require.True(t, ok, "only %d of %d timers fired after the restart", len(rcv.all()), n)
		// A second firing would come at once; give one a second to show.
		rcv.wait(time.Second, func() bool { return len(rcv.calls) > n })
		for id, executeAt := range due {
			calls := rcv.of(id)
			require.Len(t, calls, 1, "timer %s was not yet due at the kill and must fire exactly once", id)
			requireCallback(t, calls[0])
			require.Equal(t, executeAt, calls[0].Body.ExecuteAt)
		}

		// Timers that fired just before a crash may fire again after it, but
		// must fire at least once.
		const m = 50
		imm := make([]obj, m)
		for i := range imm {
			imm[i] = newTimer(rcv, []string{"default", "other"}[i%2], fmt.Sprintf("imm-%02d", i), at(0), nil)
		}
		srv.createAll(t, imm, 16)
		ok = rcv.wait(callbackTimeout, func() bool {
			for i := range m {
				if len(rcv.byID[fmt.Sprintf("imm-%02d", i)]) == 0 {
					return false
				}
			}
			return true
		})
		require.True(t, ok, "the timers due at once did not all fire")
		before := rcv.total()
		srv.kill()
		srv.restart()
		// Sentinels due now in every shard fire after whatever the restart
		// fires again, which they thus bound.
		sentinels := sentinelIDs("sentinel")
		for ns, ids := range sentinels {
			for _, id := range ids {
				srv.create(t, newTimer(rcv, ns, id, at(0), nil))
			}
		}
		for _, ids := range sentinels {
			for _, id := range ids {
				rcv.await(t, id, 1, callbackTimeout)
			}
		}
		dups := 0
		for _, c := range rcv.all()[before:] {
			if !strings.HasPrefix(c.Body.TimerID, "sentinel-") {
				dups++
			}
		}
		for i := range m {
			id := fmt.Sprintf("imm-%02d", i)
			require.NotEmpty(t, rcv.of(id), "timer %s never fired", id)
		}
		t.Logf("after the second kill -9, %d callbacks of timers that had already fired came again (at-least-once)", dups)
	})
}

// TestGracefulShutdown: SIGTERM lets a callback in flight finish, the
// process exits 0, and the completed timer does not fire again after a
// restart.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	forEachDriver(t, true, func(t *testing.T, d driver) {
		srv, rcv := setup(t, d)
		rcv.script("inflight", answer{Delay: time.Second, Body: `{"ok": true}`, ContentType: "application/json"})
		srv.create(t, newTimer(rcv, "default", "inflight", at(0), nil))
		rcv.await(t, "inflight", 1, callbackTimeout)

		srv.stop() // SIGTERM while the callback is in flight; exit code 0
		c := rcv.awaitFinished(t, "inflight", 1, callbackTimeout)
		require.False(t, c.Canceled, "the server abandoned the callback in flight instead of letting it finish")
		require.NoError(t, c.WriteErr)
		require.True(t, srv.hasLogged(1, "stopped; shards released"))

		srv.restart()
		// A control timer in the same shard fires after anything the restart
		// fires again.
		var control string
		for _, id := range sentinelIDs("control")["default"] {
			if timer.ShardOf(id, shards["default"]) == timer.ShardOf("inflight", shards["default"]) {
				control = id
			}
		}
		srv.create(t, newTimer(rcv, "default", control, at(0), nil))
		rcv.await(t, control, 1, callbackTimeout)
		rcv.never(t, "inflight", 2, time.Now().Add(time.Second))
	})
}

// TestHealthcheckCommand: `dtimer-server healthcheck`, what container images
// without curl use, exits 0 while the node serves and non-zero once it
// stopped.
func TestHealthcheckCommand(t *testing.T) {
	t.Parallel()
	srv := startServer(t, drivers[0])
	check := func(args ...string) error {
		cmd := exec.Command(serverBin, append([]string{"healthcheck"}, args...)...)
		cmd.Env = []string{"DTIMER_HTTP_ADDRESS=" + strings.TrimPrefix(srv.URL, "http://")}
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	}
	require.NoError(t, check())
	require.NoError(t, check("--ready"))
	srv.stop()
	require.ErrorContains(t, check(), "connection refused")
}
