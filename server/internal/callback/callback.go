// Package callback delivers a timer to its callback URL and classifies the
// answer by the callback contract (docs/callbacks.md):
//
//   - 2xx with {"ok": true}, an empty body or any body that is not a
//     CallbackResponse: done;
//   - 2xx with {"ok": false, "nextExecuteAt": T}: reschedule to T;
//   - 2xx with {"ok": false} and no nextExecuteAt, 5xx, timeout, connection
//     error: retry by the timer's retry policy;
//   - 4xx: permanent failure.
package callback

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/dtimer/dtimer/server/internal/timer"
)

// Outcome is what the engine does with a timer after a callback attempt.
type Outcome int

const (
	// Done: the timer completed and is removed.
	Done Outcome = iota
	// Reschedule: the callback asked to run the timer again at NextExecuteAt.
	Reschedule
	// Retry: the attempt failed in a way worth retrying.
	Retry
	// Permanent: the callback rejected the timer (4xx); no retry.
	Permanent
)

func (o Outcome) String() string {
	switch o {
	case Done:
		return "done"
	case Reschedule:
		return "reschedule"
	case Retry:
		return "retry"
	case Permanent:
		return "permanent"
	}
	return "unknown"
}

// Result is the classified answer of one attempt.
type Result struct {
	Outcome       Outcome
	NextExecuteAt time.Time // with Reschedule
	// Err describes a failed attempt (Retry, Permanent); it becomes the
	// timer's lastError.
	Err string
}

// Request is the body POSTed to the callback URL.
type Request struct {
	Namespace string          `json:"namespace"`
	TimerID   string          `json:"timerId"`
	ExecuteAt string          `json:"executeAt"`
	Payload   json.RawMessage `json:"payload"`
	Attempt   int             `json:"attempt"`
}

// Response is what a callback may answer with.
type Response struct {
	OK            *bool   `json:"ok"`
	NextExecuteAt *string `json:"nextExecuteAt"`
}

// Client fires callbacks over HTTP.
type Client struct {
	http *http.Client
	// maxBody bounds how much of an answer is read.
	maxBody int64
}

// NewClient returns a client whose connection pool can keep `concurrency`
// connections per callback host alive, so a burst to one receiver reuses
// connections instead of opening one per timer.
func NewClient(concurrency int) *Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = concurrency
	tr.MaxIdleConnsPerHost = concurrency
	tr.IdleConnTimeout = 90 * time.Second
	return &Client{
		http: &http.Client{
			Transport: tr,
			// A redirect is followed like a browser would (POST becomes GET on
			// 301-303), which is never what a callback wants: answer with the
			// 3xx instead and classify it below.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		maxBody: 64 << 10,
	}
}

// Close releases idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// Fire POSTs the timer to its callback URL as attempt number `attempt` and
// classifies the answer. It never returns an error: every failure is a
// Result.
func (c *Client) Fire(ctx context.Context, t *timer.Timer, attempt int) Result {
	body := appendBody(make([]byte, 0, 128+len(t.Namespace)+len(t.ID)+len(t.Payload)), t, attempt)
	ctx, cancel := context.WithTimeout(ctx, t.CallbackTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.CallbackURL, bytes.NewReader(body))
	if err != nil {
		return Result{Outcome: Permanent, Err: "build callback request: " + err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "dtimer")
	resp, err := c.http.Do(req)
	if err != nil {
		return Result{Outcome: Retry, Err: describe(err, t.CallbackTimeout)}
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, c.maxBody))
	if err != nil && resp.StatusCode/100 == 2 {
		// The status counts; a body cut short by a timeout does not undo it.
		answer = nil
	}
	// Drain a little more so the connection can be reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, c.maxBody))
	return classify(resp.StatusCode, answer)
}

// appendBody appends the JSON of Request for attempt of t. It is written by
// hand because it runs once per fire: encoding/json's reflection and its
// re-compaction of the payload (stored compact by the API) were a visible
// part of a burst's CPU.
func appendBody(b []byte, t *timer.Timer, attempt int) []byte {
	b = append(b, `{"namespace":`...)
	b = appendString(b, t.Namespace)
	b = append(b, `,"timerId":`...)
	b = appendString(b, t.ID)
	b = append(b, `,"executeAt":"`...)
	b = t.ExecuteAt.UTC().AppendFormat(b, TimeFormat)
	b = append(b, `","payload":`...)
	if len(t.Payload) == 0 {
		b = append(b, "null"...)
	} else {
		b = append(b, t.Payload...)
	}
	b = append(b, `,"attempt":`...)
	b = strconv.AppendInt(b, int64(attempt), 10)
	return append(b, '}')
}

// appendString appends s as a JSON string. Namespaces and ids are plain
// ASCII in practice; anything else takes encoding/json's path, which escapes
// it the standard way.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// TimeFormat is how times travel in the callback body: RFC 3339, UTC,
// milliseconds.
const TimeFormat = "2006-01-02T15:04:05.000Z07:00"

func classify(status int, body []byte) Result {
	switch {
	case status >= 200 && status < 300:
		var r Response
		if len(bytes.TrimSpace(body)) == 0 || json.Unmarshal(body, &r) != nil || r.OK == nil || *r.OK {
			return Result{Outcome: Done}
		}
		if r.NextExecuteAt != nil {
			next, err := time.Parse(time.RFC3339Nano, *r.NextExecuteAt)
			if err != nil {
				return Result{Outcome: Retry, Err: fmt.Sprintf("callback answered ok=false with an invalid nextExecuteAt %q", *r.NextExecuteAt)}
			}
			return Result{Outcome: Reschedule, NextExecuteAt: timer.TruncateTime(next)}
		}
		return Result{Outcome: Retry, Err: "callback answered ok=false"}
	case status >= 400 && status < 500:
		return Result{Outcome: Permanent, Err: fmt.Sprintf("callback answered HTTP %d%s", status, snippet(body))}
	default:
		return Result{Outcome: Retry, Err: fmt.Sprintf("callback answered HTTP %d%s", status, snippet(body))}
	}
}

func snippet(body []byte) string {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return ""
	}
	if len(body) > 200 {
		body = body[:200]
	}
	return ": " + string(body)
}

func describe(err error, timeout time.Duration) string {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return fmt.Sprintf("callback timed out after %s", timeout)
	}
	return "callback failed: " + err.Error()
}
