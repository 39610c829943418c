package e2b

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	"github.com/agentjail/agentjail/internal/errdefs"
)

// rpcCodes maps error kinds to the Connect codes the SDK turns into its
// own errors (not_found → NotFoundError or FileNotFoundError,
// invalid_argument → InvalidArgumentError, unauthenticated →
// AuthenticationError, resource_exhausted → RateLimitError...).
var rpcCodes = []struct {
	kind error
	code connect.Code
}{
	{errdefs.ErrInvalid, connect.CodeInvalidArgument},
	{errdefs.ErrUnprocessable, connect.CodeInvalidArgument},
	{errdefs.ErrNotFound, connect.CodeNotFound},
	{errdefs.ErrConflict, connect.CodeFailedPrecondition},
	{errdefs.ErrForbidden, connect.CodePermissionDenied},
	{errdefs.ErrUnauthorized, connect.CodeUnauthenticated},
	{errdefs.ErrTooLarge, connect.CodeResourceExhausted},
	{errdefs.ErrNotImplemented, connect.CodeUnimplemented},
	{errdefs.ErrUnavailable, connect.CodeUnavailable},
	{errdefs.ErrTimeout, connect.CodeDeadlineExceeded},
}

// rpcError converts err for a sandbox-plane RPC answer. Errors without a
// kind are internal: their text stays in the daemon's log.
func (s *Service) rpcError(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	switch {
	case errors.Is(err, errSandboxGone):
		return connect.NewError(connect.CodeUnavailable, errSandboxGone)
	case errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	case errors.Is(err, context.Canceled):
		return connect.NewError(connect.CodeCanceled, err)
	}
	for _, k := range rpcCodes {
		if errors.Is(err, k.kind) {
			return connect.NewError(k.code, err)
		}
	}
	s.log.Error("e2b: internal error", "err", err)
	return connect.NewError(connect.CodeInternal, errors.New("internal error (see the daemon's log)"))
}
