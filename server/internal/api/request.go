package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/dtimer/dtimer/server/internal/timer"
)

// Limits of the request fields; api.yaml states the same.
const (
	maxKeyBytes         = 255
	maxCallbackURLBytes = 2048
	minYear, maxYear    = 1970, 9999
)

// optional is a request field that tells absent from null from a value:
// only payload may be null, and an update changes only the fields present.
type optional[T any] struct {
	set   bool
	null  bool
	value T
}

// UnmarshalJSON is called for every field present, null included. Type
// errors it returns get their field name from the enclosing decoder.
func (o *optional[T]) UnmarshalJSON(b []byte) error {
	o.set = true
	if string(b) == "null" {
		o.null = true
		return nil
	}
	// Most fields are strings without escapes; those need no second
	// decoder (this runs several times per request).
	if p, ok := any(&o.value).(*string); ok && isPlainString(b) {
		*p = string(b[1 : len(b)-1])
		return nil
	}
	return json.Unmarshal(b, &o.value)
}

// isPlainString reports whether b is a JSON string that means exactly the
// bytes between its quotes: no escapes, no control characters, valid UTF-8
// (encoding/json would replace invalid bytes).
func isPlainString(b []byte) bool {
	if len(b) < 2 || b[0] != '"' || b[len(b)-1] != '"' {
		return false
	}
	s := b[1 : len(b)-1]
	for _, c := range s {
		if c < 0x20 || c == '"' || c == '\\' {
			return false
		}
	}
	return utf8.Valid(s)
}

// createRequest is the body of POST /api/v1/timers/create.
type createRequest struct {
	Namespace optional[string] `json:"namespace"`
	ID        optional[string] `json:"id"`
	timerFields
}

// updateRequest is the body of POST /api/v1/timers/update.
type updateRequest struct {
	keyRequest
	timerFields
}

// timerFields are the timer's settable fields: all required on create
// except payload, retryPolicy and callbackTimeoutSeconds; all optional on
// update.
type timerFields struct {
	ExecuteAt              optional[string]           `json:"executeAt"`
	CallbackURL            optional[string]           `json:"callbackUrl"`
	Payload                json.RawMessage            `json:"payload"`
	RetryPolicy            optional[retryPolicyInput] `json:"retryPolicy"`
	CallbackTimeoutSeconds optional[int64]            `json:"callbackTimeoutSeconds"`
}

// keyRequest is the body of get and delete.
type keyRequest struct {
	Namespace optional[string] `json:"namespace"`
	TimerID   optional[string] `json:"timerId"`
}

// retryPolicyInput is a possibly partial retry policy: absent fields take
// the server's default.
type retryPolicyInput struct {
	MaxAttempts         optional[int]     `json:"maxAttempts"`
	MaxAttemptsDuration optional[string]  `json:"maxAttemptsDuration"`
	InitialInterval     optional[string]  `json:"initialInterval"`
	BackoffMultiplier   optional[float64] `json:"backoffMultiplier"`
	MaxInterval         optional[string]  `json:"maxInterval"`
}

// UnmarshalJSON checks the field names itself, so that an error names them
// as retryPolicy.NAME.
func (p *retryPolicyInput) UnmarshalJSON(b []byte) error {
	type plain retryPolicyInput // without this method
	if err := checkFieldNames(b, reflect.TypeFor[plain](), "retryPolicy."); err != nil {
		return err
	}
	return json.Unmarshal(b, (*plain)(p))
}

// checkFieldNames rejects the names in the JSON object b that are not
// exactly a json name of struct t, and names given twice: encoding/json
// alone matches names case-insensitively and keeps the last of duplicates,
// which would accept bodies api.yaml rejects. A b that is not a valid JSON
// object is left to the decoder to report.
//
// It runs on every request, so it scans the bytes itself instead of going
// through encoding/json's tokenizer, which cost more than decoding the body.
func checkFieldNames(b []byte, t reflect.Type, prefix string) error {
	if !json.Valid(b) {
		return nil
	}
	names := jsonNames(t)
	i := skipSpace(b, 0)
	if i == len(b) || b[i] != '{' {
		return nil
	}
	var seen [][]byte
	for i = skipSpace(b, i+1); i < len(b) && b[i] == '"'; {
		end := stringEnd(b, i)
		name := b[i+1 : end-1]
		if bytes.IndexByte(name, '\\') >= 0 {
			var s string
			if err := json.Unmarshal(b[i:end], &s); err != nil {
				return nil
			}
			name = []byte(s)
		}
		if !names[string(name)] {
			return &fieldNameError{problem: "unknown field", field: prefix + string(name)}
		}
		if slices.ContainsFunc(seen, func(n []byte) bool { return bytes.Equal(n, name) }) {
			return &fieldNameError{problem: "duplicate field", field: prefix + string(name)}
		}
		seen = append(seen, name)
		i = skipSpace(b, skipValue(b, skipSpace(b, end)+1)) // past the ':' and the value
		if i < len(b) && b[i] == ',' {
			i = skipSpace(b, i+1)
		}
	}
	return nil
}

// The scanning helpers below assume valid JSON (checkFieldNames checks it
// first): they never have to report an error.

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index after the string that starts at b[i] ('"').
func stringEnd(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// skipValue returns the index after the value that starts at or after i.
func skipValue(b []byte, i int) int {
	i = skipSpace(b, i)
	if i == len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = stringEnd(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
		i++
	}
	return i
}

// fieldNames caches jsonNames by struct type.
var fieldNames sync.Map // reflect.Type -> map[string]bool

// jsonNames returns the json names of struct t's fields, its embedded
// structs' included.
func jsonNames(t reflect.Type) map[string]bool {
	if v, ok := fieldNames.Load(t); ok {
		return v.(map[string]bool)
	}
	names := map[string]bool{}
	var add func(t reflect.Type)
	add = func(t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			if f.Anonymous && f.Type.Kind() == reflect.Struct {
				add(f.Type)
				continue
			}
			if tag, _, _ := strings.Cut(f.Tag.Get("json"), ","); tag != "" && tag != "-" {
				names[tag] = true
			}
		}
	}
	add(t)
	fieldNames.Store(t, names)
	return names
}

// fieldNameError names a field the request may not have, with its path.
type fieldNameError struct{ problem, field string }

func (e *fieldNameError) Error() string { return fmt.Sprintf("%s %q", e.problem, e.field) }

// decodeBody reads the request body, at most maxBodyBytes of it, and
// decodes it as one JSON object into dst, rejecting unknown fields.
func (s *server) decodeBody(c echo.Context, dst any) error {
	r := c.Request()
	if ct := r.Header.Get(echo.HeaderContentType); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != echo.MIMEApplicationJSON {
			return &apiError{
				status:  http.StatusUnsupportedMediaType,
				code:    CodeUnsupportedMediaType,
				message: fmt.Sprintf("Content-Type must be application/json, got %q", ct),
			}
		}
	}
	if r.ContentLength > s.maxBodyBytes {
		return s.payloadTooLarge()
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, s.maxBodyBytes+1))
	if err != nil {
		return invalidInput("reading the request body: %v", err)
	}
	if int64(len(body)) > s.maxBodyBytes {
		return s.payloadTooLarge()
	}
	c.Set(rawBodyKey, body) // forwarded as is if another node owns the shard

	// Names first: a misspelt name must not surface as a type error of the
	// field it was matched to case-insensitively.
	if err := checkFieldNames(body, reflect.TypeOf(dst).Elem(), ""); err != nil {
		return decodeError(err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields() // already checked; kept as a second guard
	if err := dec.Decode(dst); err != nil {
		return decodeError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return invalidInput("request body must hold a single JSON object, but there is more data after it")
	}
	return nil
}

// decodeError explains a decoding error, naming the field at fault.
func decodeError(err error) error {
	var (
		syntaxErr *json.SyntaxError
		typeErr   *json.UnmarshalTypeError
		nameErr   *fieldNameError
	)
	switch {
	case errors.Is(err, io.EOF):
		return invalidInput("request body is empty; it must be a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return invalidInput("request body is not valid JSON: it ends unexpectedly")
	case errors.As(err, &syntaxErr):
		return invalidInput("request body is not valid JSON: %v (at byte %d)", syntaxErr, syntaxErr.Offset)
	case errors.As(err, &typeErr):
		if typeErr.Field == "" {
			return invalidInput("request body must be a JSON object, got %s", typeErr.Value)
		}
		// Field is the Go path, which names embedded structs too
		// ("timerFields.executeAt"); the client knows only the JSON one.
		field := strings.TrimPrefix(typeErr.Field, "timerFields.")
		return invalidInput("%s must be %s, got %s", field, describeType(typeErr.Type), typeErr.Value)
	case errors.As(err, &nameErr):
		return invalidInput("%s", nameErr.Error())
	}
	return invalidInput("request body is not valid: %v", err)
}

// describeType names a Go type the way the API documents it.
func describeType(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return "of type " + t.String()
}

// requireKey validates a namespace or timer id: present, non-empty, at
// most 255 bytes and free of control characters.
func requireKey(name string, f optional[string]) (string, error) {
	v, err := requireString(name, f)
	if err != nil {
		return "", err
	}
	if len(v) > maxKeyBytes {
		return "", invalidInput("%s must be at most %d bytes, got %d", name, maxKeyBytes, len(v))
	}
	if strings.IndexFunc(v, unicode.IsControl) >= 0 {
		return "", invalidInput("%s must not contain control characters", name)
	}
	return v, nil
}

func requireString(name string, f optional[string]) (string, error) {
	switch {
	case !f.set:
		return "", invalidInput("%s is required", name)
	case f.null:
		return "", invalidInput("%s must not be null", name)
	case f.value == "":
		return "", invalidInput("%s must not be empty", name)
	}
	return f.value, nil
}

// parseExecuteAt parses an RFC 3339 time with any offset and normalises it
// to UTC milliseconds, rounding up. A time in the past is valid: the timer
// fires as soon as possible.
func parseExecuteAt(f optional[string]) (time.Time, error) {
	const name = "executeAt"
	s, err := requireString(name, f)
	if err != nil {
		return time.Time{}, err
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, invalidInput("%s must be an RFC 3339 date-time such as \"2026-01-02T03:04:05Z\", got %q", name, s)
	}
	t = timer.TruncateTime(t)
	if t.Year() < minYear || t.Year() > maxYear {
		return time.Time{}, invalidInput("%s must be in the years %d to %d (UTC), got %q", name, minYear, maxYear, s)
	}
	return t, nil
}

func parseCallbackURL(f optional[string]) (string, error) {
	const name = "callbackUrl"
	s, err := requireString(name, f)
	if err != nil {
		return "", err
	}
	if len(s) > maxCallbackURLBytes {
		return "", invalidInput("%s must be at most %d bytes, got %d", name, maxCallbackURLBytes, len(s))
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Opaque != "" || u.Hostname() == "" {
		return "", invalidInput("%s must be an absolute http or https URL with a host, got %q", name, s)
	}
	return s, nil
}

func (s *server) parseCallbackTimeout(f optional[int64]) (time.Duration, error) {
	const name = "callbackTimeoutSeconds"
	if f.null {
		return 0, invalidInput("%s must not be null", name)
	}
	if f.value < 1 || f.value > s.maxCallbackTimeoutSec {
		return 0, invalidInput("%s must be an integer between 1 and %d, got %d", name, s.maxCallbackTimeoutSec, f.value)
	}
	return time.Duration(f.value) * time.Second, nil
}

// parsePayload returns the payload in compact form; nil when absent.
func parsePayload(raw json.RawMessage) (json.RawMessage, error) {
	if raw == nil {
		return nil, nil
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		// The body parsed, so this cannot happen; say so if it does.
		return nil, invalidInput("payload is not valid JSON: %v", err)
	}
	return json.RawMessage(b.Bytes()), nil
}

// parseRetryPolicy fills the fields f leaves out from the server default and
// validates the result.
func (s *server) parseRetryPolicy(f optional[retryPolicyInput]) (timer.RetryPolicy, error) {
	p := s.defaultRetryPolicy
	if !f.set {
		return p, nil
	}
	if f.null {
		return p, invalidInput("retryPolicy must not be null")
	}
	in := f.value
	if in.MaxAttempts.set {
		if in.MaxAttempts.null {
			return p, invalidInput("retryPolicy.maxAttempts must not be null")
		}
		p.MaxAttempts = in.MaxAttempts.value
	}
	if in.BackoffMultiplier.set {
		if in.BackoffMultiplier.null {
			return p, invalidInput("retryPolicy.backoffMultiplier must not be null")
		}
		p.BackoffMultiplier = in.BackoffMultiplier.value
	}
	for _, d := range []struct {
		name string
		in   optional[string]
		out  *time.Duration
	}{
		{"maxAttemptsDuration", in.MaxAttemptsDuration, &p.MaxAttemptsDuration},
		{"initialInterval", in.InitialInterval, &p.InitialInterval},
		{"maxInterval", in.MaxInterval, &p.MaxInterval},
	} {
		if !d.in.set {
			continue
		}
		if d.in.null {
			return p, invalidInput("retryPolicy.%s must not be null", d.name)
		}
		v, err := time.ParseDuration(d.in.value)
		if err != nil {
			return p, invalidInput("retryPolicy.%s must be a duration such as \"1s\", \"1m30s\" or \"24h\", got %q", d.name, d.in.value)
		}
		*d.out = v
	}
	if err := p.Validate(); err != nil {
		return p, invalidInput("%v", err)
	}
	return p, nil
}

// toTimer validates a create request and builds the timer to store; the
// service fills the rest (shard, UUID, times, status).
func (s *server) toTimer(req *createRequest) (*timer.Timer, error) {
	ns, err := requireKey("namespace", req.Namespace)
	if err != nil {
		return nil, err
	}
	id, err := requireKey("id", req.ID)
	if err != nil {
		return nil, err
	}
	executeAt, err := parseExecuteAt(req.ExecuteAt)
	if err != nil {
		return nil, err
	}
	callbackURL, err := parseCallbackURL(req.CallbackURL)
	if err != nil {
		return nil, err
	}
	payload, err := parsePayload(req.Payload)
	if err != nil {
		return nil, err
	}
	policy, err := s.parseRetryPolicy(req.RetryPolicy)
	if err != nil {
		return nil, err
	}
	callbackTimeout := s.defaultCallbackTimeout
	if req.CallbackTimeoutSeconds.set {
		if callbackTimeout, err = s.parseCallbackTimeout(req.CallbackTimeoutSeconds); err != nil {
			return nil, err
		}
	}
	return &timer.Timer{
		Namespace:       ns,
		ID:              id,
		ExecuteAt:       executeAt,
		CallbackURL:     callbackURL,
		Payload:         payload,
		RetryPolicy:     policy,
		CallbackTimeout: callbackTimeout,
	}, nil
}

// toKey validates the key of a get, update or delete request.
func toKey(req keyRequest) (timer.Key, error) {
	ns, err := requireKey("namespace", req.Namespace)
	if err != nil {
		return timer.Key{}, err
	}
	id, err := requireKey("timerId", req.TimerID)
	if err != nil {
		return timer.Key{}, err
	}
	return timer.Key{Namespace: ns, ID: id}, nil
}

// toPatch validates an update request and builds its patch: fields that are
// absent keep their value; a present payload null sets the payload to JSON
// null.
func (s *server) toPatch(req *updateRequest) (timer.Key, timer.Patch, error) {
	var patch timer.Patch
	key, err := toKey(req.keyRequest)
	if err != nil {
		return key, patch, err
	}
	if req.ExecuteAt.set {
		t, err := parseExecuteAt(req.ExecuteAt)
		if err != nil {
			return key, patch, err
		}
		patch.ExecuteAt = &t
	}
	if req.CallbackURL.set {
		u, err := parseCallbackURL(req.CallbackURL)
		if err != nil {
			return key, patch, err
		}
		patch.CallbackURL = &u
	}
	if req.Payload != nil {
		p, err := parsePayload(req.Payload)
		if err != nil {
			return key, patch, err
		}
		patch.Payload = &p
	}
	if req.RetryPolicy.set {
		p, err := s.parseRetryPolicy(req.RetryPolicy)
		if err != nil {
			return key, patch, err
		}
		patch.RetryPolicy = &p
	}
	if req.CallbackTimeoutSeconds.set {
		d, err := s.parseCallbackTimeout(req.CallbackTimeoutSeconds)
		if err != nil {
			return key, patch, err
		}
		patch.CallbackTimeout = &d
	}
	if patch == (timer.Patch{}) {
		return key, patch, invalidInput("update must change at least one of executeAt, callbackUrl, payload, retryPolicy, callbackTimeoutSeconds")
	}
	return key, patch, nil
}
