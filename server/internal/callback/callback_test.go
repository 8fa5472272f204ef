package callback_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dtimer/dtimer/server/internal/callback"
	"github.com/dtimer/dtimer/server/internal/timer"
)

func newTimer(url string) *timer.Timer {
	return &timer.Timer{
		Namespace: "ns", ID: "id-1", ExecuteAt: time.Date(2030, 1, 2, 3, 4, 5, 600_000_000, time.UTC),
		CallbackURL: url, Payload: json.RawMessage(`{"k":[1,2]}`), CallbackTimeout: 2 * time.Second,
	}
}

func TestFireSendsTheContractBody(t *testing.T) {
	t.Parallel()
	got := make(chan *http.Request, 1)
	bodies := make(chan []byte, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- r
		bodies <- b
	}))
	defer srv.Close()
	c := callback.NewClient(4)
	defer c.Close()
	res := c.Fire(context.Background(), newTimer(srv.URL+"/cb"), 3)
	require.Equal(t, callback.Done, res.Outcome)
	r := <-got
	require.Equal(t, http.MethodPost, r.Method)
	require.Equal(t, "/cb", r.URL.Path)
	require.Equal(t, "application/json", r.Header.Get("Content-Type"))
	require.JSONEq(t, `{"namespace":"ns","timerId":"id-1","executeAt":"2030-01-02T03:04:05.600Z","payload":{"k":[1,2]},"attempt":3}`, string(<-bodies))
}

func TestFireSendsNullPayload(t *testing.T) {
	t.Parallel()
	bodies := make(chan []byte, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		bodies <- b
	}))
	defer srv.Close()
	tm := newTimer(srv.URL)
	tm.Payload = nil
	callback.NewClient(1).Fire(context.Background(), tm, 1)
	var body map[string]any
	require.NoError(t, json.Unmarshal(<-bodies, &body))
	require.Contains(t, body, "payload")
	require.Nil(t, body["payload"])
}

func TestFireClassifiesAnswers(t *testing.T) {
	t.Parallel()
	next := "2031-05-06T07:08:09.123Z"
	cases := []struct {
		name    string
		status  int
		body    string
		outcome callback.Outcome
		errHas  string
	}{
		{"ok true", 200, `{"ok":true}`, callback.Done, ""},
		{"empty 200", 200, ``, callback.Done, ""},
		{"204", 204, ``, callback.Done, ""},
		{"not json", 200, `thanks!`, callback.Done, ""},
		{"other json", 200, `{"status":"fine"}`, callback.Done, ""},
		{"ok false", 200, `{"ok":false}`, callback.Retry, "ok=false"},
		{"reschedule", 200, `{"ok":false,"nextExecuteAt":"` + next + `"}`, callback.Reschedule, ""},
		{"bad reschedule time", 200, `{"ok":false,"nextExecuteAt":"tomorrow"}`, callback.Retry, "invalid nextExecuteAt"},
		{"500", 500, `boom`, callback.Retry, "HTTP 500: boom"},
		{"503", 503, ``, callback.Retry, "HTTP 503"},
		{"400", 400, `bad`, callback.Permanent, "HTTP 400"},
		{"404", 404, ``, callback.Permanent, "HTTP 404"},
		{"redirect", 302, ``, callback.Retry, "HTTP 302"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.status == 302 {
					w.Header().Set("Location", "/elsewhere")
				}
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			res := callback.NewClient(1).Fire(context.Background(), newTimer(srv.URL), 1)
			require.Equal(t, tc.outcome, res.Outcome, res.Err)
			require.Contains(t, res.Err, tc.errHas)
			if tc.outcome == callback.Reschedule {
				want, _ := time.Parse(time.RFC3339, next)
				require.True(t, want.Equal(res.NextExecuteAt), res.NextExecuteAt)
			}
		})
	}
}

func TestFireTimeoutIsRetried(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	tm := newTimer(srv.URL)
	tm.CallbackTimeout = 100 * time.Millisecond
	res := callback.NewClient(1).Fire(context.Background(), tm, 1)
	require.Equal(t, callback.Retry, res.Outcome)
	require.Contains(t, res.Err, "timed out after 100ms")
}

func TestFireConnectionErrorIsRetried(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now
	res := callback.NewClient(1).Fire(context.Background(), newTimer("http://"+addr+"/cb"), 1)
	require.Equal(t, callback.Retry, res.Outcome)
	require.True(t, strings.HasPrefix(res.Err, "callback failed:"), res.Err)
}

// The hand-written body must be exactly what encoding/json makes of Request,
// whatever the namespace and id hold.
func TestBodyMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	names := []string{"default", "ns-1_a.b", `quo"te`, `back\slash`, "tab\there", "<html>&", "üñï©ødé", "emoji 🎉", "bad \xff utf8", "\u2028line"}
	for _, ns := range names {
		for _, id := range names {
			tm := &timer.Timer{Namespace: ns, ID: id, ExecuteAt: time.Date(2026, 1, 2, 3, 4, 5, 678e6, time.UTC), Payload: json.RawMessage(`{"a":[1,2,{"b":null}]}`)}
			for _, payload := range []json.RawMessage{tm.Payload, nil} {
				tm.Payload = payload
				sent := payload
				if sent == nil {
					sent = json.RawMessage("null")
				}
				want, err := json.Marshal(callback.Request{
					Namespace: ns, TimerID: id, ExecuteAt: "2026-01-02T03:04:05.678Z", Payload: sent, Attempt: 3,
				})
				require.NoError(t, err)
				require.Equal(t, string(want), string(callback.AppendBody(nil, tm, 3)), "namespace %q id %q", ns, id)
			}
		}
	}
}
