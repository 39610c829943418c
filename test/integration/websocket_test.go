package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// echoWebSocket accepts a WebSocket and sends every message back until
// the client closes.
func echoWebSocket(w http.ResponseWriter, r *http.Request) {
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	ctx, cancel := context.WithTimeout(r.Context(), time.Minute)
	defer cancel()
	for {
		typ, msg, err := c.Read(ctx)
		if err != nil {
			return
		}
		if err := c.Write(ctx, typ, msg); err != nil {
			return
		}
	}
}

// wsClient is a WebSocket client written against RFC 6455 with the
// standard library only: it connects to argv[1]:argv[2] (or the address
// argv[5] with Host argv[1]) directly, or
// through $HTTP_PROXY when argv[4] is "proxy", upgrades argv[3], prints
// the status of the answer, then sends two messages (one past 125 bytes)
// and prints whether each came back the same.
const wsClient = `
import base64, os, socket, struct, sys, urllib.parse
host, port, path, via = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
target = path
addr = (sys.argv[5] if len(sys.argv) > 5 else host, port)
if via == 'proxy':
    p = urllib.parse.urlparse(os.environ['HTTP_PROXY'])
    addr = (p.hostname, p.port)
    target = 'http://%s:%d%s' % (host, port, path)
s = socket.create_connection(addr, timeout=10)
key = base64.b64encode(os.urandom(16)).decode()
s.sendall(('GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n'
           'Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n' % (target, host, key)).encode())
head = b''
while not head.endswith(b'\r\n\r\n'):
    b = s.recv(1)
    if not b:
        break
    head += b
print(head.split(b' ')[1].decode())
def readn(n):
    out = b''
    while len(out) < n:
        b = s.recv(n - len(out))
        if not b:
            raise EOFError
        out += b
    return out
def send(msg):
    data = msg.encode()
    mask = os.urandom(4)
    hdr = bytes([0x81, 0x80 | len(data)]) if len(data) < 126 else bytes([0x81, 0x80 | 126]) + struct.pack('>H', len(data))
    s.sendall(hdr + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
def recv():
    h = readn(2)
    n = h[1] & 0x7f
    if n == 126:
        n = struct.unpack('>H', readn(2))[0]
    return readn(n).decode()
if head.startswith(b'HTTP/1.1 101'):
    for m in ('hello', 'x' * 300):
        send(m)
        print(recv() == m)
`

// TestWebSocketThroughProxy opens ws:// connections from a jail whose
// policy allows the host, through the transparent proxy (port 80) and
// the explicit one ($HTTP_PROXY): each upgrades, echoes both ways, and is
// recorded like any request (GET /ws, status 101, bytes both ways); a host
// the policy does not allow gets 403 and no upgrade.
func TestWebSocketThroughProxy(t *testing.T) {
	in := newTestInternet(t, "web.test", "other.test")
	d := newDaemon(t, "--hosts-file", in.hosts)
	j := d.createJail(t, map[string]any{"isolation": map[string]any{"network": map[string]any{
		"mode": "isolated", "allowed_egress": []map[string]any{{"destination": "web.test"}}}}})
	run := func(host, via string) string {
		// Names outside the policy do not resolve in the jail: connect to
		// the address, name the host in the request.
		res := d.exec(t, j.ID, execReq{Cmd: []string{"python3", "-c", wsClient, host, "80", "/ws", via, in.addr}, TimeoutMs: 30_000})
		if res.ExitCode != 0 {
			t.Fatalf("ws client %s via %s: %s", host, via, &res)
		}
		return strings.Join(strings.Fields(res.Stdout), " ")
	}
	for _, via := range []string{"direct", "proxy"} {
		if got := run("web.test", via); got != "101 True True" {
			t.Errorf("ws://web.test/ws via %s: %q, want the upgrade and both echoes", via, got)
		}
		if got := run("other.test", via); got != "403" {
			t.Errorf("ws://other.test/ws via %s: %q, want 403", via, got)
		}
	}
	// Recorded as requests, with the bytes of the whole exchange.
	type rec struct {
		Host     string `json:"host"`
		Method   string `json:"method"`
		Path     string `json:"path"`
		Status   int    `json:"status"`
		Verdict  string `json:"verdict"`
		Via      string `json:"via"`
		BytesOut int64  `json:"bytes"`
		BytesIn  int64  `json:"bytes_in"`
	}
	var got []rec
	if err := waitFor(5*time.Second, func() error {
		got = nil
		body := string(d.api.want(t, http.StatusOK, "GET", "/jails/"+j.ID+"/network/log", nil, nil).body)
		for _, l := range strings.Split(body, "\n") {
			var r rec
			if json.Unmarshal([]byte(l), &r) == nil && r.Path == "/ws" && r.Status == http.StatusSwitchingProtocols {
				got = append(got, r)
			}
		}
		if len(got) != 2 {
			return fmt.Errorf("%d upgraded requests recorded, want 2: %+v", len(got), got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, r := range got {
		// Two masked frames up (5 and 300 bytes of payload), two echoes down.
		if r.Host != "web.test" || r.Method != "GET" || r.Verdict != "allow" || r.BytesOut < 305 || r.BytesIn < 305 {
			t.Errorf("record of an upgrade: %+v", r)
		}
	}
}
