package backend

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestStaticBinary: a dynamically linked executable (one with an ELF
// interpreter) is named as such with the way to build a static one.
func TestStaticBinary(t *testing.T) {
	err := StaticBinary("/bin/true")
	if err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Errorf("StaticBinary(/bin/true), a dynamic binary: %v, want a refusal naming CGO_ENABLED=0", err)
	}
	if err := StaticBinary(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("StaticBinary of a missing file succeeded")
	}
}
