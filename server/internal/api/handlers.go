package api

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

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
	got, err := s.svc.Create(c.Request().Context(), t)
	if err != nil {
		return serviceError(err, t.Key())
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
	got, err := s.svc.Get(c.Request().Context(), key)
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
	got, err := s.svc.Update(c.Request().Context(), key, patch)
	if err != nil {
		return serviceError(err, key)
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
	if err := s.svc.Delete(c.Request().Context(), key); err != nil {
		return serviceError(err, key)
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
