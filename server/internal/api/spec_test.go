package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/stretchr/testify/require"

	"github.com/dtimer/dtimer/server/internal/routing"
	"github.com/dtimer/dtimer/server/internal/store"
)

// specPath is the API contract at the repository root.
const specPath = "../../../api.yaml"

func loadSpec(t *testing.T) (*openapi3.T, routers.Router) {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile(specPath)
	require.NoError(t, err)
	require.NoError(t, doc.Validate(loader.Context))
	router, err := gorillamux.NewRouter(doc)
	require.NoError(t, err)
	return doc, router
}

func TestSpecIsValid(t *testing.T) {
	t.Parallel()
	doc, _ := loadSpec(t)
	require.Equal(t, "3.0.3", doc.OpenAPI)
	require.Equal(t, "1.0.0", doc.Info.Version)

	// Every route the server has, and nothing else.
	b := setup(t)
	var served []string
	for _, r := range b.e.Routes() {
		served = append(served, r.Method+" "+r.Path)
	}
	var specified []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			specified = append(specified, method+" "+path)
		}
	}
	require.ElementsMatch(t, served, specified)

	// The error codes the server uses are the ones the spec lists.
	var codes []string
	for _, c := range doc.Components.Schemas["Error"].Value.Properties["error"].Value.Enum {
		codes = append(codes, c.(string))
	}
	require.ElementsMatch(t, []string{
		CodeInvalidInput, CodeNamespaceNotFound, CodeTimerNotFound, CodePayloadTooLarge,
		CodeUnsupportedMediaType, CodeShardUnavailable, CodeMethodNotAllowed, CodeNotFound, CodeInternal,
	}, codes)
}

// TestSpecConformance sends real requests through the real handler and
// checks them and every response against api.yaml, so that the server and
// its contract cannot drift apart.
func TestSpecConformance(t *testing.T) {
	t.Parallel()
	doc, router := loadSpec(t)

	type specCase struct {
		name    string
		method  string
		path    string
		body    string
		headers []string // name, value pairs; Content-Type defaults to JSON
		prepare func(b *bundle)
		status  int
		// valid requests must pass the spec's request validation. Invalid
		// ones must fail it too, unless specAllows says why the spec cannot
		// tell (a rule JSON Schema cannot express).
		valid      bool
		specAllows string
	}
	stored := func(b *bundle) { b.svc.put(storedTimer()) }
	failWith := func(err error) func(*bundle) { return func(b *bundle) { stored(b); b.svc.setErr(err) } }

	cases := []specCase{
		// Happy paths.
		{name: "create full", method: http.MethodPost, path: pathCreate, status: 200, valid: true, body: `{
			"namespace": "billing", "id": "invoice-42", "executeAt": "2026-03-01T09:00:00.5+01:00",
			"callbackUrl": "https://billing.example.com/hooks/reminder",
			"payload": {"invoiceId": "2026-0042", "n": [1, 2.5, null, true]},
			"retryPolicy": {"maxAttempts": 10, "maxAttemptsDuration": "1h30m", "initialInterval": "500ms", "backoffMultiplier": 1.5, "maxInterval": "2m"},
			"callbackTimeoutSeconds": 60}`},
		{name: "create minimal", method: http.MethodPost, path: pathCreate, body: validCreate, status: 200, valid: true},
		{name: "create with payload null", method: http.MethodPost, path: pathCreate, body: with(validCreate, "payload", `null`), status: 200, valid: true},
		{name: "create with a string payload", method: http.MethodPost, path: pathCreate, body: with(validCreate, "payload", `"x"`), status: 200, valid: true},
		{name: "create in the past", method: http.MethodPost, path: pathCreate, body: with(validCreate, "executeAt", `"1999-12-31T23:59:59Z"`), status: 200, valid: true},
		{name: "create with charset", method: http.MethodPost, path: pathCreate, body: validCreate, headers: []string{"Content-Type", "application/json; charset=utf-8"}, status: 200, valid: true},
		{name: "get", method: http.MethodPost, path: pathGet, body: validKey, prepare: stored, status: 200, valid: true},
		{name: "update executeAt", method: http.MethodPost, path: pathUpdate, body: validUpdate, prepare: stored, status: 200, valid: true},
		{name: "update payload null", method: http.MethodPost, path: pathUpdate, body: with(validKey, "payload", `null`), prepare: stored, status: 200, valid: true},
		{name: "update everything", method: http.MethodPost, path: pathUpdate, prepare: stored, status: 200, valid: true,
			body: with(validUpdate, "callbackUrl", `"http://127.0.0.1:9000/cb"`, "payload", `[1]`, "retryPolicy", `{"maxAttempts":1}`, "callbackTimeoutSeconds", `1`)},
		{name: "delete", method: http.MethodPost, path: pathDelete, body: validKey, prepare: stored, status: 204, valid: true},
		{name: "health", method: http.MethodGet, path: "/health", status: 200, valid: true},
		{name: "ready", method: http.MethodGet, path: "/ready", status: 200, valid: true},
		{name: "not ready", method: http.MethodGet, path: "/ready", status: 503, valid: true,
			prepare: func(b *bundle) { b.svc.setReadyErr(errors.New("store: ping: connection refused")) }},
		{name: "metrics", method: http.MethodGet, path: "/metrics", status: 200, valid: true},

		// Errors of the service, on valid requests.
		{name: "get not found", method: http.MethodPost, path: pathGet, body: validKey, status: 404, valid: true},
		{name: "update not found", method: http.MethodPost, path: pathUpdate, body: validUpdate, status: 404, valid: true},
		{name: "delete not found", method: http.MethodPost, path: pathDelete, body: validKey, status: 404, valid: true},
		{name: "create namespace not found", method: http.MethodPost, path: pathCreate, body: validCreate, status: 400, valid: true, prepare: failWith(routing.ErrNamespaceNotFound)},
		{name: "get namespace not found", method: http.MethodPost, path: pathGet, body: validKey, status: 400, valid: true, prepare: failWith(routing.ErrNamespaceNotFound)},
		{name: "create shard unavailable", method: http.MethodPost, path: pathCreate, body: validCreate, status: 503, valid: true, prepare: failWith(routing.ErrShardUnavailable)},
		{name: "get shard unavailable", method: http.MethodPost, path: pathGet, body: validKey, status: 503, valid: true, prepare: failWith(routing.ErrShardUnavailable)},
		{name: "update shard unavailable", method: http.MethodPost, path: pathUpdate, body: validUpdate, status: 503, valid: true, prepare: failWith(routing.ErrShardUnavailable)},
		{name: "delete shard unavailable", method: http.MethodPost, path: pathDelete, body: validKey, status: 503, valid: true, prepare: failWith(routing.ErrShardUnavailable)},
		{name: "create internal", method: http.MethodPost, path: pathCreate, body: validCreate, status: 500, valid: true, prepare: failWith(errors.New("disk full"))},
		{name: "get internal", method: http.MethodPost, path: pathGet, body: validKey, status: 500, valid: true, prepare: failWith(errors.New("disk full"))},
		{name: "update internal", method: http.MethodPost, path: pathUpdate, body: validUpdate, status: 500, valid: true, prepare: failWith(errors.New("disk full"))},
		{name: "delete internal", method: http.MethodPost, path: pathDelete, body: validKey, status: 500, valid: true, prepare: failWith(store.ErrShardOwnershipLost)},

		// Bad input.
		{name: "malformed JSON", method: http.MethodPost, path: pathCreate, body: `{"namespace":`, status: 400},
		{name: "unknown field", method: http.MethodPost, path: pathCreate, body: with(validCreate, "tags", `[]`), status: 400},
		{name: "missing namespace", method: http.MethodPost, path: pathCreate, body: with(validCreate, "namespace", ""), status: 400},
		{name: "missing callbackUrl", method: http.MethodPost, path: pathCreate, body: with(validCreate, "callbackUrl", ""), status: 400},
		{name: "empty id", method: http.MethodPost, path: pathCreate, body: with(validCreate, "id", `""`), status: 400},
		{name: "id too long", method: http.MethodPost, path: pathCreate, body: with(validCreate, "id", `"`+strings.Repeat("x", 256)+`"`), status: 400},
		{name: "id too long in bytes only", method: http.MethodPost, path: pathCreate, body: with(validCreate, "id", `"`+strings.Repeat("é", 128)+`"`), status: 400,
			specAllows: "maxLength counts characters; the server's limit is 255 bytes, as the description says"},
		{name: "id with a control character", method: http.MethodPost, path: pathCreate, body: with(validCreate, "id", `"a\u0001b"`), status: 400},
		{name: "executeAt not a date-time", method: http.MethodPost, path: pathCreate, body: with(validCreate, "executeAt", `"tomorrow"`), status: 400},
		{name: "executeAt before 1970", method: http.MethodPost, path: pathCreate, body: with(validCreate, "executeAt", `"1969-07-20T20:17:40Z"`), status: 400,
			specAllows: "a date-time range is in the description only"},
		{name: "callbackUrl ftp", method: http.MethodPost, path: pathCreate, body: with(validCreate, "callbackUrl", `"ftp://x.example/y"`), status: 400},
		{name: "callbackUrl too long", method: http.MethodPost, path: pathCreate, body: with(validCreate, "callbackUrl", `"http://h.example/`+strings.Repeat("p", 2048)+`"`), status: 400},
		{name: "callbackTimeoutSeconds zero", method: http.MethodPost, path: pathCreate, body: with(validCreate, "callbackTimeoutSeconds", `0`), status: 400},
		{name: "callbackTimeoutSeconds over the maximum", method: http.MethodPost, path: pathCreate, body: with(validCreate, "callbackTimeoutSeconds", `61`), status: 400},
		{name: "callbackTimeoutSeconds fractional", method: http.MethodPost, path: pathCreate, body: with(validCreate, "callbackTimeoutSeconds", `2.5`), status: 400},
		{name: "retryPolicy maxAttempts zero", method: http.MethodPost, path: pathCreate, body: with(validCreate, "retryPolicy", `{"maxAttempts":0}`), status: 400},
		{name: "retryPolicy initialInterval not a duration", method: http.MethodPost, path: pathCreate, body: with(validCreate, "retryPolicy", `{"initialInterval":"soon"}`), status: 400},
		{name: "retryPolicy backoffMultiplier too big", method: http.MethodPost, path: pathCreate, body: with(validCreate, "retryPolicy", `{"backoffMultiplier":1000}`), status: 400},
		{name: "retryPolicy unknown field", method: http.MethodPost, path: pathCreate, body: with(validCreate, "retryPolicy", `{"jitter":0.1}`), status: 400},
		{name: "retryPolicy maxInterval below initialInterval", method: http.MethodPost, path: pathCreate, body: with(validCreate, "retryPolicy", `{"initialInterval":"10s","maxInterval":"5s"}`), status: 400,
			specAllows: "a rule between two fields, stated in the description"},
		{name: "get without timerId", method: http.MethodPost, path: pathGet, body: `{"namespace":"billing"}`, status: 400},
		{name: "delete with id instead of timerId", method: http.MethodPost, path: pathDelete, body: `{"namespace":"billing","id":"invoice-42"}`, status: 400},
		{name: "update without changes", method: http.MethodPost, path: pathUpdate, body: validKey, status: 400},
		{name: "update executeAt null", method: http.MethodPost, path: pathUpdate, body: with(validKey, "executeAt", `null`), status: 400},
		{name: "wrong content type", method: http.MethodPost, path: pathCreate, body: validCreate, headers: []string{"Content-Type", "text/plain"}, status: 415},
		{name: "body too large", method: http.MethodPost, path: pathCreate, status: 413,
			body:       with(validCreate, "payload", `"`+strings.Repeat("a", DefaultMaxBodyBytes)+`"`),
			specAllows: "the body size limit is in the description only"},

		// Routes the spec does not have.
		{name: "unknown path", method: http.MethodPost, path: "/api/v1/timers/list", body: validKey, status: 404},
		{name: "unknown method", method: http.MethodGet, path: pathCreate, status: 405},

		// The cluster.
		{name: "cluster view", method: http.MethodGet, path: "/api/v1/cluster", status: 200, valid: true, prepare: func(b *bundle) { b.svc.clusterV = sampleCluster() }},
		{name: "cluster view fails", method: http.MethodGet, path: "/api/v1/cluster", status: 500, valid: true, prepare: func(b *bundle) { b.svc.clusterErr = errors.New("store down") }},
		{name: "forwarded create", method: http.MethodPost, path: pathCreate, body: validCreate, headers: []string{routing.ForwardedHeader, "node-b"}, status: 200, valid: true},
		{name: "create relayed from the owner", method: http.MethodPost, path: pathCreate, body: validCreate, status: 200, valid: true, prepare: func(b *bundle) {
			b.svc.setErr(&routing.NotLocalError{Node: "node-b", HTTPAddress: "10.0.0.2:8080"})
			b.svc.relay = &routing.Relayed{Status: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(relayedTimerJSON)}
		}},
		{name: "delete relayed 503", method: http.MethodPost, path: pathDelete, body: validKey, status: 503, valid: true, prepare: func(b *bundle) {
			b.svc.setErr(&routing.NotLocalError{Node: "node-b", HTTPAddress: "10.0.0.2:8080"})
			b.svc.relay = &routing.Relayed{Status: 503, Header: http.Header{"Content-Type": {"application/json"}, "Retry-After": {"1"}},
				Body: []byte(`{"error":"SHARD_UNAVAILABLE","message":"moving","timestamp":"2026-02-20T14:31:07.120Z"}`)}
		}},
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			if tc.prepare != nil {
				tc.prepare(b)
			}
			newRequest := func() *http.Request {
				req := httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body))
				if tc.body != "" {
					req.Header.Set("Content-Type", "application/json")
				}
				for i := 0; i+1 < len(tc.headers); i += 2 {
					req.Header.Set(tc.headers[i], tc.headers[i+1])
				}
				return req
			}
			rec := httptest.NewRecorder()
			b.e.ServeHTTP(rec, newRequest())
			require.Equal(t, tc.status, rec.Code, rec.Body.String()[:min(rec.Body.Len(), 500)])
			if !tc.valid {
				require.Zero(t, b.svc.callCount(), "bad input reached the service")
			}

			ctx := context.Background()
			req := newRequest()
			route, params, err := router.FindRoute(req)
			if err != nil {
				// Not in the spec: the route errors still have its Error shape.
				require.False(t, tc.valid)
				require.Contains(t, []int{http.StatusNotFound, http.StatusMethodNotAllowed}, rec.Code)
				var body any
				require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
				require.NoError(t, doc.Components.Schemas["Error"].Value.VisitJSON(body))
				return
			}

			reqInput := &openapi3filter.RequestValidationInput{
				Request:    req,
				PathParams: params,
				Route:      route,
				Options:    &openapi3filter.Options{MultiError: true},
			}
			reqErr := openapi3filter.ValidateRequest(ctx, reqInput)
			switch {
			case tc.valid:
				require.NoError(t, reqErr, "a request the server accepts must be valid by the spec")
			case tc.specAllows == "":
				require.Error(t, reqErr, "a request the server rejects must be invalid by the spec")
			default:
				require.NoError(t, reqErr, "the spec was expected to allow this request: %s", tc.specAllows)
			}

			respInput := &openapi3filter.ResponseValidationInput{
				RequestValidationInput: reqInput,
				Status:                 rec.Code,
				Header:                 rec.Header(),
				Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
			}
			respInput.SetBodyBytes(bytes.Clone(rec.Body.Bytes()))
			require.NoError(t, openapi3filter.ValidateResponse(ctx, respInput), "response: %d %v %s",
				rec.Code, rec.Header(), rec.Body.String()[:min(rec.Body.Len(), 500)])
			if rec.Code == http.StatusNoContent {
				require.Zero(t, rec.Body.Len())
			}
		})
	}
}
