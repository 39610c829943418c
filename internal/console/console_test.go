package console_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"sigs.k8s.io/yaml"

	"github.com/agentjail/agentjail/internal/api"
	"github.com/agentjail/agentjail/internal/api/apitest"
	"github.com/agentjail/agentjail/internal/console"
	"github.com/agentjail/agentjail/internal/model"
)

const token = "secret-token"

// harness is a console in front of the API over a fake service (these
// tests are about the console's own checks, not the jails).
type harness struct {
	t   *testing.T
	srv *httptest.Server
	svc *apitest.Service
}

func newHarness(t *testing.T) *harness {
	svc := apitest.New()
	c := console.New(console.Options{API: api.NewServer(svc, token, nil)})
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	return &harness{t: t, srv: srv, svc: svc}
}

// client is a browser: a cookie jar, no redirects followed.
func (h *harness) client() *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

type resp struct {
	status int
	header http.Header
	body   string
}

func (h *harness) do(c *http.Client, method, path, body string, hdr map[string]string) resp {
	h.t.Helper()
	req, err := http.NewRequest(method, h.srv.URL+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	r, err := c.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return resp{r.StatusCode, r.Header, string(b)}
}

// login logs c in and returns the CSRF token.
func (h *harness) login(c *http.Client) string {
	h.t.Helper()
	r := h.do(c, "POST", "/console/login", `{"credential":"`+token+`"}`, map[string]string{"Content-Type": "application/json", "Origin": h.srv.URL, "Sec-Fetch-Site": "same-origin"})
	if r.status != http.StatusOK {
		h.t.Fatalf("login: %d %s", r.status, r.body)
	}
	var s console.SessionInfo
	if err := json.Unmarshal([]byte(r.body), &s); err != nil || s.CSRFToken == "" {
		h.t.Fatalf("login answer %s: %v", r.body, err)
	}
	return s.CSRFToken
}

func TestLoginCookie(t *testing.T) {
	h := newHarness(t)
	c := h.client()
	for _, body := range []string{`{"credential":"wrong"}`, `{"credential":""}`, `{"token":"x"}`, `not json`} {
		if r := h.do(c, "POST", "/console/login", body, nil); r.status != http.StatusUnauthorized && r.status != http.StatusBadRequest {
			t.Errorf("login %s: %d %s", body, r.status, r.body)
		}
	}
	r := h.do(c, "POST", "/console/login", `{"credential":"`+token+`"}`, nil)
	if r.status != http.StatusOK {
		t.Fatalf("login: %d %s", r.status, r.body)
	}
	setCookie := r.header.Get("Set-Cookie")
	for _, want := range []string{console.CookieName + "=", "HttpOnly", "SameSite=Strict", "Path=/"} {
		if !strings.Contains(setCookie, want) {
			t.Errorf("Set-Cookie %q lacks %s", setCookie, want)
		}
	}
	if strings.Contains(setCookie, token) || strings.Contains(r.body, token) {
		t.Error("the login answer carries the credential")
	}
	if r.header.Get("Access-Control-Allow-Origin") != "" {
		t.Error("CORS header on the login answer")
	}
	// The session works for pages and the API.
	if r := h.do(c, "GET", "/", "", nil); r.status != http.StatusOK || !strings.Contains(r.body, "app.js") {
		t.Errorf("GET / logged in: %d", r.status)
	}
	if r := h.do(c, "GET", "/api/jails", "", nil); r.status != http.StatusOK {
		t.Errorf("GET /api/jails logged in: %d %s", r.status, r.body)
	}
	// The API at the root ignores the cookie: it takes bearer tokens only.
	if r := h.do(c, "GET", "/jails", "", nil); r.status != http.StatusUnauthorized {
		t.Errorf("GET /jails with only the cookie: %d", r.status)
	}
	// Logout needs the CSRF token, then ends the session.
	if r := h.do(c, "POST", "/console/logout", "", nil); r.status != http.StatusForbidden {
		t.Errorf("logout without CSRF: %d", r.status)
	}
	var s console.SessionInfo
	sr := h.do(c, "GET", "/console/session", "", nil)
	if err := json.Unmarshal([]byte(sr.body), &s); err != nil {
		t.Fatal(err)
	}
	if r := h.do(c, "POST", "/console/logout", "", map[string]string{console.CSRFHeader: s.CSRFToken}); r.status != http.StatusNoContent {
		t.Fatalf("logout: %d %s", r.status, r.body)
	}
	if r := h.do(c, "GET", "/api/jails", "", nil); r.status != http.StatusUnauthorized {
		t.Errorf("API after logout: %d", r.status)
	}
}

// TestRefusedWithoutLogin: every page but the login page, every
// protected asset and every API operation of api/openapi.yaml (under
// /api/) is refused without a session, a forged cookie included.
func TestRefusedWithoutLogin(t *testing.T) {
	h := newHarness(t)
	h.svc.Create(context.Background(), createReq("x"))
	b, err := os.ReadFile("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]any `json:"paths"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	for _, forged := range []bool{false, true} {
		c := h.client()
		if forged {
			u, _ := url.Parse(h.srv.URL)
			c.Jar.SetCookies(u, []*http.Cookie{{Name: console.CookieName, Value: "forged-session-id"}})
		}
		n := 0
		for p, ops := range doc.Paths {
			path := strings.NewReplacer("{id}", "x", "{sid}", "s", "{rid}", "x-s", "{path}", "workspace/f").Replace(p)
			for m := range ops {
				method := strings.ToUpper(m)
				if method != "GET" && method != "POST" && method != "PUT" && method != "DELETE" {
					continue
				}
				n++
				r := h.do(c, method, "/api"+path, "{}", nil)
				if r.status != http.StatusUnauthorized {
					t.Errorf("forged=%v %s /api%s without login: %d %s", forged, method, path, r.status, r.body)
				}
			}
		}
		if n < 30 {
			t.Fatalf("only %d operations found in api/openapi.yaml", n)
		}
		if r := h.do(c, "GET", "/", "", nil); r.status != http.StatusSeeOther || r.header.Get("Location") != "/login" || strings.Contains(r.body, "app.js") {
			t.Errorf("GET / without login: %d %s", r.status, r.header.Get("Location"))
		}
		for _, a := range []string{"app.js", "jail.js", "vendor/xterm.mjs", "index.html"} {
			if r := h.do(c, "GET", "/console/assets/"+a, "", nil); r.status != http.StatusUnauthorized && r.status != http.StatusNotFound {
				t.Errorf("asset %s without login: %d", a, r.status)
			}
		}
		if r := h.do(c, "GET", "/console/session", "", nil); r.status != http.StatusUnauthorized {
			t.Errorf("session without login: %d", r.status)
		}
	}
	c := h.client()
	if r := h.do(c, "GET", "/login", "", nil); r.status != http.StatusOK || !strings.Contains(r.body, "login.js") {
		t.Errorf("the login page: %d", r.status)
	}
	if r := h.do(c, "GET", "/console/assets/login.js", "", nil); r.status != http.StatusOK {
		t.Errorf("login.js: %d", r.status)
	}
}

func createReq(name string) model.CreateRequest { return model.CreateRequest{Name: name} }

// TestCrossOrigin: a request carrying the session cookie from a page of
// another origin (another port of the same host included, which is
// same-site, so SameSite=Strict alone would let the cookie through) is
// refused, reads and writes alike; state-changing calls need the CSRF
// token even from the console's own origin.
func TestCrossOrigin(t *testing.T) {
	h := newHarness(t)
	c := h.client()
	csrf := h.login(c)
	u, _ := url.Parse(h.srv.URL)
	other := "http://" + u.Hostname() + ":1"
	cases := []struct {
		method, path string
		hdr          map[string]string
		want         int
	}{
		{"GET", "/api/jails", map[string]string{"Origin": "http://evil.example"}, http.StatusForbidden},
		{"GET", "/api/jails", map[string]string{"Origin": other, "Sec-Fetch-Site": "same-site"}, http.StatusForbidden},
		{"GET", "/api/jails", map[string]string{"Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
		{"POST", "/api/jails", map[string]string{"Origin": other, console.CSRFHeader: csrf}, http.StatusForbidden},
		{"POST", "/api/jails", map[string]string{"Origin": h.srv.URL, "Sec-Fetch-Site": "same-origin"}, http.StatusForbidden},
		{"POST", "/api/jails", map[string]string{"Origin": h.srv.URL, console.CSRFHeader: "wrong"}, http.StatusForbidden},
		{"GET", "/console/session", map[string]string{"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
		{"POST", "/console/login", map[string]string{"Origin": "http://evil.example"}, http.StatusForbidden},
		// The console's own origin with the token: allowed.
		{"GET", "/api/jails", map[string]string{"Origin": h.srv.URL, "Sec-Fetch-Site": "same-origin"}, http.StatusOK},
		{"POST", "/api/jails", map[string]string{"Origin": h.srv.URL, "Sec-Fetch-Site": "same-origin", console.CSRFHeader: csrf}, http.StatusCreated},
	}
	for _, tc := range cases {
		body := `{"name":"n` + time.Now().Format("150405.000000000")[7:] + `"}`
		if tc.path == "/console/login" {
			body = `{"credential":"` + token + `"}`
		}
		r := h.do(c, tc.method, tc.path, body, tc.hdr)
		if r.status != tc.want {
			t.Errorf("%s %s %v: %d, want %d (%s)", tc.method, tc.path, tc.hdr, r.status, tc.want, r.body)
		}
		if r.header.Get("Access-Control-Allow-Origin") != "" || r.header.Get("Access-Control-Allow-Credentials") != "" {
			t.Errorf("%s %s: CORS headers in the answer", tc.method, tc.path)
		}
		if r.header.Get("Cross-Origin-Resource-Policy") != "same-origin" || r.header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s %s: missing CORP or nosniff", tc.method, tc.path)
		}
	}
	// Pages cannot be framed.
	r := h.do(c, "GET", "/", "", nil)
	if r.header.Get("X-Frame-Options") != "DENY" || !strings.Contains(r.header.Get("Content-Security-Policy"), "frame-ancestors 'none'") {
		t.Errorf("framing headers: %v", r.header)
	}
}

// TestWebSocketOrigin: the terminal WebSocket through the console needs
// the session and the console's own Origin.
func TestWebSocketOrigin(t *testing.T) {
	h := newHarness(t)
	h.svc.Create(context.Background(), createReq("x"))
	c := h.client()
	h.login(c)
	wsURL := "ws" + strings.TrimPrefix(h.srv.URL, "http") + "/api/jails/x/terminal?cmd=sh"
	dial := func(hc *http.Client, origin string) (*websocket.Conn, int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		hdr := http.Header{}
		if origin != "" {
			hdr.Set("Origin", origin)
		}
		conn, r, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPClient: hc, HTTPHeader: hdr})
		code := 0
		if r != nil {
			code = r.StatusCode
		}
		return conn, code, err
	}
	u, _ := url.Parse(h.srv.URL)
	for _, origin := range []string{"http://evil.example", "http://" + u.Hostname() + ":1", "null", ""} {
		if conn, code, err := dial(c, origin); err == nil || code != http.StatusForbidden {
			if conn != nil {
				conn.CloseNow()
			}
			t.Errorf("WebSocket with Origin %q: %d %v", origin, code, err)
		}
	}
	if conn, code, err := dial(h.client(), h.srv.URL); err == nil || code != http.StatusUnauthorized {
		if conn != nil {
			conn.CloseNow()
		}
		t.Errorf("WebSocket without a session: %d %v", code, err)
	}
	conn, code, err := dial(c, h.srv.URL)
	if err != nil {
		t.Fatalf("WebSocket from the console's origin: %d %v", code, err)
	}
	defer conn.CloseNow()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if typ, data, err := conn.Read(ctx); err != nil || typ != websocket.MessageText || !strings.Contains(string(data), `"session"`) {
		t.Fatalf("first message: %v %s", err, data)
	}
}

func TestSessionsExpireAndAreBounded(t *testing.T) {
	svc := apitest.New()
	c := console.New(console.Options{API: api.NewServer(svc, token, nil), MaxSessions: 2, SessionTTL: time.Hour})
	srv := httptest.NewServer(c)
	defer srv.Close()
	h := &harness{t: t, srv: srv, svc: svc}
	a, b, d := h.client(), h.client(), h.client()
	h.login(a)
	h.login(b)
	h.login(d) // the third ends the oldest
	if r := h.do(a, "GET", "/api/jails", "", nil); r.status != http.StatusUnauthorized {
		t.Errorf("oldest session at capacity: %d", r.status)
	}
	for _, cl := range []*http.Client{b, d} {
		if r := h.do(cl, "GET", "/api/jails", "", nil); r.status != http.StatusOK {
			t.Errorf("newer session: %d", r.status)
		}
	}
}
