package container

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentjail/agentjail/internal/backend"
	"github.com/agentjail/agentjail/internal/errdefs"
)

// TestMoveCheckpoint: a process checkpoint requires the digest of the init
// binary it ran; a host whose init binary has that digest (at whatever
// path) adopts it, its record then naming this host's binary; another
// build is refused with a conflict naming both; a filesystem checkpoint
// requires nothing.
func TestMoveCheckpoint(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	theirs := write("their-init", "build 1")
	snap := filepath.Join(dir, "snap")
	if err := os.Mkdir(snap, 0o700); err != nil {
		t.Fatal(err)
	}
	write("snap/"+checkpointRec, `{"init_binary":"`+theirs+`","runtime":"runc","criu":"/usr/local/sbin/criu"}`)
	src := &Backend{opts: Options{Host: backend.Host{InitBinary: theirs}}}
	req, err := src.Requirements(snap)
	if err != nil || len(req[reqInit]) != 64 {
		t.Fatalf("requirements %v %v", req, err)
	}

	same := &Backend{opts: Options{Host: backend.Host{InitBinary: write("our-init", "build 1")}}}
	if err := same.Adopt("", req); err != nil {
		t.Fatalf("the same build: %v", err)
	}
	if err := same.Adopt(snap, req); err != nil {
		t.Fatal(err)
	}
	info, err := readCheckpointInfo(snap)
	if err != nil || info.InitBinary != same.opts.InitBinary || info.CRIU != "/usr/local/sbin/criu" {
		t.Fatalf("adopted record %+v %v", info, err)
	}

	other := &Backend{opts: Options{Host: backend.Host{InitBinary: write("new-init", "build 2")}}}
	err = other.Adopt("", req)
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "another agentjail build") || !strings.Contains(err.Error(), other.opts.InitBinary) {
		t.Fatalf("another build: %v", err)
	}

	fsOnly := t.TempDir()
	if req, err := src.Requirements(fsOnly); err != nil || req != nil {
		t.Fatalf("a filesystem checkpoint requires %v %v", req, err)
	}
	if err := other.Adopt(fsOnly, nil); err != nil {
		t.Fatalf("nothing required: %v", err)
	}
}
