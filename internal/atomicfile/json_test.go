package atomicfile

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestJSONRoundTrip(t *testing.T) {
	p := filepath.Join(t.TempDir(), "state.json")
	m := map[string][]string{"kept": {"a", "b"}}
	if err := ReadJSON(p, &m); err != nil || len(m) != 1 {
		t.Fatalf("a missing file: %v, %v (want no error and the value untouched)", err, m)
	}
	want := map[string][]string{"x": {"1"}, "y": nil}
	if err := WriteJSON(p, want, 0o600); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode: %v %v", fi, err)
	}
	var got map[string][]string
	if err := ReadJSON(p, &got); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("read back %v %v, want %v", got, err, want)
	}
	if err := os.WriteFile(p, []byte("{torn"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := ReadJSON(p, &got); err == nil {
		t.Fatal("a torn file decoded")
	}
	if err := WriteJSON(p, func() {}, 0o600); err == nil {
		t.Fatal("a value JSON cannot hold was written")
	}
	if b, _ := os.ReadFile(p); string(b) != "{torn" {
		t.Fatalf("a failed write changed the file: %q", b)
	}
}
