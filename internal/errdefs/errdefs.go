// Package errdefs defines the error kinds shared by every layer of agentjail.
//
// Lower layers wrap one of the sentinel kinds (with %w or the constructors
// below); the API maps a kind to an HTTP status in exactly one place
// (internal/api). A kind is tested with errors.Is.
package errdefs

import (
	"errors"
	"fmt"
	"syscall"
)

// The error kinds. Each maps to one HTTP status in the API.
var (
	ErrInvalid        = errors.New("invalid argument") // 400: malformed input, unknown keys
	ErrUnprocessable  = errors.New("unprocessable")    // 422: well-formed but not acceptable (limits, names)
	ErrNotFound       = errors.New("not found")        // 404
	ErrConflict       = errors.New("conflict")         // 409: illegal state transition, name taken
	ErrForbidden      = errors.New("forbidden")        // 403: blocked path, permission
	ErrUnauthorized   = errors.New("unauthorized")     // 401
	ErrTooLarge       = errors.New("too large")        // 413
	ErrNotImplemented = errors.New("not implemented")  // 501: backend lacks the capability
	ErrUnavailable    = errors.New("unavailable")      // 503: dependency missing or busy
	ErrTimeout        = errors.New("timeout")          // 504
	ErrUnresponsive   = errors.New("unresponsive")     // 504: a jail's init does not answer
	ErrNoSpace        = errors.New("no space")         // 507: the data dir's disk is full (so is an error wrapping ENOSPC)
	ErrQuota          = errors.New("quota exceeded")   // 429: a tenant's quota is used up (until something is freed)
)

// kindError carries a message and a kind, and optionally a cause.
type kindError struct {
	kind  error
	msg   string
	cause error
}

func (e *kindError) Error() string {
	if e.cause != nil {
		return e.msg + ": " + e.cause.Error()
	}
	return e.msg
}

func (e *kindError) Unwrap() []error {
	if e.cause != nil {
		return []error{e.kind, e.cause}
	}
	return []error{e.kind}
}

// New returns an error of the given kind with a formatted message.
func New(kind error, format string, args ...any) error {
	return &kindError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// Wrap returns an error of the given kind whose message is msg followed by cause.
func Wrap(kind error, cause error, format string, args ...any) error {
	return &kindError{kind: kind, msg: fmt.Sprintf(format, args...), cause: cause}
}

// Invalidf is New(ErrInvalid, ...).
func Invalidf(format string, args ...any) error { return New(ErrInvalid, format, args...) }

// Unprocessablef is New(ErrUnprocessable, ...).
func Unprocessablef(format string, args ...any) error {
	return New(ErrUnprocessable, format, args...)
}

// NotFoundf is New(ErrNotFound, ...).
func NotFoundf(format string, args ...any) error { return New(ErrNotFound, format, args...) }

// Conflictf is New(ErrConflict, ...).
func Conflictf(format string, args ...any) error { return New(ErrConflict, format, args...) }

// Forbiddenf is New(ErrForbidden, ...).
func Forbiddenf(format string, args ...any) error { return New(ErrForbidden, format, args...) }

// NotImplementedf is New(ErrNotImplemented, ...).
func NotImplementedf(format string, args ...any) error {
	return New(ErrNotImplemented, format, args...)
}

// Unavailablef is New(ErrUnavailable, ...).
func Unavailablef(format string, args ...any) error { return New(ErrUnavailable, format, args...) }

// Code returns the stable machine-readable code of err's kind, as used in the
// API's {"error":{"code":...}} body ("internal" when err has no kind). An
// error without a kind that wraps ENOSPC is of kind ErrNoSpace.
func Code(err error) string {
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			return k.code
		}
	}
	if errors.Is(err, syscall.ENOSPC) {
		return "no_space"
	}
	return "internal"
}

var kinds = []struct {
	err  error
	code string
}{
	{ErrInvalid, "invalid_argument"},
	{ErrUnprocessable, "unprocessable"},
	{ErrNotFound, "not_found"},
	{ErrConflict, "conflict"},
	{ErrForbidden, "forbidden"},
	{ErrUnauthorized, "unauthorized"},
	{ErrTooLarge, "too_large"},
	{ErrNotImplemented, "not_implemented"},
	{ErrUnavailable, "unavailable"},
	{ErrTimeout, "timeout"},
	{ErrUnresponsive, "jail_unresponsive"},
	{ErrNoSpace, "no_space"},
	{ErrQuota, "quota_exceeded"},
}
