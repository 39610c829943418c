package api

import (
	"fmt"
	"net/http"
	"os"
	"syscall"
	"testing"

	"github.com/agentjail/agentjail/internal/errdefs"
)

// TestFullDiskIs507: an error that comes from a full disk (it wraps
// ENOSPC) is 507 no_space, unless a kind of its own says otherwise.
func TestFullDiskIs507(t *testing.T) {
	full := fmt.Errorf("snapshot s1: %w", &os.PathError{Op: "write", Path: "/data/x", Err: syscall.ENOSPC})
	if got, code := HTTPStatus(full), errdefs.Code(full); got != http.StatusInsufficientStorage || code != "no_space" {
		t.Errorf("a full disk: %d %s, want 507 no_space", got, code)
	}
	kinded := errdefs.Wrap(errdefs.ErrConflict, full, "busy")
	if got := HTTPStatus(kinded); got != http.StatusConflict {
		t.Errorf("a conflict wrapping ENOSPC: %d, want 409", got)
	}
	if got := HTTPStatus(fmt.Errorf("x: %w", syscall.EIO)); got != http.StatusInternalServerError {
		t.Errorf("another errno: %d, want 500", got)
	}
}
