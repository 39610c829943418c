package api

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"unicode"

	"github.com/agentjail/agentjail/internal/atomicfile"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/tenant"
)

// TokenFile is the name of the token file inside the data directory.
const TokenFile = "api-token"

// EnsureToken returns the API's bearer token, kept in dataDir/api-token.
// On first start it creates dataDir (0700) if missing and writes a new
// random token (32 bytes, hex) to the file with mode 0600; afterwards it
// reuses the file. It refuses a token file that is not a regular file,
// that group or other may access (anyone who reads it controls every
// jail), or that is empty.
func EnsureToken(dataDir string) (string, error) {
	path := filepath.Join(dataDir, TokenFile)
	tok, err := ReadToken(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return tok, err
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return "", fmt.Errorf("api token: create data dir: %w", err)
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", fmt.Errorf("api token: %w", err)
	}
	tok = hex.EncodeToString(raw)
	// Write a private temp file, then link it into place: the token file
	// never exists half-written, and a concurrent first start keeps the
	// token that won.
	tmp, err := os.CreateTemp(dataDir, ".api-token-*")
	if err != nil {
		return "", fmt.Errorf("api token: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return "", fmt.Errorf("api token: %w", err)
	}
	if _, err := tmp.WriteString(tok + "\n"); err != nil {
		tmp.Close()
		return "", fmt.Errorf("api token: write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return "", fmt.Errorf("api token: sync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("api token: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return ReadToken(path)
		}
		return "", fmt.Errorf("api token: %w", err)
	}
	if err := atomicfile.SyncDir(dataDir); err != nil {
		return "", fmt.Errorf("api token: %w", err)
	}
	return tok, nil
}

// ReadToken reads a token file written by EnsureToken, with its checks: a
// regular file, not accessible by group or other, holding one non-empty
// token without spaces. An absent file is an error satisfying
// errors.Is(err, fs.ErrNotExist).
func ReadToken(path string) (string, error) {
	st, err := os.Lstat(path)
	if err != nil {
		return "", fmt.Errorf("api token: %w", err)
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("api token: %s is not a regular file (%s); remove it to have a new token made", path, st.Mode().Type())
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return "", fmt.Errorf("api token: refusing %s: its mode %04o lets group or other read or change it, and whoever holds the token controls every jail; run chmod 600 on it, or remove it to have a new token made", path, perm)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("api token: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("api token: %s is empty; remove it to have a new token made", path)
	}
	if strings.IndexFunc(tok, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		return "", fmt.Errorf("api token: %s holds more than one word; it must hold only the token", path)
	}
	return tok, nil
}

// authenticate returns who r's credential belongs to: the bearer token
// (the bootstrap admin, tenant "default") or an API key with its tenant
// and role; the terminal WebSocket also takes the token or a ticket in
// its query (see queryPrincipal). The comparison with the token takes the
// same time wherever they differ. errdefs.ErrUnauthorized when there is
// no valid credential.
func (s *server) authenticate(r *http.Request) (tenant.Principal, error) {
	if r.Pattern == terminalPattern {
		if p, ok := s.queryPrincipal(r); ok {
			return p, nil
		}
	}
	h := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || s.token == "" {
		return tenant.Principal{}, errUnauthenticated
	}
	tok = strings.TrimSpace(tok)
	if subtle.ConstantTimeCompare([]byte(tok), []byte(s.token)) == 1 {
		return tenant.Token, nil
	}
	if s.keys == nil {
		return tenant.Principal{}, errUnauthenticated
	}
	k, err := s.keys.Verify(tok)
	if err != nil {
		return tenant.Principal{}, errUnauthenticated
	}
	return tenant.FromKey(k), nil
}

// errUnauthenticated answers a request without a valid credential.
var errUnauthenticated = errdefs.New(errdefs.ErrUnauthorized, "missing or invalid bearer token (Authorization: Bearer <token>: the token in DATA_DIR/api-token, or an API key from `agentjail keys create`)")

// allows returns nil when p may call routes of access a, else an
// errdefs.ErrForbidden saying why.
func (a access) allows(p tenant.Principal) error {
	switch a {
	case read:
		return nil
	case write:
		if !p.Role.CanWrite() {
			return errdefs.Forbiddenf("API key %s is a viewer's (tenant %s): it may only read", p.KeyID, p.Tenant)
		}
		return nil
	case adminOnly:
		if !p.Admin() {
			return errdefs.Forbiddenf("this concerns every tenant: only an admin key or the API token may")
		}
		return nil
	case tokenOnly:
		if p.Kind != tenant.Token.Kind {
			return errdefs.Forbiddenf("API keys are managed with the API token (DATA_DIR/api-token) alone")
		}
		return nil
	}
	return errdefs.Forbiddenf("no access")
}

// Whoami is the answer of GET /whoami: who the request's credential
// belongs to.
type Whoami struct {
	// Kind is "token" for the daemon's API token, "key" for an API key.
	Kind string `json:"kind"`
	// Role is what the credential may do: "admin" (everything, across
	// tenants), "user" (its tenant's resources) or "viewer" (read them).
	Role string `json:"role"`
	// Tenant is the tenant the credential acts for.
	Tenant string `json:"tenant"`
	// KeyID and KeyName describe an API key.
	KeyID   string `json:"key_id,omitempty"`
	KeyName string `json:"key_name,omitempty"`
}

func (s *server) whoami(w http.ResponseWriter, r *http.Request) error {
	p, _ := tenant.FromContext(r.Context())
	writeJSON(w, http.StatusOK, Whoami{Kind: p.Kind, Role: string(p.Role), Tenant: p.Tenant, KeyID: p.KeyID, KeyName: p.KeyName})
	return nil
}
