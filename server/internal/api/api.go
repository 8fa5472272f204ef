// Package api is dtimer's HTTP API: echo handlers that decode and validate
// requests, call routing.Service, and map its errors to HTTP statuses. The
// contract it serves is /api.yaml at the repository root; spec_test.go keeps
// the two from drifting apart.
//
// Every error response, the router's 404 and 405 included, has one shape:
// {"error": CODE, "message": TEXT, "timestamp": RFC3339}. Bad input is
// rejected here with a 4xx and never reaches the service.
package api

import (
	"errors"
	"fmt"
	"net/http"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/dtimer/dtimer/server/internal/routing"
	"github.com/dtimer/dtimer/server/internal/timer"
)

// Defaults applied by New to zero Options fields.
const (
	DefaultMaxBodyBytes       = 1 << 20
	DefaultCallbackTimeout    = 10 * time.Second
	DefaultMaxCallbackTimeout = 60 * time.Second
)

// routeUnmatched is the metrics route label of requests no route matched.
const routeUnmatched = "unmatched"

// Options configure the API. Service and DefaultRetryPolicy are required;
// other zero fields take the defaults documented on each.
type Options struct {
	Service routing.Service
	// Logger defaults to a no-op logger.
	Logger *zap.Logger
	// Metrics is served at GET /metrics (the caller builds the promhttp
	// handler over its registry). Without it, /metrics is not routed.
	Metrics http.Handler
	// Registerer receives the API's request metrics. Without it they are
	// kept in a private registry nobody scrapes.
	Registerer prometheus.Registerer
	// MaxBodyBytes bounds a request body; larger ones get 413. Default 1 MiB.
	MaxBodyBytes int64
	// DefaultRetryPolicy fills the retryPolicy fields a request leaves out.
	// It must be valid: config checks it before the API is built.
	DefaultRetryPolicy timer.RetryPolicy
	// DefaultCallbackTimeout applies when a create omits
	// callbackTimeoutSeconds. Default 10s.
	DefaultCallbackTimeout time.Duration
	// MaxCallbackTimeout is the largest callbackTimeoutSeconds accepted, in
	// whole seconds. Default 60s.
	MaxCallbackTimeout time.Duration
	// Now is the clock of error timestamps. Default time.Now. Request
	// latencies are measured on the real clock whatever it is.
	Now func() time.Time
}

// server holds what the handlers share.
type server struct {
	svc                    routing.Service
	log                    *zap.Logger
	now                    func() time.Time
	maxBodyBytes           int64
	defaultRetryPolicy     timer.RetryPolicy
	defaultCallbackTimeout time.Duration
	maxCallbackTimeoutSec  int64
	requests               *prometheus.CounterVec
	duration               *prometheus.HistogramVec
}

// New builds the HTTP handler of the API. It panics on options that config
// validation should have rejected (no service, an invalid default retry
// policy, a default callback timeout outside [1s, MaxCallbackTimeout]): those
// are programming errors, not run-time conditions.
func New(opts Options) *echo.Echo {
	s, err := newServer(opts)
	if err != nil {
		panic("api: " + err.Error())
	}

	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	e.HTTPErrorHandler = s.handleError
	e.Use(s.observe)

	e.GET("/health", s.health)
	e.GET("/ready", s.ready)
	if opts.Metrics != nil {
		e.GET("/metrics", echo.WrapHandler(opts.Metrics))
	}
	e.POST("/api/v1/timers/create", s.create)
	e.POST("/api/v1/timers/get", s.get)
	e.POST("/api/v1/timers/update", s.update)
	e.POST("/api/v1/timers/delete", s.delete)
	e.GET("/api/v1/cluster", s.cluster)
	return e
}

func newServer(opts Options) (*server, error) {
	if opts.Service == nil {
		return nil, errors.New("Options.Service is required")
	}
	if err := opts.DefaultRetryPolicy.Validate(); err != nil {
		return nil, fmt.Errorf("Options.DefaultRetryPolicy: %w", err)
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.DefaultCallbackTimeout == 0 {
		opts.DefaultCallbackTimeout = DefaultCallbackTimeout
	}
	if opts.MaxCallbackTimeout == 0 {
		opts.MaxCallbackTimeout = DefaultMaxCallbackTimeout
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxCallbackTimeout < time.Second {
		return nil, fmt.Errorf("Options.MaxCallbackTimeout must be at least 1s, got %s", opts.MaxCallbackTimeout)
	}
	if opts.DefaultCallbackTimeout < time.Second || opts.DefaultCallbackTimeout > opts.MaxCallbackTimeout {
		return nil, fmt.Errorf("Options.DefaultCallbackTimeout must be between 1s and %s, got %s",
			opts.MaxCallbackTimeout, opts.DefaultCallbackTimeout)
	}

	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dtimer_api_requests_total",
		Help: "HTTP API requests by route and response status code.",
	}, []string{"route", "code"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "dtimer_api_request_duration_seconds",
		Help:    "HTTP API request latency by route.",
		Buckets: prometheus.DefBuckets,
	}, []string{"route"})
	requests, err := register(opts.Registerer, requests)
	if err != nil {
		return nil, err
	}
	duration, err = register(opts.Registerer, duration)
	if err != nil {
		return nil, err
	}

	return &server{
		svc:                    opts.Service,
		log:                    opts.Logger,
		now:                    opts.Now,
		maxBodyBytes:           opts.MaxBodyBytes,
		defaultRetryPolicy:     opts.DefaultRetryPolicy,
		defaultCallbackTimeout: opts.DefaultCallbackTimeout,
		maxCallbackTimeoutSec:  int64(opts.MaxCallbackTimeout / time.Second),
		requests:               requests,
		duration:               duration,
	}, nil
}

// register registers c, or returns the collector already registered under
// the same description, so that building the API twice on one registry (a
// restart of the HTTP server within the process, tests) keeps counting.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, fmt.Errorf("registering API metrics: %w", err)
}

// observe is the outermost middleware: it turns panics and handler errors
// into responses (so that the status it records is the one sent), then
// records the request's metrics and logs it.
func (s *server) observe(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					if r == http.ErrAbortHandler {
						panic(r) // net/http's way to abort a response: not ours to catch
					}
					err = fmt.Errorf("panic in handler: %v\n%s", r, debug.Stack())
				}
			}()
			return next(c)
		}()
		if err != nil {
			c.Error(err)
		}

		route := c.Path()
		if errors.Is(err, echo.ErrNotFound) || route == "" {
			// The router reports the nearest node's path for unmatched
			// requests; one label keeps the metric's cardinality bounded.
			route = routeUnmatched
		}
		status := c.Response().Status
		elapsed := time.Since(start)
		s.requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
		s.duration.WithLabelValues(route).Observe(elapsed.Seconds())
		if ce := s.log.Check(zap.DebugLevel, "http request"); ce != nil {
			ce.Write(
				zap.String("method", c.Request().Method),
				zap.String("path", c.Request().URL.Path),
				zap.String("route", route),
				zap.Int("status", status),
				zap.Duration("duration", elapsed),
			)
		}
		return nil
	}
}
