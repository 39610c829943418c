package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// previewServer is a dev server for the preview test, on python's standard
// library alone: / serves a page, /headers the request headers it got,
// /ws is a WebSocket echo (RFC 6455 text frames).
const previewServer = `
import base64, hashlib, http.server, json, socketserver, struct, sys

class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        if self.path == "/headers":
            body = json.dumps({k: v for k, v in self.headers.items()}).encode()
        elif self.path == "/ws":
            key = self.headers["Sec-WebSocket-Key"]
            acc = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", acc)
            self.end_headers()
            self.wfile.flush()
            r = self.rfile
            while True:
                h = r.read(2)
                if len(h) < 2: return
                op, n = h[0] & 15, h[1] & 127
                if n == 126: n = struct.unpack(">H", r.read(2))[0]
                elif n == 127: n = struct.unpack(">Q", r.read(8))[0]
                mask = r.read(4) if h[1] & 128 else b"\0\0\0\0"
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(r.read(n)))
                if op == 8: return
                out = b"echo:" + data
                self.wfile.write(bytes([0x81, len(out)]) + out)
                self.wfile.flush()
        else:
            body = b"hello from the jail's dev server\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

S(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
`

// TestPreview: a dev server inside a jail, bound to the jail's loopback,
// is reached from the host at <port>-<jail>.localhost through the daemon:
// refused without the token, served with it (header, or once in the query
// for a cookie) or with a signed link (for that port only), WebSocket
// included; the token never reaches the jail; a port nobody serves is a
// clear 502.
func TestPreview(t *testing.T) {
	d := newDaemon(t)
	j := d.createJail(t, nil)
	d.putFile(t, j.ID, "/workspace/devserver.py", []byte(previewServer))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go runUntil(ctx, d, "/jails/"+j.ID+"/exec/stream", map[string]any{"cmd": []string{"python3", "/workspace/devserver.py", "8000"}})
	d.waitSh(t, j.ID, "python3 -c 'import urllib.request; urllib.request.urlopen(\"http://127.0.0.1:8000/\")'", time.Minute, "the dev server answering in the jail")

	_, dport, _ := strings.Cut(d.addr, ":")
	host := func(port int) string { return fmt.Sprintf("%d-%s.localhost:%s", port, j.Name, dport) }
	noRedirect := &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(hostHdr, path string, hdr http.Header) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+d.addr+path, nil)
		req.Host = hostHdr
		for k, v := range hdr {
			req.Header[k] = v
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatalf("GET %s%s: %v", hostHdr, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	bearer := http.Header{"Authorization": {"Bearer " + d.token}}

	if resp, body := get(host(8000), "/", nil); resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "Preview refused") {
		t.Fatalf("without the token: %d %s", resp.StatusCode, body)
	}
	if resp, _ := get(host(8000), "/", http.Header{"Authorization": {"Bearer wrong"}}); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("with a wrong token: %d", resp.StatusCode)
	}
	if resp, body := get(host(8000), "/", bearer); resp.StatusCode != 200 || body != "hello from the jail's dev server\n" {
		t.Fatalf("with the token: %d %q", resp.StatusCode, body)
	}
	// The dev server sees the browser's host name, not the daemon's token.
	_, body := get(host(8000), "/headers", bearer)
	var seen map[string]string
	if err := json.Unmarshal([]byte(body), &seen); err != nil {
		t.Fatalf("headers: %v %s", err, body)
	}
	if seen["Host"] != host(8000) || strings.Contains(body, d.token) {
		t.Fatalf("the dev server saw %s", body)
	}

	// The token once in the query becomes a cookie for this jail and port.
	resp, _ := get(host(8000), "/?agentjail_token="+url.QueryEscape(d.token), nil)
	cookie := resp.Header.Get("Set-Cookie")
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" || !strings.HasPrefix(cookie, "agentjail_preview=") {
		t.Fatalf("token in the query: %d %v", resp.StatusCode, resp.Header)
	}
	jar := http.Header{"Cookie": {strings.Split(cookie, ";")[0]}}
	if resp, body := get(host(8000), "/", jar); resp.StatusCode != 200 || !strings.Contains(body, "hello") {
		t.Fatalf("with the cookie: %d %s", resp.StatusCode, body)
	}
	if resp, _ := get(host(8001), "/", jar); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the cookie of port 8000 on port 8001: %d", resp.StatusCode)
	}

	// A signed link.
	var link struct {
		URL string `json:"url"`
	}
	d.api.want(t, http.StatusCreated, "POST", "/jails/"+j.ID+"/previews", map[string]any{"port": 8000, "ttl_s": 600}, &link)
	u, err := url.Parse(link.URL)
	if err != nil || u.Host != host(8000) {
		t.Fatalf("link %q: host %q, want %q", link.URL, u.Host, host(8000))
	}
	resp, _ = get(u.Host, u.RequestURI(), nil)
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Set-Cookie"), "agentjail_preview=") {
		t.Fatalf("signed link: %d %v", resp.StatusCode, resp.Header)
	}
	if resp, _ := get(host(8000), "/?agentjail_preview=1.forged", nil); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a forged link: %d", resp.StatusCode)
	}
	out, stderr, code := runBin(t, []string{"AGENTJAIL_ADDR=" + d.addr, "AGENTJAIL_TOKEN=" + d.token}, "", "preview", j.Name, "8000")
	if code != 0 || !strings.HasPrefix(out, "http://"+host(8000)+"/?agentjail_preview=") {
		t.Fatalf("agentjail preview: exit %d %s%s", code, out, stderr)
	}

	// WebSocket through the proxy.
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	ws, _, err := websocket.Dial(wctx, "ws://"+d.addr+"/ws", &websocket.DialOptions{Host: host(8000), HTTPHeader: bearer})
	if err != nil {
		t.Fatalf("websocket through the preview: %v", err)
	}
	defer ws.CloseNow()
	for _, msg := range []string{"ping-1", "hot reload"} {
		if err := ws.Write(wctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		_, got, err := ws.Read(wctx)
		if err != nil || string(got) != "echo:"+msg {
			t.Fatalf("websocket echo of %q: %q %v", msg, got, err)
		}
	}
	if _, _, err := websocket.Dial(wctx, "ws://"+d.addr+"/ws", &websocket.DialOptions{Host: host(8000)}); err == nil {
		t.Fatal("a websocket without the token was let through")
	}

	// Nobody serves port 8001: a clear 502, at once.
	start := time.Now()
	resp, body = get(host(8001), "/", bearer)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "Nothing answers on port 8001") || time.Since(start) > 10*time.Second {
		t.Fatalf("unserved port: %d after %v: %s", resp.StatusCode, time.Since(start), body)
	}
	// An unknown jail.
	if resp, _ := get(fmt.Sprintf("8000-no-such-jail.localhost:%s", dport), "/", bearer); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown jail: %d", resp.StatusCode)
	}
	// The API itself is unchanged on its own host name.
	if resp, _ := get(d.addr, "/health", nil); resp.StatusCode != 200 {
		t.Fatalf("health: %d", resp.StatusCode)
	}
}

// runUntil posts body to a streaming route and reads the answer until ctx
// ends (which cancels the command).
func runUntil(ctx context.Context, d *daemon, path string, body any) {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, "POST", "http://"+d.addr+path, bytes.NewReader(b))
	if err != nil {
		return
	}
	req.Header.Set("Authorization", "Bearer "+d.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}
