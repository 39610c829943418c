package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// dnsFlood sends UDP queries for names outside the policy to the jail's
// resolver as fast as it can for argv[1] seconds, never waiting for an
// answer, and prints how many it sent and how many answers came back.
const dnsFlood = `
import socket, struct, sys, time
ns = [l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')][0]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setblocking(False)
def query(i):
    name = b''.join(bytes([len(p)]) + p for p in (b'flood%d' % i, b'test')) + b'\0'
    return struct.pack('>HHHHHH', i & 0xffff, 0x0100, 1, 0, 0, 0) + name + struct.pack('>HH', 1, 1)
sent = got = 0
end = time.time() + float(sys.argv[1])
while time.time() < end:
    try:
        s.sendto(query(sent), (ns, 53)); sent += 1
    except BlockingIOError:
        pass
    try:
        while True:
            s.recv(4096); got += 1
    except BlockingIOError:
        pass
time.sleep(0.5)
try:
    while True:
        s.recv(4096); got += 1
except BlockingIOError:
    pass
print(sent, got)
`

// dnsOnce asks the jail's resolver for a name outside the policy and
// prints the answer's rcode and how long it took in ms.
const dnsOnce = `
import socket, struct, time
ns = [l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')][0]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
q = struct.pack('>HHHHHH', 7, 0x0100, 1, 0, 0, 0) + b'\x05other\x04test\x00' + struct.pack('>HH', 1, 1)
t = time.time()
s.sendto(q, (ns, 53))
r = s.recv(4096)
print(r[3] & 15, int((time.time() - t) * 1000))
`

// TestDNSFlood floods the daemon's DNS from inside one jail (rate limit 50
// queries/s) while another jail resolves and the API is used: the daemon
// stays responsive, the other jail's answers come at once, the flooding
// jail gets at most its rate, and its drops are counted in its report and
// recorded in its network log.
func TestDNSFlood(t *testing.T) {
	d := shared(t)
	const rate, secs = 50, 4
	flooder := d.createJail(t, map[string]any{"isolation": map[string]any{"network": map[string]any{
		"limits": map[string]any{"dns_queries_per_second": rate}}}})
	other := d.createJail(t, nil)

	var wg sync.WaitGroup
	var flood execResult
	wg.Go(func() {
		flood = d.exec(t, flooder.ID, execReq{Cmd: []string{"python3", "-c", dnsFlood, fmt.Sprint(secs)}, TimeoutMs: 60_000})
	})
	// While it floods: the API answers, the other jail resolves.
	deadline := time.Now().Add(secs * time.Second)
	var worstAPI time.Duration
	var worstDNS int
	for time.Now().Before(deadline) {
		start := time.Now()
		d.api.want(t, http.StatusOK, "GET", "/jails/"+other.ID, nil, nil)
		worstAPI = max(worstAPI, time.Since(start))
		res := d.shAs(t, other.ID, "", "python3 -c '"+strings.ReplaceAll(dnsOnce, "'", `'"'"'`)+"'")
		var rcode, ms int
		if _, err := fmt.Sscan(res.Stdout, &rcode, &ms); err != nil || rcode != 3 {
			t.Fatalf("the other jail's query during the flood: %s", &res)
		}
		worstDNS = max(worstDNS, ms)
	}
	wg.Wait()
	var sent, got int
	if _, err := fmt.Sscan(flood.Stdout, &sent, &got); err != nil {
		t.Fatalf("flood: %s", &flood)
	}
	t.Logf("flood: %d queries sent in %d s, %d answered; worst API call %v, worst answer to the other jail %d ms",
		sent, secs, got, worstAPI, worstDNS)
	if worstAPI > time.Second || worstDNS > 1000 {
		t.Errorf("during the flood: an API call took %v, the other jail's answer %d ms", worstAPI, worstDNS)
	}
	if limit := rate*(secs+2) + rate; got > limit || sent < 10*limit {
		t.Errorf("%d of %d queries answered, want many more sent and at most %d answered", got, sent, limit)
	}

	// The drops are counted in the report and recorded in the network log,
	// a line per second and reason, not per query; the last second's
	// count arrives within a second.
	type dnsStats struct {
		Answered         uint64 `json:"answered"`
		DroppedRateLimit uint64 `json:"dropped_rate_limit"`
		DroppedBusy      uint64 `json:"dropped_busy"`
	}
	var rep struct {
		DNS *dnsStats `json:"dns"`
	}
	if err := waitFor(5*time.Second, func() error {
		d.api.want(t, http.StatusOK, "GET", "/jails/"+flooder.ID+"/report", nil, &rep)
		if rep.DNS == nil {
			return fmt.Errorf("no dns in the report")
		}
		body := string(d.api.want(t, http.StatusOK, "GET", "/jails/"+flooder.ID+"/network/log", nil, nil).body)
		logged := map[string]uint64{}
		lines := 0
		for _, l := range strings.Split(body, "\n") {
			var ev struct{ Rule, Error string }
			if json.Unmarshal([]byte(l), &ev) != nil || !strings.HasPrefix(ev.Rule, "limit:dns_") {
				continue
			}
			var n uint64
			fmt.Sscanf(ev.Error, "%d queries dropped", &n)
			logged[ev.Rule] += n
			lines++
		}
		if logged["limit:dns_queries_per_second"] != rep.DNS.DroppedRateLimit || logged["limit:dns_in_flight"] != rep.DNS.DroppedBusy {
			return fmt.Errorf("network log: %v dropped in %d lines, the report counts %+v", logged, lines, *rep.DNS)
		}
		if lines > 2*(secs+3) {
			return fmt.Errorf("network log: %d lines of drops for %d s", lines, secs)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("report: %+v", *rep.DNS)
	// Most queries reach the kernel's limit (a flood also overflows queues
	// on the way, which the kernel counts elsewhere).
	if s := rep.DNS; s.DroppedRateLimit == 0 || s.Answered+s.DroppedRateLimit+s.DroppedBusy < uint64(sent)/2 {
		t.Errorf("report dns: %+v for %d sent", *s, sent)
	}

	// The limit is validated.
	r := d.api.do(t, "POST", "/jails", map[string]any{"name": uniqueName(t), "isolation": map[string]any{"network": map[string]any{
		"limits": map[string]any{"dns_queries_per_second": 20000}}}})
	if r.status != http.StatusUnprocessableEntity || !strings.Contains(r.errorMessage(), "isolation.network.limits.dns_queries_per_second") {
		t.Errorf("dns_queries_per_second 20000: %s", r)
	}
}
