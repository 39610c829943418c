package barepty

import "testing"

func TestRun(t *testing.T) {
	n, d, err := Run([]string{"sh", "-c", "printf 'a\\nb\\n'; exit 0"})
	if err != nil || d <= 0 {
		t.Fatal(n, d, err)
	}
	// The terminal turns each newline into CR LF.
	if n != 6 {
		t.Fatalf("read %d bytes, want 6 (a CR LF b CR LF)", n)
	}
	if _, _, err := Run([]string{"sh", "-c", "exit 3"}); err == nil {
		t.Fatal("a failing command's error was lost")
	}
}
