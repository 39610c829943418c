package audit

import (
	"os"
	"path/filepath"
	"testing"
)

func TestLogWritesTailsAndRotates(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(filepath.Join(dir, FileName), 300)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i, tn := range []string{"a", "b", "a", "a"} {
		if err := l.Write(Entry{Surface: "api", Who: "key:k" + tn, Tenant: tn, Action: "POST /jails", Status: 201 + i, Result: ResultOf(201)}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := l.Tail(10, func(e *Entry) bool { return e.Tenant == "a" })
	if err != nil {
		t.Fatal(err)
	}
	if len(got) == 0 || got[len(got)-1].Status != 204 || got[0].Time.IsZero() {
		t.Fatalf("tail of a: %+v", got)
	}
	if _, err := os.Stat(filepath.Join(dir, FileName+".1")); err != nil {
		t.Errorf("the log was not rotated past its bound: %v", err)
	}
	if st, _ := os.Stat(filepath.Join(dir, FileName)); st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", st.Mode())
	}
	if r := ResultOf(429); r != "denied" {
		t.Errorf("429 is %s", r)
	}
}
