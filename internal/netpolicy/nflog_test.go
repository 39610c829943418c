package netpolicy

import (
	"log/slog"
	"os"
	"testing"

	"github.com/agentjail/agentjail/internal/testenv"
)

// TestNflogGroupTakenMovesOn: a second daemon whose prefix hashes to a
// group another daemon holds binds the next free one of the range, and a
// closed reader frees its group.
func TestNflogGroupTakenMovesOn(t *testing.T) {
	testenv.RequireRoot(t)
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	const base = 0x6aff // the last of its range: the next one wraps around
	a := &Manager{log: log, group: base}
	ra, err := a.startNflog()
	if err != nil {
		t.Fatal(err)
	}
	defer ra.Close()
	b := &Manager{log: log, group: a.group}
	rb, err := b.startNflog()
	if err != nil {
		t.Fatal(err)
	}
	if b.group == a.group || b.group&0xff00 != base&0xff00 {
		t.Fatalf("the second reader bound 0x%04x, want another group of 0x6a00..0x6aff", b.group)
	}
	rb.Close()
	rb.Close() // idempotent
	// Closing frees the group: a third reader gets it.
	c := &Manager{log: log, group: b.group}
	rc, err := c.startNflog()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if c.group != b.group {
		t.Fatalf("after Close, group 0x%04x was not free (got 0x%04x)", b.group, c.group)
	}
}
