package api

import (
	"net/http"

	"github.com/agentjail/agentjail/internal/apikey"
	"github.com/agentjail/agentjail/internal/errdefs"
)

// KeyCreateRequest is the body of POST /keys.
type KeyCreateRequest struct {
	// Name labels the key (optional).
	Name string `json:"name,omitempty"`
	// Tenant the key acts for (default "default").
	Tenant string `json:"tenant,omitempty"`
	// Role is admin, user (default) or viewer.
	Role apikey.Role `json:"role,omitempty"`
}

// KeyCreated is the answer to POST /keys: the key's record and the key
// itself, shown this once.
type KeyCreated struct {
	apikey.Key
	Secret string `json:"secret"`
}

// KeyList is the body of GET /keys.
type KeyList struct {
	Keys []apikey.Key `json:"keys"`
}

// Option configures the server made by NewServer.
type Option func(*server)

// WithKeys serves the API key routes (/keys) over store.
func WithKeys(store *apikey.Store) Option { return func(s *server) { s.keys = store } }

// WithMount serves h for every request whose path is prefix or below it
// (prefix ends with "/"; h sees the full path). Such a handler does its own
// authentication: the E2B-compatible surface is mounted this way.
func WithMount(prefix string, h http.Handler) Option {
	return func(s *server) { s.mounts = append(s.mounts, mount{prefix, h}) }
}

type mount struct {
	prefix string
	h      http.Handler
}

func (s *server) keyStore() (*apikey.Store, error) {
	if s.keys == nil {
		return nil, errdefs.NotImplementedf("this daemon has no API key store")
	}
	return s.keys, nil
}

func (s *server) createKey(w http.ResponseWriter, r *http.Request) error {
	st, err := s.keyStore()
	if err != nil {
		return err
	}
	var req KeyCreateRequest
	if err := decodeBody(w, r, &req, false, true); err != nil {
		return err
	}
	k, secret, err := st.Create(req.Name, req.Tenant, req.Role)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, KeyCreated{Key: k, Secret: secret})
	return nil
}

func (s *server) listKeys(w http.ResponseWriter, r *http.Request) error {
	st, err := s.keyStore()
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, KeyList{Keys: st.List()})
	return nil
}

func (s *server) deleteKey(w http.ResponseWriter, r *http.Request) error {
	st, err := s.keyStore()
	if err != nil {
		return err
	}
	if err := st.Remove(r.PathValue("kid")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
