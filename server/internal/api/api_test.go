package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/dtimer/dtimer/server/internal/routing"
	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/timer"
)

// shippedRetryPolicy is the default retry policy the server ships with;
// api.yaml describes the same values. It is the only place the tests spell
// them out.
var shippedRetryPolicy = timer.RetryPolicy{
	MaxAttempts:         5,
	MaxAttemptsDuration: 24 * time.Hour,
	InitialInterval:     time.Second,
	BackoffMultiplier:   2,
	MaxInterval:         60 * time.Second,
}

// testNow is the fixed clock of every test: error timestamps and the fake's
// createdAt/updatedAt.
var testNow = time.Date(2026, 2, 20, 14, 31, 7, 120_000_000, time.UTC)

type bundle struct {
	e    *echo.Echo
	svc  *fakeService
	reg  *prometheus.Registry
	logs *observer.ObservedLogs
}

// setup builds the API over a fake service with the shipped defaults;
// change opts to test other limits.
func setup(t *testing.T, change ...func(*Options)) *bundle {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	logger := zap.New(zapcore.NewTee(core, zaptest.NewLogger(t).Core()))
	svc := newFakeService(testNow)
	reg := prometheus.NewRegistry()
	opts := Options{
		Service:                svc,
		Logger:                 logger,
		Metrics:                promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		Registerer:             reg,
		DefaultRetryPolicy:     shippedRetryPolicy,
		DefaultCallbackTimeout: 10 * time.Second,
		MaxCallbackTimeout:     60 * time.Second,
		Now:                    func() time.Time { return testNow },
	}
	for _, c := range change {
		c(&opts)
	}
	return &bundle{e: New(opts), svc: svc, reg: reg, logs: logs}
}

// do sends a request through the echo handler; headers come in name, value
// pairs.
func (b *bundle) do(t *testing.T, method, path string, body io.Reader, headers ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, path, body)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	b.e.ServeHTTP(rec, req)
	return rec
}

// post sends a JSON body.
func (b *bundle) post(t *testing.T, path, body string) *httptest.ResponseRecorder {
	t.Helper()
	return b.do(t, http.MethodPost, path, strings.NewReader(body), "Content-Type", "application/json")
}

// requireError checks an error response: status, code, our shape, and that
// the message mentions each of mentions (the field at fault).
func requireError(t *testing.T, rec *httptest.ResponseRecorder, status int, code string, mentions ...string) errorBody {
	t.Helper()
	require.Equal(t, status, rec.Code, rec.Body.String())
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	var body errorBody
	dec := json.NewDecoder(rec.Body)
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&body))
	require.Equal(t, code, body.Error)
	require.Equal(t, "2026-02-20T14:31:07.120Z", body.Timestamp)
	require.NotEmpty(t, body.Message)
	for _, m := range mentions {
		require.Contains(t, body.Message, m)
	}
	require.NotContains(t, body.Message, "Fields.", "the message names a Go struct, not the JSON field")
	return body
}

// with returns the JSON object base with fields set to raw JSON values, in
// key, raw pairs; an empty raw removes the field.
func with(base string, kv ...string) string {
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(base), &m); err != nil {
		panic(err)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "" {
			delete(m, kv[i])
		} else {
			m[kv[i]] = json.RawMessage(kv[i+1])
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return string(b)
}

const (
	pathCreate = "/api/v1/timers/create"
	pathGet    = "/api/v1/timers/get"
	pathUpdate = "/api/v1/timers/update"
	pathDelete = "/api/v1/timers/delete"

	validCreate = `{"namespace":"billing","id":"invoice-42","executeAt":"2026-03-01T09:00:00+01:00","callbackUrl":"https://billing.example.com/hooks/reminder"}`
	validKey    = `{"namespace":"billing","timerId":"invoice-42"}`
	validUpdate = `{"namespace":"billing","timerId":"invoice-42","executeAt":"2026-03-08T08:00:00Z"}`
)

// storedTimer is a timer the fake holds before a get, update or delete.
func storedTimer() *timer.Timer {
	return &timer.Timer{
		Namespace:       "billing",
		ID:              "invoice-42",
		UUID:            timer.UUIDOf("billing", "invoice-42"),
		ExecuteAt:       time.Date(2026, 3, 1, 8, 0, 0, 0, time.UTC),
		DueAt:           time.Date(2026, 3, 1, 8, 0, 7, 0, time.UTC),
		CallbackURL:     "https://billing.example.com/hooks/reminder",
		Payload:         json.RawMessage(`{"invoiceId":"2026-0042"}`),
		RetryPolicy:     shippedRetryPolicy,
		CallbackTimeout: 10 * time.Second,
		CreatedAt:       time.Date(2026, 2, 1, 10, 0, 0, 0, time.UTC),
		UpdatedAt:       time.Date(2026, 3, 1, 8, 0, 3, 5_000_000, time.UTC),
		Attempts:        3,
		Status:          timer.StatusFailed,
		LastError:       "callback answered HTTP 503",
	}
}

func TestCreate(t *testing.T) {
	t.Parallel()
	b := setup(t)

	rec := b.post(t, pathCreate, `{
		"namespace": "billing",
		"id": "invoice-42",
		"executeAt": "2026-03-01T09:00:00.0000001+01:00",
		"callbackUrl": "https://billing.example.com/hooks/reminder",
		"payload": {"invoiceId": "2026-0042", "lines": [1, 2]},
		"retryPolicy": {"maxAttempts": 10, "initialInterval": "5s"},
		"callbackTimeoutSeconds": 30
	}`)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	require.JSONEq(t, `{
		"namespace": "billing",
		"id": "invoice-42",
		"executeAt": "2026-03-01T08:00:00.001Z",
		"callbackUrl": "https://billing.example.com/hooks/reminder",
		"payload": {"invoiceId": "2026-0042", "lines": [1, 2]},
		"retryPolicy": {"maxAttempts": 10, "maxAttemptsDuration": "24h0m0s", "initialInterval": "5s", "backoffMultiplier": 2, "maxInterval": "1m0s"},
		"callbackTimeoutSeconds": 30,
		"createdAt": "2026-02-20T14:31:07.120Z",
		"updatedAt": "2026-02-20T14:31:07.120Z",
		"attempts": 0,
		"status": "PENDING"
	}`, rec.Body.String())

	want := &timer.Timer{
		Namespace: "billing",
		ID:        "invoice-42",
		// UTC, rounded up to the millisecond.
		ExecuteAt:   time.Date(2026, 3, 1, 8, 0, 0, 1_000_000, time.UTC),
		CallbackURL: "https://billing.example.com/hooks/reminder",
		Payload:     json.RawMessage(`{"invoiceId":"2026-0042","lines":[1,2]}`),
		RetryPolicy: timer.RetryPolicy{
			MaxAttempts:         10,
			MaxAttemptsDuration: shippedRetryPolicy.MaxAttemptsDuration,
			InitialInterval:     5 * time.Second,
			BackoffMultiplier:   shippedRetryPolicy.BackoffMultiplier,
			MaxInterval:         shippedRetryPolicy.MaxInterval,
		},
		CallbackTimeout: 30 * time.Second,
	}
	require.Equal(t, want, b.svc.lastCreated())
}

func TestCreateDefaults(t *testing.T) {
	t.Parallel()
	b := setup(t)

	rec := b.post(t, pathCreate, validCreate)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.JSONEq(t, `{
		"namespace": "billing",
		"id": "invoice-42",
		"executeAt": "2026-03-01T08:00:00.000Z",
		"callbackUrl": "https://billing.example.com/hooks/reminder",
		"payload": null,
		"retryPolicy": {"maxAttempts": 5, "maxAttemptsDuration": "24h0m0s", "initialInterval": "1s", "backoffMultiplier": 2, "maxInterval": "1m0s"},
		"callbackTimeoutSeconds": 10,
		"createdAt": "2026-02-20T14:31:07.120Z",
		"updatedAt": "2026-02-20T14:31:07.120Z",
		"attempts": 0,
		"status": "PENDING"
	}`, rec.Body.String())

	got := b.svc.lastCreated()
	require.Nil(t, got.Payload)
	require.Equal(t, shippedRetryPolicy, got.RetryPolicy)
	require.Equal(t, 10*time.Second, got.CallbackTimeout)
}

// TestCreateUpsert checks only that a second create reaches the service as a
// create: replacing the stored timer is the service's job.
func TestCreateUpsert(t *testing.T) {
	t.Parallel()
	b := setup(t)

	require.Equal(t, http.StatusOK, b.post(t, pathCreate, validCreate).Code)
	rec := b.post(t, pathCreate, with(validCreate, "callbackUrl", `"http://other.example.com/cb"`))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Equal(t, "http://other.example.com/cb", b.svc.lastCreated().CallbackURL)
	require.Equal(t, 2, b.svc.callCount())
}

// TestCreateValidEdges covers inputs at the edge of validity: they must
// reach the service.
func TestCreateValidEdges(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		body  string
		check func(t *testing.T, got *timer.Timer)
	}{
		{"executeAt in the past", with(validCreate, "executeAt", `"2001-01-01T00:00:00Z"`), func(t *testing.T, got *timer.Timer) {
			require.Equal(t, time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC), got.ExecuteAt)
		}},
		{"executeAt at 1970", with(validCreate, "executeAt", `"1970-01-01T00:00:00Z"`), nil},
		{"executeAt at the end of 9999", with(validCreate, "executeAt", `"9999-12-31T23:59:59.999Z"`), nil},
		{"executeAt with a negative offset", with(validCreate, "executeAt", `"2026-03-01T03:00:00-05:00"`), func(t *testing.T, got *timer.Timer) {
			require.Equal(t, time.Date(2026, 3, 1, 8, 0, 0, 0, time.UTC), got.ExecuteAt)
		}},
		{"id of 255 bytes", with(validCreate, "id", `"`+strings.Repeat("é", 127)+`x"`), nil},
		{"namespace of 255 bytes", with(validCreate, "namespace", `"`+strings.Repeat("n", 255)+`"`), nil},
		{"callbackUrl of 2048 bytes", with(validCreate, "callbackUrl", `"http://h.example/`+strings.Repeat("p", 2048-len("http://h.example/"))+`"`), nil},
		{"callbackUrl with port, query and upper-case scheme", with(validCreate, "callbackUrl", `"HTTP://127.0.0.1:8081/cb?x=1"`), nil},
		{"callbackTimeoutSeconds at the maximum", with(validCreate, "callbackTimeoutSeconds", `60`), func(t *testing.T, got *timer.Timer) {
			require.Equal(t, 60*time.Second, got.CallbackTimeout)
		}},
		{"callbackTimeoutSeconds of 1", with(validCreate, "callbackTimeoutSeconds", `1`), nil},
		{"payload null", with(validCreate, "payload", `null`), func(t *testing.T, got *timer.Timer) {
			require.Equal(t, json.RawMessage("null"), got.Payload)
		}},
		{"payload a string", with(validCreate, "payload", `"hello"`), func(t *testing.T, got *timer.Timer) {
			require.Equal(t, json.RawMessage(`"hello"`), got.Payload)
		}},
		{"payload a number", with(validCreate, "payload", `12.5e3`), nil},
		{"empty retryPolicy", with(validCreate, "retryPolicy", `{}`), func(t *testing.T, got *timer.Timer) {
			require.Equal(t, shippedRetryPolicy, got.RetryPolicy)
		}},
		{"full retryPolicy", with(validCreate, "retryPolicy", `{"maxAttempts":1000,"maxAttemptsDuration":"0s","initialInterval":"100ms","backoffMultiplier":1.5,"maxInterval":"1h30m"}`),
			func(t *testing.T, got *timer.Timer) {
				require.Equal(t, timer.RetryPolicy{
					MaxAttempts:       1000,
					InitialInterval:   100 * time.Millisecond,
					BackoffMultiplier: 1.5,
					MaxInterval:       90 * time.Minute,
				}, got.RetryPolicy)
			}},
		{"whitespace around the body", "\n\t " + validCreate + " \r\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			rec := b.post(t, pathCreate, tc.body)
			require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
			if tc.check != nil {
				tc.check(t, b.svc.lastCreated())
			}
		})
	}
}

func TestContentType(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		contentType string
		ok          bool
	}{
		{"", true},
		{"application/json", true},
		{"application/json; charset=utf-8", true},
		{"Application/JSON", true},
		{"text/plain", false},
		{"application/x-www-form-urlencoded", false},
		{"application/json-patch+json", false},
		{"not a media type;;", false},
	} {
		t.Run(tc.contentType, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var headers []string
			if tc.contentType != "" {
				headers = []string{"Content-Type", tc.contentType}
			}
			rec := b.do(t, http.MethodPost, pathCreate, strings.NewReader(validCreate), headers...)
			if tc.ok {
				require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
				return
			}
			requireError(t, rec, http.StatusUnsupportedMediaType, CodeUnsupportedMediaType, "Content-Type")
			require.Zero(t, b.svc.callCount())
		})
	}
}

func TestGet(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.svc.put(storedTimer())

	rec := b.post(t, pathGet, validKey)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.JSONEq(t, `{
		"namespace": "billing",
		"id": "invoice-42",
		"executeAt": "2026-03-01T08:00:00.000Z",
		"callbackUrl": "https://billing.example.com/hooks/reminder",
		"payload": {"invoiceId": "2026-0042"},
		"retryPolicy": {"maxAttempts": 5, "maxAttemptsDuration": "24h0m0s", "initialInterval": "1s", "backoffMultiplier": 2, "maxInterval": "1m0s"},
		"callbackTimeoutSeconds": 10,
		"createdAt": "2026-02-01T10:00:00.000Z",
		"updatedAt": "2026-03-01T08:00:03.005Z",
		"attempts": 3,
		"status": "FAILED",
		"lastError": "callback answered HTTP 503"
	}`, rec.Body.String())
	require.Equal(t, timer.Key{Namespace: "billing", ID: "invoice-42"}, b.svc.lastKey())

	rec = b.post(t, pathGet, `{"namespace":"billing","timerId":"nope"}`)
	requireError(t, rec, http.StatusNotFound, CodeTimerNotFound, `"nope"`, `"billing"`)
}

func TestUpdate(t *testing.T) {
	t.Parallel()
	newExecuteAt := time.Date(2026, 3, 8, 8, 0, 0, 0, time.UTC)
	newURL := "http://other.example.com/cb"
	nullPayload := json.RawMessage("null")
	objectPayload := json.RawMessage(`{"a":[1,2],"b":null}`)
	newPolicy := shippedRetryPolicy
	newPolicy.MaxAttempts = 2
	thirty := 30 * time.Second

	for _, tc := range []struct {
		name  string
		body  string
		patch timer.Patch
	}{
		{"executeAt", validUpdate, timer.Patch{ExecuteAt: &newExecuteAt}},
		{"callbackUrl", with(validKey, "callbackUrl", `"`+newURL+`"`), timer.Patch{CallbackURL: &newURL}},
		{"payload null sets it to null", with(validKey, "payload", `null`), timer.Patch{Payload: &nullPayload}},
		{"payload object, compacted", with(validKey, "payload", `{ "a" : [1, 2], "b": null }`), timer.Patch{Payload: &objectPayload}},
		{"partial retryPolicy takes the defaults", with(validKey, "retryPolicy", `{"maxAttempts":2}`), timer.Patch{RetryPolicy: &newPolicy}},
		{"callbackTimeoutSeconds", with(validKey, "callbackTimeoutSeconds", `30`), timer.Patch{CallbackTimeout: &thirty}},
		{"all at once",
			with(validUpdate, "callbackUrl", `"`+newURL+`"`, "payload", `null`, "retryPolicy", `{"maxAttempts":2}`, "callbackTimeoutSeconds", `30`),
			timer.Patch{ExecuteAt: &newExecuteAt, CallbackURL: &newURL, Payload: &nullPayload, RetryPolicy: &newPolicy, CallbackTimeout: &thirty}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.svc.put(storedTimer())

			rec := b.post(t, pathUpdate, tc.body)
			require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
			key, patch, ok := b.svc.lastPatch()
			require.True(t, ok)
			require.Equal(t, timer.Key{Namespace: "billing", ID: "invoice-42"}, key)
			require.Equal(t, tc.patch, patch)

			// The response is the timer the service returned.
			want := newTimerResponse(tc.patch.Apply(storedTimer(), testNow))
			wantJSON, err := json.Marshal(want)
			require.NoError(t, err)
			require.JSONEq(t, string(wantJSON), rec.Body.String())
		})
	}
}

func TestUpdateNullPayloadShowsNull(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.svc.put(storedTimer())

	rec := b.post(t, pathUpdate, with(validKey, "payload", `null`))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var got map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got))
	require.Equal(t, "null", string(got["payload"]))
	// A new executeAt was not given: the failed timer stays failed.
	require.Equal(t, `"FAILED"`, string(got["status"]))
}

func TestUpdateNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := b.post(t, pathUpdate, validUpdate)
	requireError(t, rec, http.StatusNotFound, CodeTimerNotFound, `"invoice-42"`)
}

func TestDelete(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.svc.put(storedTimer())

	rec := b.post(t, pathDelete, validKey)
	require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
	require.Empty(t, rec.Body.String())
	require.Equal(t, timer.Key{Namespace: "billing", ID: "invoice-42"}, b.svc.lastKey())

	rec = b.post(t, pathDelete, validKey)
	requireError(t, rec, http.StatusNotFound, CodeTimerNotFound, `"invoice-42"`)
}

// TestValidation sends bad input to every endpoint: each gets a 4xx with the
// right code, a message naming the field, and never reaches the service.
func TestValidation(t *testing.T) {
	t.Parallel()
	long := func(n int) string { return `"` + strings.Repeat("x", n) + `"` }
	longURL := `"http://h.example/` + strings.Repeat("p", 2049-len("http://h.example/")) + `"`

	type tc struct {
		name     string
		path     string
		body     string
		mentions []string
	}
	cases := []tc{
		// The body as a whole.
		{"empty body", pathCreate, ``, []string{"empty"}},
		{"malformed JSON", pathCreate, `{"namespace": "billing",`, []string{"not valid JSON"}},
		{"syntax error", pathCreate, `{"namespace": billing}`, []string{"not valid JSON"}},
		{"array body", pathCreate, `[1, 2]`, []string{"JSON object"}},
		{"string body", pathGet, `"billing"`, []string{"JSON object"}},
		{"null body", pathGet, `null`, []string{"namespace is required"}},
		{"trailing object", pathCreate, validCreate + ` {}`, []string{"more data"}},
		{"trailing garbage", pathGet, validKey + `x`, []string{"more data"}},
		{"unknown field", pathCreate, with(validCreate, "callbackURL", `"http://x.example"`), []string{`"callbackURL"`}},
		{"unknown field on get", pathGet, with(validKey, "id", `"x"`), []string{`"id"`}},
		{"unknown field on delete", pathDelete, with(validKey, "force", `true`), []string{`"force"`}},
		{"unknown field on update", pathUpdate, with(validUpdate, "status", `"PENDING"`), []string{`"status"`}},
		{"unknown retryPolicy field", pathCreate, with(validCreate, "retryPolicy", `{"maxRetries":3}`), []string{`"retryPolicy.maxRetries"`}},
		{"field name in another case", pathCreate, with(validCreate, "ID", `"other"`), []string{`unknown field "ID"`}},
		{"retryPolicy field name in another case", pathCreate, with(validCreate, "retryPolicy", `{"MaxAttempts":3}`), []string{`unknown field "retryPolicy.MaxAttempts"`}},
		{"duplicate field", pathGet, `{"namespace":"billing","timerId":"a","timerId":"b"}`, []string{`duplicate field "timerId"`}},
		{"duplicate retryPolicy field", pathCreate, with(validCreate, "retryPolicy", `{"maxAttempts":3,"maxAttempts":4}`), []string{`duplicate field "retryPolicy.maxAttempts"`}},

		// namespace.
		{"namespace missing", pathCreate, with(validCreate, "namespace", ""), []string{"namespace is required"}},
		{"namespace null", pathCreate, with(validCreate, "namespace", `null`), []string{"namespace must not be null"}},
		{"namespace empty", pathCreate, with(validCreate, "namespace", `""`), []string{"namespace must not be empty"}},
		{"namespace not a string", pathCreate, with(validCreate, "namespace", `7`), []string{"namespace must be a string"}},
		{"namespace too long", pathCreate, with(validCreate, "namespace", long(256)), []string{"namespace", "255"}},
		{"namespace control character", pathGet, with(validKey, "namespace", `"a\u0000b"`), []string{"namespace", "control"}},
		{"namespace missing on get", pathGet, with(validKey, "namespace", ""), []string{"namespace is required"}},
		{"namespace missing on update", pathUpdate, with(validUpdate, "namespace", ""), []string{"namespace is required"}},
		{"namespace missing on delete", pathDelete, with(validKey, "namespace", ""), []string{"namespace is required"}},

		// id and timerId.
		{"id missing", pathCreate, with(validCreate, "id", ""), []string{"id is required"}},
		{"id empty", pathCreate, with(validCreate, "id", `""`), []string{"id must not be empty"}},
		{"id not a string", pathCreate, with(validCreate, "id", `{"x":1}`), []string{"id must be a string"}},
		{"id too long", pathCreate, with(validCreate, "id", long(256)), []string{"id", "255"}},
		{"id too long in bytes", pathCreate, with(validCreate, "id", `"`+strings.Repeat("é", 128)+`"`), []string{"id", "255"}},
		{"id with a newline", pathCreate, with(validCreate, "id", `"a\nb"`), []string{"id", "control"}},
		{"id with DEL", pathCreate, with(validCreate, "id", `"a\u007fb"`), []string{"id", "control"}},
		{"id with a C1 control", pathCreate, with(validCreate, "id", `"a\u0085b"`), []string{"id", "control"}},
		{"timerId missing on get", pathGet, with(validKey, "timerId", ""), []string{"timerId is required"}},
		{"timerId empty on delete", pathDelete, with(validKey, "timerId", `""`), []string{"timerId must not be empty"}},
		{"timerId too long on update", pathUpdate, with(validUpdate, "timerId", long(256)), []string{"timerId", "255"}},
		{"timerId control character on get", pathGet, with(validKey, "timerId", `"\t"`), []string{"timerId", "control"}},
		{"timerId not a string on delete", pathDelete, with(validKey, "timerId", `42`), []string{"timerId must be a string"}},

		// executeAt.
		{"executeAt missing", pathCreate, with(validCreate, "executeAt", ""), []string{"executeAt is required"}},
		{"executeAt empty", pathCreate, with(validCreate, "executeAt", `""`), []string{"executeAt must not be empty"}},
		{"executeAt not a time", pathCreate, with(validCreate, "executeAt", `"tomorrow"`), []string{"executeAt", "RFC 3339"}},
		{"executeAt a date only", pathCreate, with(validCreate, "executeAt", `"2026-03-01"`), []string{"executeAt", "RFC 3339"}},
		{"executeAt without offset", pathCreate, with(validCreate, "executeAt", `"2026-03-01T08:00:00"`), []string{"executeAt", "RFC 3339"}},
		{"executeAt a number", pathCreate, with(validCreate, "executeAt", `1767225600`), []string{"executeAt must be a string"}},
		{"executeAt before 1970", pathCreate, with(validCreate, "executeAt", `"1969-12-31T23:59:59.999Z"`), []string{"executeAt", "1970"}},
		{"executeAt before 1970 in UTC", pathCreate, with(validCreate, "executeAt", `"1970-01-01T00:30:00+01:00"`), []string{"executeAt", "1970"}},
		{"executeAt year 1", pathCreate, with(validCreate, "executeAt", `"0001-01-01T00:00:00Z"`), []string{"executeAt", "1970"}},
		{"executeAt after 9999 in UTC", pathCreate, with(validCreate, "executeAt", `"9999-12-31T23:00:00-05:00"`), []string{"executeAt", "9999"}},
		{"executeAt rounds up past 9999", pathCreate, with(validCreate, "executeAt", `"9999-12-31T23:59:59.9999Z"`), []string{"executeAt", "9999"}},
		{"executeAt invalid on update", pathUpdate, with(validUpdate, "executeAt", `"2026-02-30T00:00:00Z"`), []string{"executeAt", "RFC 3339"}},
		{"executeAt null on update", pathUpdate, with(validUpdate, "executeAt", `null`), []string{"executeAt must not be null"}},

		// callbackUrl.
		{"callbackUrl missing", pathCreate, with(validCreate, "callbackUrl", ""), []string{"callbackUrl is required"}},
		{"callbackUrl empty", pathCreate, with(validCreate, "callbackUrl", `""`), []string{"callbackUrl must not be empty"}},
		{"callbackUrl not a string", pathCreate, with(validCreate, "callbackUrl", `["http://x.example"]`), []string{"callbackUrl must be a string"}},
		{"callbackUrl relative", pathCreate, with(validCreate, "callbackUrl", `"/hooks/reminder"`), []string{"callbackUrl", "absolute"}},
		{"callbackUrl without scheme", pathCreate, with(validCreate, "callbackUrl", `"billing.example.com/hooks"`), []string{"callbackUrl", "absolute"}},
		{"callbackUrl ftp", pathCreate, with(validCreate, "callbackUrl", `"ftp://files.example.com/x"`), []string{"callbackUrl", "http"}},
		{"callbackUrl without host", pathCreate, with(validCreate, "callbackUrl", `"http:///path"`), []string{"callbackUrl", "host"}},
		{"callbackUrl opaque", pathCreate, with(validCreate, "callbackUrl", `"http:billing.example.com"`), []string{"callbackUrl", "absolute"}},
		{"callbackUrl port only", pathCreate, with(validCreate, "callbackUrl", `"http://:8080/x"`), []string{"callbackUrl", "host"}},
		{"callbackUrl unparsable", pathCreate, with(validCreate, "callbackUrl", `"http://[::1/x"`), []string{"callbackUrl"}},
		{"callbackUrl too long", pathCreate, with(validCreate, "callbackUrl", longURL), []string{"callbackUrl", "2048"}},
		{"callbackUrl invalid on update", pathUpdate, with(validKey, "callbackUrl", `"mailto:ops@example.com"`), []string{"callbackUrl"}},

		// callbackTimeoutSeconds.
		{"callbackTimeoutSeconds zero", pathCreate, with(validCreate, "callbackTimeoutSeconds", `0`), []string{"callbackTimeoutSeconds", "between 1 and 60"}},
		{"callbackTimeoutSeconds negative", pathCreate, with(validCreate, "callbackTimeoutSeconds", `-5`), []string{"callbackTimeoutSeconds", "between 1 and 60"}},
		{"callbackTimeoutSeconds over the maximum", pathCreate, with(validCreate, "callbackTimeoutSeconds", `61`), []string{"callbackTimeoutSeconds", "between 1 and 60"}},
		{"callbackTimeoutSeconds fractional", pathCreate, with(validCreate, "callbackTimeoutSeconds", `1.5`), []string{"callbackTimeoutSeconds must be an integer"}},
		{"callbackTimeoutSeconds a string", pathCreate, with(validCreate, "callbackTimeoutSeconds", `"10"`), []string{"callbackTimeoutSeconds must be an integer"}},
		{"callbackTimeoutSeconds huge", pathCreate, with(validCreate, "callbackTimeoutSeconds", `1e30`), []string{"callbackTimeoutSeconds must be an integer"}},
		{"callbackTimeoutSeconds null", pathCreate, with(validCreate, "callbackTimeoutSeconds", `null`), []string{"callbackTimeoutSeconds must not be null"}},
		{"callbackTimeoutSeconds zero on update", pathUpdate, with(validKey, "callbackTimeoutSeconds", `0`), []string{"callbackTimeoutSeconds"}},

		// retryPolicy.
		{"retryPolicy not an object", pathCreate, with(validCreate, "retryPolicy", `"fast"`), []string{"retryPolicy must be an object"}},
		{"retryPolicy null", pathCreate, with(validCreate, "retryPolicy", `null`), []string{"retryPolicy must not be null"}},
		{"maxAttempts zero", pathCreate, with(validCreate, "retryPolicy", `{"maxAttempts":0}`), []string{"retryPolicy.maxAttempts"}},
		{"maxAttempts too many", pathCreate, with(validCreate, "retryPolicy", `{"maxAttempts":1001}`), []string{"retryPolicy.maxAttempts"}},
		{"maxAttempts fractional", pathCreate, with(validCreate, "retryPolicy", `{"maxAttempts":2.5}`), []string{"retryPolicy.maxAttempts must be an integer"}},
		{"maxAttempts a string", pathCreate, with(validCreate, "retryPolicy", `{"maxAttempts":"3"}`), []string{"retryPolicy.maxAttempts must be an integer"}},
		{"maxAttempts null", pathCreate, with(validCreate, "retryPolicy", `{"maxAttempts":null}`), []string{"retryPolicy.maxAttempts must not be null"}},
		{"maxAttemptsDuration negative", pathCreate, with(validCreate, "retryPolicy", `{"maxAttemptsDuration":"-1s"}`), []string{"retryPolicy.maxAttemptsDuration"}},
		{"maxAttemptsDuration a number", pathCreate, with(validCreate, "retryPolicy", `{"maxAttemptsDuration":3600}`), []string{"retryPolicy.maxAttemptsDuration must be a string"}},
		{"maxAttemptsDuration without unit", pathCreate, with(validCreate, "retryPolicy", `{"maxAttemptsDuration":"3600"}`), []string{"retryPolicy.maxAttemptsDuration", "duration"}},
		{"initialInterval not a duration", pathCreate, with(validCreate, "retryPolicy", `{"initialInterval":"soon"}`), []string{"retryPolicy.initialInterval", "duration"}},
		{"initialInterval zero", pathCreate, with(validCreate, "retryPolicy", `{"initialInterval":"0s"}`), []string{"retryPolicy.initialInterval"}},
		{"initialInterval null", pathCreate, with(validCreate, "retryPolicy", `{"initialInterval":null}`), []string{"retryPolicy.initialInterval must not be null"}},
		{"backoffMultiplier below 1", pathCreate, with(validCreate, "retryPolicy", `{"backoffMultiplier":0.5}`), []string{"retryPolicy.backoffMultiplier"}},
		{"backoffMultiplier too big", pathCreate, with(validCreate, "retryPolicy", `{"backoffMultiplier":101}`), []string{"retryPolicy.backoffMultiplier"}},
		{"backoffMultiplier a string", pathCreate, with(validCreate, "retryPolicy", `{"backoffMultiplier":"2"}`), []string{"retryPolicy.backoffMultiplier must be a number"}},
		{"backoffMultiplier null", pathCreate, with(validCreate, "retryPolicy", `{"backoffMultiplier":null}`), []string{"retryPolicy.backoffMultiplier must not be null"}},
		{"maxInterval below the default initialInterval", pathCreate, with(validCreate, "retryPolicy", `{"maxInterval":"500ms"}`), []string{"retryPolicy.maxInterval"}},
		{"maxInterval not a duration", pathCreate, with(validCreate, "retryPolicy", `{"maxInterval":"1 minute"}`), []string{"retryPolicy.maxInterval", "duration"}},
		{"retryPolicy invalid on update", pathUpdate, with(validKey, "retryPolicy", `{"maxAttempts":-1}`), []string{"retryPolicy.maxAttempts"}},
		{"unknown retryPolicy field on update", pathUpdate, with(validKey, "retryPolicy", `{"jitter":true}`), []string{`"retryPolicy.jitter"`}},

		// Update needs something to change.
		{"update without changes", pathUpdate, validKey, []string{"at least one"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			rec := b.post(t, tc.path, tc.body)
			requireError(t, rec, http.StatusBadRequest, CodeInvalidInput, tc.mentions...)
			require.Zero(t, b.svc.callCount(), "bad input reached the service")
		})
	}
}

func TestPayloadTooLarge(t *testing.T) {
	t.Parallel()
	// bodyOfSize is a create body of exactly n bytes, padded in the payload.
	bodyOfSize := func(n int) string {
		s := with(validCreate, "payload", `""`)
		pad := n - len(s)
		return with(validCreate, "payload", `"`+strings.Repeat("a", pad)+`"`)
	}

	for _, tc := range []struct {
		name     string
		maxBytes int64
		size     int
		// unknownLength hides the length, as a chunked request does.
		unknownLength bool
		tooLarge      bool
	}{
		{"default limit, at it", 0, DefaultMaxBodyBytes, false, false},
		{"default limit, one over", 0, DefaultMaxBodyBytes + 1, false, true},
		{"default limit, one over, chunked", 0, DefaultMaxBodyBytes + 1, true, true},
		{"small limit, at it", 1024, 1024, true, false},
		{"small limit, far over", 1024, 1 << 20, false, true},
		{"small limit, far over, chunked", 1024, 1 << 20, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(o *Options) { o.MaxBodyBytes = tc.maxBytes })
			body := bodyOfSize(tc.size)
			require.Len(t, body, tc.size)
			var r io.Reader = strings.NewReader(body)
			if tc.unknownLength {
				r = io.MultiReader(r) // hides the length
			}
			rec := b.do(t, http.MethodPost, pathCreate, r, "Content-Type", "application/json")
			if !tc.tooLarge {
				require.Equal(t, http.StatusOK, rec.Code, rec.Body.String()[:min(rec.Body.Len(), 500)])
				return
			}
			limit := tc.maxBytes
			if limit == 0 {
				limit = DefaultMaxBodyBytes
			}
			requireError(t, rec, http.StatusRequestEntityTooLarge, CodePayloadTooLarge, fmt.Sprint(limit))
			require.Zero(t, b.svc.callCount())
		})
	}
}

func TestServiceErrors(t *testing.T) {
	t.Parallel()
	requests := []struct{ path, body string }{
		{pathCreate, validCreate},
		{pathGet, validKey},
		{pathUpdate, validUpdate},
		{pathDelete, validKey},
	}
	for _, tc := range []struct {
		name       string
		err        error
		status     int
		code       string
		retryAfter string
		mentions   []string
	}{
		{"timer not found", fmt.Errorf("get: %w", store.ErrTimerNotFound), http.StatusNotFound, CodeTimerNotFound, "", []string{`"invoice-42"`, `"billing"`}},
		{"timer too large", fmt.Errorf("dynamodb: %w: encodes to 204800 bytes", store.ErrTimerTooLarge), http.StatusRequestEntityTooLarge, CodePayloadTooLarge, "", []string{`"invoice-42"`, "204800 bytes"}},
		{"namespace not found", routing.ErrNamespaceNotFound, http.StatusBadRequest, CodeNamespaceNotFound, "", []string{`"billing"`}},
		{"shard unavailable", fmt.Errorf("shard 3: %w", routing.ErrShardUnavailable), http.StatusServiceUnavailable, CodeShardUnavailable, "1", []string{"retry"}},
		{"unknown error", errors.New("pq: password authentication failed for user dtimer"), http.StatusInternalServerError, CodeInternal, "", nil},
	} {
		for _, r := range requests {
			t.Run(tc.name+" "+r.path, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				b.svc.put(storedTimer())
				b.svc.setErr(tc.err)

				rec := b.post(t, r.path, r.body)
				body := requireError(t, rec, tc.status, tc.code, tc.mentions...)
				require.Equal(t, tc.retryAfter, rec.Header().Get("Retry-After"))
				errorLogs := b.logs.FilterLevelExact(zap.ErrorLevel).All()
				if tc.status == http.StatusInternalServerError {
					// Nothing internal leaks to the client; the log has it.
					require.Equal(t, "internal server error", body.Message)
					require.Len(t, errorLogs, 1)
					require.Contains(t, errorLogs[0].ContextMap()["error"], "password authentication")
				} else {
					require.Empty(t, errorLogs)
				}
			})
		}
	}
}

func TestPanicIsInternal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.e.GET("/panic", func(echo.Context) error { panic("boom") })
	rec := b.do(t, http.MethodGet, "/panic", nil)
	requireError(t, rec, http.StatusInternalServerError, CodeInternal)
	require.Len(t, b.logs.FilterLevelExact(zap.ErrorLevel).All(), 1)
}

func TestUnknownRoutes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		method, path string
		status       int
		code         string
	}{
		{http.MethodPost, "/api/v1/timers/list", http.StatusNotFound, CodeNotFound},
		{http.MethodGet, "/", http.StatusNotFound, CodeNotFound},
		{http.MethodPost, "/api/v1/timers/create/", http.StatusNotFound, CodeNotFound},
		{http.MethodPost, "/api/v1/cluster", http.StatusMethodNotAllowed, CodeMethodNotAllowed},
		{http.MethodGet, pathCreate, http.StatusMethodNotAllowed, CodeMethodNotAllowed},
		{http.MethodPut, pathUpdate, http.StatusMethodNotAllowed, CodeMethodNotAllowed},
		{http.MethodDelete, pathDelete, http.StatusMethodNotAllowed, CodeMethodNotAllowed},
		{http.MethodPost, "/health", http.StatusMethodNotAllowed, CodeMethodNotAllowed},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			rec := b.do(t, tc.method, tc.path, strings.NewReader(validKey), "Content-Type", "application/json")
			requireError(t, rec, tc.status, tc.code, tc.path)
			if tc.status == http.StatusMethodNotAllowed {
				require.NotEmpty(t, rec.Header().Get("Allow"))
			}
			require.Zero(t, b.svc.callCount())
		})
	}
}

func TestHealthAndReady(t *testing.T) {
	t.Parallel()
	b := setup(t)

	rec := b.do(t, http.MethodGet, "/health", nil)
	require.Equal(t, http.StatusOK, rec.Code)
	require.JSONEq(t, `{"status":"ok"}`, rec.Body.String())

	rec = b.do(t, http.MethodGet, "/ready", nil)
	require.Equal(t, http.StatusOK, rec.Code)
	require.JSONEq(t, `{"status":"ready"}`, rec.Body.String())

	b.svc.setReadyErr(errors.New("shards not owned yet"))
	rec = b.do(t, http.MethodGet, "/ready", nil)
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.JSONEq(t, `{"status":"not ready","reason":"shards not owned yet"}`, rec.Body.String())

	// Health does not depend on readiness.
	rec = b.do(t, http.MethodGet, "/health", nil)
	require.Equal(t, http.StatusOK, rec.Code)
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.post(t, pathCreate, validCreate)
	b.post(t, pathCreate, validCreate)
	b.post(t, pathCreate, `{}`)
	b.post(t, pathGet, `{"namespace":"billing","timerId":"nope"}`)
	b.do(t, http.MethodGet, "/no/such/route/1", nil)
	b.do(t, http.MethodGet, "/no/such/route/2", nil)
	b.do(t, http.MethodGet, pathCreate, nil)

	families, err := b.reg.Gather()
	require.NoError(t, err)
	counts := map[string]float64{}
	observations := map[string]uint64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch f.GetName() {
			case "dtimer_api_requests_total":
				counts[labels["route"]+" "+labels["code"]] = m.GetCounter().GetValue()
			case "dtimer_api_request_duration_seconds":
				observations[labels["route"]] = m.GetHistogram().GetSampleCount()
			}
		}
	}
	require.Equal(t, map[string]float64{
		pathCreate + " 200": 2,
		pathCreate + " 400": 1,
		pathCreate + " 405": 1,
		pathGet + " 404":    1,
		"unmatched 404":     2,
	}, counts)
	require.Equal(t, map[string]uint64{pathCreate: 4, pathGet: 1, "unmatched": 2}, observations)

	rec := b.do(t, http.MethodGet, "/metrics", nil)
	require.Equal(t, http.StatusOK, rec.Code)
	require.Contains(t, rec.Body.String(), `dtimer_api_requests_total{code="200",route="/api/v1/timers/create"} 2`)
}

// TestNewTwiceOnOneRegistry: rebuilding the API on the same registry keeps
// the existing metrics instead of panicking.
func TestNewTwiceOnOneRegistry(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	opts := Options{Service: newFakeService(testNow), Registerer: reg, DefaultRetryPolicy: shippedRetryPolicy}
	require.NotPanics(t, func() {
		New(opts)
		New(opts)
	})
}

func TestNewRejectsBadOptions(t *testing.T) {
	t.Parallel()
	svc := newFakeService(testNow)
	for name, opts := range map[string]Options{
		"no service":               {DefaultRetryPolicy: shippedRetryPolicy},
		"no default retry policy":  {Service: svc},
		"default timeout over max": {Service: svc, DefaultRetryPolicy: shippedRetryPolicy, DefaultCallbackTimeout: 90 * time.Second},
		"max timeout below 1s":     {Service: svc, DefaultRetryPolicy: shippedRetryPolicy, MaxCallbackTimeout: time.Millisecond},
	} {
		require.Panics(t, func() { New(opts) }, name)
	}
}
