package container

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// enableKSM on a copy of the controls: it starts ksmd and raises a low scan
// rate, keeps a higher one, and says when the kernel has no KSM.
func TestEnableKSM(t *testing.T) {
	for _, tc := range []struct{ run, scan, wantScan string }{
		{"0\n", "100\n", "2000"},
		{"1\n", "5000\n", "5000"},
		{"2\n", "2000\n", "2000"},
	} {
		dir := t.TempDir()
		for name, v := range map[string]string{"run": tc.run, "pages_to_scan": tc.scan} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := enableKSM(dir); err != nil {
			t.Fatalf("run %q scan %q: %v", tc.run, tc.scan, err)
		}
		run, _ := os.ReadFile(filepath.Join(dir, "run"))
		scan, _ := os.ReadFile(filepath.Join(dir, "pages_to_scan"))
		if strings.TrimSpace(string(run)) != "1" || strings.TrimSpace(string(scan)) != tc.wantScan {
			t.Errorf("run %q scan %q: now run %q scan %q, want 1 and %s", tc.run, tc.scan, run, scan, tc.wantScan)
		}
	}
	err := enableKSM(filepath.Join(t.TempDir(), "absent"))
	if err == nil || !strings.Contains(err.Error(), "CONFIG_KSM") {
		t.Errorf("no KSM: %v", err)
	}
}
