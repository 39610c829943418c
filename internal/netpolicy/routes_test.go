package netpolicy

import (
	"strings"
	"testing"
)

// TestRoutesAndSecretCredentials: a jail speaks plain HTTP to a routed
// name; the proxy sends the request to the route's origin (https with a
// path prefix, or plain http on another port), adds the credential made
// from a daemon secret, records the upstream and the header's name, and
// answers 502 when the daemon lacks the secret.
func TestRoutesAndSecretCredentials(t *testing.T) {
	e := setup(t)
	const key = "sk-route-secret-51c0"
	e.m.o.Secrets = func(name string) (string, bool) {
		if name == "MODEL_KEY" {
			return key, true
		}
		return "", false
	}
	p := basePolicy()
	p.AlwaysAllow = []Rule{{Destination: "model.test"}, {Destination: "plain.test"}, {Destination: "nokey.test"}}
	p.Routes = []Route{
		{Host: "model.test", URL: "https://api.test/prefix/"},
		{Host: "plain.test", URL: "http://allowed.test:8080"},
		{Host: "nokey.test", URL: "http://allowed.test"},
	}
	p.Credentials = []Credential{
		{Host: "model.test", Header: "X-Api-Key", Secret: "MODEL_KEY"},
		{Host: "plain.test", Header: "Authorization", Value: "Bearer ", Secret: "MODEL_KEY"},
		{Host: "nokey.test", Header: "X-Api-Key", Secret: "NO_SUCH_KEY"},
	}
	j := attach(t, e.m, "routes", ModeIsolated, p)
	proxyEnv := map[string]string{"http_proxy": j.att.Env["http_proxy"]}

	out, code := j.exec(t, proxyEnv, "curl", "-sS", "--max-time", "8", "-H", "X-Api-Key: dummy", "http://model.test/v1/messages?beta=true")
	if code != 0 || out != "hello from api.test /prefix/v1/messages" {
		t.Fatalf("routed request: %q exit %d", out, code)
	}
	if !e.in.sawHeader("X-Api-Key", key) {
		t.Error("the upstream did not get the key made from the daemon's secret")
	}
	if e.in.sawHeader("X-Api-Key", "dummy") {
		t.Error("the jail's dummy key reached the upstream")
	}
	ev := e.rec.wait(t, j.id, "routed request", func(ev ConnEvent) bool {
		return ev.Host == "model.test" && ev.Path == "/v1/messages" && ev.Status == 200
	})
	if ev.Upstream != "https://api.test/prefix" || len(ev.Credentials) != 1 || ev.Credentials[0] != "X-Api-Key" {
		t.Errorf("record: upstream %q credentials %v", ev.Upstream, ev.Credentials)
	}

	// Through a CONNECT tunnel, as Node's proxy agents send http:// too.
	out, code = j.exec(t, proxyEnv, "curl", "-sS", "--max-time", "8", "--proxytunnel", "-x", j.att.Env["http_proxy"], "http://model.test/tunnelled")
	if code != 0 || out != "hello from api.test /prefix/tunnelled" {
		t.Fatalf("routed request through a tunnel: %q exit %d", out, code)
	}
	// Without the proxy variables: the daemon's DNS answers the routed name
	// (which resolves nowhere) and the connection is redirected to the proxy.
	out, code = j.exec(t, nil, "curl", "-sS", "--max-time", "8", "http://plain.test/chat")
	if code != 0 || out != "hello from allowed.test:8080 /chat" {
		t.Fatalf("routed plain request: %q exit %d", out, code)
	}
	if !e.in.sawHeader("Authorization", "Bearer "+key) {
		t.Error("the prefixed credential did not reach the upstream")
	}

	out, _ = j.exec(t, proxyEnv, "curl", "-sS", "--max-time", "8", "-w", " %{http_code}", "http://nokey.test/x")
	if !strings.HasSuffix(out, " 502") || !strings.Contains(out, `no secret "NO_SUCH_KEY"`) {
		t.Errorf("missing secret: %q, want a 502 naming it", out)
	}
	if strings.Contains(j.att.Env["http_proxy"]+strings.Join(envValues(j.att.Env), " "), key) {
		t.Error("the secret is in the jail's environment")
	}
}

func envValues(env map[string]string) []string {
	var out []string
	for _, v := range env {
		out = append(out, v)
	}
	return out
}
