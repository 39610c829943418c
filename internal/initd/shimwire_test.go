package initd

import (
	"reflect"
	"strings"
	"testing"
)

// TestShimWire: every shim message body decodes to what was encoded, and
// a body cut short or followed by extra bytes is an error, never a
// command run with half its spec.
func TestShimWire(t *testing.T) {
	bodies := []struct{ in, out shimBody }{
		{&shimSpec{Path: "/usr/bin/env", Argv: []string{"env", "", "ünï\x01code"}, Env: []string{"A=1", "PATH=/bin"},
			Dir: "/workspace", UID: 1000, GID: 1000, Groups: []int{1000, 27, 65534}, Tty: true, HandOff: true}, &shimSpec{}},
		{&shimSpec{Path: "/bin/true", Argv: []string{"true"}, Dir: "/", UID: -1, GID: 0}, &shimSpec{}},
		{&shimStarted{Pid: 4194304}, &shimStarted{}},
		{&shimExit{StartErrno: 2, Reusable: true}, &shimExit{}},
		{&shimExit{Exited: true, Code: 255, Signal: 9}, &shimExit{}},
	}
	for _, b := range bodies {
		enc := b.in.appendTo(nil)
		if err := b.out.decode(enc); err != nil {
			t.Fatalf("decode %#v: %v", b.in, err)
		}
		if !reflect.DeepEqual(b.in, b.out) {
			t.Fatalf("round trip: got %#v, want %#v", b.out, b.in)
		}
		for n := range len(enc) {
			if err := b.out.decode(enc[:n]); err == nil {
				t.Fatalf("%T cut to %d of %d bytes decoded without an error", b.in, n, len(enc))
			}
		}
		if err := b.out.decode(append(enc, 0)); err == nil || !strings.Contains(err.Error(), "too many") {
			t.Fatalf("%T with an extra byte: %v", b.in, err)
		}
	}
	// A list length beyond what the body holds is refused before any
	// allocation of that size.
	var s shimSpec
	if err := s.decode([]byte{0, 0xff, 0xff, 0xff, 0xff, 0x0f}); err == nil {
		t.Fatal("a spec claiming 4G arguments decoded")
	}
}
