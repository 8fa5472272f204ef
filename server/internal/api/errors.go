package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"
	"go.uber.org/zap"

	"github.com/dtimer/dtimer/server/internal/routing"
	"github.com/dtimer/dtimer/server/internal/store"
	"github.com/dtimer/dtimer/server/internal/timer"
)

// Error codes of the error body; api.yaml's Error.error enum lists the same.
const (
	CodeInvalidInput         = "INVALID_INPUT"
	CodeNamespaceNotFound    = "NAMESPACE_NOT_FOUND"
	CodeTimerNotFound        = "TIMER_NOT_FOUND"
	CodePayloadTooLarge      = "PAYLOAD_TOO_LARGE"
	CodeUnsupportedMediaType = "UNSUPPORTED_MEDIA_TYPE"
	CodeShardUnavailable     = "SHARD_UNAVAILABLE"
	CodeMethodNotAllowed     = "METHOD_NOT_ALLOWED"
	CodeNotFound             = "NOT_FOUND"
	CodeInternal             = "INTERNAL"
)

// apiError is an error with the response it becomes. Handlers return it;
// handleError writes it.
type apiError struct {
	status  int
	code    string
	message string
	// retryAfter, when set, is sent as the Retry-After header (seconds).
	retryAfter string
}

func (e *apiError) Error() string { return e.code + ": " + e.message }

// errorBody is the JSON body of every error response.
type errorBody struct {
	Error     string `json:"error"`
	Message   string `json:"message"`
	Timestamp string `json:"timestamp"`
}

func invalidInput(format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, code: CodeInvalidInput, message: fmt.Sprintf(format, args...)}
}

// serviceError maps an error of routing.Service for the timer key to the
// response the client gets. Unknown errors stay as they are and become 500.
func serviceError(err error, key timer.Key) error {
	switch {
	case errors.Is(err, store.ErrTimerNotFound):
		return &apiError{
			status:  http.StatusNotFound,
			code:    CodeTimerNotFound,
			message: fmt.Sprintf("timer %q not found in namespace %q", key.ID, key.Namespace),
		}
	case errors.Is(err, store.ErrTimerTooLarge):
		return &apiError{
			status:  http.StatusRequestEntityTooLarge,
			code:    CodePayloadTooLarge,
			message: fmt.Sprintf("timer %q does not fit in one row of the store: %v", key.ID, err),
		}
	case errors.Is(err, routing.ErrNamespaceNotFound):
		return &apiError{
			status:  http.StatusBadRequest,
			code:    CodeNamespaceNotFound,
			message: fmt.Sprintf("namespace %q is not configured", key.Namespace),
		}
	case errors.Is(err, routing.ErrShardUnavailable):
		return &apiError{
			status:     http.StatusServiceUnavailable,
			code:       CodeShardUnavailable,
			message:    fmt.Sprintf("the shard of timer %q in namespace %q is unavailable; retry later", key.ID, key.Namespace),
			retryAfter: "1",
		}
	}
	return err
}

// handleError is echo's HTTPErrorHandler: it writes every error, the
// router's and the middleware's included, in the one error shape.
func (s *server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		s.log.Error("error after the response was committed", zap.Error(err),
			zap.String("path", c.Request().URL.Path))
		return
	}
	ae := s.toAPIError(err, c)
	if ae.retryAfter != "" {
		c.Response().Header().Set("Retry-After", ae.retryAfter)
	}
	body := errorBody{Error: ae.code, Message: ae.message, Timestamp: formatTime(s.now())}
	if c.Request().Method == http.MethodHead {
		err = c.NoContent(ae.status)
	} else {
		err = c.JSON(ae.status, body)
	}
	if err != nil {
		s.log.Debug("writing error response", zap.Error(err))
	}
}

// toAPIError classifies err; it logs the errors that become a 500.
func (s *server) toAPIError(err error, c echo.Context) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		switch he.Code {
		case http.StatusNotFound:
			return &apiError{status: he.Code, code: CodeNotFound,
				message: fmt.Sprintf("no route for %s %s", c.Request().Method, c.Request().URL.Path)}
		case http.StatusMethodNotAllowed:
			return &apiError{status: he.Code, code: CodeMethodNotAllowed,
				message: fmt.Sprintf("method %s is not allowed on %s", c.Request().Method, c.Request().URL.Path)}
		case http.StatusRequestEntityTooLarge:
			return s.payloadTooLarge()
		case http.StatusUnsupportedMediaType:
			return &apiError{status: he.Code, code: CodeUnsupportedMediaType, message: fmt.Sprint(he.Message)}
		}
		if he.Code >= 400 && he.Code < 500 {
			return &apiError{status: http.StatusBadRequest, code: CodeInvalidInput, message: fmt.Sprint(he.Message)}
		}
	}

	fields := []zap.Field{
		zap.Error(err),
		zap.String("method", c.Request().Method),
		zap.String("path", c.Request().URL.Path),
	}
	if errors.Is(c.Request().Context().Err(), context.Canceled) {
		// The client went away; nobody reads this response.
		s.log.Debug("request canceled by the client", fields...)
	} else {
		s.log.Error("internal error", fields...)
	}
	return &apiError{status: http.StatusInternalServerError, code: CodeInternal, message: "internal server error"}
}

func (s *server) payloadTooLarge() *apiError {
	return &apiError{
		status:  http.StatusRequestEntityTooLarge,
		code:    CodePayloadTooLarge,
		message: fmt.Sprintf("request body must be at most %d bytes", s.maxBodyBytes),
	}
}
