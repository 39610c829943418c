package console

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"sync"
	"time"
)

// session is one logged-in browser.
type session struct {
	// credential is the bearer credential the browser logged in with (the
	// API token or an API key). Every API call of the session carries it,
	// so the API alone decides what the session may do, and a revoked key
	// ends the session's access at once.
	credential string
	// csrf must accompany every state-changing call (X-CSRF-Token).
	csrf    string
	created time.Time
	expires time.Time
	// whoami is the API's description of the credential's holder.
	whoami []byte
}

// sessionStore holds the live sessions, keyed by the SHA-256 of their
// cookie value (the value itself is never stored). Sessions live in memory:
// a daemon restart logs every browser out.
type sessionStore struct {
	mu  sync.Mutex
	m   map[[32]byte]*session
	ttl time.Duration
	max int
	now func() time.Time
}

func newSessionStore(ttl time.Duration, max int) *sessionStore {
	return &sessionStore{m: map[[32]byte]*session{}, ttl: ttl, max: max, now: time.Now}
}

// randomToken returns n random bytes, base64url without padding.
func randomToken(n int) string {
	b := make([]byte, n)
	// crypto/rand.Read never fails (it panics if the system's source does).
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// create starts a session for credential and returns its cookie value.
// At the store's capacity the oldest session is ended first.
func (st *sessionStore) create(credential string, whoami []byte) (string, *session) {
	id := randomToken(32)
	now := st.now()
	s := &session{credential: credential, csrf: randomToken(32), created: now, expires: now.Add(st.ttl), whoami: whoami}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.sweep(now)
	if len(st.m) >= st.max {
		var oldest [32]byte
		var at time.Time
		for k, v := range st.m {
			if at.IsZero() || v.created.Before(at) {
				oldest, at = k, v.created
			}
		}
		delete(st.m, oldest)
	}
	st.m[sha256.Sum256([]byte(id))] = s
	return id, s
}

// get returns the live session of a cookie value, or nil.
func (st *sessionStore) get(id string) *session {
	if id == "" {
		return nil
	}
	key := sha256.Sum256([]byte(id))
	st.mu.Lock()
	defer st.mu.Unlock()
	s := st.m[key]
	if s == nil {
		return nil
	}
	if !st.now().Before(s.expires) {
		delete(st.m, key)
		return nil
	}
	return s
}

// end removes the session of a cookie value.
func (st *sessionStore) end(id string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	delete(st.m, sha256.Sum256([]byte(id)))
}

// sweep drops expired sessions; st.mu is held.
func (st *sessionStore) sweep(now time.Time) {
	for k, s := range st.m {
		if !now.Before(s.expires) {
			delete(st.m, k)
		}
	}
}

// checkCSRF reports whether tok is the session's CSRF token.
func (s *session) checkCSRF(tok string) bool {
	return tok != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(s.csrf)) == 1
}
