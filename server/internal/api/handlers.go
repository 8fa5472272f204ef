package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/dtimer/dtimer/server/internal/routing"
	"github.com/dtimer/dtimer/server/internal/timer"
)

// timeLayout is how every time leaves the API: UTC, milliseconds.
const timeLayout = "2006-01-02T15:04:05.000Z"

func formatTime(t time.Time) string { return t.UTC().Format(timeLayout) }

// timerResponse is a timer as the API shows it.
type timerResponse struct {
	Namespace   string          `json:"namespace"`
	ID          string          `json:"id"`
	ExecuteAt   string          `json:"executeAt"`
	CallbackURL string          `json:"callbackUrl"`
	Payload     json.RawMessage `json:"payload"`
	// RetryPolicy marshals its durations as Go duration strings.
	RetryPolicy            timer.RetryPolicy `json:"retryPolicy"`
	CallbackTimeoutSeconds int64             `json:"callbackTimeoutSeconds"`
	CreatedAt              string            `json:"createdAt"`
	UpdatedAt              string            `json:"updatedAt"`
	Attempts               int               `json:"attempts"`
	Status                 timer.Status      `json:"status"`
	LastError              string            `json:"lastError,omitempty"`
}

func newTimerResponse(t *timer.Timer) timerResponse {
	payload := t.Payload
	if len(payload) == 0 {
		payload = nil // marshals as null
	}
	return timerResponse{
		Namespace:   t.Namespace,
		ID:          t.ID,
		ExecuteAt:   formatTime(t.ExecuteAt),
		CallbackURL: t.CallbackURL,
		Payload:     payload,
		RetryPolicy: t.RetryPolicy,
		// Round up: the API accepts whole seconds only, so a sub-second
		// remainder can only come from elsewhere and must not show as less.
		CallbackTimeoutSeconds: int64((t.CallbackTimeout + time.Second - 1) / time.Second),
		CreatedAt:              formatTime(t.CreatedAt),
		UpdatedAt:              formatTime(t.UpdatedAt),
		Attempts:               t.Attempts,
		Status:                 t.Status,
		LastError:              t.LastError,
	}
}

func (s *server) create(c echo.Context) error {
	var req createRequest
	if err := s.decodeBody(c, &req); err != nil {
		return err
	}
	t, err := s.toTimer(&req)
	if err != nil {
		return err
	}
	got, err := s.svc.Create(s.context(c), t)
	if err != nil {
		return s.fail(c, err, t.Key())
	}
	return c.JSON(http.StatusOK, newTimerResponse(got))
}

func (s *server) get(c echo.Context) error {
	var req keyRequest
	if err := s.decodeBody(c, &req); err != nil {
		return err
	}
	key, err := toKey(req)
	if err != nil {
		return err
	}
	got, err := s.svc.Get(s.context(c), key)
	if err != nil {
		return serviceError(err, key)
	}
	return c.JSON(http.StatusOK, newTimerResponse(got))
}

func (s *server) update(c echo.Context) error {
	var req updateRequest
	if err := s.decodeBody(c, &req); err != nil {
		return err
	}
	key, patch, err := s.toPatch(&req)
	if err != nil {
		return err
	}
	got, err := s.svc.Update(s.context(c), key, patch)
	if err != nil {
		return s.fail(c, err, key)
	}
	return c.JSON(http.StatusOK, newTimerResponse(got))
}

func (s *server) delete(c echo.Context) error {
	var req keyRequest
	if err := s.decodeBody(c, &req); err != nil {
		return err
	}
	key, err := toKey(req)
	if err != nil {
		return err
	}
	if err := s.svc.Delete(s.context(c), key); err != nil {
		return s.fail(c, err, key)
	}
	return c.NoContent(http.StatusNoContent)
}

// statusResponse is the body of /health and /ready.
type statusResponse struct {
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
}

// health answers whenever the process serves HTTP: a liveness probe.
func (s *server) health(c echo.Context) error {
	return c.JSON(http.StatusOK, statusResponse{Status: "ok"})
}

// ready answers 200 when the node can serve timers (the store answers and
// its shards are owned), else 503: a readiness probe.
func (s *server) ready(c echo.Context) error {
	if err := s.svc.Ready(c.Request().Context()); err != nil {
		return c.JSON(http.StatusServiceUnavailable, statusResponse{Status: "not ready", Reason: err.Error()})
	}
	return c.JSON(http.StatusOK, statusResponse{Status: "ready"})
}

// rawBodyKey holds the request body as received, in the echo context.
const rawBodyKey = "dtimer.rawBody"

// context is the request's context, marked when another node forwarded the
// call, so that it is served here or refused but never forwarded again.
func (s *server) context(c echo.Context) context.Context {
	ctx := c.Request().Context()
	if c.Request().Header.Get(routing.ForwardedHeader) != "" {
		ctx = routing.WithForwarded(ctx)
	}
	return ctx
}

// fail answers a service error; a shard owned by another node gets the
// call forwarded there, and that node's answer relayed unchanged.
func (s *server) fail(c echo.Context, err error, key timer.Key) error {
	var nle *routing.NotLocalError
	if !errors.As(err, &nle) {
		return serviceError(err, key)
	}
	body, _ := c.Get(rawBodyKey).([]byte)
	r, err := s.svc.Forward(c.Request().Context(), nle, c.Request().URL.Path, body)
	if err != nil {
		s.log.Debug("forwarding failed", zap.String("owner", nle.Node), zap.Error(err))
		return serviceError(err, key)
	}
	h := c.Response().Header()
	for _, name := range []string{echo.HeaderContentType, echo.HeaderRetryAfter} {
		if v := r.Header.Get(name); v != "" {
			h.Set(name, v)
		}
	}
	c.Response().WriteHeader(r.Status)
	_, err = c.Response().Write(r.Body)
	return err
}

// clusterResponse is GET /api/v1/cluster.
type clusterResponse struct {
	Node       string              `json:"node"`
	Members    []memberResponse    `json:"members"`
	Namespaces []namespaceResponse `json:"namespaces"`
}

type memberResponse struct {
	Name            string `json:"name"`
	GossipAddress   string `json:"gossipAddress"`
	HTTPAddress     string `json:"httpAddress"`
	State           string `json:"state"`
	Draining        bool   `json:"draining"`
	ProtocolVersion int    `json:"protocolVersion"`
}

type namespaceResponse struct {
	Name      string          `json:"name"`
	NumShards int             `json:"numShards"`
	Shards    []shardResponse `json:"shards"`
}

type shardResponse struct {
	Shard      int    `json:"shard"`
	Owner      string `json:"owner"`
	Version    int64  `json:"version"`
	ClaimedAt  string `json:"claimedAt,omitempty"`
	AssignedTo string `json:"assignedTo"`
}

func (s *server) cluster(c echo.Context) error {
	v, err := s.svc.Cluster(c.Request().Context())
	if err != nil {
		return err
	}
	out := clusterResponse{Node: v.Node, Members: []memberResponse{}, Namespaces: []namespaceResponse{}}
	for _, m := range v.Members {
		out.Members = append(out.Members, memberResponse{
			Name: m.Name, GossipAddress: m.GossipAddress, HTTPAddress: m.HTTPAddress,
			State: string(m.State), Draining: m.Draining, ProtocolVersion: m.Protocol,
		})
	}
	for _, ns := range v.Namespaces {
		nr := namespaceResponse{Name: ns.Name, NumShards: ns.NumShards, Shards: make([]shardResponse, 0, len(ns.Shards))}
		for _, sh := range ns.Shards {
			sr := shardResponse{Shard: sh.Shard, Owner: sh.Owner, Version: sh.Version, AssignedTo: sh.AssignedTo}
			if !sh.ClaimedAt.IsZero() {
				sr.ClaimedAt = formatTime(sh.ClaimedAt)
			}
			nr.Shards = append(nr.Shards, sr)
		}
		out.Namespaces = append(out.Namespaces, nr)
	}
	return c.JSON(http.StatusOK, out)
}
