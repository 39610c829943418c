package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"syscall"

	"github.com/agentjail/agentjail/internal/errdefs"
)

// ErrorBody is the body of every error response:
// {"error":{"code":"...","message":"..."}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is an error's machine-readable code (errdefs.Code) and its
// human-readable message.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// statusKinds maps each error kind to its HTTP status; the one place
// where kinds meet statuses.
var statusKinds = []struct {
	kind   error
	status int
}{
	{errdefs.ErrInvalid, http.StatusBadRequest},
	{errdefs.ErrUnprocessable, http.StatusUnprocessableEntity},
	{errdefs.ErrNotFound, http.StatusNotFound},
	{errdefs.ErrConflict, http.StatusConflict},
	{errdefs.ErrForbidden, http.StatusForbidden},
	{errdefs.ErrUnauthorized, http.StatusUnauthorized},
	{errdefs.ErrTooLarge, http.StatusRequestEntityTooLarge},
	{errdefs.ErrNotImplemented, http.StatusNotImplemented},
	{errdefs.ErrUnavailable, http.StatusServiceUnavailable},
	{errdefs.ErrTimeout, http.StatusGatewayTimeout},
	{errdefs.ErrUnresponsive, http.StatusGatewayTimeout},
	{errdefs.ErrNoSpace, http.StatusInsufficientStorage},
	{errdefs.ErrQuota, http.StatusTooManyRequests},
}

// HTTPStatus returns the HTTP status of err's kind: 400 ErrInvalid,
// 422 ErrUnprocessable, 404 ErrNotFound, 409 ErrConflict, 403 ErrForbidden,
// 401 ErrUnauthorized, 413 ErrTooLarge, 501 ErrNotImplemented,
// 503 ErrUnavailable, 504 ErrTimeout and ErrUnresponsive, 429 ErrQuota,
// 507 ErrNoSpace (and an error without a kind that wraps ENOSPC: a full
// disk), and 500 for any other error without a kind.
func HTTPStatus(err error) int {
	for _, k := range statusKinds {
		if errors.Is(err, k.kind) {
			return k.status
		}
	}
	if errors.Is(err, syscall.ENOSPC) {
		return http.StatusInsufficientStorage
	}
	return http.StatusInternalServerError
}

// writeError answers a request with err. An error without a kind is logged
// and answered with a generic 500, so internals do not leak. When the
// response has already begun (a stream), the error can only be logged.
func (s *server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	status := HTTPStatus(err)
	msg := err.Error()
	if status == http.StatusInternalServerError {
		s.log.Error("internal error", "method", r.Method, "path", r.URL.EscapedPath(), "err", err)
		msg = "internal error (see the daemon's log)"
	}
	if rec, ok := w.(*recorder); ok && rec.wroteHeader {
		s.log.Warn("error after the response began", "method", r.Method, "path", r.URL.EscapedPath(), "err", err)
		return
	}
	writeErrorBody(w, status, errdefs.Code(err), msg)
}

// errorDetail is err as it appears in a stream's error event.
func (s *server) errorDetail(r *http.Request, err error) ErrorDetail {
	if HTTPStatus(err) == http.StatusInternalServerError {
		s.log.Error("internal error", "method", r.Method, "path", r.URL.EscapedPath(), "err", err)
		return ErrorDetail{Code: errdefs.Code(err), Message: "internal error (see the daemon's log)"}
	}
	return ErrorDetail{Code: errdefs.Code(err), Message: err.Error()}
}

func writeErrorBody(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, ErrorBody{Error: ErrorDetail{Code: code, Message: msg}})
}

// writeJSON writes v as the JSON body of a response with the given status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Every type the API encodes marshals; this is a programming error.
		panic(err)
	}
	b = append(b, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
