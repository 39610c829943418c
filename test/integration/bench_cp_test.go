package integration

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// BenchmarkCopyTree times `agentjail cp` of a source tree into a jail (400
// files of 1 KiB in 20 directories), against the same files written one
// request after another through the files API (ref: what cp did before it
// moved several files at once).
func BenchmarkCopyTree(b *testing.B) {
	d := shared(b)
	j := d.createJail(b, nil)
	src := filepath.Join(b.TempDir(), "tree")
	content := []byte(strings.Repeat("x", 1024))
	var files []string
	for i := range 20 {
		dir := fmt.Sprintf("pkg%02d", i)
		if err := os.MkdirAll(filepath.Join(src, dir), 0o755); err != nil {
			b.Fatal(err)
		}
		for k := range 20 {
			f := fmt.Sprintf("%s/mod%02d.py", dir, k)
			if err := os.WriteFile(filepath.Join(src, f), content, 0o644); err != nil {
				b.Fatal(err)
			}
			files = append(files, f)
		}
	}
	var ours, ref []time.Duration
	b.ResetTimer()
	for i := range b.N {
		dst := fmt.Sprintf("/workspace/cp%d", i)
		start := time.Now()
		if out, errOut, code := runBin(b, []string{"AGENTJAIL_TOKEN=" + d.token}, "", "--addr", d.addr, "cp", src, j.ID+":"+dst); code != 0 {
			b.Fatalf("cp: exit %d\n%s%s", code, out, errOut)
		}
		ours = append(ours, time.Since(start))
		dst = fmt.Sprintf("/workspace/seq%d", i)
		start = time.Now()
		for k := range 20 {
			d.api.want(b, http.StatusCreated, "PUT", fmt.Sprintf("/jails/%s/files%s/pkg%02d?type=dir", j.ID, dst, k), nil, nil)
		}
		for _, f := range files {
			d.putFile(b, j.ID, dst+"/"+f, content)
		}
		ref = append(ref, time.Since(start))
	}
	b.StopTimer()
	if out := d.mustSh(b, j.ID, "find /workspace/cp0 -type f | wc -l"); strings.TrimSpace(out) != fmt.Sprint(len(files)) {
		b.Fatalf("cp copied %s files, want %d", out, len(files))
	}
	mo, mr := median(ours), median(ref)
	b.ReportMetric(ms(mo), "ms")
	b.ReportMetric(ms(mr), "ref-ms")
	b.ReportMetric(float64(mo)/float64(mr), "x-ref")
}
