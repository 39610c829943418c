package integration

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestUploadLimits: a file upload declared larger than the documented
// limit (1 GiB) is refused with 413 before any byte is read, and one that
// outgrows the jail's disk gets a clear error; neither leaves a partial
// file, and the jail keeps working.
func TestUploadLimits(t *testing.T) {
	d := shared(t)
	j := d.createJail(t, map[string]any{"isolation": map[string]any{"resources": map[string]any{"disk_bytes": 64 << 20}}})
	path := "/jails/" + j.ID + "/files/workspace/big"

	// Declared too large: the daemon answers without waiting for a body
	// that never comes.
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(d.api.base, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(conn, "PUT %s HTTP/1.1\r\nHost: agentjail\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n", path, d.token, 1<<30+1)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer to a declared 1 GiB + 1 upload: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(body), `"too_large"`) {
		t.Errorf("declared 1 GiB + 1 upload: HTTP %d %s, want 413 too_large", resp.StatusCode, body)
	}
	conn.Close()

	// Larger than the jail's 64 MiB disk: refused with a message, nothing
	// left, and the jail and its disk still work.
	r, err := d.api.send("PUT", path, io.LimitReader(zeros{}, 100<<20))
	if err != nil {
		t.Fatal(err)
	}
	if r.status/100 != 4 && r.status != http.StatusInsufficientStorage || !strings.Contains(strings.ToLower(r.errorMessage()), "space") {
		t.Errorf("upload larger than the jail's disk: want a 4xx/507 saying the disk is full, got %s", r)
	}
	if r := d.api.do(t, "GET", path+"?stat=true", nil); r.status != http.StatusNotFound {
		t.Errorf("after the failed upload: GET answers %s, want 404 (no partial file)", r)
	}
	if out := d.mustSh(t, j.ID, "echo fits > /workspace/small && cat /workspace/small"); out != "fits\n" {
		t.Errorf("the jail after the failed upload: %q", out)
	}
}

// zeros is an endless reader of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
